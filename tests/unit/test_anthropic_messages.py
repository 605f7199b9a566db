"""Anthropic Messages bodies → the chat body vLLM renders for them (``anthropic_messages``).

Each expectation is what vLLM 0.32's ``to_chat_completion_request`` makes of the body (the
real-vLLM tests compare whole renderings with the engine's own conversion); here every rule of
the module, and every case it must refuse, in isolation.
"""

from __future__ import annotations

import json

import pytest

from cortex.prompt.anthropic_messages import chat_body, disabled_effort, merges_inline_system
from cortex.prompt.chat_template import ChatTemplate, ChatTemplates
from cortex.prompt.request_text import messages_prompt
from cortex.prompt.unrenderable import Unrenderable
from tests import deepseek_profile as ds

U, A = "<｜User｜>", "<｜Assistant｜>"


def convert(body, merge=False):
    return chat_body(body, merge_inline_system=merge)


def test_system_string_and_blocks_without_billing_header():
    assert convert({"system": "S", "messages": []})["messages"] == [
        {"role": "system", "content": "S"}]
    blocks = [{"type": "text", "text": "x-anthropic-billing-header: cch=1;"},
              {"type": "text", "text": "A"}, {"type": "text", "text": ""},
              {"type": "text", "text": "B"}]
    assert convert({"system": blocks, "messages": []})["messages"] == [
        {"role": "system", "content": "AB"}]
    assert convert({"system": "", "messages": []})["messages"] == []


def test_inline_system_stays_in_place_or_is_merged_first():
    messages = [{"role": "user", "content": "a"},
                {"role": "system", "content": [{"type": "text", "text": "R"}]},
                {"role": "system", "content": "x-anthropic-billing-header: dropped"},
                {"role": "user", "content": "b"}]
    assert convert({"system": "S", "messages": messages})["messages"] == [
        {"role": "system", "content": "S"}, {"role": "user", "content": "a"},
        {"role": "system", "content": "R"}, {"role": "user", "content": "b"}]
    assert convert({"system": "S", "messages": messages}, merge=True)["messages"] == [
        {"role": "system", "content": "SR"}, {"role": "user", "content": "a"},
        {"role": "user", "content": "b"}]


def test_blocks_become_content_reasoning_and_tool_calls():
    body = {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "one"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "t1", "signature": "x"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "thinking", "thinking": "t2"},
            {"type": "text", "text": "a"}, {"type": "text", "text": "b"},
            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"z": 1, "a": [2]}}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_2", "name": "g"}]}]}
    one, two, three = convert(body)["messages"]
    assert one == {"role": "user", "content": "one"}
    assert two == {"role": "assistant", "reasoning": "t1t2",
                   "tool_calls": [{"id": "toolu_1", "type": "function", "function": {
                       "name": "f", "arguments": json.dumps({"z": 1, "a": [2]})}}],
                   "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    assert three["tool_calls"][0]["function"]["arguments"] == "{}"
    assert "content" not in three


def test_tool_results_come_before_their_user_message():
    body = {"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "21 C"},
        {"type": "tool_result", "tool_use_id": "t2",
         "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"type": "tool_result", "tool_use_id": "t3"},
        {"type": "text", "text": "thanks"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t4",
                                      "content": "only a result"}]}]}
    assert convert(body)["messages"] == [
        {"role": "tool", "tool_call_id": "t1", "content": "21 C"},
        {"role": "tool", "tool_call_id": "t2", "content": "a\nb"},
        {"role": "tool", "tool_call_id": "t3", "content": ""},
        {"role": "user", "content": "thanks"},
        {"role": "tool", "tool_call_id": "t4", "content": "only a result"}]  # user dropped


def test_images_are_media_parts():
    body = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "see"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
            {"type": "image", "source": {"type": "url", "url": "http://x"}}]}]}]}
    first, tool, images = convert(body)["messages"]
    assert [part["type"] for part in first["content"]] == ["text", "image_url"]
    assert tool == {"role": "tool", "tool_call_id": "t", "content": ""}
    assert images["role"] == "user" and images["content"][0]["type"] == "image_url"


def test_tools_effort_kwargs_and_salt():
    body = {"messages": [], "tools": [
        {"name": "f", "description": "d", "input_schema": {"properties": {}}, "strict": True},
        {"name": "g", "input_schema": {"type": "object"}}],
        "output_config": {"effort": "high"}, "chat_template_kwargs": {"k": 1},
        "cache_salt": "s", "tool_choice": {"type": "any"}, "thinking": {"type": "enabled",
                                                                       "budget_tokens": 2048}}
    chat = convert(body)
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "f", "description": "d", "parameters": {
            "properties": {}, "type": "object"}, "strict": True, "defer_loading": None}},
        {"type": "function", "function": {"name": "g", "description": None, "parameters": {
            "type": "object"}, "strict": None, "defer_loading": None}}]
    assert list(chat["tools"][0]["function"]["parameters"]) == ["properties", "type"]
    assert (chat["reasoning_effort"], chat["chat_template_kwargs"], chat["cache_salt"]) == (
        "high", {"k": 1}, "s")
    assert "tools" not in convert({"messages": []})


@pytest.mark.parametrize("body", [
    {"messages": [{"role": "system", "content": [
        {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "f"}}]}]},
    {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "f"}]}]},
    {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                "content": [{"type": "tool_reference",
                                                             "tool_name": "f"}]}]}]},
    {"messages": [{"role": "assistant", "content": [{"type": "tool_result",
                                                     "tool_use_id": "t", "content": "x"}]}]},
    {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
    {"messages": [{"role": "tool", "content": "x"}]},
    {"messages": "hi"},
    {"messages": [], "tools": [{"name": "f"}]},
])
def test_what_vllm_renders_its_own_way_is_unrenderable(body):
    with pytest.raises(Unrenderable) as caught:
        convert(body)
    assert caught.value.reason == "unmodelled"


def test_the_inline_system_probe_is_vllms():
    plain = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}")
    strict = ChatTemplate("{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
                          "{{ raise_exception('system first') }}{% endif %}{% endfor %}")
    assert not merges_inline_system(ChatTemplates(plain, plain))
    assert merges_inline_system(ChatTemplates(plain, strict))  # either template counts
    assert merges_inline_system(ChatTemplates(None, plain))  # no template: vLLM merges


def test_a_messages_request_renders_as_its_chat():
    prompt = messages_prompt({"model": "m", "max_tokens": 4, "system": "S", "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "more"}], "cache_salt": "s"}, ds.chat_templates())
    assert prompt is not None and prompt.cache_salt == "s"
    assert prompt.text == f"{ds.BOS}S{U}hi{A}yo{ds.EOS}{U}more{A}"


def test_what_the_template_or_chat_path_refuses_is_unrenderable_not_a_client_error():
    templates = ds.chat_templates()  # DeepSeek's template raises on a tool turn
    with pytest.raises(Unrenderable) as caught:
        messages_prompt({"messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": "x"}]}]}, templates)
    assert caught.value.reason == "template_failed"
    with pytest.raises(Unrenderable) as caught:
        messages_prompt({"messages": []}, templates)  # nothing to render: the engine says
    assert caught.value.reason == "unmodelled"


def test_thinking_disabled_becomes_the_effort_vllm_probes_from_the_template():
    body = {"messages": [], "output_config": {"effort": "high"}, "thinking": {"type": "disabled"}}
    assert chat_body(body, merge_inline_system=False,
                     disabled_thinking_effort="none")["reasoning_effort"] == "none"
    ignores = ChatTemplate("{{ messages[0].content }}")
    thinks = ChatTemplate("{% if enable_thinking %}<think>{% endif %}{{ messages[0].content }}")
    refuses = ChatTemplate("{% if reasoning_effort == 'none' %}{{ raise_exception('no') }}"
                           "{% endif %}{{ reasoning_effort }}")
    assert disabled_effort(ChatTemplates(ignores, ignores)) == "low"  # renders none like low
    assert disabled_effort(ChatTemplates(thinks, thinks)) == "none"
    assert disabled_effort(ChatTemplates(refuses, refuses)) == "low"
    assert disabled_effort(ChatTemplates(None, thinks)) == "low"


@pytest.mark.parametrize("block", [
    {"type": [], "text": "x"}, {"type": "text", "text": True}, {"type": "thinking", "thinking": 1},
    {"type": "tool_use", "id": ["t"], "name": "f", "input": {}},
    {"type": "tool_result", "tool_use_id": 5, "content": "x"}])
def test_type_confused_blocks_are_unmodelled_not_a_crash(block):
    # (each was a TypeError or AttributeError: a 500 from the simulator and the gateway; vLLM's
    # validation refuses them with 400)
    for body in ({"system": [block], "messages": [{"role": "user", "content": "hi"}]},
                 {"messages": [{"role": "user", "content": [block]}]}):
        with pytest.raises(Unrenderable):
            convert(body)
