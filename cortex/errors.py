"""The one error root of Cortex and its few leaves.

Every leaf that can reach an HTTP client carries ``http_status``; the mapping to a response
lives in exactly one place (the front end). Cancellation is never caught or wrapped here.
"""

from __future__ import annotations


class CortexError(Exception):
    """Root of every error Cortex raises on purpose."""

    http_status: int = 500


class ConfigError(CortexError):
    """The configuration cannot be used; ``problems`` lists every problem found at once."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


class DecodeError(CortexError):
    """Bytes from an engine (ZeroMQ frames, msgpack payloads) are malformed.

    The only exception the event decoder may raise on bad input; the subscriber counts it
    and carries on with the next message.
    """

    http_status = 502


class BadRequest(CortexError):
    """The client sent something Cortex cannot accept."""

    http_status = 400


class NotFound(CortexError):
    """No such route or resource."""

    http_status = 404


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
    """No live worker can take the request (all dead, or all above their watermark)."""

    http_status = 503
