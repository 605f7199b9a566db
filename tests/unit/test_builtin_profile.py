"""The built-in ``deepseek`` profile (``cortex.profile.builtin``): the same profile as the tests'
DeepSeek files, named by ``builtin`` in a ``ProfileSpec`` and in the configuration."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from cortex.config import add_config_arguments, file_checks, load_config
from cortex.errors import ConfigError
from cortex.profile import builtin
from cortex.profile.model_profile import ProfileError, ProfileSpec, load_profile
from cortex.prompt.chat_template import ChatTemplate
from tests import deepseek_profile as ds

REPO = Path(__file__).resolve().parents[2]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]


def flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_config_arguments(parser)
    return parser.parse_args(list(argv))


def test_builtin_deepseek_is_the_deepseek_tokenizer_with_the_tests_template(tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text(ds.TEMPLATE)
    named = load_profile(ProfileSpec("deepseek", None, 16, builtin="deepseek"))
    from_files = load_profile(ProfileSpec("deepseek", ds.TOKENIZER_JSON, 16, str(template),
                                          bos_token=ds.BOS, eos_token=ds.EOS))
    assert named.fingerprint == from_files.fingerprint
    assert (named.bos_token, named.eos_token, named.bos_id, named.add_bos) == (
        ds.BOS, ds.EOS, 0, False)
    assert named.chat_template is not None
    assert named.chat_template.render(MESSAGES, add_generation_prompt=True) == \
        ds.chat_template().render(MESSAGES, add_generation_prompt=True)
    # the tests take their template from the builtin: pin what it renders independently
    assert named.chat_template.render(MESSAGES, add_generation_prompt=True) == (
        f"{ds.BOS}Be brief.<｜User｜>hi<｜Assistant｜>hello{ds.EOS}<｜User｜>again<｜Assistant｜>")


def test_a_chat_template_file_replaces_the_builtins(tmp_path):
    template = tmp_path / "plain.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    profile = load_profile(ProfileSpec("m", None, 16, str(template), builtin="deepseek"))
    assert profile.chat_template.render(MESSAGES[:2], add_generation_prompt=True) == \
        "Be brief.\nhi\n"


def test_builtin_problems_are_listed():
    with pytest.raises(ProfileError) as unknown:
        load_profile(ProfileSpec("m", None, 16, builtin="llama"))
    assert unknown.value.problems == [
        "builtin 'llama' is not a built-in profile (known: deepseek)"]
    with pytest.raises(ProfileError) as both:
        load_profile(ProfileSpec("m", ds.TOKENIZER_JSON, 16, builtin="deepseek"))
    assert "name one of them" in both.value.problems[0]
    with pytest.raises(ProfileError) as neither:
        load_profile(ProfileSpec("m", None, 16))
    assert neither.value.problems == ["no tokenizer: tokenizer_path or builtin is required"]
    assert builtin.installed("deepseek") and not builtin.installed("llama")


def test_a_model_names_the_builtin_in_the_configuration():
    config = load_config(flags("--model", "sim-model,builtin=deepseek,block_size=16"), env={})
    (model,) = config.models
    assert (model.builtin, model.tokenizer) == ("deepseek", None)
    assert model.profile_spec() == ProfileSpec("sim-model", None, 16, builtin="deepseek")
    assert file_checks(config) == []  # check-config loads the profile too
    with pytest.raises(ConfigError) as info:
        load_config(flags("--model", "a,builtin=llama,block_size=16",
                          "--model", f"b,builtin=deepseek,tokenizer={ds.TOKENIZER_JSON},"
                          "block_size=16"), env={})
    assert sorted(info.value.problems) == [
        "models[0]: model a: builtin 'llama' is not a built-in profile (known: deepseek)",
        "models[1]: model b: tokenizer and builtin both set: name one of them"]


@pytest.mark.parametrize("messages", [
    MESSAGES,
    [{"role": "user", "content": "call it"}, {"role": "assistant", "content": None},
     {"role": "user", "content": "and now?"}],
    [{"role": "assistant", "content": ""}],
    [{"role": "system", "content": "日本語 and emoji 🚀"}, {"role": "user", "content": "  spaced  "}],
])
def test_the_builtin_template_renders_as_the_real_engines_template(messages):
    """The real vLLM tests serve engines/templates/deepseek.jinja; Cortex's built-in profile and
    the sim serve the built-in template: the two render every conversation alike (an assistant
    turn without content is empty, not "None")."""
    engines_template = (REPO / "engines" / "templates" / "deepseek.jinja").read_text("utf-8")
    real = ChatTemplate(engines_template, ds.TOKENS)
    ours = ChatTemplate(builtin.DEEPSEEK_CHAT_TEMPLATE, ds.TOKENS)
    for generation_prompt in (True, False):
        assert ours.render(messages, add_generation_prompt=generation_prompt) == \
            real.render(messages, add_generation_prompt=generation_prompt)
