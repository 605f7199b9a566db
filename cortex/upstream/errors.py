"""How an upstream exchange failed: three leaves of ``cortex.errors.UpstreamError``.

Every instance says where it happened, so the gateway can decide about retries without
parsing messages:

* ``origin`` — the worker, ``"http://host:port"``;
* ``phase`` — ``"acquire"`` (waiting for a connection slot), ``"connect"``, ``"send"``,
  ``"head"`` (waiting for the response head), ``"body"`` (reading the response body);
* ``response_started`` — at least one response byte was received on the exchange. A request
  may be retried on another worker only while this is false AND nothing reached the client.

Leaves:

* ``UpstreamConnectError`` (502): the TCP connection could not be opened (refused, unreachable,
  name not resolved, connect timeout). Nothing was sent: always safe to retry elsewhere.
* ``UpstreamTimeout`` (504): no connection slot in time (``acquire``), no response head in time
  (``head``), or no body bytes for too long (``body``).
* ``UpstreamBroken`` (502): the connection died or the worker broke HTTP mid-exchange (reset,
  EOF before the end, malformed bytes, a body larger than the reader's limit).

Cancellation is never wrapped in any of these.
"""

from __future__ import annotations

from typing import Literal

from cortex.errors import UpstreamError

Phase = Literal["acquire", "connect", "send", "head", "body"]


class _UpstreamFailure(UpstreamError):
    """Common shape of the three leaves (not raised itself)."""

    def __init__(self, message: str, *, origin: str, phase: Phase,
                 response_started: bool = False) -> None:
        super().__init__(f"{origin} ({phase}): {message}")
        self.origin = origin
        self.phase: Phase = phase
        self.response_started = response_started


class UpstreamConnectError(_UpstreamFailure):
    """The connection could not be opened; nothing was sent."""

    http_status = 502


class UpstreamTimeout(_UpstreamFailure):
    """A slot, a response head or the next body bytes did not come in time."""

    http_status = 504


class UpstreamBroken(_UpstreamFailure):
    """The connection died, or the worker broke HTTP, in the middle of an exchange."""

    http_status = 502
