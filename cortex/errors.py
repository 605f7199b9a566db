"""The one error root of Cortex and its few leaves.

Every leaf that can reach an HTTP client carries ``http_status``; the mapping to a response
lives in exactly one place (the front end). Cancellation is never caught or wrapped here.
"""

from __future__ import annotations


class CortexError(Exception):
    """Root of every error Cortex raises on purpose."""

    http_status: int = 500
    retry_after_s: float | None = None  # sent as Retry-After when set (429, 503)


class ConfigError(CortexError):
    """The configuration cannot be used; ``problems`` lists every problem found at once.
    ``partial``: what of the configuration did build (``load_config``), for further checks."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)
        self.partial: object | None = None


class DecodeError(CortexError):
    """Bytes from an engine (ZeroMQ frames, msgpack payloads) are malformed.

    The only exception the event decoder may raise on bad input; the subscriber counts it
    and carries on with the next message.
    """

    http_status = 502


class BadRequest(CortexError):
    """The client sent something Cortex cannot accept. ``reason``: a fixed word for the
    ``cortex_http_bad_requests_total{reason}`` label (``BAD_REQUEST_REASONS``)."""

    http_status = 400

    def __init__(self, message: str, *, reason: str = "invalid_field") -> None:
        super().__init__(message)
        if reason not in BAD_REQUEST_REASONS:
            raise ValueError(f"unknown bad-request reason {reason!r}")
        self.reason = reason


# Why Cortex refused a request with 400 itself (a label: a fixed vocabulary, never a sentence).
BAD_REQUEST_REASONS = (
    "malformed_http",  # request line, headers, framing or chunked encoding
    "empty_body",
    "invalid_json",  # not JSON (truncated, bad escapes, a lone surrogate, invalid UTF-8, ...)
    "number_out_of_range",  # a JSON number no 64-bit integer or double holds
    "nesting_too_deep",
    "not_an_object",  # JSON, but the body is not an object
    "invalid_model",  # model is not a non-empty string
    "model_required",  # no model named while several are served
    "invalid_field",  # a field Cortex reads has the wrong shape (messages, tools, prompt, ...)
    "unforwardable_head",  # a header value that cannot be sent on to a worker
)


class NotFound(CortexError):
    """No such route or resource."""

    http_status = 404


class MethodNotAllowed(CortexError):
    """The path exists but not for this method; ``allow`` lists the methods it takes."""

    http_status = 405

    def __init__(self, message: str, *, allow: tuple[str, ...]) -> None:
        super().__init__(message)
        self.allow = allow


class Unauthorized(CortexError):
    """An admin or debug endpoint was called without the right bearer token."""

    http_status = 401


class PayloadTooLarge(CortexError):
    """A request body or header block exceeds its configured limit."""

    http_status = 413


class UpstreamError(CortexError):
    """A worker failed or answered badly."""

    http_status = 502


class NoWorkerAvailable(CortexError):
    """No live worker can take the request (all dead, or all above their watermark).

    ``saturated`` says the workers are alive but every one is above a watermark: waiting may
    help (the admission queue waits for capacity before giving up)."""

    http_status = 503

    def __init__(self, message: str, *, saturated: bool = False,
                 retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.saturated = saturated
        self.retry_after_s = retry_after_s


class Overloaded(CortexError):
    """The model's admission queue is full: the client should come back later."""

    http_status = 429

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
