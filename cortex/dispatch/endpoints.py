"""The data plane's generation endpoints and what Cortex changes in what it forwards. Pure.

Rules:

* Five generation endpoints: OpenAI chat, OpenAI completions, SGLang ``/generate``, Anthropic
  Messages (``/v1/messages``) and OpenAI Responses (``/v1/responses``), plus Anthropic's
  ``/v1/messages/count_tokens``. Each body is parsed once (JSON object, else ``BadRequest``); the parsed dict serves routing, the raw
  bytes are forwarded unchanged unless Cortex must add a field.
* Inbound ``x-cortex-*`` headers are dropped (only Cortex says what Cortex decided), as are
  hop-by-hop headers and ``host``/``content-length`` (the upstream client sets them).
* Data-parallel rank (engine-endpoints.md §4): SGLang takes ``routed_dp_rank`` in the body
  (the body is re-encoded only then); vLLM takes the ``x-data-parallel-rank`` header (vLLM's
  ``_get_data_parallel_rank`` reads it case-insensitively). ``rank`` ``None``: the engine's
  own DP balancer chooses. Cortex owns that decision: a client's own ``routed_dp_rank`` /
  ``x-data-parallel-rank`` is stripped, unless the operator lets clients choose
  (``scheduler.client_dp_rank``; Cortex's rank, when it has one, still wins).
* Engines: chat, completions, Messages and Responses are served by both engines (SGLang's
  ``http_server`` routes ``/v1/messages`` and ``/v1/responses`` too); ``/generate`` is SGLang's
  native API only (``SERVED_BY``): a request goes only to workers whose engine serves its
  endpoint. Messages and Responses are converted to a chat prompt by each engine its own way;
  Cortex reproduces vLLM's (``EXACT_FOR``), so a pool with a worker of another engine routes
  them by load (``Unrenderable`` ``engine_rendering``). Anthropic's
  ``/v1/messages/count_tokens`` (both engines) renders and counts without generating: it goes
  by load, unpredicted and uncounted (it fills no cache).
* Decision headers on the response: ``x-cortex-cache-hit-tokens``,
  ``x-cortex-assigned-worker``, ``x-cortex-match-mode`` (the ``Mode`` value), plus
  ``x-cortex-dp-rank`` when a rank was set and ``x-cortex-attempts`` after retries.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import msgspec

from cortex.errors import BadRequest
from cortex.prompt.chat_template import ChatTemplates
from cortex.prompt.request_text import (
    RequestPrompt,
    chat_prompt,
    completions_prompt,
    generate_prompt,
    messages_prompt,
    responses_prompt,
)

Headers = list[tuple[bytes, bytes]]

_DROPPED_REQUEST_HEADERS = frozenset({
    b"host", b"content-length", b"connection", b"keep-alive", b"transfer-encoding", b"te",
    b"trailer", b"upgrade", b"proxy-authorization", b"proxy-connection", b"expect",
})
_json_decoder = msgspec.json.Decoder()
_json_encoder = msgspec.json.Encoder()


class Endpoint(enum.Enum):
    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"
    GENERATE = "/generate"
    MESSAGES = "/v1/messages"
    RESPONSES = "/v1/responses"
    COUNT_TOKENS = "/v1/messages/count_tokens"


ENDPOINTS = {endpoint.value.encode(): endpoint for endpoint in Endpoint}
ENGINES = frozenset({"vllm", "sglang"})
SERVED_BY = {Endpoint.CHAT: ENGINES, Endpoint.COMPLETIONS: ENGINES,
             Endpoint.GENERATE: frozenset({"sglang"}), Endpoint.MESSAGES: ENGINES,
             Endpoint.RESPONSES: ENGINES, Endpoint.COUNT_TOKENS: ENGINES}
# The engines whose rendering of an endpoint's requests Cortex reproduces (absent: every one).
EXACT_FOR = {Endpoint.MESSAGES: frozenset({"vllm"}), Endpoint.RESPONSES: frozenset({"vllm"})}


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object; anything else is the client's error."""
    if not raw:
        raise BadRequest("request body must be a JSON object, got an empty body",
                         reason="empty_body")
    try:
        body = _json_decoder.decode(raw)
    except msgspec.ValidationError as error:  # (a number out of range: JSON, but unusable)
        raise BadRequest(f"request body is not valid JSON: {error}",
                         reason="number_out_of_range") from None
    except msgspec.DecodeError as error:
        raise BadRequest(f"request body is not valid JSON: {error}",
                         reason="invalid_json") from None
    except RecursionError:  # msgspec's own depth guard
        raise BadRequest("request body is nested too deeply", reason="nesting_too_deep") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object", reason="not_an_object")
    return body


def body_model(body: Mapping[str, Any]) -> str | None:
    """The model the body names (``base`` of ``base:adapter``); ``None`` if it names none."""
    model = body.get("model")
    if model is None:
        return None
    if not isinstance(model, str) or not model:
        raise BadRequest("model must be a non-empty string", reason="invalid_model")
    base, sep, adapter = model.partition(":")
    return base if sep and base and adapter else model


def request_prompt(
    endpoint: Endpoint, body: Mapping[str, Any], templates: ChatTemplates | None,
    chat_engine: str = "vllm",
) -> RequestPrompt | None:
    """What to tokenize (or the ids sent); ``None`` when a chat-like request has no template to
    render with. Messages and Responses raise ``Unrenderable`` when not exact. ``chat_engine``:
    whose chat rendering to reproduce ("vllm" | "sglang", ``ModelPool.chat_engine``)."""
    if endpoint is Endpoint.CHAT:
        return None if templates is None else chat_prompt(body, templates, chat_engine)
    if endpoint is Endpoint.COMPLETIONS:
        return completions_prompt(body)
    if endpoint is Endpoint.GENERATE:
        return generate_prompt(body)
    if templates is None or endpoint is Endpoint.COUNT_TOKENS:  # (counting fills no cache)
        return None
    if endpoint is Endpoint.MESSAGES:
        return messages_prompt(body, templates)
    return responses_prompt(body, templates)


def forwarded_headers(headers: Headers, client_dp_rank: bool = False) -> Headers:
    """The client's headers minus ``x-cortex-*``, hop-by-hop and framing headers, and minus
    its ``x-data-parallel-rank`` unless clients may choose the rank."""
    return [(name, value) for name, value in headers
            if name not in _DROPPED_REQUEST_HEADERS and not name.startswith(b"x-cortex-")
            and (client_dp_rank or name != b"x-data-parallel-rank")]


def with_dp_rank(
    engine: str, body: dict[str, Any], raw: bytes, headers: Headers, rank: int | None,
    client_dp_rank: bool = False,
) -> tuple[bytes, Headers]:
    """Body and headers to send so the engine serves the request on DP ``rank`` (``None``:
    the engine chooses, or the client when it may)."""
    if rank is None:
        if "routed_dp_rank" in body and not client_dp_rank:
            return _json_encoder.encode({k: v for k, v in body.items()
                                         if k != "routed_dp_rank"}), headers
        return raw, headers
    if engine == "sglang":
        return _json_encoder.encode({**body, "routed_dp_rank": rank}), headers
    return raw, [*[(n, v) for n, v in headers if n != b"x-data-parallel-rank"],
                 (b"x-data-parallel-rank", str(rank).encode())]


def decision_headers(
    worker: str, mode: str, cached_tokens: int, rank: int | None, attempts: int
) -> Headers:
    headers = [
        (b"x-cortex-assigned-worker", worker.encode()),
        (b"x-cortex-match-mode", mode.encode()),
        (b"x-cortex-cache-hit-tokens", str(cached_tokens).encode()),
    ]
    if rank is not None:
        headers.append((b"x-cortex-dp-rank", str(rank).encode()))
    if attempts > 1:
        headers.append((b"x-cortex-attempts", str(attempts).encode()))
    return headers
