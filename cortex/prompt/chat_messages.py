"""The conversation and tools a chat template gets: what the engine's renderer makes of a body.

A template never sees the client's JSON as sent. vLLM (0.32: ``renderers/chat_utils.py``
``parse_chat_messages`` + ``_postprocess_messages``, ``online_renderer`` for tools) rebuilds
each message, and Cortex must hand its template the same objects or the prompt differs from
the first changed byte on (the real-vLLM tests compare both with ``/tokenize``):

* A message becomes ``{"role", "content"}`` and only these copied fields: ``tool_calls``
  (assistant, when not null), ``reasoning`` and ``reasoning_content`` (assistant ``reasoning``),
  ``tool_call_id`` (tool), ``name`` (a string), ``task`` (a string). Anything else the client
  put in a message is not seen by the template.
* ``content`` (the "string" content format): a string as is; ``null`` becomes ``""``; a list of
  parts becomes its texts joined with ``"\\n"`` (parts ``text``/``input_text``/``output_text``
  by ``text``, ``refusal`` by ``refusal``, ``thinking`` by ``thinking``, bare strings; a text
  part whose text is null is skipped). A system message's text starting with
  ``x-anthropic-billing-header`` loses that first line (vLLM drops Claude Code's per-request
  attribution line so the prefix stays cacheable).
* A ``developer`` message also gets ``tools`` (its own, else ``None``). When the conversation
  has one and the template's source names no ``"developer"`` / ``'developer'`` role
  (``developer_as_system``, as vLLM's ``safe_apply_chat_template``), developer messages become
  ``system`` ones (without ``tools``) and, if a system message is then not first or not alone,
  every system message is merged into one first message: their non-empty texts joined with
  ``"\n\n"``.
* Media: the first non-text part ends what Cortex can reproduce (engines put their own
  placeholder tokens there, a hard tokenizer boundary): that message keeps its texts before
  the part (joined, then ``MEDIA_SENTINEL``) and later messages are dropped; ``media_cut``.
* Assistant ``tool_calls``: an empty list is dropped; each call's ``function.arguments`` (a
  JSON string in the OpenAI API) is parsed into an object — a string that is not JSON or not
  an object becomes ``{}``, as does a missing or empty one (templates expect a mapping).
* ``tools``: each as vLLM's ``ChatCompletionToolsParam.model_dump()``:
  ``{"type": "function", "function": {"name", "description", "parameters"[, "strict"]
  [, "defer_loading"]}[, "defer_loading"]}`` in that order, ``description`` and ``parameters``
  ``null`` when absent, fields vLLM does not know dropped. ``tools`` ``null`` stays ``null``.

Bad shapes raise ``BadRequest``. Pure: data in, data out (the client's body is not mutated).
"""

from __future__ import annotations

import json
from typing import Any

from cortex.errors import BadRequest

MEDIA_SENTINEL = "\x00cortex-media-cut\x00"
BILLING_HEADER = "x-anthropic-billing-header"
_PART_TEXT = {"text": "text", "input_text": "text", "output_text": "text",
              "refusal": "refusal", "thinking": "thinking"}
TEXT_PART_TYPES = frozenset(_PART_TEXT)
_COPIED = ("name", "task")


def engine_messages(messages: list[object]) -> tuple[list[dict[str, Any]], bool]:
    """The messages the template renders, and whether media cut them short."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest("each message must be an object with a string role")
        role = message["role"]
        content, media = _content(message.get("content"), role == "system")
        result: dict[str, Any] = {"role": role, "content": content}
        if role == "assistant":
            calls = message.get("tool_calls")
            if calls is not None:
                if not isinstance(calls, list):
                    raise BadRequest("tool_calls must be a list")
                if calls:
                    result["tool_calls"] = [_tool_call(call) for call in calls]
            reasoning = message.get("reasoning")
            if reasoning is not None:
                result["reasoning"] = result["reasoning_content"] = reasoning
        elif role == "tool" and "tool_call_id" in message:
            result["tool_call_id"] = message["tool_call_id"]
        for name in _COPIED:
            if isinstance(message.get(name), str):
                result[name] = message[name]
        if role == "developer":
            result["tools"] = message.get("tools")
        out.append(result)
        if media:
            return out, True
    return out, False


def knows_developer(source: str) -> bool:
    """vLLM's test of a template for the developer role: its source names it, quoted."""
    return '"developer"' in source or "'developer'" in source


def developer_as_system(messages: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    """``messages`` as the template gets them: developer turns become system turns, merged
    first, when the template does not know the developer role (see the module's rules)."""
    if knows_developer(source) or not any(m["role"] == "developer" for m in messages):
        return messages
    converted = [{k: v for k, v in m.items() if k != "tools"} | {"role": "system"}
                 if m["role"] == "developer" else m for m in messages]
    systems = [i for i, m in enumerate(converted) if m["role"] == "system"]
    if not systems or systems == [0]:
        return converted
    texts = [m["content"] for m in converted if m["role"] == "system" and m["content"]]
    return [{"role": "system", "content": "\n\n".join(texts)},
            *(m for m in converted if m["role"] != "system")]


def engine_tools(tools: object) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list")
    return [_tool(tool) for tool in tools]


def _content(content: object, system: bool) -> tuple[str, bool]:
    """The message's text ("string" content format) and whether a media part ended it."""
    if content is None:
        return "", False
    if isinstance(content, str):
        return _strip_billing(content) if system else content, False
    if not isinstance(content, list):
        raise BadRequest("message content must be a string, a list of parts or null")
    texts: list[str] = []
    for part in content:
        if isinstance(part, str):
            text: object = part
        elif not isinstance(part, dict):
            raise BadRequest("content parts must be objects or strings")
        elif not isinstance(part.get("type"), str):
            raise BadRequest("a content part's type must be a string")
        elif part["type"] in _PART_TEXT:
            text = part.get(_PART_TEXT[part["type"]])
            if text is None:
                continue
            if not isinstance(text, str):
                raise BadRequest("a text content part needs a string text")
        else:
            return "\n".join(texts) + MEDIA_SENTINEL, True
        if system:
            text = _strip_billing(text)
            if not text:
                continue
        texts.append(text)
    return "\n".join(texts), False


def _strip_billing(text: str) -> str:
    return text.partition("\n")[2] if text.startswith(BILLING_HEADER) else text


def _tool_call(call: object) -> dict[str, Any]:
    if not isinstance(call, dict):
        raise BadRequest("assistant tool_calls entries must be objects")
    function = call.get("function")
    if call.get("type", "function") != "function" or not isinstance(function, dict):
        raise BadRequest("assistant tool_calls must be of type 'function'")
    arguments = function.get("arguments")
    if arguments and not isinstance(arguments, dict):
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except (ValueError, RecursionError):  # (RecursionError: nested too deeply)
            arguments = None
    return {**call, "function": {**function,
                                 "arguments": arguments if isinstance(arguments, dict) else {}}}


def _tool(tool: object) -> dict[str, Any]:
    if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict):
        raise BadRequest("each tool must be an object with a function object")
    if tool.get("type", "function") != "function":
        raise BadRequest("tools must be of type 'function'")
    function = tool["function"]
    if not isinstance(function.get("name"), str):
        raise BadRequest("a tool's function needs a string name")
    dumped_function: dict[str, Any] = {"name": function["name"],
                                       "description": function.get("description"),
                                       "parameters": function.get("parameters")}
    for name in ("strict", "defer_loading"):
        if function.get(name) is not None:
            dumped_function[name] = function[name]
    defer = tool.get("defer_loading")
    if defer is not None and "defer_loading" not in dumped_function:
        dumped_function["defer_loading"] = defer  # vLLM propagates it into the function
    dumped: dict[str, Any] = {"type": "function", "function": dumped_function}
    if defer is not None:
        dumped["defer_loading"] = defer
    return dumped
