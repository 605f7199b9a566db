"""OpenAI Responses bodies → the chat body vLLM renders for them (``responses_input``).

Each expectation is what vLLM 0.32's ``construct_input_messages`` / ``construct_tool_dicts``
make of the body (the real-vLLM tests compare whole renderings with the engine's own
conversion); here every rule of the module, and every case it must refuse, in isolation.
"""

from __future__ import annotations

import pytest

from cortex.prompt.request_text import responses_prompt
from cortex.prompt.responses_input import chat_body
from cortex.prompt.unrenderable import Unrenderable
from tests import deepseek_profile as ds

U, A = "<｜User｜>", "<｜Assistant｜>"
CALL = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": 1}'}


def test_a_string_input_with_instructions():
    chat = chat_body({"instructions": "S", "input": "hi"})
    assert chat["messages"] == [{"role": "system", "content": "S"},
                                {"role": "user", "content": "hi"}]
    assert (chat["add_generation_prompt"], chat["continue_final_message"]) == (True, False)
    assert chat_body({"instructions": "", "input": "hi"})["messages"] == [
        {"role": "user", "content": "hi"}]


def test_items_merge_into_assistant_turns_as_vllm_merges_them():
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]}
    items = [user,
             {"type": "reasoning", "id": "rs", "summary": [{"type": "summary_text",
                                                            "text": "sum"}]},
             {"type": "message", "role": "assistant", "id": "m", "status": "completed",
              "content": [{"type": "output_text", "text": "a", "annotations": []},
                          {"type": "output_text", "text": "dropped", "annotations": []}]},
             CALL, {**CALL, "call_id": "c2"},
             {"type": "function_call_output", "call_id": "c1", "output": "r1"},
             {"role": "assistant", "content": "plain"},
             {"type": "reasoning", "id": "rs2", "summary": [],
              "content": [{"type": "reasoning_text", "text": "late"}]},
             CALL]
    messages = chat_body({"input": items})["messages"]
    call = {"id": "c1", "function": {"name": "f", "arguments": '{"a": 1}'}, "type": "function"}
    assert messages == [
        user,
        {"role": "assistant", "reasoning": "sum", "content": "a",
         "tool_calls": [call, {**call, "id": "c2"}]},
        {"role": "tool", "content": "r1", "tool_call_id": "c1"},
        {"role": "assistant", "content": "plain", "reasoning": "late", "tool_calls": [call]}]
    assert items[0] is user and "tool_calls" not in items[2]  # the client's body untouched


def test_a_call_with_no_assistant_before_starts_one():
    assert chat_body({"input": [{"role": "user", "content": "q"}, CALL]})["messages"][1] == {
        "role": "assistant", "tool_calls": [
            {"id": "c1", "function": {"name": "f", "arguments": '{"a": 1}'},
             "type": "function"}]}


def test_a_partial_last_message_is_continued():
    items = [{"role": "user", "content": "q"},
             {"type": "message", "role": "assistant", "id": "m", "status": "in_progress",
              "content": [{"type": "output_text", "text": "One,", "annotations": []}]}]
    chat = chat_body({"input": items})
    assert (chat["add_generation_prompt"], chat["continue_final_message"]) == (False, True)
    prompt = responses_prompt({"input": items}, ds.chat_templates())
    assert prompt is not None and prompt.text == f"{ds.BOS}{U}q{A}One,"


def test_function_tools_only_and_none_when_empty():
    tools = [{"type": "web_search"},
             {"type": "function", "name": "f", "parameters": {"type": "object"},
              "strict": True, "description": "d"},
             {"type": "function", "name": "g", "parameters": None, "strict": None}]
    assert chat_body({"input": "x", "tools": tools})["tools"] == [
        {"type": "function", "function": {"name": "f", "description": "d",
                                          "parameters": {"type": "object"}, "strict": True}},
        {"type": "function", "function": {"name": "g", "description": None,
                                          "parameters": None}}]
    assert "tools" not in chat_body({"input": "x", "tools": []})
    assert "tools" not in chat_body({"input": "x", "tools": [{"type": "file_search"}]})


def test_effort_kwargs_and_salt():
    chat = chat_body({"input": "x", "reasoning": {"effort": "low", "summary": "auto"},
                      "chat_template_kwargs": {"k": 1}, "cache_salt": "s"})
    assert (chat["reasoning_effort"], chat["chat_template_kwargs"], chat["cache_salt"]) == (
        "low", {"k": 1}, "s")
    assert "reasoning_effort" not in chat_body({"input": "x", "reasoning": {"effort": None}})


@pytest.mark.parametrize("field", ["previous_response_id", "previous_input_messages", "prompt"])
def test_state_kept_elsewhere_is_unrenderable(field):
    with pytest.raises(Unrenderable) as caught:
        chat_body({"input": "x", field: "resp_1" if field != "prompt" else {"id": "p"}})
    assert caught.value.reason == "engine_state"


@pytest.mark.parametrize("body", [
    {"input": [{**CALL, "namespace": "ns"}]},
    {"input": [{"type": "custom_tool_call", "call_id": "c", "name": "f", "input": "x"}]},
    {"input": [{"type": "item_reference", "id": "msg_1"}]},
    {"input": [{"type": "reasoning", "id": "r", "summary": [], "encrypted_content": "e"}]},
    {"input": [{"type": "reasoning", "id": "r", "summary": [], "status": "incomplete"}]},
    {"input": [{"type": "function_call_output", "call_id": "c",
                "output": [{"type": "input_text", "text": "x"}]}]},
    {"input": [{"type": "message", "role": "assistant", "content": []}]},
    {"input": [{"type": "function_call", "call_id": "c", "name": "f"}]},
    {"input": "x", "tools": [{"type": "custom", "name": "f"}]},
    {"input": "x", "tools": [{"type": "namespace", "name": "ns", "tools": []}]},
    {"input": 3},
])
def test_what_vllm_renders_its_own_way_is_unrenderable(body):
    with pytest.raises(Unrenderable) as caught:
        chat_body(body)
    assert caught.value.reason == "unmodelled"


def test_a_responses_request_renders_as_its_chat():
    prompt = responses_prompt({"model": "m", "instructions": "S", "input": [
        {"role": "user", "content": "hi"},
        {"type": "message", "role": "assistant", "id": "m", "status": "completed",
         "content": [{"type": "output_text", "text": "yo", "annotations": []}]},
        {"role": "user", "content": [{"type": "input_text", "text": "more"}]}]},
        ds.chat_templates())
    assert prompt is not None
    assert prompt.text == f"{ds.BOS}S{U}hi{A}yo{ds.EOS}{U}more{A}"


@pytest.mark.parametrize("body", [
    {"input": [{"role": {}, "content": "x"}]}, {"input": [{"role": [], "content": "x"}]},
    {"input": "x", "tools": [{"type": []}]}, {"input": "x", "tools": [{"type": {"a": 1}}]}])
def test_type_confused_roles_and_tool_types_are_unmodelled_not_a_crash(body):
    with pytest.raises(Unrenderable):  # (an unhashable TypeError before: a 500)
        chat_body(body)
