"""A simulated engine's tokenizer endpoints: the answers of ``POST /tokenize`` and
``/detokenize`` (both flavors; SGLang also under ``/v1/``), in each engine's shapes. Pure:
takes the engine and the decoded body, returns the answer's JSON or raises ``BadRequest``.

vLLM 0.32 (``vllm/entrypoints/serve/tokenize/``):

* ``/tokenize``: ``{"prompt": str}`` (``add_special_tokens`` default true) or
  ``{"messages": [...]}`` (rendered as chat: ``add_generation_prompt`` default true,
  ``continue_final_message``, ``tools``, ``chat_template_kwargs``; ``add_special_tokens``
  default false), ``return_token_strs`` default false ->
  ``{"count", "max_model_len", "tokens", "token_strs"}`` (``token_strs`` ``null`` unless asked:
  the tokenizer's token strings, ``convert_ids_to_tokens``).
* ``/detokenize``: ``{"tokens": [int >= 0]}`` -> ``{"prompt": decoded text}`` (special tokens
  kept: the tokenizer's ``decode`` defaults).

SGLang (``sglang/srt/entrypoints/openai/serving_tokenize.py``, ``protocol.py``):

* ``/tokenize``: exactly one of ``prompt`` (a string, or a list of strings: a batch) and
  ``messages`` (rendered as chat); ``add_special_tokens`` default true (for prompts) ->
  ``{"tokens", "count", "max_model_len"}``, lists per prompt for a batch.
* ``/detokenize``: ``{"tokens": [ids] | [[ids], ...]}``, ``skip_special_tokens`` default
  true -> ``{"text": str | [str, ...]}`` (``""`` for no tokens).

``max_model_len`` is the engine's (``SimEngineView.max_model_len``).
"""

from __future__ import annotations

from typing import Any

from cortex.errors import BadRequest
from cortex.ledger.kv_events import EngineFamily
from cortex.sim.engine_view import SimEngineView
from cortex.sim.request_fields import flag
from cortex.sim.tokenize import SimTokenizer


def tokenize_body(engine: SimEngineView, body: dict[str, Any]) -> dict[str, Any]:
    tokenizer = engine.tokenizer
    prompt, messages = body.get("prompt"), body.get("messages")
    if engine.family is EngineFamily.VLLM:
        if messages is not None:
            ids = tokenizer.chat_ids(body)
        elif isinstance(prompt, str):
            ids = _text_ids(tokenizer, body, prompt)
        else:
            raise BadRequest("prompt must be a string (or send messages)")
        strs = None
        if flag(body, "return_token_strs", False):
            strs = [_profile(tokenizer).tokenizer.id_to_token(i) for i in ids]
        return {"count": len(ids), "max_model_len": engine.max_model_len, "tokens": ids,
                "token_strs": strs}
    if (prompt is None) == (messages is None):
        raise BadRequest("Exactly one of 'prompt' or 'messages' must be provided.")
    if messages is not None:  # SGLang renders it as a chat request (add_special_tokens unused)
        ids = tokenizer.chat_ids({k: v for k, v in body.items() if k != "add_special_tokens"})
        return {"tokens": ids, "count": len(ids), "max_model_len": engine.max_model_len}
    if isinstance(prompt, str):
        ids = _text_ids(tokenizer, body, prompt)
        return {"tokens": ids, "count": len(ids), "max_model_len": engine.max_model_len}
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        batch = [_text_ids(tokenizer, body, p) for p in prompt]
        return {"tokens": batch, "count": [len(ids) for ids in batch],
                "max_model_len": engine.max_model_len}
    raise BadRequest("Invalid prompt type. Expected str or List[str].")


def detokenize_body(engine: SimEngineView, body: dict[str, Any]) -> dict[str, Any]:
    decoder = _profile(engine.tokenizer).tokenizer
    tokens = body.get("tokens")
    if engine.family is EngineFamily.VLLM:
        return {"prompt": decoder.decode(_ids(tokens), skip_special_tokens=False)}
    skip = flag(body, "skip_special_tokens", True)
    if isinstance(tokens, list) and tokens and isinstance(tokens[0], list):
        return {"text": [decoder.decode(_ids(ids), skip_special_tokens=skip) for ids in tokens]}
    ids = _ids(tokens)
    return {"text": decoder.decode(ids, skip_special_tokens=skip) if ids else ""}


def _text_ids(tokenizer: SimTokenizer, body: dict[str, Any], text: str) -> list[int]:
    """One text's ids as the engine's tokenizer gives them (an empty text too: no ids, or the
    BOS alone with special tokens)."""
    if text:
        return tokenizer.prompt_ids(body, text, "prompt")
    profile = _profile(tokenizer)
    with_bos = flag(body, "add_special_tokens", True) and profile.add_bos
    return [profile.bos_id] if with_bos and profile.bos_id is not None else []


def _ids(tokens: object) -> list[int]:
    if not isinstance(tokens, list) or not all(type(t) is int and t >= 0 for t in tokens):
        raise BadRequest("tokens must be a list of integers >= 0")
    return tokens


def _profile(tokenizer: SimTokenizer) -> Any:
    if tokenizer.profile is None:
        raise BadRequest("this simulated engine has no tokenizer")
    return tokenizer.profile
