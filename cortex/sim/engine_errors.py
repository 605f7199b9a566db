"""The error bodies a simulated engine answers with: each engine's own shape, route by route. Pure.

A real engine answers a request it refuses in one of two ways, and the two differ in shape:

* **validation** — the body does not fit the route's request model (a wrong type, a missing or
  unknown-valued field, a body that is not an object): FastAPI's ``RequestValidationError``,
  answered by the server's handler for it before the route runs;
* **serving** — the route itself refuses the request (a template that fails, an empty prompt,
  an unknown model) or fails (a 500).

The simulator's own checks of field types and shapes (``request_fields``, ``tokenize``, the
converters of ``cortex.profile``) are the validation kind; a chat template's failure and every
status other than 400 are the serving kind. (Requests the simulator refuses only because it does
not model them are answered in the validation shape: a real engine would serve them.)

vLLM 0.32 / 0.33 (``vllm/entrypoints/serve/``; 0.33 answers the same):

* validation, every route (``/v1/messages`` too): ``{"error": {"message", "type": "Bad
  Request", "param", "code": 400}}`` (``exception_handling/handlers/validation.py``
  ``validation_exception_handler``; ``param`` is the field's dotted path there, ``null`` here);
* serving, OpenAI routes: ``{"error": {"message", "type", "param": null, "code"}}``
  (``engine/protocol.py`` ``ErrorInfo``/``ErrorResponse``; ``exception_handling/
  error_response.py`` ``create_error_response``): type ``BadRequestError`` (400),
  ``NotFoundError`` (404), ``InternalServerError`` (500), else the status phrase (a
  ``GracefulHTTPError``: ``Service Unavailable`` for 503);
* serving, ``/v1/messages`` and ``/count_tokens``: Anthropic's ``{"type": "error", "error":
  {"type", "message"}}`` with the same types (``entrypoints/anthropic/api_router.py``
  ``translate_error_response``).

SGLang (0.5.x, ``python/sglang/srt/entrypoints/``):

* validation, ``/v1/responses``: ``{"error": {"message", "type": "Bad Request", "param": null,
  "code": 400}}``; every other route: the flat ``{"object": "error", "message", "type": "Bad
  Request", "param": null, "code": 400}`` (``http_server.py`` ``validation_exception_handler``
  for ``RequestValidationError``; ``openai/protocol.py`` ``ErrorResponse``);
* serving, ``/generate``: ``{"error": {"message"}}`` for 400 (``http_server.py``
  ``_create_error_response``); other statuses come from an ``HTTPException``: flat, type the
  status as a string (``http_server.py``, its ``HTTPException`` handler), as on every route
  for statuses other than 400 and 500 (``/v1/responses``: nested, type the status phrase);
* serving, ``/v1/messages`` and ``/count_tokens``: ``{"type": "error", "error": {"type":
  "invalid_request_error" | "internal_error", "message"}}`` (``anthropic/serving.py``
  ``AnthropicServing._error_response``);
* serving, the other OpenAI routes: flat, type ``BadRequestError`` / ``InternalServerError``
  (``openai/serving_base.py`` ``OpenAIServingBase.create_error_response``; its catch-all in
  ``handle_request`` answers 500 ``InternalServerError``).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from cortex.ledger.kv_events import EngineFamily

MESSAGES_PATHS = frozenset({b"/v1/messages", b"/v1/messages/count_tokens"})
RESPONSES_PATH = b"/v1/responses"
GENERATE_PATH = b"/generate"
VALIDATION_TYPE = "Bad Request"  # HTTPStatus.BAD_REQUEST.phrase, as both handlers write it
_VLLM_TYPES = {400: "BadRequestError", 404: "NotFoundError", 422: "UnprocessableEntityError",
               500: "InternalServerError", 501: "NotImplementedError"}
_SGLANG_TYPES = {400: "BadRequestError", 500: "InternalServerError"}


def error_body(family: EngineFamily, path: bytes, status: int, message: str, *,
               validation: bool) -> dict[str, Any]:
    """The JSON body the engine of ``family`` answers ``status`` with on ``path``
    (``validation``: the request did not fit the route's model; only with 400)."""
    validation = validation and status == 400
    if family is EngineFamily.VLLM:
        return _vllm(path, status, message, validation)
    return _sglang(path, status, message, validation)


def _vllm(path: bytes, status: int, message: str, validation: bool) -> dict[str, Any]:
    if validation:
        return _nested(message, VALIDATION_TYPE, status)
    kind = _VLLM_TYPES.get(status) or _phrase(status)
    if path in MESSAGES_PATHS:
        return _anthropic(kind, message)
    return _nested(message, kind, status)


def _sglang(path: bytes, status: int, message: str, validation: bool) -> dict[str, Any]:
    responses = path == RESPONSES_PATH
    if validation:
        return (_nested if responses else _flat)(message, VALIDATION_TYPE, status)
    if status not in _SGLANG_TYPES:  # an HTTPException
        return _nested(message, _phrase(status), status) if responses else _flat(
            message, str(status), status)
    if path == GENERATE_PATH:
        return {"error": {"message": message}} if status == 400 else _flat(
            message, str(status), status)
    if path in MESSAGES_PATHS:
        return _anthropic("invalid_request_error" if status == 400 else "internal_error",
                          message)
    return _flat(message, _SGLANG_TYPES[status], status)


def _nested(message: str, kind: str, status: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def _flat(message: str, kind: str, status: int) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": kind, "param": None, "code": status}


def _anthropic(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return str(status)
