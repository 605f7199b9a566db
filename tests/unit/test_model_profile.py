"""load_profile / check_worker / fingerprint with the real DeepSeek tokenizer files."""

from __future__ import annotations

import dataclasses
import json

import pytest

from cortex.errors import CortexError
from cortex.profile.model_profile import (
    ProfileError,
    ProfileSpec,
    check_worker,
    load_profile,
    profile_fingerprint,
    template_identity,
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


def test_fingerprint_follows_what_decides_ids_and_keys(spec):
    profile = load_profile(spec)
    tok = ds.tokenizer_json_bytes()
    base = profile_fingerprint(tok, template_identity({"default": ds.TEMPLATE}, ds.TOKENS), 16,
                               True)
    assert profile.fingerprint == base
    assert profile_fingerprint(tok, ds.TEMPLATE, 32, True) != base
    assert profile_fingerprint(tok, ds.TEMPLATE, 16, False) != base
    assert profile_fingerprint(tok, None, 16, True) != base
    assert profile_fingerprint(tok, "", 16, True) != profile_fingerprint(tok, None, 16, True)
    assert profile_fingerprint(tok, ds.TEMPLATE + " ", 16, True) != base
    assert profile_fingerprint(tok + b" ", ds.TEMPLATE, 16, True) != base


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
    assert "prefix caching off" in check_worker(profile, "deepseek", 16, prefix_caching=False)
    assert check_worker(profile, "deepseek", 16, prefix_caching=True) is None


def test_template_from_an_hf_tokenizer_config(tmp_path, spec):
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": ds.TEMPLATE}))
    from_json = load_profile(dataclasses.replace(spec, chat_template_path=str(config)))
    assert from_json.fingerprint == load_profile(spec).fingerprint
    named = tmp_path / "named_config.json"
    named.write_text(json.dumps({"chat_template": [{"name": "tool_use", "template": "x"},
                                                   {"name": "default", "template": "{{ 1 }}"}]}))
    profile = load_profile(dataclasses.replace(spec, chat_template_path=str(named)))
    assert profile.chat_template is not None and profile.chat_template.render([]) == "1"
    with pytest.raises(ProfileError, match="no chat_template"):
        load_profile(dataclasses.replace(spec, chat_template_path=ds.TOKENIZER_JSON))
