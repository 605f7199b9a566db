"""An OpenAI Responses request as the chat conversation vLLM renders for it. Pure.

vLLM (0.32, not Harmony: ``renderers/online_renderer.py`` ``render_responses`` with
``entrypoints/openai/responses/utils.py`` ``construct_input_messages`` and
``construct_tool_dicts``) turns ``instructions`` + ``input`` into chat messages and renders
them with the chat template like a chat request. ``chat_body`` reproduces that for the items
it models; the result goes through ``request_text.chat_prompt`` like a chat body. Anything
else raises ``Unrenderable`` (routed by load, counted): never a guess.

Conversion:

* ``instructions`` (when not empty) is the first message, role ``system``.
* ``input`` a string: one user message. A list of items, in order:

  - a message with role ``user``/``system``/``developer`` (``type`` ``"message"`` or none):
    passed as it is (``chat_messages`` keeps role, content and the known fields);
  - an assistant message: its first content part's ``text`` (or its string content); it
    fills the previous assistant message's content when that has none, else starts one;
  - ``function_call``: a tool call ``{id: call_id, type: "function", function: {name,
    arguments}}`` appended to the previous assistant message's calls, else a new assistant
    message with it;
  - ``function_call_output``: a ``tool`` message (``content`` = ``output``, ``tool_call_id``
    = ``call_id``);
  - ``reasoning``: its first ``content`` text, else first ``summary`` text, else ``""``; the
    previous assistant message's ``reasoning`` when that has none, else a new assistant
    message.

* The last item a message (or reasoning) with ``status`` ``in_progress``/``incomplete``:
  the rendering continues that message (``continue_final_message``, no generation prompt).
* ``tools``: ``function`` tools as chat tools (``{"type": "function", "function": {name,
  description, parameters, strict}}``); tool types vLLM never shows the model (web search,
  file search, MCP, ...) are left out; an empty list is no tools at all.
* ``reasoning.effort`` becomes ``reasoning_effort``; ``chat_template_kwargs`` and
  ``cache_salt`` are passed on.

Unrenderable: ``previous_response_id`` / ``previous_input_messages`` / ``prompt``
(``engine_state``: the conversation lives in the engine or the provider); ``namespace`` and
``custom`` tools, namespaced calls, custom tool calls, item references, encrypted reasoning,
any other item type, a continued reasoning item, and shapes vLLM's validation would refuse
(``unmodelled``).
"""

from __future__ import annotations

from typing import Any

from cortex.prompt.unrenderable import Unrenderable

_STATEFUL = ("previous_response_id", "previous_input_messages", "prompt")
_PLAIN_ROLES = frozenset({"user", "system", "developer"})
_UNRENDERED_TOOLS = frozenset({"file_search", "web_search", "web_search_preview",
                               "web_search_2025_08_26", "web_search_preview_2025_03_11",
                               "computer_use_preview", "computer", "mcp", "code_interpreter",
                               "image_generation", "local_shell", "shell", "apply_patch",
                               "tool_search"})


def chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """The chat body vLLM renders for the Responses request ``body``."""
    for name in _STATEFUL:
        if body.get(name) is not None:
            raise Unrenderable("engine_state", name)
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions:
        if not isinstance(instructions, str):
            raise Unrenderable("unmodelled", "instructions not a string")
        messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    continue_final = False
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    elif isinstance(items, list):
        for item in items:
            _add_item(item, messages)
        continue_final = _continues(items)
    else:
        raise Unrenderable("unmodelled", "input neither a string nor a list")
    chat: dict[str, Any] = {"messages": messages, "add_generation_prompt": not continue_final,
                            "continue_final_message": continue_final}
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    for name in ("chat_template_kwargs", "cache_salt", "model"):
        if body.get(name) is not None:
            chat[name] = body[name]
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    return chat


def _add_item(item: object, messages: list[dict[str, Any]]) -> None:
    if not isinstance(item, dict):
        raise Unrenderable("unmodelled", "an input item that is not an object")
    kind = item.get("type", "message" if "role" in item else None)
    previous = messages[-1] if messages and messages[-1].get("role") == "assistant" else None
    if kind == "function_call":
        call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
        if not (isinstance(call_id, str) and isinstance(name, str)
                and isinstance(arguments, str)):
            raise Unrenderable("unmodelled", "a function_call vLLM would refuse")
        if item.get("namespace"):
            raise Unrenderable("unmodelled", "a namespaced function_call")
        call = {"id": call_id, "function": {"name": name, "arguments": arguments},
                "type": "function"}
        if previous is not None:
            previous.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        if not isinstance(output, str) or not isinstance(item.get("call_id"), str):
            raise Unrenderable("unmodelled", "a function_call_output not of text")
        messages.append({"role": "tool", "content": output, "tool_call_id": item["call_id"]})
    elif kind == "reasoning":
        if item.get("encrypted_content"):
            raise Unrenderable("unmodelled", "encrypted reasoning")
        text = _reasoning_text(item)
        if previous is not None and previous.get("reasoning") is None:
            previous["reasoning"] = text
        else:
            messages.append({"role": "assistant", "reasoning": text})
    elif kind == "message" and item.get("role") == "assistant":
        text = _assistant_text(item)
        if previous is not None and previous.get("content") is None:
            previous["content"] = text
        else:
            messages.append({"role": "assistant", "content": text})
    elif kind == "message" and isinstance(item.get("role"), str) and (
            item["role"] in _PLAIN_ROLES):
        messages.append(item)
    else:
        raise Unrenderable("unmodelled", f"input item type {kind!r}")


def _assistant_text(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and isinstance(content[0], dict):
        first = content[0]
        if first.get("type", "output_text") in ("output_text", "input_text") and isinstance(
                first.get("text"), str):
            return first["text"]
    raise Unrenderable("unmodelled", "an assistant message without a leading text part")


def _reasoning_text(item: dict[str, Any]) -> str:
    summary = item.get("summary")
    if not isinstance(summary, list) or not isinstance(item.get("id"), str):
        raise Unrenderable("unmodelled", "a reasoning item vLLM would refuse")
    for parts in (item.get("content"), summary):
        if parts:
            if not isinstance(parts, list) or not isinstance(parts[0], dict) or not isinstance(
                    parts[0].get("text"), str):
                raise Unrenderable("unmodelled", "a reasoning item vLLM would refuse")
            return parts[0]["text"]
    return ""


def _continues(items: list[object]) -> bool:
    """vLLM ``should_continue_final_message``: the last item is a partial message."""
    if not items:
        return False
    last = items[-1]
    assert isinstance(last, dict)  # (every item was checked)
    kind = last.get("type", "message")
    if kind not in ("message", "reasoning") or last.get("status") not in (
            "in_progress", "incomplete"):
        return False
    if kind == "reasoning":
        raise Unrenderable("unmodelled", "a continued reasoning item")
    return True


def _tools(tools: object) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise Unrenderable("unmodelled", "tools is not a list")
    out = []
    for tool in tools:
        if not isinstance(tool, dict):
            raise Unrenderable("unmodelled", "a tool that is not an object")
        kind = tool.get("type")
        if isinstance(kind, str) and kind in _UNRENDERED_TOOLS:
            continue  # never shown to the model
        if kind != "function" or not isinstance(tool.get("name"), str):
            raise Unrenderable("unmodelled", f"tool type {kind!r}")
        function = {"name": tool["name"], "description": tool.get("description"),
                    "parameters": tool.get("parameters")}
        for name in ("strict", "defer_loading"):
            if tool.get(name) is not None:
                function[name] = tool[name]
        out.append({"type": "function", "function": function})
    return out
