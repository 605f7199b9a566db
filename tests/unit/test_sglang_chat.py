"""SGLang's chat rendering as Cortex reproduces it (``cortex.prompt.sglang_chat``): the facts
the real-SGLang test (tests/real_engine/test_sglang.py) established, checked without the engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from cortex.prompt.chat_template import ChatTemplate, ChatTemplates
from cortex.prompt.request_text import chat_prompt
from cortex.prompt.sglang_chat import sglang_conversation
from cortex.prompt.unrenderable import Unrenderable

ROOT = Path(__file__).resolve().parents[2]
QWEN = ChatTemplate((ROOT / "engines/templates/qwen2.5.jinja").read_text(),
                    {"eos_token": "<|im_end|>"})
TEMPLATES = ChatTemplates(QWEN, QWEN)
TOOL = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}


def render(body: dict) -> str:
    text = sglang_conversation(body, TEMPLATES)
    assert text is not None
    return text


def test_text_parts_are_joined_with_a_space_and_the_generation_prompt_is_always_there():
    text = render({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "part one"}, {"type": "input_text", "text": "part two"}]}],
        "add_generation_prompt": False})
    assert "part one part two<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    vllm = chat_prompt({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]}]}, TEMPLATES)
    assert vllm is not None and "part one\npart two" in vllm.text


def test_tools_are_dumped_as_sglangs_model_and_dropped_by_tool_choice_none():
    text = render({"messages": [{"role": "user", "content": "hi"}], "tools": [TOOL]})
    assert ('{"type": "function", "function": {"description": null, "name": "search", '
            '"parameters": {"type": "object"}, "strict": false}, "defer_loading": null}') in text
    assert "<tools>" not in render({"messages": [{"role": "user", "content": "hi"}],
                                    "tools": [TOOL], "tool_choice": "none"})
    named = {"type": "function", "function": {"name": "other"}}
    only = render({"messages": [{"role": "user", "content": "hi"}], "tools": [TOOL, named],
                   "tool_choice": {"type": "function", "function": {"name": "other"}}})
    assert '"name": "other"' in only and '"name": "search"' not in only


def test_a_developer_turn_reaches_the_template_as_it_is():
    body = {"messages": [{"role": "system", "content": "S"},
                         {"role": "developer", "content": "D"},
                         {"role": "user", "content": "U"}]}
    assert "D" not in render(body)  # Qwen2.5's template renders no developer role
    vllm = chat_prompt(body, TEMPLATES)
    assert vllm is not None and "S\n\nD" in vllm.text  # vLLM merges it into the system turn


@pytest.mark.parametrize("body", [
    {"messages": [{"role": "user", "content": [{"type": "image_url",
                                                "image_url": {"url": "http://x/i.png"}}]}]},
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "h"}],
     "continue_final_message": True},
    {"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "not json"}}]}]},
    {"messages": [{"role": "critic", "content": "x"}]},
    {"messages": [{"role": "user", "content": "x"}], "tools": [TOOL],
     "tool_choice": {"type": "function", "function": "search"}},
    {"messages": [{"role": "user", "content": "x"}], "tools": [TOOL], "tool_choice": ["auto"]},
])
def test_what_cortex_does_not_reproduce_routes_by_load(body):
    with pytest.raises(Unrenderable):
        sglang_conversation(body, TEMPLATES)
