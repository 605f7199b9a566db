"""The one place where a Cortex error becomes an HTTP response.

Rules:

* The status is the error's ``http_status``; nothing else decides it. An error that knows when
  to come back (``retry_after_s``: overload 429, saturation 503, no live worker 503 — when
  the registry expects one back) adds ``Retry-After``.
* The body is OpenAI-style JSON, so the official clients surface it as an API error:
  ``{"error": {"message": str(exc), "type": <snake_case class name>, "code": status}}``.
  A ``ConfigError`` also lists every problem under ``"problems"``.
* The lean server answers its own protocol failures (malformed request, limits, read timeouts,
  handler bugs) through the same function, with the few leaves below. They exist only at the
  HTTP edge, so they live here rather than in ``cortex.errors``; all stay under ``CortexError``.
"""

from __future__ import annotations

import math
import re

import msgspec

from cortex.errors import BadRequest, ConfigError, CortexError, MethodNotAllowed, PayloadTooLarge
from cortex.front.messages import HttpResponse, json_response


class RequestTimeout(BadRequest):
    """The client did not send its request head or body before the read deadline."""

    http_status = 408


class HeaderFieldsTooLarge(PayloadTooLarge):
    """The request line and headers exceed the byte or count limit."""

    http_status = 431


class InternalServerError(CortexError):
    """A handler failed with an exception that is not a Cortex error (a bug)."""

    http_status = 500

    def __init__(self, message: str = "internal server error") -> None:
        super().__init__(message)


class ServiceUnavailable(CortexError):
    """The server cannot take the request now (shutting down)."""

    http_status = 503


_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_type_names: dict[type, str] = {}


def error_type_name(cls: type) -> str:
    """``NoWorkerAvailable`` → ``no_worker_available`` (cached per class)."""
    name = _type_names.get(cls)
    if name is None:
        name = _type_names[cls] = _CAMEL_BOUNDARY.sub("_", cls.__name__).lower()
    return name


def error_payload(exc: CortexError) -> dict[str, object]:
    status = exc.http_status
    error: dict[str, object] = {"message": str(exc), "type": error_type_name(type(exc)),
                                "code": status}
    if isinstance(exc, ConfigError):
        error["problems"] = list(exc.problems)
    return {"error": error}


def error_response(exc: CortexError) -> HttpResponse:
    """The JSON response for ``exc`` (status from ``exc.http_status``; ``Retry-After`` in
    whole seconds, at least 1, when the error says when to come back)."""
    headers = None
    if exc.retry_after_s is not None:
        headers = [(b"retry-after", b"%d" % max(1, math.ceil(exc.retry_after_s)))]
    if isinstance(exc, MethodNotAllowed):
        headers = [(b"allow", ", ".join(exc.allow).encode())]
    return json_response(exc.http_status, msgspec.json.encode(error_payload(exc)), headers)
