"""What each leg of a prefill/decode (PD) request carries. Pure: bodies in, bodies out.

Rules (protocols/pd-disaggregation.md):

* SGLang — both legs get the client's body plus ``bootstrap_host`` (the host of the prefill
  worker's URL), ``bootstrap_port`` (its registered bootstrap port, ``null`` = the engine's
  own default) and ``bootstrap_room``: one random room per item, in [0, 2**63 - 1]; a batch
  (``/generate`` with several prompts, chat with ``n`` > 1, completions with several prompts)
  gets a list of rooms, one per item. Both legs are sent at once; the client gets decode's
  answer.
* vLLM — the prefill leg is the client's body with ``kv_transfer_params =
  {"do_remote_decode": true, ...}``, ``stream: false``, ``max_tokens: 1`` (and
  ``max_completion_tokens: 1`` when present; a Responses body gets ``max_output_tokens: 1``
  instead, Anthropic Messages' limit being ``max_tokens`` too), without ``stream_options``,
  ``min_tokens``,
  ``min_completion_tokens``; the decode leg is the client's body unchanged plus the
  ``kv_transfer_params`` object of prefill's answer, passed through untouched (absent or null →
  decode computes the prefill itself). Both legs carry one ``x-request-id``.
* Logprob merge (SGLang, when asked): prefill's ``meta_info.input_token_logprobs`` is prepended
  to decode's, in a JSON body or in every SSE ``data:`` event except ``[DONE]``.
* Bypass: the prefill leg is skipped when the decode worker already holds all but at most
  ``bypass_max_uncached_tokens`` of the prompt (vLLM: decode then prefills the rest itself).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from cortex.errors import ConfigError, UpstreamError

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()
MAX_ROOM = (1 << 63) - 1
_VLLM_PREFILL_DROPPED = ("stream_options", "min_tokens", "min_completion_tokens")


def new_room(randbits: Callable[[int], int] = secrets.randbits) -> int:
    return randbits(63)


def batch_items(endpoint_path: str, body: Mapping[str, Any]) -> int:
    """How many items the engine expands the request into (1 for a single prompt)."""
    if endpoint_path == "/generate":
        ids = body.get("input_ids")
        if isinstance(ids, list) and ids and isinstance(ids[0], list):
            return len(ids)
        text = body.get("text")
        if isinstance(text, list):
            return max(len(text), 1)
        return 1
    if endpoint_path == "/v1/completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            return len(prompt)
        return 1
    n = body.get("n")
    return n if type(n) is int and n > 1 else 1


def sglang_leg_body(
    body: Mapping[str, Any],
    bootstrap_host: str,
    bootstrap_port: int | None,
    items: int,
    randbits: Callable[[int], int] = secrets.randbits,
) -> tuple[bytes, int | list[int]]:
    """The body both SGLang legs get, and the room(s) in it."""
    rooms: int | list[int] = (new_room(randbits) if items == 1
                              else [new_room(randbits) for _ in range(items)])
    leg = {**body, "bootstrap_host": bootstrap_host, "bootstrap_port": bootstrap_port,
           "bootstrap_room": rooms}
    return _encoder.encode(leg), rooms


def vllm_prefill_body(body: Mapping[str, Any], responses: bool = False) -> bytes:
    """``responses``: an OpenAI Responses body, whose limit is ``max_output_tokens``."""
    leg = {key: value for key, value in body.items() if key not in _VLLM_PREFILL_DROPPED}
    leg["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False,
                                 "remote_engine_id": None, "remote_block_ids": None,
                                 "remote_host": None, "remote_port": None}
    leg["stream"] = False
    leg["max_output_tokens" if responses else "max_tokens"] = 1
    if "max_completion_tokens" in body:
        leg["max_completion_tokens"] = 1
    return _encoder.encode(leg)


def vllm_transfer_params(prefill_answer: bytes) -> Any:
    """The ``kv_transfer_params`` of prefill's JSON answer (``None`` if absent)."""
    try:
        answer = _decoder.decode(prefill_answer)
    except msgspec.DecodeError:
        raise UpstreamError("prefill answered with a body that is not JSON") from None
    if not isinstance(answer, dict):
        raise UpstreamError("prefill answered with a JSON body that is not an object")
    return answer.get("kv_transfer_params")


def vllm_decode_body(body: Mapping[str, Any], transfer_params: Any) -> bytes:
    if transfer_params is None:
        return _encoder.encode(dict(body))
    return _encoder.encode({**body, "kv_transfer_params": transfer_params})


def wants_logprobs(endpoint_path: str, body: Mapping[str, Any]) -> bool:
    if endpoint_path == "/generate":
        return bool(body.get("return_logprob"))
    if endpoint_path == "/v1/chat/completions":
        return bool(body.get("logprobs"))
    return body.get("logprobs") is not None


def prefill_input_logprobs(prefill_answer: bytes) -> list[Any] | None:
    """``meta_info.input_token_logprobs`` of a prefill answer (JSON, or the last SSE event
    that carries it)."""
    for payload in _json_payloads(prefill_answer):
        meta = payload.get("meta_info") if isinstance(payload, dict) else None
        if isinstance(meta, dict) and isinstance(meta.get("input_token_logprobs"), list):
            return meta["input_token_logprobs"]
    return None


def merge_logprobs_json(decode_body: bytes, prefill_logprobs: list[Any]) -> bytes:
    """Decode's JSON body with prefill's input logprobs prepended (body unchanged if none)."""
    try:
        answer = _decoder.decode(decode_body)
    except msgspec.DecodeError:
        return decode_body
    if _prepend(answer, prefill_logprobs):
        return _encoder.encode(answer)
    return decode_body


def merge_logprobs_event(event: bytes, prefill_logprobs: list[Any]) -> bytes:
    """One SSE event (``data: {...}\\n\\n``) with prefill's input logprobs prepended."""
    head, sep, rest = event.partition(b"data:")
    if not sep:
        return event
    payload, newline, tail = rest.strip().partition(b"\n")
    if payload == b"[DONE]":
        return event
    try:
        answer = _decoder.decode(payload)
    except msgspec.DecodeError:
        return event
    if not _prepend(answer, prefill_logprobs):
        return event
    ending = event[len(event.rstrip(b"\r\n")):]
    return head + b"data: " + _encoder.encode(answer) + (newline + tail if tail else b"") + ending


def _prepend(answer: Any, prefill_logprobs: list[Any]) -> bool:
    items = answer if isinstance(answer, list) else [answer]
    changed = False
    for item in items:
        meta = item.get("meta_info") if isinstance(item, dict) else None
        if isinstance(meta, dict):
            own = meta.get("input_token_logprobs")
            meta["input_token_logprobs"] = list(prefill_logprobs) + (
                own if isinstance(own, list) else [])
            changed = True
    return changed


def _json_payloads(raw: bytes) -> list[Any]:
    stripped = raw.strip()
    if stripped.startswith((b"{", b"[")):
        try:
            return [_decoder.decode(stripped)]
        except msgspec.DecodeError:
            return []
    found = []
    for line in stripped.split(b"\n"):
        if line.startswith(b"data:"):
            payload = line[5:].strip()
            if payload and payload != b"[DONE]":
                try:
                    found.append(_decoder.decode(payload))
                except msgspec.DecodeError:
                    continue
    return list(reversed(found))


def bypass_prefill(prompt_tokens: int, decode_cached_tokens: int, max_uncached: int) -> bool:
    """Whether decode already holds enough of the prompt to skip the prefill leg."""
    return prompt_tokens > 0 and prompt_tokens - decode_cached_tokens <= max_uncached


@dataclass(frozen=True, slots=True)
class PdSettings:
    retries: int = 1  # more prefill/decode pairs tried before the first byte
    fallback_to_both: bool = True  # then a `both` worker serves alone, if there is one
    bypass_max_uncached_tokens: int = 64  # vLLM: decode holds all but this many → no prefill

    def __post_init__(self) -> None:
        problems = []
        if self.retries < 0:
            problems.append("pd.retries must be >= 0")
        if self.bypass_max_uncached_tokens < 0:
            problems.append("pd.bypass_max_uncached_tokens must be >= 0")
        if problems:
            raise ConfigError(problems)
