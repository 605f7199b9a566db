"""A model directory read as the engines' transformers reads it: special tokens in every written
form, legacy special_tokens_map.json, named templates, chat_template.jinja precedence, and BOS
from the tokenizer itself — and what config states still wins."""

from __future__ import annotations

import json
import shutil

import pytest
from tokenizers import Tokenizer, processors

from cortex.profile.hf_settings import named_templates, pick_template, read_hf_settings, token_text
from cortex.profile.model_profile import ProfileError, ProfileSpec, load_profile
from tests import deepseek_profile as ds

ADDED = {"__type": "AddedToken", "content": ds.BOS, "lstrip": False, "normalized": True,
         "rstrip": False, "single_word": False}


def model_dir(tmp_path, config=None, post_processor="keep", files=None):
    """A model directory: the DeepSeek tokenizer.json (its post-processor replaced when
    asked), a tokenizer_config.json and any other files given ({relative path: text})."""
    folder = tmp_path / "model"
    folder.mkdir(parents=True)
    tokenizer = Tokenizer.from_file(ds.TOKENIZER_JSON)
    if post_processor != "keep":
        tokenizer.post_processor = post_processor
    if post_processor is None:  # tokenizers cannot unset it: write the JSON without one
        data = json.loads(tokenizer.to_str())
        data["post_processor"] = None
        (folder / "tokenizer.json").write_text(json.dumps(data))
    else:
        tokenizer.save(str(folder / "tokenizer.json"))
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    for name, text in (files or {}).items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return folder


def test_token_forms_and_template_forms():
    assert token_text("<s>") == "<s>" and token_text(ADDED) == ds.BOS
    assert token_text({"content": "x"}) == "x" and token_text(None) is None
    assert named_templates("t") == {"default": "t"}
    assert named_templates([{"name": "default", "template": "d"},
                            {"name": "tool_use", "template": "t"}]) == {
        "default": "d", "tool_use": "t"}
    with pytest.raises(ValueError):
        named_templates([{"template": "nameless"}])
    assert pick_template({"only": "o"}, tools=True) == "o"
    assert pick_template({"default": "d", "tool_use": "t"}, tools=True) == "t"
    assert pick_template({"default": "d", "tool_use": "t"}, tools=False) == "d"
    assert pick_template({"rag": "r", "tool_use": "t"}, tools=False) is None


def test_settings_read_config_then_legacy_map(tmp_path):
    legacy = {"bos_token": "ignored", "unk_token": {"content": "<unk>"}, "pad_token": "<pad>"}
    folder = model_dir(tmp_path, {"bos_token": ADDED, "eos_token": "</e>", "pad_token": None,
                                  "add_bos_token": True, "chat_template": "{{ bos_token }}"},
                       files={"special_tokens_map.json": json.dumps(legacy)})
    problems: list[str] = []
    settings = read_hf_settings(folder, problems)
    assert problems == []
    # the config's own null pad_token wins over the legacy map's
    assert settings.special_tokens == {"bos_token": ds.BOS, "eos_token": "</e>",
                                       "unk_token": "<unk>"}
    assert settings.add_bos_token is True and settings.add_eos_token is None
    assert settings.chat_templates == {"default": "{{ bos_token }}"}


def test_template_files_win_over_the_config(tmp_path):
    folder = model_dir(tmp_path, {"chat_template": "config"}, files={
        "chat_template.jinja": "file", "additional_chat_templates/tool_use.jinja": "tools"})
    settings = read_hf_settings(folder, [])
    assert settings.chat_templates == {"default": "file", "tool_use": "tools"}
    assert settings.templates_from == str(folder / "chat_template.jinja")


def test_bad_files_are_problems_not_crashes(tmp_path):
    folder = model_dir(tmp_path, None)
    (folder / "tokenizer_config.json").write_text("{oops")
    problems: list[str] = []
    assert read_hf_settings(folder, problems).special_tokens == {}
    assert problems and "tokenizer_config.json" in problems[0]
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"add_bos_token": "yes", "chat_template": 7}))
    problems = []
    read_hf_settings(folder, problems)
    assert len(problems) == 2, problems


def test_a_profile_from_a_model_directory_renders_what_the_engine_renders(tmp_path):
    # the bug a real vLLM showed: the template starts with {{ bos_token }} and the profile
    # was given no bos_token, so Cortex rendered one token less than the engine
    folder = model_dir(tmp_path, {"bos_token": ADDED, "eos_token": {"content": ds.EOS},
                                  "add_bos_token": False, "chat_template": ds.TEMPLATE})
    for tokenizer_path in (str(folder), str(folder / "tokenizer.json")):
        profile = load_profile(ProfileSpec("m", tokenizer_path, 32))
        text = profile.chat_template.render([{"role": "user", "content": "hi"}])
        assert text.startswith(ds.BOS)
        assert (profile.bos_token, profile.eos_token, profile.add_bos) == (ds.BOS, ds.EOS, False)
    # what config states wins over the directory
    stated = load_profile(ProfileSpec("m", str(folder), 32, bos_token=ds.EOS, add_bos=True))
    assert stated.chat_template.render([]).startswith(ds.EOS)
    assert stated.add_bos and stated.bos_id == 1


def test_named_templates_pick_the_tool_one_for_requests_with_tools(tmp_path):
    folder = model_dir(tmp_path, {"chat_template": [
        {"name": "default", "template": "plain"}, {"name": "tool_use", "template": "tools"}]})
    profile = load_profile(ProfileSpec("m", str(folder), 32))
    assert profile.chat_templates.pick(None).render([]) == "plain"
    assert profile.chat_templates.pick([]).render([]) == "tools"
    nameless = model_dir(tmp_path / "x", {"chat_template": [
        {"name": "rag", "template": "r"}, {"name": "other", "template": "o"}]})
    with pytest.raises(ProfileError, match="none is named 'default'"):
        load_profile(ProfileSpec("m", str(nameless), 32))


@pytest.mark.parametrize(("post_processor", "config", "bos"), [
    # the post-processor decides when tokenizer.json has one (add_bos_token is then ignored,
    # as transformers 5 ignores it)
    (processors.TemplateProcessing(single=f"{ds.BOS} $A", special_tokens=[(ds.BOS, 0)]),
     {"add_bos_token": False}, 0),
    (processors.ByteLevel(trim_offsets=False), {"add_bos_token": True, "bos_token": ds.BOS},
     None),
    # without one, transformers builds it from add_bos_token
    (None, {"add_bos_token": True, "bos_token": ds.BOS}, 0),
    (None, {"bos_token": ds.BOS}, None),
])
def test_bos_for_text_is_what_the_tokenizer_adds(tmp_path, post_processor, config, bos):
    folder = model_dir(tmp_path, config, post_processor)
    profile = load_profile(ProfileSpec("m", str(folder), 32))
    assert profile.add_bos is (bos is not None)
    assert bos is None or profile.bos_id == bos
    ids = profile.new_cached_tokenizer().encode("hello", add_special_tokens=True)
    reference = ds.tokenizer().encode("hello", add_special_tokens=False).ids
    assert ids == ([bos] if bos is not None else []) + reference


def test_a_tokenizer_that_adds_an_eos_is_refused_with_the_reason(tmp_path):
    adds_eos = processors.TemplateProcessing(single=f"$A {ds.EOS}", special_tokens=[(ds.EOS, 1)])
    folder = model_dir(tmp_path, {}, adds_eos)
    with pytest.raises(ProfileError, match="only a single leading BOS"):
        load_profile(ProfileSpec("m", str(folder), 32))
    load_profile(ProfileSpec("m", str(folder), 32, add_bos=False))  # stated: no probe


def test_the_example_model_directory_is_copied_whole(tmp_path):
    # a model directory copied as an operator copies it (tokenizer files only) loads the same
    source = model_dir(tmp_path, {"bos_token": ADDED, "chat_template": ds.TEMPLATE})
    copy = tmp_path / "copy"
    shutil.copytree(source, copy)
    assert load_profile(ProfileSpec("m", str(copy), 32)).fingerprint == \
        load_profile(ProfileSpec("m", str(source), 32)).fingerprint
