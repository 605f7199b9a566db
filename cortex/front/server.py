"""The lean HTTP/1.1 server: llhttp (``httptools``) over trio streams, no ASGI on the hot path.

``HttpServer(handler, limits).serve(host, port, reuse_port=False, task_status=...)`` binds one
listening socket (port 0 = ephemeral; ``reuse_port``: shared with other processes of the host,
``SO_REUSEPORT``), reports ``(host, bound_port)`` through ``task_status`` and accepts
connections, each served by ``HttpConnection`` (rules in ``cortex.front.connection``).

Rules:

* At most ``limits.max_connections`` connections are open: past that the accept loop waits on
  a ``trio.CapacityLimiter`` and further clients wait in the listen backlog.
* Connections are accepted in bursts: after one awaited accept (a free limiter token, then a
  connection), the loop takes every connection already waiting, up to ``_ACCEPT_BURST``, with
  non-blocking ``accept`` calls on the listening socket and tokens taken without waiting while
  one is free — no scheduler pass between them. Each awaited step is a full pass of the
  scheduler, so one connection per pass made N waiting connections cost ~N² (the 64th of a
  burst answered ~0.8 s late); the bound keeps a flood of connections from starving requests
  already running, since the loop yields again after each burst.
* Accept errors: a connection the kernel already dropped (``ECONNABORTED`` and the like) is
  skipped; any other error (``EMFILE``, ``ENFILE``, ``ENOBUFS``, ...) is logged and the loop
  waits ``_ACCEPT_BACKOFF_S`` before it tries again (in a burst it ends the burst, and the
  next awaited accept meets it).
* Every accepted socket gets ``TCP_NODELAY`` (a streamed event must not wait for an ACK).
* ``drain()`` is graceful shutdown: the accept loop stops and the listening socket closes (new
  connections are refused), idle keep-alive connections close at once, requests already
  arriving or in flight are answered with ``connection: close``. After
  ``limits.drain_timeout_s`` whatever still runs is cancelled. ``serve`` returns when every
  connection is closed.
* Idle keep-alive deadlines, and the moments responses start watching their clients
  (``limits.client_watch_after_s``), are kept by one ``WaitDeadlines`` task per server (rules
  in ``cortex.wait_deadlines``), started before the first connection and stopped after the
  last.
* Counters are plain ints (``ServerCounters``), read by the metrics layer. They and the state
  every connection shares (``ServerShared``) live in ``cortex.front.shared``, which the
  connection's parts import instead of this module (re-exported here).
* ``on_exchange`` (optional) is told what each request came to, once it is over: the access
  log's source (``cortex.front.exchange``).
"""

from __future__ import annotations

import errno
import logging
import socket

import trio

from cortex.front.connection import HttpConnection
from cortex.front.exchange import ExchangeHook
from cortex.front.limits import ServerLimits
from cortex.front.messages import Handler
from cortex.front.shared import ServerCounters, ServerShared

__all__ = ["HttpServer", "ServerCounters", "ServerShared"]

log = logging.getLogger("cortex.front")

_ACCEPT_BACKOFF_S = 0.1  # after an accept error such as EMFILE
_ACCEPT_BURST = 64  # connections taken per scheduler pass at most, the awaited one included
# accept errors that only mean the waiting connection is gone (trio's SocketListener skips them)
_GONE_ERRNOS = frozenset(getattr(errno, name) for name in (
    "EPERM", "ECONNABORTED", "EPROTO", "ENETDOWN", "ENOPROTOOPT", "EHOSTDOWN", "ENONET",
    "EHOSTUNREACH", "EOPNOTSUPP", "ENETUNREACH") if hasattr(errno, name))


class HttpServer:
    """Serves ``handler`` over HTTP/1.1 on one port; ``serve`` runs it, ``drain`` stops it."""

    def __init__(self, handler: Handler, limits: ServerLimits = ServerLimits(),
                 server_header: bytes = b"cortex", *,
                 on_exchange: ExchangeHook | None = None) -> None:
        """``on_exchange``: told what each request came to (``cortex.front.exchange``)."""
        self.counters = ServerCounters()
        self._shared = ServerShared(handler, limits, self.counters, server_header,
                                    on_exchange=on_exchange)
        self._limiter = trio.CapacityLimiter(limits.max_connections)
        self._accept_scope = trio.CancelScope()
        self._drain_deadline: float | None = None
        self.connections: set[HttpConnection] = set()  # open ones (tests, debugging)

    @property
    def in_flight(self) -> int:
        """Requests whose handler runs or whose response is being sent."""
        return self._shared.in_flight

    @property
    def draining(self) -> bool:
        return self._shared.draining

    async def serve(self, host: str, port: int, *, reuse_port: bool = False,
                    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
                    ) -> None:
        listener, raw = await _open_listener(host, port, reuse_port)
        try:
            async with trio.open_nursery() as services:
                await services.start(self._shared.deadlines.run)
                async with trio.open_nursery() as connections:
                    task_status.started((host, listener.socket.getsockname()[1]))
                    with self._accept_scope:
                        await self._accept_loop(listener, raw, connections)
                    await listener.aclose()
                    assert self._drain_deadline is not None
                    connections.cancel_scope.deadline = self._drain_deadline
                services.cancel_scope.cancel()  # every connection is closed
        finally:
            await trio.aclose_forcefully(listener)

    def drain(self) -> None:
        """Starts graceful shutdown (idempotent; call from the trio thread)."""
        shared = self._shared
        if shared.draining:
            return
        shared.draining = True
        self._drain_deadline = trio.current_time() + shared.limits.drain_timeout_s
        self._accept_scope.cancel()
        for connection in list(shared.idle_connections):
            connection.wake_idle()

    async def _accept_loop(self, listener: trio.SocketListener, raw: socket.socket,
                           connections: trio.Nursery) -> None:
        while True:
            borrower = object()
            await self._limiter.acquire_on_behalf_of(borrower)
            try:
                stream = await listener.accept()
            except OSError as exc:
                self._limiter.release_on_behalf_of(borrower)
                log.warning("accept failed: %r", exc)
                await trio.sleep(_ACCEPT_BACKOFF_S)
                continue
            except BaseException:
                self._limiter.release_on_behalf_of(borrower)
                raise
            connections.start_soon(self._serve_connection, stream, borrower)
            self._accept_waiting(raw, connections, _ACCEPT_BURST - 1)

    def _accept_waiting(self, raw: socket.socket, connections: trio.Nursery,
                        most: int) -> None:
        """Takes up to ``most`` connections already waiting in the backlog, without yielding;
        stops at the first moment no token is free, no connection waits, or accept fails
        otherwise than for a connection already gone (the awaited accept meets that error)."""
        limiter = self._limiter
        for _ in range(most):
            borrower = object()
            try:
                limiter.acquire_on_behalf_of_nowait(borrower)
            except trio.WouldBlock:
                return
            try:
                sock, _ = raw.accept()
            except OSError as exc:
                limiter.release_on_behalf_of(borrower)
                if exc.errno in _GONE_ERRNOS:
                    continue
                return  # BlockingIOError: none waits; else EMFILE & co., met by the next await
            stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
            connections.start_soon(self._serve_connection, stream, borrower)

    async def _serve_connection(self, stream: trio.SocketStream, borrower: object) -> None:
        counters = self.counters
        counters.connections_opened += 1
        counters.connections_open += 1
        try:
            stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        except OSError:
            pass  # the peer already reset; the connection fails on its first read
        try:
            peer = stream.socket.getpeername()
            client: tuple[str, int] | None = (peer[0], peer[1])
        except OSError:
            client = None
        connection = HttpConnection(stream, self._shared, client)
        self.connections.add(connection)
        try:
            await connection.run()
        finally:
            self.connections.discard(connection)
            counters.connections_open -= 1
            self._limiter.release_on_behalf_of(borrower)


async def _open_listener(host: str, port: int, reuse_port: bool = False,
                         ) -> tuple[trio.SocketListener, socket.socket]:
    """One listening TCP socket on the first address ``host`` resolves to: trio's listener
    over it, and the standard socket itself (non-blocking; the accept loop's bursts call its
    ``accept``, which raises ``BlockingIOError`` when no connection waits). ``reuse_port``:
    ``SO_REUSEPORT``, so that other processes (of the same user) may bind the same port; the
    kernel then hands each new connection to one of the listening sockets (by a hash of its
    addresses)."""
    infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                          flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    raw = socket.socket(family, kind, proto)
    try:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        raw.bind(address)  # a resolved address: binding does not block
        raw.listen(socket.SOMAXCONN)
        sock = trio.socket.from_stdlib_socket(raw)  # sets it non-blocking
    except BaseException:
        raw.close()
        raise
    return trio.SocketListener(sock), raw
