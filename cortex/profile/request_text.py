"""From a parsed request body to what must be tokenized (or the token ids the client sent).

Endpoints (bodies already parsed from JSON into dicts):

* OpenAI chat (``/v1/chat/completions``): ``messages`` rendered through the profile's chat
  template with ``tools``, ``add_generation_prompt`` (default true), ``continue_final_message``
  (the text ends right after the last message's content, as vLLM cuts it) and
  ``chat_template_kwargs``. Tokenized without special tokens (the template writes BOS).
* OpenAI completions (``/v1/completions``): ``prompt`` as text (tokenized with special tokens)
  or as token ids (no tokenization at all).
* SGLang ``/generate``: ``input_ids`` (token ids, no tokenization) or ``text``.

For a batch (a list of prompts) the first prompt decides the route. ``add_special_tokens`` in
the body overrides the endpoint default, as in vLLM.

Namespace: LoRA name from ``model`` written ``base:adapter`` (SGLang) or from ``lora_path``;
``cache_salt`` as sent (vLLM). The key namespace uses the profile's model name, not the body's.

Multimodal chat: routing uses the text before the first non-text content part. The message
holding it keeps only its text parts before that part (joined with ``"\\n"``, vLLM's string
form) directly followed by a sentinel; later messages are dropped; the rendering is cut at the
sentinel. That text is a prefix of what the engine sees up to the media placeholder (engines
put special tokens there, a hard tokenizer boundary); ``media_cut`` is set. A template that
drops the sentinel leaves no prefix (empty text): no exact routing, never a guess.

Bad shapes raise ``BadRequest``; pure otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from cortex.errors import BadRequest
from cortex.profile.chat_template import ChatTemplate

MEDIA_SENTINEL = "\x00cortex-media-cut\x00"
_MAX_TOKEN_ID = 1 << 32


class RequestPrompt(msgspec.Struct, frozen=True):
    """Exactly one of ``text`` / ``token_ids`` is set. (A frozen ``msgspec.Struct``, not a frozen
    dataclass: one is built per request, in ~0.12 µs instead of ~1.2-1.5.)"""

    text: str | None
    token_ids: list[int] | None
    add_special_tokens: bool
    lora_name: str | None
    cache_salt: str | None
    media_cut: bool = False


def split_model_name(model: object) -> tuple[str | None, str | None]:
    """``"base:adapter"`` → (``"base"``, ``"adapter"``); otherwise (model, None)."""
    if not isinstance(model, str) or not model:
        return None, None
    base, sep, adapter = model.partition(":")
    return (base, adapter) if sep and base and adapter else (model, None)


def chat_prompt(
    body: Mapping[str, Any], template: ChatTemplate, bos_token: str = "", eos_token: str = ""
) -> RequestPrompt:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    prepared, media_cut = _text_messages(messages)
    continue_final = bool(body.get("continue_final_message", False))
    add_generation_prompt = bool(body.get("add_generation_prompt", not continue_final))
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise BadRequest("chat_template_kwargs must be an object")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise BadRequest("tools must be a list")
    text = template.render(
        prepared,
        add_generation_prompt=add_generation_prompt and not media_cut,
        bos_token=bos_token,
        eos_token=eos_token,
        tools=tools,
        extra=kwargs,
    )
    if media_cut:
        cut = text.find(MEDIA_SENTINEL)
        text = text[:cut] if cut >= 0 else ""
    elif continue_final:
        last = prepared[-1].get("content")
        if isinstance(last, str) and last:
            end = text.rfind(last)
            if end >= 0:
                text = text[: end + len(last)]
    return RequestPrompt(
        text=text,
        token_ids=None,
        add_special_tokens=_flag(body, "add_special_tokens", False),
        lora_name=_lora(body),
        cache_salt=_salt(body),
        media_cut=media_cut,
    )


def completions_prompt(body: Mapping[str, Any]) -> RequestPrompt:
    return _text_or_ids(body, body.get("prompt"), "prompt")


def generate_prompt(body: Mapping[str, Any]) -> RequestPrompt:
    if body.get("input_ids") is not None:
        return _text_or_ids(body, body["input_ids"], "input_ids")
    return _text_or_ids(body, body.get("text"), "text")


def _text_or_ids(body: Mapping[str, Any], prompt: object, name: str) -> RequestPrompt:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
        prompt = prompt[0]  # a batch: the first prompt routes
    lora, salt = _lora(body), _salt(body)
    special = _flag(body, "add_special_tokens", True)
    if isinstance(prompt, str):
        return RequestPrompt(prompt, None, special, lora, salt)
    if isinstance(prompt, list):
        return RequestPrompt(None, _token_ids(prompt, name), special, lora, salt)
    raise BadRequest(f"{name} must be a string or a list of token ids")


def _token_ids(values: Sequence[object], name: str) -> list[int]:
    for v in values:
        if type(v) is not int or not 0 <= v < _MAX_TOKEN_ID:
            raise BadRequest(f"{name}: token ids must be integers in [0, 2**32)")
    return list(values)  # type: ignore[arg-type]


def _text_messages(messages: list[object]) -> tuple[list[dict[str, Any]], bool]:
    out: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest("each message must be an object with a string role")
        content = message.get("content")
        if content is None or isinstance(content, str):
            out.append(message)
            continue
        if not isinstance(content, list):
            raise BadRequest("message content must be a string, a list of parts or null")
        texts: list[str] = []
        for part in content:
            if not isinstance(part, dict):
                raise BadRequest("content parts must be objects")
            if part.get("type") != "text":
                joined = "\n".join(texts) + MEDIA_SENTINEL
                out.append({**message, "content": joined})
                return out, True
            text = part.get("text")
            if not isinstance(text, str):
                raise BadRequest("a text content part needs a string text")
            texts.append(text)
        out.append({**message, "content": "\n".join(texts)})
    return out, False


def _lora(body: Mapping[str, Any]) -> str | None:
    path = body.get("lora_path")
    if isinstance(path, list):
        path = path[0] if path else None
    if isinstance(path, str) and path:
        return path
    return split_model_name(body.get("model"))[1]


def _salt(body: Mapping[str, Any]) -> str | None:
    salt = body.get("cache_salt")
    if salt is None or isinstance(salt, str):
        return salt or None
    raise BadRequest("cache_salt must be a string")


def _flag(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be a boolean")
    return value
