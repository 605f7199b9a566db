"""Limits of the lean HTTP server (data plane and simulated engines). Frozen, validated.

Every limit protects the gateway from one kind of client: many connections, big header blocks,
big bodies, slow headers (slowloris), slow bodies, idle keep-alive connections. ``None`` is not
allowed anywhere: an operator always knows the bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from cortex.errors import ConfigError


@dataclass(frozen=True, slots=True)
class ServerLimits:
    max_connections: int = 4096  # open client connections; more wait in the listen backlog
    max_header_bytes: int = 65_536  # request line + header block
    max_header_count: int = 100
    max_body_bytes: int = 16 * 1024 * 1024  # 413 above this
    header_timeout_s: float = 10.0  # from connection (or previous response) to full head
    body_timeout_s: float = 60.0  # for the whole body once the head is in
    keepalive_idle_s: float = 75.0  # idle keep-alive connection is closed after this
    drain_timeout_s: float = 30.0  # graceful shutdown: in-flight requests get this long
    # A client that leaves while its request is handled or its answer streams is noticed (its
    # work cancelled) from this long into the response; 0: from its start (two more task
    # switches per request, which a short answer never needs: it is sent before this).
    client_watch_after_s: float = 0.1
    # A client's end of stream alone (it half-closed after sending: legal in HTTP/1.1) does
    # not abort its request; only a reset or a failed write does. True: end of stream counts
    # as gone too (work cancelled sooner for clients that close, wrong for those that
    # half-close).
    eof_is_gone: bool = False

    def __post_init__(self) -> None:
        problems = [f"server limit {name} must be > 0" for name in (
            "max_connections", "max_header_bytes", "max_header_count", "max_body_bytes",
            "header_timeout_s", "body_timeout_s", "keepalive_idle_s", "drain_timeout_s")
            if not getattr(self, name) > 0]
        if not self.client_watch_after_s >= 0:
            problems.append("server limit client_watch_after_s must be >= 0")
        if problems:
            raise ConfigError(problems)
