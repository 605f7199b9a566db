"""An Anthropic Messages request as the chat request vLLM turns it into. Pure.

vLLM (0.32: ``entrypoints/anthropic/serving.py``, ``to_chat_completion_request``) serves
``POST /v1/messages`` by converting the body into an OpenAI chat request and rendering that
like any chat. ``chat_body`` reproduces the conversion for the fields that reach the chat
template; the result goes through ``request_text.chat_prompt`` like a chat body. What it does
not reproduce exactly raises ``Unrenderable`` (routed by load, counted), never a guess.

Conversion (vLLM's order):

* ``system`` (a string, or text blocks joined with ``""``, blocks whose text starts with
  ``x-anthropic-billing-header`` skipped) becomes the first message, role ``system``, when
  not empty. When the model's template requires system-first ordering
  (``merges_inline_system``: it fails on ``[system, user, system, user]``, rendered as vLLM
  probes it — a bare sandboxed Jinja environment, no ``raise_exception``, no special tokens),
  the text of every inline ``system`` message is appended to that first message and the
  inline messages are dropped; otherwise each inline system message (billing-header text
  removed) stays where it is when not empty.
* A message with string content keeps it. With blocks: ``text`` (non-empty) and ``image``
  (an ``image_url`` part: media, cut by ``chat_messages``) become content parts, ``thinking``
  joins the message's ``reasoning`` (``""``-joined), ``tool_use`` becomes an OpenAI tool call
  (``arguments`` = ``json.dumps(input or {})``), ``redacted_thinking`` and
  ``tool_reference`` are skipped. A ``tool_result`` in a user message becomes a ``tool``
  message placed *before* that user message (``content``: the string, or the text items
  joined with ``"\\n"``); image items in it add a user message of images after it. One text
  part is the message's content as a string; several parts stay a list (``chat_messages``
  joins them with ``"\\n"``). A user message left with no content, tool calls or reasoning is
  dropped; an assistant one is kept (empty content).
* ``tools``: ``{"type": "function", "function": {name, description, parameters =
  input_schema (``"type": "object"`` appended when it has no ``type``), strict,
  defer_loading}}``; ``tool_choice`` does not reach the template.
* ``output_config.effort`` becomes ``reasoning_effort``; ``thinking.type == "disabled"``
  overrides it with the effort vLLM probes once from the template (``disabled_effort``,
  vLLM's ``--anthropic-disabled-thinking-effort auto``): ``"none"``, unless the template
  fails on it or renders it like one of the efforts ``low`` … ``max`` (a template that ignores
  efforts), then ``"low"``. ``chat_template_kwargs`` and ``cache_salt`` are passed on.

Unrenderable (``unmodelled``): ``tool_addition`` /
``tool_removal`` blocks, a ``tool_use`` without an ``id`` (vLLM makes one from the clock),
a ``tool_result`` whose content has tool references, a ``tool_result`` in an assistant
message, an unknown block type, or any shape vLLM's validation would refuse (the engine
answers that request itself).
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from cortex.prompt.chat_messages import BILLING_HEADER
from cortex.prompt.chat_template import ChatTemplate, ChatTemplates, TemplateError
from cortex.prompt.unrenderable import Unrenderable

_KNOWN_BLOCKS = frozenset({"text", "image", "tool_use", "tool_result", "tool_reference",
                           "thinking", "redacted_thinking"})
_PROBE = [{"role": "system", "content": "t"}, {"role": "user", "content": "t"},
          {"role": "system", "content": "t"}, {"role": "user", "content": "t"}]


def merges_inline_system(templates: ChatTemplates) -> bool:
    """Whether vLLM merges inline system messages into the first one for this model: either
    of the templates it would apply (without tools, with tools) rejects them."""
    return any(_merges(None if t is None else t.source)
               for t in (templates.default, templates.tool_use))


@lru_cache(maxsize=64)
def _merges(source: str | None) -> bool:
    if not source:
        return True
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    try:
        env.from_string(source).render(messages=_PROBE, add_generation_prompt=False)
    except jinja2.TemplateError:
        return True
    return False


_EFFORTS = ("low", "medium", "high", "xhigh", "max")
_HI = [{"role": "user", "content": "Hi"}]


def disabled_effort(templates: ChatTemplates) -> str:
    """The ``reasoning_effort`` vLLM sends the template for ``thinking.type: disabled``."""
    template = templates.default
    if template is None:
        return "low"
    return _disabled_effort(template)


@lru_cache(maxsize=64)
def _disabled_effort(template: ChatTemplate) -> str:
    def render(effort: str) -> str | None:
        try:
            return template.render(_HI, extra={"reasoning_effort": effort,
                                               "enable_thinking": effort != "none"})
        except TemplateError:
            return None

    none = render("none")
    if none is None or any(render(effort) == none for effort in _EFFORTS):
        return "low"
    return "none"


def chat_body(body: dict[str, Any], *, merge_inline_system: bool,
              disabled_thinking_effort: str = "none") -> dict[str, Any]:
    """The chat body vLLM renders for the Messages request ``body`` (``disabled_effort``: what
    ``thinking.type: disabled`` becomes for this model)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise Unrenderable("unmodelled", "messages is not a list")
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in (
                "user", "assistant", "system"):
            raise Unrenderable("unmodelled", "a message vLLM would refuse")
    out: list[dict[str, Any]] = []
    system_parts = _system_parts(body.get("system"))
    if merge_inline_system:
        for message in messages:
            if message["role"] == "system":
                text = _system_text(message.get("content"))
                if text:
                    system_parts.append(text)
    if system_parts:
        out.append({"role": "system", "content": "".join(system_parts)})
    for message in messages:
        role = message["role"]
        content = message.get("content")
        if role == "system":
            if not merge_inline_system:
                text = _system_text(content)
                if text:
                    out.append({"role": "system", "content": text})
            continue
        converted: dict[str, Any] = {"role": role}
        if isinstance(content, str):
            converted["content"] = content
        elif isinstance(content, list):
            _convert_blocks(content, role, converted, out)
        else:
            raise Unrenderable("unmodelled", "message content neither text nor blocks")
        if not (role == "user" and "content" not in converted):
            out.append(converted)
    chat: dict[str, Any] = {"messages": out}
    tools = body.get("tools")
    if tools is not None:
        chat["tools"] = [_tool(tool) for tool in _list(tools, "tools")]
    for name in ("chat_template_kwargs", "cache_salt", "model"):
        if body.get(name) is not None:
            chat[name] = body[name]
    config = body.get("output_config")
    if isinstance(config, dict) and config.get("effort") is not None:
        chat["reasoning_effort"] = config["effort"]
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "disabled":
        chat["reasoning_effort"] = disabled_thinking_effort
    return chat


def _system_parts(system: object) -> list[str]:
    if not system:
        return []
    if isinstance(system, str):
        return [system]
    parts = []
    for block in _list(system, "system"):
        block = _block(block)
        text = block.get("text")
        if block["type"] == "text" and text and not text.startswith(BILLING_HEADER):
            parts.append(text)
    return parts


def _system_text(content: object) -> str | None:
    """An inline system message's text (vLLM ``_extract_system_text``)."""
    if isinstance(content, str):
        return None if content.startswith(BILLING_HEADER) else content
    parts = []
    for block in _list(content, "system content"):
        block = _block(block)
        if block["type"] in ("tool_addition", "tool_removal"):
            raise Unrenderable("unmodelled", "tool_addition/tool_removal blocks")
        text = block.get("text")
        if block["type"] == "text" and text and not text.startswith(BILLING_HEADER):
            parts.append(text)
    return "".join(parts) if parts else None


def _convert_blocks(blocks: list[object], role: str, message: dict[str, Any],
                    out: list[dict[str, Any]]) -> None:
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in blocks:
        block = _block(block)
        kind = block["type"]
        if kind == "text":
            if block.get("text"):
                parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            if block.get("source"):
                parts.append({"type": "image_url", "image_url": {"url": "media"}})
        elif kind == "thinking":
            if block.get("thinking") is not None:
                reasoning.append(block["thinking"])
        elif kind == "tool_use":
            if not block.get("id"):
                raise Unrenderable("unmodelled", "tool_use without an id")
            arguments = block.get("input") or {}
            if not isinstance(arguments, dict):
                raise Unrenderable("unmodelled", "tool_use input not an object")
            calls.append({"id": block["id"], "type": "function", "function": {
                "name": block.get("name") or "", "arguments": json.dumps(arguments)}})
        elif kind == "tool_result":
            if role != "user":
                raise Unrenderable("unmodelled", "tool_result outside a user message")
            _tool_result(block, out)
        elif kind not in ("redacted_thinking", "tool_reference"):
            raise Unrenderable("unmodelled", f"{kind} blocks")
    if reasoning:
        message["reasoning"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    if parts:
        one_text = len(parts) == 1 and parts[0]["type"] == "text"
        message["content"] = parts[0]["text"] if one_text else parts


def _tool_result(block: dict[str, Any], out: list[dict[str, Any]]) -> None:
    content = block.get("content")
    text = ""
    images = False
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts = []
        for item in content:
            if not isinstance(item, dict):
                raise Unrenderable("unmodelled", "tool_result content item not an object")
            kind = item.get("type")
            if kind == "text":
                value = item.get("text", "")
                if not isinstance(value, str):
                    raise Unrenderable("unmodelled", "tool_result text not a string")
                texts.append(value)
            elif kind == "image":
                images = True
            elif kind == "tool_reference":
                raise Unrenderable("unmodelled", "tool_result with tool references")
        text = "\n".join(texts)
    elif content is not None:
        raise Unrenderable("unmodelled", "tool_result content neither text nor a list")
    tool_use_id = block.get("tool_use_id") or ""
    out.append({"role": "tool", "tool_call_id": tool_use_id, "content": text})
    if images:
        out.append({"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "media"}}]})


def _tool(tool: object) -> dict[str, Any]:
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or not isinstance(
            tool.get("input_schema"), dict):
        raise Unrenderable("unmodelled", "a tool vLLM would refuse")
    schema = tool["input_schema"]
    if "type" not in schema:
        schema = {**schema, "type": "object"}
    return {"type": "function", "function": {
        "name": tool["name"], "description": tool.get("description"), "parameters": schema,
        "strict": tool.get("strict"), "defer_loading": tool.get("defer_loading")}}


_STRING_FIELDS = ("text", "thinking", "id", "name", "tool_use_id", "signature")


def _block(block: object) -> dict[str, Any]:
    """A content block whose type Cortex knows, its fields of the types vLLM's model has
    (``AnthropicContentBlock``: the text fields strings or null)."""
    if not isinstance(block, dict):
        raise Unrenderable("unmodelled", "a content block that is not an object")
    kind = block.get("type")
    if kind in ("tool_addition", "tool_removal"):
        raise Unrenderable("unmodelled", "tool_addition/tool_removal blocks")
    if not isinstance(kind, str) or kind not in _KNOWN_BLOCKS:
        raise Unrenderable("unmodelled", f"block type {kind!r}")
    for name in _STRING_FIELDS:
        if not isinstance(block.get(name), (str, type(None))):
            raise Unrenderable("unmodelled", f"a {kind} block whose {name} is not a string")
    return block


def _list(value: object, name: str) -> list[object]:
    if not isinstance(value, list):
        raise Unrenderable("unmodelled", f"{name} is not a list")
    return value
