"""State every connection of one lean HTTP server shares, and what the server counts.

The server (``cortex.front.server``) owns one ``ServerShared``; each connection
(``cortex.front.connection``), its request parser and its response writer read and update it.
This module sits below all of them and imports none of them, so the server and its
connection's parts do not import each other.

Rules:

* Everything here belongs to the trio thread; nothing is locked.
* Counters are plain ints (``ServerCounters``), read by the metrics layer at scrape time.
* ``idle_connections`` holds the connections waiting for their next request: ``drain()`` wakes
  each (``IdleConnection.wake_idle``) so it closes at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from cortex.errors import CortexError
from cortex.front.exchange import ExchangeHook
from cortex.front.limits import ServerLimits
from cortex.front.messages import Handler
from cortex.wait_deadlines import WaitDeadlines

__all__ = ["IdleConnection", "ServerCounters", "ServerShared"]


@dataclass(slots=True)
class ServerCounters:
    """What the server counts; plain ints, exported by the metrics layer."""

    connections_opened: int = 0
    connections_open: int = 0
    requests: int = 0  # complete requests handed to the handler
    bad_requests: int = 0  # 400s Cortex answered itself (malformed HTTP or body, bad fields)
    too_large: int = 0  # 413 and 431 refusals
    header_timeouts: int = 0
    body_timeouts: int = 0
    client_gone: int = 0  # client left while its request was handled or its body streamed
    handler_errors: int = 0  # 500s from bugs, and body iterators failing after the head
    responses_by_status: dict[int, int] = field(default_factory=dict)
    bad_requests_by_reason: dict[str, int] = field(default_factory=dict)  # the 400s, by reason

    def count_status(self, status: int) -> None:
        self.responses_by_status[status] = self.responses_by_status.get(status, 0) + 1

    def count_bad_request(self, error: CortexError) -> None:
        """Cortex answers ``error`` itself: counted when it is a 400, by its reason."""
        if error.http_status != 400:
            return
        self.bad_requests += 1
        reason = getattr(error, "reason", "invalid_field")
        self.bad_requests_by_reason[reason] = self.bad_requests_by_reason.get(reason, 0) + 1


class IdleConnection(Protocol):
    """A connection waiting for its next request, as ``drain()`` sees it."""

    def wake_idle(self) -> None:
        """Ends the wait: the connection closes (the server is draining)."""


@dataclass(slots=True)
class ServerShared:
    """State every connection of one server shares (owned by the trio thread)."""

    handler: Handler
    limits: ServerLimits
    counters: ServerCounters
    server_header: bytes
    draining: bool = False
    in_flight: int = 0
    idle_connections: set[IdleConnection] = field(default_factory=set)  # woken by drain()
    # idle keep-alive deadlines; running while HttpServer.serve runs (else: cancel scopes)
    deadlines: WaitDeadlines = field(default_factory=WaitDeadlines)
    on_exchange: ExchangeHook | None = None  # told what each request came to
