"""A chat request as SGLang renders it (0.5.15, ``serving_chat._apply_jinja_template``): the
conversation and tools its template gets, which differ from vLLM's (``chat_messages``).

The real-SGLang tests compare Cortex's tokens with SGLang's own ``prompt_token_ids``. Rules:

* Messages are rebuilt from SGLang's request models (``protocol.py``) and lose every field that
  is null: a ``user`` message is ``{"role", "content"}``; any other role (``system``,
  ``assistant``, ``tool``, ``function``, ``developer``, ``latest_reminder``, case-insensitive)
  keeps ``content`` then ``tool_call_id``, ``name``, ``reasoning_content``, ``tool_calls``.
  A ``developer`` turn reaches the template as it is (vLLM makes it a system turn): a template
  that does not know the role renders what it renders, or raises.
* ``content`` ("string" content format): a string as is, ``null`` → ``""``, a list of text
  parts (``text``, ``input_text``) → their texts joined with ``" "`` (vLLM: ``"\\n"``).
* Assistant ``tool_calls`` are dumped whole (``id``, ``index``, ``type``, ``function``: name,
  arguments; nulls kept) with ``arguments`` parsed from JSON (anything but an object is
  SGLang's 400).
* ``tools`` reach the template unless ``tool_choice`` is ``"none"`` (the default without
  tools); a named ``tool_choice`` keeps only that tool. Each is ``Tool.model_dump()``:
  ``{"type", "function": {"description", "name", "parameters", "strict"[, "defer_loading"]},
  "defer_loading"}`` (the tool's ``defer_loading`` copied into the function when it has none).
* Always ``add_generation_prompt``; the template kwargs are ``reasoning_effort`` (when set,
  as is: no ``enable_thinking``) updated with ``chat_template_kwargs``; no ``documents``.

Routed by load (``Unrenderable``), since Cortex does not reproduce them: media and other
non-text parts, ``continue_final_message``, a tools list inside a message, shapes SGLang's
models refuse. Pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import partial
from typing import Any

from cortex.errors import BadRequest
from cortex.prompt.chat_template import ChatTemplates
from cortex.prompt.unrenderable import Unrenderable

_GENERIC_ROLES = ("system", "assistant", "tool", "function", "developer", "latest_reminder")
_TEXT_PARTS = ("text", "input_text")
_OPTIONAL_STRINGS = ("tool_call_id", "name", "reasoning_content")


def sglang_conversation(body: Mapping[str, Any], templates: ChatTemplates) -> str | None:
    """The chat's text as SGLang renders it; ``None`` when the model has no template for it. A
    template with a render cache renders only the messages it has not rendered before."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    if body.get("continue_final_message"):
        raise Unrenderable("unmodelled", "continue_final_message on SGLang")
    tools = sglang_tools(body.get("tools"), body.get("tool_choice"))
    template = templates.pick(tools)
    if template is None:
        return None
    kwargs: dict[str, Any] = {}
    if body.get("reasoning_effort") is not None:
        kwargs["reasoning_effort"] = body["reasoning_effort"]
    extra = body.get("chat_template_kwargs")
    if extra:
        if not isinstance(extra, dict):
            raise BadRequest("chat_template_kwargs must be an object")
        kwargs.update(extra)
    variables = {"add_generation_prompt": True, "tools": tools, "documents": None,
                 "extra": kwargs}
    if template.cache is not None:  # only the messages not rendered before (``render_cache``)
        # (the scope names the engine: vLLM's renders of the same messages differ)
        done = template.cache.render(messages, ["sglang", tools, kwargs], sglang_messages,
                                     partial(template.render_traced, **variables),
                                     partial(template.render, **variables))
        if done is not None:
            return done[0]
    else:
        template.renders += 1
    prepared, _ = sglang_messages(messages)
    return template.render(prepared, **variables)


def sglang_messages(messages: list[object]) -> tuple[list[dict[str, Any]], bool]:
    """The messages SGLang's template gets (rules at the top), and False: no media cut (a
    media part is ``Unrenderable``). Message by message: the render cache may convert any
    window of a conversation."""
    return [_message(message) for message in messages], False


def _message(message: object) -> dict[str, Any]:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise BadRequest("each message must be an object with a string role")
    role = message["role"]
    content = _content(message.get("content"))
    if role == "user":
        return {"role": "user", "content": content}
    role = role.lower()
    if role not in _GENERIC_ROLES:
        raise Unrenderable("unmodelled", f"message role {message['role']!r} (SGLang's 400)")
    result: dict[str, Any] = {"role": role, "content": content}
    for name in _OPTIONAL_STRINGS:
        value = message.get(name)
        if value is not None:
            if not isinstance(value, str):
                raise Unrenderable("unmodelled", f"non-string {name} (SGLang's 400)")
            result[name] = value
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise Unrenderable("unmodelled", "tool_calls not a list (SGLang's 400)")
        result["tool_calls"] = [_tool_call(call, role) for call in calls]
    if message.get("tools") is not None:
        raise Unrenderable("unmodelled", "tools inside a message on SGLang")
    return result


def _content(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise Unrenderable("unmodelled", "content neither text nor parts (SGLang's 400)")
    texts = []
    for part in content:
        if (not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS
                or not isinstance(part.get("text"), str)):
            raise Unrenderable("unmodelled", "a non-text content part on SGLang")
        texts.append(part["text"])
    return " ".join(texts)


def _tool_call(call: object, role: str) -> dict[str, Any]:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise Unrenderable("unmodelled", "a tool call without a function (SGLang's 400)")
    function = call["function"]
    arguments = function.get("arguments")
    if role == "assistant" and isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            raise Unrenderable("unmodelled", "tool call arguments not JSON (SGLang's 400)")
        if not isinstance(arguments, dict):
            raise Unrenderable("unmodelled", "tool call arguments not an object (SGLang's 400)")
    if call.get("type", "function") != "function":
        raise Unrenderable("unmodelled", "a tool call not of type function (SGLang's 400)")
    return {"id": call.get("id"), "index": call.get("index"), "type": "function",
            "function": {"name": function.get("name"), "arguments": arguments}}


def sglang_tools(tools: object, choice: object) -> list[dict[str, Any]] | None:
    """The tools SGLang's template gets for ``tools`` and ``tool_choice`` (rules at the top)."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list")
    if choice is None:
        choice = "auto"
    if choice == "none":
        return None
    dumped = [_tool(tool) for tool in tools]
    if isinstance(choice, dict):
        function = choice.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise Unrenderable("unmodelled", "a tool_choice without a function name")
        return [tool for tool in dumped if tool["function"]["name"] == function["name"]]
    if choice not in ("auto", "required"):
        raise Unrenderable("unmodelled", f"tool_choice {choice!r} (SGLang's 400)")
    return dumped


def _tool(tool: object) -> dict[str, Any]:
    if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict):
        raise Unrenderable("unmodelled", "a tool without a function (SGLang's 400)")
    function = tool["function"]
    if not isinstance(function.get("name"), str):
        raise Unrenderable("unmodelled", "a tool function without a name (SGLang's 400)")
    defer = tool.get("defer_loading")
    function_defer = function.get("defer_loading")
    if function_defer is None:
        function_defer = defer
    out_function: dict[str, Any] = {
        "description": function.get("description"), "name": function["name"],
        "parameters": function.get("parameters"), "strict": bool(function.get("strict", False))}
    if function_defer is not None:
        out_function["defer_loading"] = function_defer
    return {"type": tool.get("type", "function"), "function": out_function,
            "defer_loading": defer}
