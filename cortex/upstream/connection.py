"""One HTTP/1.1 keep-alive connection to a worker: h11 over a trio TCP stream.

Rules and invariants:

* ``open_connection`` opens TCP with ``TCP_NODELAY`` set (a streamed event must not wait for
  Nagle), within the connect timeout; failure is ``UpstreamConnectError`` (nothing sent).
* One exchange at a time: ``send_request`` (head and whole body in one ``send_all``, framed with
  ``content-length``), ``receive_head``, then ``receive_body`` until it returns ``None``.
* ``finish_exchange`` starts the next h11 cycle only when both sides are ``DONE`` (the whole
  response read, keep-alive allowed by both); it returns whether the connection may be reused.
  Anything else — timeout, error, early exit, ``connection: close`` — leaves the connection
  unusable and the owner must ``close`` it. A connection is never reused after an incomplete
  exchange.
* ``response_started`` turns true with the first response byte of the current exchange; it
  and ``exchanges`` (completed exchanges so far, >0 means reused) drive the pool's one retry.
* Every socket or protocol failure becomes ``UpstreamBroken`` / ``UpstreamTimeout`` carrying
  the phase; cancellation passes through untouched.
* ``close`` is synchronous and immediate: the worker sees EOF at once, which is how an engine
  learns that its client went away.
"""

from __future__ import annotations

import select
import socket

import h11
import trio

from cortex.errors import BadRequest
from cortex.upstream.errors import Phase, UpstreamBroken, UpstreamConnectError, UpstreamTimeout
from cortex.upstream.request_head import Headers

RECEIVE_SIZE = 65_536
_SOCKET_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


class UpstreamConnection:
    """A keep-alive connection; owned by one exchange at a time (the pool hands it out)."""

    __slots__ = ("origin", "stream", "exchanges", "idle_since", "generation",
                 "response_started", "_h11", "_closed", "_poller")

    def __init__(self, origin: str, stream: trio.SocketStream, generation: int = 0) -> None:
        self.origin = origin
        self.stream = stream
        self.exchanges = 0  # completed exchanges: > 0 means this connection is being reused
        self.idle_since = 0.0
        self.generation = generation  # the pool's per-origin generation when it was opened
        self.response_started = False
        self._h11 = h11.Connection(h11.CLIENT)
        self._closed = False
        self._poller = select.poll()  # "readable right now?" without a trio wait
        self._poller.register(stream.socket.fileno(), select.POLLIN)

    @property
    def closed(self) -> bool:
        return self._closed

    async def send_request(self, method: bytes, target: bytes, headers: Headers,
                           body: bytes) -> None:
        """Send the head and the whole body (``headers`` already carry content-length)."""
        self.response_started = False
        conn = self._h11
        try:
            data = conn.send(h11.Request(method=method, target=target, headers=headers))
            if body:
                data += conn.send(h11.Data(data=body))
            data += conn.send(h11.EndOfMessage())
        except h11.LocalProtocolError as exc:  # the caller's head is not valid HTTP
            raise BadRequest(f"request cannot be forwarded: {exc}") from None
        try:
            await self.stream.send_all(data)
        except _SOCKET_ERRORS as exc:
            raise self._broken("send", exc) from None

    async def receive_head(self, timeout_s: float) -> h11.Response:
        """Wait for the final response head (1xx heads are skipped), ``timeout_s`` in all."""
        with trio.move_on_after(timeout_s) as scope:
            while True:
                event = self._buffered_event("head")
                if event is h11.NEED_DATA:
                    await self._receive("head")
                elif isinstance(event, h11.Response):
                    return event
                elif not isinstance(event, h11.InformationalResponse):
                    raise UpstreamBroken(f"unexpected {type(event).__name__} before the head",
                                         origin=self.origin, phase="head",
                                         response_started=self.response_started)
        assert scope.cancelled_caught
        raise UpstreamTimeout(f"no response head within {timeout_s:g} s", origin=self.origin,
                              phase="head", response_started=self.response_started)

    async def receive_body(self, timeout_s: float) -> bytes | None:
        """The next body bytes, ``None`` at the end of the response.

        Bytes already received are returned without waiting; otherwise each wait for the
        socket is bounded by ``timeout_s`` (the gap between two chunks of a stream). A socket
        that is readable right now (one ``poll``) is read without a timeout scope, which costs
        several times more than the poll.
        """
        while True:
            event = self._buffered_event("body")
            if event is h11.NEED_DATA:
                if self._poller.poll(0):  # bytes (or EOF) are waiting: no timeout needed
                    await self._receive("body")
                    continue
                with trio.move_on_after(timeout_s) as scope:
                    await self._receive("body")
                if scope.cancelled_caught:
                    raise UpstreamTimeout(f"no body bytes for {timeout_s:g} s",
                                          origin=self.origin, phase="body",
                                          response_started=True)
            elif isinstance(event, h11.Data):
                if event.data:
                    return bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return None
            else:
                raise UpstreamBroken(f"unexpected {type(event).__name__} in the body",
                                     origin=self.origin, phase="body", response_started=True)

    def _buffered_event(self, phase: Phase) -> object:
        """The next h11 event from bytes already received, or ``h11.NEED_DATA``."""
        try:
            event = self._h11.next_event()
        except h11.RemoteProtocolError as exc:
            raise self._broken(phase, exc) from None
        if isinstance(event, h11.ConnectionClosed):
            raise self._broken(phase, "connection closed")
        return event

    async def _receive(self, phase: Phase) -> None:
        """One read from the socket into h11 (EOF included)."""
        try:
            data = await self.stream.receive_some(RECEIVE_SIZE)
        except _SOCKET_ERRORS as exc:
            raise self._broken(phase, exc) from None
        if data:
            self.response_started = True
        try:
            self._h11.receive_data(data)
        except RuntimeError as exc:  # data after EOF: the connection is unusable
            raise self._broken(phase, exc) from None

    def drain_buffered(self) -> bool:
        """Consume body events already received, without I/O: did the response end?"""
        conn = self._h11
        try:
            while True:
                event = conn.next_event()
                if isinstance(event, h11.EndOfMessage):
                    return True
                if not isinstance(event, h11.Data):
                    return False  # NEED_DATA (more is to come), or something unusable
        except h11.RemoteProtocolError:
            return False

    def finish_exchange(self) -> bool:
        """After a fully read response: may this connection carry another exchange?"""
        conn = self._h11
        if self._closed or conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
            return False
        conn.start_next_cycle()
        self.exchanges += 1
        return True

    def looks_closed(self) -> bool:
        """An idle connection that is readable has EOF or stray bytes: it cannot be used.

        A non-blocking peek on the idle socket (one ``poll`` call); a connection the worker
        closes after this check is still caught by the pool's single retry.
        """
        return self._closed or bool(self._poller.poll(0))

    def close(self) -> None:
        """Close the socket now (synchronous; idempotent)."""
        if not self._closed:
            self._closed = True
            self.stream.socket.close()

    def _broken(self, phase: Phase, cause: object) -> UpstreamBroken:
        return UpstreamBroken(str(cause) or type(cause).__name__, origin=self.origin,
                              phase=phase, response_started=self.response_started)


async def open_connection(origin: str, host: str, port: int, timeout_s: float,
                          generation: int = 0) -> UpstreamConnection:
    """A new connection to ``host:port`` with ``TCP_NODELAY``, or ``UpstreamConnectError``."""
    with trio.move_on_after(timeout_s) as scope:
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            raise UpstreamConnectError(str(exc) or type(exc).__name__, origin=origin,
                                       phase="connect") from None
        try:
            stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            stream.socket.close()
            raise UpstreamConnectError(f"TCP_NODELAY: {exc}", origin=origin,
                                       phase="connect") from None
        return UpstreamConnection(origin, stream, generation)
    assert scope.cancelled_caught
    raise UpstreamConnectError(f"connect timeout after {timeout_s:g} s", origin=origin,
                               phase="connect")
