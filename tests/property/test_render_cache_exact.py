"""The render cache gives one full render's text, always: for the shipped template (the builtin
DeepSeek one) and both real-engine templates (``engines/templates``: Qwen2.5's with tools,
tool calls and merged tool results, and the DeepSeek one), on random conversations that grow,
branch (an earlier turn edited, the tail cut), repeat and change their globals (tools,
``add_generation_prompt``, template kwargs) between requests — one cache per template shared
across all examples, so an entry from one conversation is tried against every other."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cortex.profile.builtin import DEEPSEEK_CHAT_TEMPLATE
from cortex.prompt.chat_messages import engine_messages, engine_tools
from cortex.prompt.chat_template import ChatTemplate, ChatTemplates
from cortex.prompt.request_text import chat_prompt
from cortex.prompt.sglang_chat import sglang_conversation, sglang_messages, sglang_tools
from cortex.prompt.unrenderable import Unrenderable

ROOT = Path(__file__).resolve().parents[2]
TOKENS = {"bos_token": "<B>", "eos_token": "<E>"}
TEMPLATES = {
    "builtin-deepseek": ChatTemplate(DEEPSEEK_CHAT_TEMPLATE, TOKENS),
    "engines-deepseek": ChatTemplate((ROOT / "engines/templates/deepseek.jinja").read_text(),
                                     TOKENS),
    "engines-qwen2.5": ChatTemplate((ROOT / "engines/templates/qwen2.5.jinja").read_text(),
                                    TOKENS),
}
for _template in TEMPLATES.values():  # cache every conversation, however cheap to render whole
    _template.cache.window_s_per_byte = 0.0
TOOLED = {"engines-qwen2.5"}  # renders tools and tool calls; the DeepSeek ones know 3 roles

_text = st.text(alphabet="ab 中\n<|>{}\"'é", max_size=12)
_tool_call = st.fixed_dictionaries({
    "id": st.sampled_from(["c1", "c2"]), "type": st.just("function"),
    "function": st.fixed_dictionaries({"name": st.sampled_from(["read", "grep"]),
                                       "arguments": st.sampled_from(
                                           ['{"path": "a.py"}', "{}", "not json", ""])})})


def _message(tooled: bool) -> st.SearchStrategy[dict]:
    plain = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]),
                                   "content": _text})
    if not tooled:
        return st.one_of(plain, st.fixed_dictionaries({"role": st.just("system"),
                                                       "content": _text}))
    return st.one_of(
        plain,
        st.fixed_dictionaries({"role": st.just("system"), "content": _text}),
        st.fixed_dictionaries({"role": st.just("assistant"),
                               "content": st.one_of(st.none(), _text),
                               "tool_calls": st.lists(_tool_call, min_size=1, max_size=2)}),
        st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": st.just("c1"),
                               "content": _text}),
        st.fixed_dictionaries({"role": st.just("user"), "content": st.lists(
            st.fixed_dictionaries({"type": st.just("text"), "text": _text}), max_size=2)}),
    )


_TOOLS = [None, [{"type": "function", "function": {"name": "read", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}}}}]]


def _steps(tooled: bool) -> st.SearchStrategy[list]:
    # each step: (keep how many messages of the conversation so far, new messages, globals)
    step = st.tuples(st.integers(min_value=0, max_value=40),
                     st.lists(_message(tooled), min_size=1, max_size=6),
                     st.sampled_from(_TOOLS if tooled else [None]), st.booleans(),
                     st.sampled_from([None, {"enable_thinking": True}]))
    return st.lists(step, min_size=1, max_size=8)


def _plain_text(template: ChatTemplate, body: dict) -> str:
    prepared, _ = engine_messages(body["messages"])
    tools = engine_tools(body.get("tools"))
    return template.render(prepared, add_generation_prompt=body["add_generation_prompt"],
                           tools=tools, documents=None,
                           extra=body.get("chat_template_kwargs") or {})


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_the_cached_render_equals_one_full_render(name: str, data: st.DataObject) -> None:
    template = TEMPLATES[name]
    assert template.cache is not None, template.not_local
    templates = ChatTemplates(template, template)
    conversation: list[dict] = []
    for keep, new, tools, gen, kwargs in data.draw(_steps(name in TOOLED)):
        conversation = conversation[:keep] + new
        body = {"messages": conversation, "add_generation_prompt": gen}
        if tools is not None:
            body["tools"] = tools
        if kwargs is not None:
            body["chat_template_kwargs"] = kwargs
        prompt = chat_prompt(body, templates)
        assert prompt is not None
        assert prompt.text == _plain_text(template, body)
    assert template.cache.off is None


def test_a_grown_conversation_is_rendered_by_window() -> None:
    template = ChatTemplate((ROOT / "engines/templates/qwen2.5.jinja").read_text(), TOKENS)
    template.cache.window_s_per_byte = 0.0
    templates = ChatTemplates(template, template)
    conversation = [{"role": "system", "content": "be brief"}]
    for turn in range(12):
        conversation += [{"role": "user", "content": f"ask {turn}"},
                         {"role": "assistant", "content": None, "tool_calls": [
                             {"id": "c1", "type": "function", "function": {
                                 "name": "read", "arguments": '{"path": "a"}'}}]},
                         {"role": "tool", "tool_call_id": "c1", "content": f"out {turn}"},
                         {"role": "tool", "tool_call_id": "c1", "content": "more"}]
        body = {"messages": list(conversation), "tools": _TOOLS[1]}
        prompt = chat_prompt(body, templates)
        assert prompt is not None and prompt.text == _plain_text(
            template, {**body, "add_generation_prompt": True})
    assert template.cache.renders["window"] >= 10, template.cache.renders
    assert chat_prompt(body, templates).text == prompt.text  # the same conversation again
    assert template.cache.renders["same"] == 1


def test_a_conversation_cheaper_to_render_whole_is_not_windowed() -> None:
    template = ChatTemplate(DEEPSEEK_CHAT_TEMPLATE, TOKENS)
    template.cache.window_s_per_byte = 1.0  # a window would always cost more
    templates = ChatTemplates(template, template)
    conversation = [{"role": "user", "content": "hi " * 500}] + [
        {"role": "assistant", "content": "a"}, {"role": "user", "content": "u"}] * 4
    for turn in range(6):
        conversation += [{"role": "assistant", "content": f"a{turn}"},
                         {"role": "user", "content": f"u{turn}"}]
        body = {"messages": list(conversation), "add_generation_prompt": True}
        assert chat_prompt(body, templates).text == _plain_text(template, body)
    # (a conversation rendered short is not kept: a full render every LOOK_BACK messages)
    assert template.cache.renders["window"] == 0 and template.cache.renders["short"] >= 4
    assert template.cache.whole_s_per_message is not None


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_sglangs_cached_render_equals_one_full_render(data: st.DataObject) -> None:
    """The same for SGLang's rendering (``sglang_chat``), sharing the cache of the template with
    vLLM's renders of the same conversations: never one for the other."""
    template = TEMPLATES["engines-qwen2.5"]
    templates = ChatTemplates(template, template)
    conversation: list[dict] = []
    for keep, new, tools, _, kwargs in data.draw(_steps(True)):
        conversation = conversation[:keep] + new
        body = {"messages": conversation}
        if tools is not None:
            body["tools"] = tools
        if kwargs is not None:
            body["chat_template_kwargs"] = kwargs
        try:
            prepared, _ = sglang_messages(conversation)
        except Unrenderable:
            with pytest.raises(Unrenderable):
                sglang_conversation(body, templates)
            continue
        plain = template.render(prepared, add_generation_prompt=True,
                                tools=sglang_tools(body.get("tools"), None), documents=None,
                                extra=kwargs or {})
        vllm = chat_prompt({**body, "add_generation_prompt": True}, templates)
        assert chat_prompt(body, templates, "sglang").text == plain
        assert vllm is not None and chat_prompt(body, templates).text == vllm.text
