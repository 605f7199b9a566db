"""Request bodies → text to tokenize or token ids, with the namespace (LoRA, salt)."""

from __future__ import annotations

import pytest

from cortex.errors import BadRequest
from cortex.prompt.chat_template import ChatTemplate, ChatTemplates
from cortex.prompt.request_text import (
    chat_prompt,
    completions_prompt,
    generate_prompt,
    split_model_name,
)
from tests import deepseek_profile as ds

T = ds.chat_templates()
U, A = "<｜User｜>", "<｜Assistant｜>"


def chat(body):
    return chat_prompt(body, T)


def test_chat_renders_with_generation_prompt_and_no_special_tokens():
    p = chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert p.text == f"{ds.BOS}{U}hi{A}"
    assert p.token_ids is None and not p.add_special_tokens and not p.media_cut
    assert (p.lora_name, p.cache_salt) == (None, None)
    off = chat({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": False})
    assert off.text == f"{ds.BOS}{U}hi"


def test_continue_final_message_ends_after_its_content():
    body = {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure"}],
        "continue_final_message": True,
    }
    assert chat(body).text == f"{ds.BOS}{U}hi{A}Sure"


def test_text_parts_join_and_the_first_media_part_cuts_the_prompt():
    parts = [
        {"type": "text", "text": "look"},
        {"type": "text", "text": "here"},
        {"type": "image_url", "image_url": {"url": "http://x"}},
        {"type": "text", "text": "after"},
    ]
    body = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": parts},
                         {"role": "assistant", "content": "never"}]}
    p = chat(body)
    assert p.text == f"{ds.BOS}S{U}look\nhere" and p.media_cut
    text_only = chat({"messages": [{"role": "user", "content": parts[:2]}]})
    assert text_only.text == f"{ds.BOS}{U}look\nhere{A}" and not text_only.media_cut


def test_a_template_that_drops_the_media_sentinel_leaves_no_prefix():
    t = ChatTemplate("{% for m in messages %}{{ m.content[:2] }}{% endfor %}")
    p = chat_prompt({"messages": [{"role": "user", "content": [{"type": "image"}]}]},
                    ChatTemplates(t, t))
    assert p.text == "" and p.media_cut


def test_namespace_from_model_lora_path_and_salt():
    msgs = [{"role": "user", "content": "hi"}]
    p = chat({"model": "base:adapter", "messages": msgs, "cache_salt": "s1"})
    assert (p.lora_name, p.cache_salt) == ("adapter", "s1")
    assert generate_prompt({"text": "x", "lora_path": "lora-a"}).lora_name == "lora-a"
    assert generate_prompt({"text": "x", "lora_path": ["lora-b"]}).lora_name == "lora-b"
    assert split_model_name("plain") == ("plain", None)
    assert split_model_name("a:") == ("a:", None)


def test_token_id_prompts_skip_tokenization():
    p = completions_prompt({"prompt": [1, 2, 3]})
    assert p.token_ids == [1, 2, 3] and p.text is None
    assert completions_prompt({"prompt": [[4, 5], [6]]}).token_ids == [4, 5]
    g = generate_prompt({"input_ids": [7, 8], "text": "ignored"})
    assert g.token_ids == [7, 8] and g.text is None


def test_text_prompts_ask_for_special_tokens_unless_told_otherwise():
    assert completions_prompt({"prompt": "abc"}).add_special_tokens
    assert completions_prompt({"prompt": ["abc", "def"]}).text == "abc"
    assert not completions_prompt({"prompt": "a", "add_special_tokens": False}).add_special_tokens
    assert generate_prompt({"text": "abc"}).add_special_tokens


@pytest.mark.parametrize(
    "call",
    [
        lambda: chat({"messages": []}),
        lambda: chat({"messages": "hi"}),
        lambda: chat({"messages": [{"content": "no role"}]}),
        lambda: chat({"messages": [{"role": "user", "content": 5}]}),
        lambda: chat({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}),
        lambda: chat({"messages": [{"role": "user", "content": [5]}]}),
        lambda: chat({"messages": [{"role": "assistant", "tool_calls": "x"}]}),
        lambda: chat({"messages": [{"role": "assistant", "tool_calls": [{"type": "x"}]}]}),
        lambda: chat({"messages": [{"role": "user", "content": "x"}], "tools": [{"n": 1}]}),
        lambda: chat({"messages": [{"role": "user", "content": "x"}], "tools": "t"}),
        lambda: chat({"messages": [{"role": "user", "content": "x"}], "cache_salt": 3}),
        lambda: chat({"messages": [{"role": "tool", "content": "x"}]}),  # raise_exception
        lambda: completions_prompt({"prompt": [1, -1]}),
        lambda: completions_prompt({"prompt": [1, 2**32]}),
        lambda: completions_prompt({"prompt": [True]}),
        lambda: completions_prompt({"prompt": 5}),
        lambda: completions_prompt({"prompt": "x", "add_special_tokens": "yes"}),
        lambda: generate_prompt({}),
    ],
)
def test_bad_bodies_are_bad_requests(call):
    with pytest.raises(BadRequest):
        call()


def test_reasoning_effort_reaches_the_template_as_vllm_hands_it():
    """vLLM passes ``reasoning_effort`` and (unless the kwargs set it) ``enable_thinking`` =
    effort is not "none" to the template (``build_chat_params``)."""
    template = ChatTemplate("{{ reasoning_effort }}|{{ enable_thinking }}|{{ messages[0].content }}")
    templates = ChatTemplates(template, template)
    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert chat_prompt(body, templates).text == "||hi"
    assert chat_prompt({**body, "reasoning_effort": "low"}, templates).text == "low|True|hi"
    assert chat_prompt({**body, "reasoning_effort": "none"}, templates).text == "none|False|hi"
    kwargs = {"enable_thinking": True, "reasoning_effort": "high"}
    assert chat_prompt({**body, "reasoning_effort": "none", "chat_template_kwargs": kwargs},
                       templates).text == "none|True|hi"
