"""From a parsed request body to what must be tokenized (or the token ids the client sent).

Endpoints (bodies already parsed from JSON into dicts):

* OpenAI chat (``/v1/chat/completions``), as vLLM renders it (a pool of SGLang workers only:
  as SGLang does, ``sglang_chat``): ``messages`` rendered through the model's chat
  template (``ChatTemplates.pick``: the ``tool_use`` one when the request has tools and the
  model names one) with ``tools``, ``documents``, ``add_generation_prompt`` (default true),
  ``continue_final_message`` (the text ends right after the last message's content, as vLLM
  cuts it), ``chat_template_kwargs`` and ``reasoning_effort`` (vLLM hands the template
  ``reasoning_effort`` and, unless the kwargs set it, ``enable_thinking`` = effort is not
  ``"none"``); developer turns as ``chat_messages.developer_as_system`` hands them on; the
  model's special tokens are the template's own constants. Tokenized without special tokens
  (the template writes BOS).
* OpenAI completions (``/v1/completions``): ``prompt`` as text (tokenized with special tokens)
  or as token ids (no tokenization at all).
* SGLang ``/generate``: ``input_ids`` (token ids, no tokenization) or ``text``.
* Anthropic Messages (``/v1/messages``) and OpenAI Responses (``/v1/responses``): converted
  into the chat body vLLM renders for them (``anthropic_messages``, ``responses_input``),
  then rendered as chat. What Cortex cannot reproduce exactly — the converters' cases, a
  template that fails, a shape the chat path refuses — raises ``Unrenderable``: the engine,
  not Cortex, judges these requests, and they route by load.

For a batch (a list of prompts) the first prompt decides the route. ``add_special_tokens`` in
the body overrides the endpoint default, as in vLLM.

Prompt logprobs limit what an engine reads from its cache (``cache_limit``: prompt tokens it
may serve cached, ``None`` = no limit beyond ``request_keys.reusable_tokens``): vLLM skips its
prefix cache for a request with prompt logprobs (``prompt_logprobs`` set, or ``echo`` with
``logprobs`` on completions / ``top_logprobs``, default 0, on chat: ``SamplingParams``
``skip_reading_prefix_cache``), and SGLang matches at most ``logprob_start_len`` tokens of a
``/generate`` request with ``return_logprob`` (and sets it to 0 for a completion with ``echo``
and ``logprobs``). A pool may mix engines, so the limit is the smallest either would apply: a
possible miss, never a false hit.

Namespace: LoRA name from ``model`` written ``base:adapter`` (SGLang) or from ``lora_path``;
``cache_salt`` as sent (vLLM). The key namespace uses the profile's model name, not the body's.

Messages and tools reach the template as the engine's renderer rebuilds them
(``chat_messages``). Multimodal chat: routing uses the text before the first non-text content
part, cut by ``chat_messages`` with a sentinel; the rendering is cut at the sentinel. That
text is a prefix of what the engine sees up to the media placeholder (engines put special
tokens there, a hard tokenizer boundary); ``media_cut`` is set. A template that drops the
sentinel leaves no prefix (empty text): no exact routing, never a guess.

Bad shapes raise ``BadRequest``; pure otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import msgspec

from cortex.errors import BadRequest
from cortex.prompt import anthropic_messages, responses_input
from cortex.prompt.chat_messages import (
    MEDIA_SENTINEL,
    developer_as_system,
    engine_messages,
    engine_tools,
    knows_developer,
)
from cortex.prompt.chat_template import ChatTemplates, TemplateError
from cortex.prompt.sglang_chat import sglang_conversation
from cortex.prompt.unrenderable import Unrenderable

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
    cache_limit: int | None = None  # prompt tokens the engine may serve from its cache


def split_model_name(model: object) -> tuple[str | None, str | None]:
    """``"base:adapter"`` → (``"base"``, ``"adapter"``); otherwise (model, None)."""
    if not isinstance(model, str) or not model:
        return None, None
    base, sep, adapter = model.partition(":")
    return (base, adapter) if sep and base and adapter else (model, None)


def chat_prompt(body: Mapping[str, Any], templates: ChatTemplates,
                engine: str = "vllm") -> RequestPrompt | None:
    """The rendered chat, as ``engine`` renders it ("vllm", or "sglang": ``sglang_chat``);
    ``None`` when the model has no template for this request."""
    if engine == "sglang":
        text = sglang_conversation(body, templates)
        if text is None:
            return None
        return RequestPrompt(
            text=text, token_ids=None, add_special_tokens=False, lora_name=_lora(body),
            cache_salt=_salt(body),
            cache_limit=_prompt_logprobs_limit(body, body.get("top_logprobs", 0)))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    continue_final = bool(body.get("continue_final_message", False))
    add_generation_prompt = bool(body.get("add_generation_prompt", not continue_final))
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise BadRequest("chat_template_kwargs must be an object")
    effort = body.get("reasoning_effort")
    if effort is not None and effort != "auto":  # (vLLM's merge_kwargs drops None, "auto")
        kwargs = {**kwargs, "reasoning_effort": effort}
        if "enable_thinking" not in (body.get("chat_template_kwargs") or {}):
            kwargs["enable_thinking"] = effort != "none"
    tools = engine_tools(body.get("tools"))
    template = templates.pick(tools)
    if template is None:
        return None
    documents = body.get("documents")
    done = None
    cached = template.cache is not None and (knows_developer(template.source) or not any(
        type(m) is dict and m.get("role") == "developer" for m in messages))
    if cached:
        done = template.cache.render(
            messages, [tools, documents, kwargs, add_generation_prompt], engine_messages,
            partial(template.render_traced, add_generation_prompt=add_generation_prompt,
                    tools=tools, documents=documents, extra=kwargs),
            partial(template.render, add_generation_prompt=add_generation_prompt,
                    tools=tools, documents=documents, extra=kwargs))
    if done is not None:  # only the messages not rendered before (``render_cache``)
        text, last_message = done
        media_cut = False
    else:
        if template.cache is None:
            template.renders += 1
        elif not cached:  # developer turns merged: rendered whole (the cache counts its own)
            template.cache.renders["fallback"] += 1
        prepared, media_cut = engine_messages(messages)
        if media_cut and not knows_developer(template.source) and any(
                m.get("role") == "developer" for m in messages) and any(
                m.get("role") in ("developer", "system") for m in messages[len(prepared):]):
            # the engine merges system turns after the cut into the first message
            raise Unrenderable("unmodelled", "system or developer turns after media")
        prepared = developer_as_system(prepared, template.source)
        text = template.render(
            prepared,
            add_generation_prompt=add_generation_prompt and not media_cut,
            tools=tools,
            documents=documents,
            extra=kwargs,
        )
        last_message = prepared[-1]
    if media_cut:
        cut = text.find(MEDIA_SENTINEL)
        text = text[:cut] if cut >= 0 else ""
    elif continue_final:
        last = last_message.get("content")
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
        cache_limit=_prompt_logprobs_limit(body, body.get("top_logprobs", 0)),
    )


def messages_prompt(body: Mapping[str, Any], templates: ChatTemplates) -> RequestPrompt | None:
    """An Anthropic Messages request, rendered as vLLM renders it (else ``Unrenderable``)."""
    chat = anthropic_messages.chat_body(
        dict(body), merge_inline_system=anthropic_messages.merges_inline_system(templates),
        disabled_thinking_effort=anthropic_messages.disabled_effort(templates))
    return _as_chat(chat, templates)


def responses_prompt(body: Mapping[str, Any], templates: ChatTemplates) -> RequestPrompt | None:
    """An OpenAI Responses request, rendered as vLLM renders it (else ``Unrenderable``)."""
    return _as_chat(responses_input.chat_body(dict(body)), templates)


def _as_chat(chat: Mapping[str, Any], templates: ChatTemplates) -> RequestPrompt | None:
    try:
        return chat_prompt(chat, templates)
    except TemplateError as error:
        raise Unrenderable("template_failed", str(error)) from None
    except BadRequest as error:  # the engine answers the client; Cortex only routes
        raise Unrenderable("unmodelled", str(error)) from None


def completions_prompt(body: Mapping[str, Any]) -> RequestPrompt:
    return _text_or_ids(body, body.get("prompt"), "prompt",
                        _prompt_logprobs_limit(body, body.get("logprobs")))


def generate_prompt(body: Mapping[str, Any]) -> RequestPrompt:
    limit = None
    start = body.get("logprob_start_len")
    if body.get("return_logprob") is True and type(start) is int and start >= 0:
        limit = start
    if body.get("input_ids") is not None:
        return _text_or_ids(body, body["input_ids"], "input_ids", limit)
    return _text_or_ids(body, body.get("text"), "text", limit)


def _prompt_logprobs_limit(body: Mapping[str, Any], echo_logprobs: object) -> int | None:
    """0 when the request asks for prompt logprobs (vLLM then reads nothing from its cache)."""
    if body.get("prompt_logprobs") is not None or (body.get("echo") is True
                                                   and echo_logprobs is not None):
        return 0
    return None


def _text_or_ids(
    body: Mapping[str, Any], prompt: object, name: str, cache_limit: int | None
) -> RequestPrompt:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
        prompt = prompt[0]  # a batch: the first prompt routes
    lora, salt = _lora(body), _salt(body)
    special = _flag(body, "add_special_tokens", True)
    if isinstance(prompt, str):
        return RequestPrompt(prompt, None, special, lora, salt, cache_limit=cache_limit)
    if isinstance(prompt, list):
        return RequestPrompt(None, _token_ids(prompt, name), special, lora, salt,
                             cache_limit=cache_limit)
    raise BadRequest(f"{name} must be a string or a list of token ids")


def _token_ids(values: Sequence[object], name: str) -> list[int]:
    for v in values:
        if type(v) is not int or not 0 <= v < _MAX_TOKEN_ID:
            raise BadRequest(f"{name}: token ids must be integers in [0, 2**32)")
    return list(values)  # type: ignore[arg-type]


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
