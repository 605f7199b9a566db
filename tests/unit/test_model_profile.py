"""load_profile / check_worker / fingerprint with the real DeepSeek tokenizer files."""

from __future__ import annotations

import dataclasses

import pytest

from cortex.errors import CortexError
from cortex.profile.model_profile import (
    ProfileError,
    ProfileSpec,
    check_worker,
    load_profile,
)
from tests import deepseek_profile as ds


@pytest.fixture
def template_path(tmp_path):
    path = tmp_path / "chat.jinja"
    path.write_text(ds.TEMPLATE)
    return str(path)


@pytest.fixture
def spec(template_path):
    return ProfileSpec(
        model="deepseek", tokenizer_path=ds.TOKENIZER_JSON, block_size=16,
        chat_template_path=template_path, add_bos=True, bos_token=ds.BOS, eos_token=ds.EOS,
        version="2026-11",
    )


def test_loads_a_complete_profile(spec):
    profile = load_profile(spec)
    assert (profile.model, profile.block_size, profile.bos_id, profile.version) == (
        "deepseek", 16, 0, "2026-11"
    )
    assert len(profile.fingerprint) == 16
    assert profile.chat_template is not None
    tok = profile.new_cached_tokenizer()
    assert tok.encode("hi", add_special_tokens=True) == [0, *ds.tokenizer().encode("hi").ids]


def test_fingerprint_follows_what_decides_ids_and_keys(spec, tmp_path):
    base = load_profile(spec).fingerprint
    assert load_profile(spec).fingerprint == base
    assert load_profile(dataclasses.replace(spec, version="other")).fingerprint == base
    assert load_profile(dataclasses.replace(spec, block_size=32)).fingerprint != base
    assert load_profile(dataclasses.replace(spec, add_bos=False)).fingerprint != base
    assert load_profile(dataclasses.replace(spec, chat_template_path=None)).fingerprint != base
    other = tmp_path / "other.jinja"
    other.write_text(ds.TEMPLATE + " ")
    changed = dataclasses.replace(spec, chat_template_path=str(other))
    assert load_profile(changed).fingerprint != base


def test_every_problem_is_reported_at_once(tmp_path):
    bad_template = tmp_path / "bad.jinja"
    bad_template.write_text("{% for %}")
    spec = ProfileSpec(
        model="m", tokenizer_path=str(tmp_path / "missing.json"), block_size=0,
        chat_template_path=str(bad_template), add_bos=True,
    )
    with pytest.raises(ProfileError) as info:
        load_profile(spec)
    assert isinstance(info.value, CortexError)
    problems = info.value.problems
    assert len(problems) == 4, problems
    assert any("block_size" in p for p in problems)
    assert any("missing.json" in p for p in problems)
    assert any("bad.jinja" in p for p in problems)
    assert any("add_bos" in p for p in problems)


def test_unreadable_tokenizer_and_unknown_bos_are_problems(tmp_path, spec):
    junk = tmp_path / "tokenizer.json"
    junk.write_text("{not json")
    with pytest.raises(ProfileError, match="cannot load"):
        load_profile(dataclasses.replace(spec, tokenizer_path=str(junk)))
    with pytest.raises(ProfileError, match="not a single token"):
        load_profile(dataclasses.replace(spec, bos_token="<s>"))


def test_check_worker_names_each_disagreement(spec):
    profile = load_profile(spec)
    assert check_worker(profile, "deepseek", 16) is None
    assert "page size 32" in check_worker(profile, "deepseek", 32)
    reason = check_worker(profile, "llama", 64)
    assert "'llama'" in reason and "page size 64" in reason
    assert "did not report" in check_worker(profile, None, None)
