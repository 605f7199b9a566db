"""Messages and tools as vLLM's renderer hands them to a chat template (the real-engine tests
check the rendered prompts against vLLM's /tokenize; these pin each rule)."""

from __future__ import annotations

import pytest

from cortex.errors import BadRequest
from cortex.prompt.chat_messages import (
    MEDIA_SENTINEL,
    developer_as_system,
    engine_messages,
    engine_tools,
)


def test_messages_keep_only_what_the_engine_copies():
    messages = [
        {"role": "system", "content": "x-anthropic-billing-header: cch=1\nBe brief.", "x": 1},
        {"role": "user", "content": None, "name": "ann", "extra": True},
        {"role": "assistant", "content": None, "reasoning": "hmm", "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "f", "arguments": '{"a": 1, "b": "é"}'}},
            {"id": "c2", "function": {"name": "g", "arguments": "not json"}},
            {"id": "c3", "function": {"name": "h", "arguments": "[1]"}},
            {"id": "c4", "function": {"name": "k", "arguments": {"z": 2}}},
            {"id": "c5", "function": {"name": "m"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "21"},
                                                           {"type": "text", "text": "C"}]},
        {"role": "assistant", "content": "ok", "tool_calls": []},
    ]
    out, cut = engine_messages(messages)
    assert not cut
    assert out[0] == {"role": "system", "content": "Be brief."}
    assert out[1] == {"role": "user", "content": "", "name": "ann"}
    assert out[2]["content"] == "" and out[2]["reasoning"] == out[2]["reasoning_content"] == "hmm"
    assert [c["function"]["arguments"] for c in out[2]["tool_calls"]] == [
        {"a": 1, "b": "é"}, {}, {}, {"z": 2}, {}]
    assert out[3] == {"role": "tool", "content": "21\nC", "tool_call_id": "c1"}
    assert out[4] == {"role": "assistant", "content": "ok"}  # empty tool_calls dropped
    assert messages[2]["tool_calls"][0]["function"]["arguments"].startswith("{")  # not mutated


def test_text_part_kinds_and_media_cut():
    parts = ["bare", {"type": "input_text", "text": "in"}, {"type": "refusal", "refusal": "no"},
             {"type": "text", "text": None}, {"type": "thinking", "thinking": "t"}]
    out, cut = engine_messages([{"role": "user", "content": parts}])
    assert out[0]["content"] == "bare\nin\nno\nt" and not cut
    media = [{"role": "user", "content": [{"type": "text", "text": "look"},
                                          {"type": "image_url", "image_url": {"url": "u"}},
                                          {"type": "text", "text": "after"}]},
             {"role": "user", "content": "dropped"}]
    out, cut = engine_messages(media)
    assert cut and out == [{"role": "user", "content": "look" + MEDIA_SENTINEL}]


def test_tools_are_dumped_as_vllm_dumps_them():
    tools = [
        {"type": "function", "function": {"name": "f", "unknown": 1,
                                          "parameters": {"type": "object"}}, "extra": 2},
        {"function": {"name": "g", "description": "d", "strict": True}, "defer_loading": True},
    ]
    assert engine_tools(tools) == [
        {"type": "function", "function": {"name": "f", "description": None,
                                          "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "g", "description": "d", "parameters": None,
                                          "strict": True, "defer_loading": True},
         "defer_loading": True},
    ]
    assert engine_tools(None) is None and engine_tools([]) == []
    assert list(engine_tools(tools)[0]["function"]) == ["name", "description", "parameters"]


@pytest.mark.parametrize("bad", [
    "tools", [1], [{"function": {"description": "no name"}}], [{"type": "x", "function": {}}]])
def test_bad_tools_are_bad_requests(bad):
    with pytest.raises(BadRequest):
        engine_tools(bad)


def test_developer_turns_become_system_turns_merged_first_unless_the_template_knows_them():
    messages, _ = engine_messages([
        {"role": "system", "content": "S"}, {"role": "user", "content": "u"},
        {"role": "developer", "content": "D", "tools": [{"x": 1}]},
        {"role": "system", "content": ""}, {"role": "user", "content": "v"}])
    assert messages[2] == {"role": "developer", "content": "D", "tools": [{"x": 1}]}
    assert developer_as_system(messages, "{{ messages }}") == [
        {"role": "system", "content": "S\n\nD"}, {"role": "user", "content": "u"},
        {"role": "user", "content": "v"}]
    knows = "{% if m.role == 'developer' %}{% endif %}"
    assert developer_as_system(messages, knows) is messages
    alone = engine_messages([{"role": "developer", "content": "D"},
                             {"role": "user", "content": "u"}])[0]
    assert alone[0]["tools"] is None
    assert developer_as_system(alone, "") == [{"role": "system", "content": "D"},
                                              {"role": "user", "content": "u"}]
    plain = [{"role": "system", "content": "S"}, {"role": "system", "content": "T"}]
    assert developer_as_system(plain, "") is plain  # no developer turn: nothing merged


@pytest.mark.parametrize("part", [{"type": [], "text": "x"}, {"type": {}, "text": "x"},
                                  {"type": "text", "text": ["x"]}, 5])
def test_type_confused_content_parts_are_bad_requests(part):
    # ({"type": []} was a TypeError, unhashable: a 500 from the simulator and the gateway)
    with pytest.raises(BadRequest):
        engine_messages([{"role": "user", "content": [part]}])


def test_tool_call_arguments_nested_too_deeply_become_an_empty_object():
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[" * 5000}}
    out, _ = engine_messages([{"role": "assistant", "content": "", "tool_calls": [call]}])
    assert out[0]["tool_calls"][0]["function"]["arguments"] == {}
