"""One HTTP/1.1 keep-alive connection to a worker: a non-blocking socket driven from trio.

The bytes are framed elsewhere: requests by ``request_head.request_bytes``, responses by
``response_parser.ResponseReader`` (llhttp). This module only moves bytes, and waits with
``trio.lowlevel.wait_readable`` / ``wait_writable`` only when the socket has nothing to give
or take right now — a read that can be served at once costs one ``recv`` and no trip through
trio's scheduler.

Rules and invariants:

* ``open_connection`` opens TCP with ``TCP_NODELAY`` set (a streamed event must not wait for
  Nagle), within the connect timeout; failure is ``UpstreamConnectError`` (nothing sent).
* One exchange at a time: ``send_request`` (head and whole body in one buffer, framed with
  ``content-length``, usually one ``send``), ``receive_head``, then ``receive_body`` until
  it returns ``None``. A head that is not valid HTTP is ``BadRequest`` before anything is sent.
* Timeouts: ``receive_head`` has one deadline for the whole head; ``receive_body`` one per
  wait (the gap between two chunks of a stream); bytes already received or readable at once
  are returned without any timer. The deadlines are kept by the pool's ``WaitDeadlines`` task
  (no cancel scope per wait); without it running, each wait has its own cancel scope.
* ``finish_exchange`` returns whether the connection may carry another exchange: only after
  the whole response was received, keep-alive allowed by both sides and nothing else arrived
  (``ResponseReader.reusable``). Anything else — timeout, error, early exit, ``connection:
  close`` — leaves the connection unusable and the owner must ``close`` it. A connection is
  never reused after an incomplete exchange.
* ``response_started`` turns true with the first response byte of the current exchange; it
  and ``exchanges`` (completed exchanges so far, >0 means reused) drive the pool's one retry.
* Every socket or protocol failure becomes ``UpstreamBroken`` / ``UpstreamTimeout`` carrying
  the phase; cancellation passes through untouched (every wait is a trio checkpoint, and a
  read served at once still honours a pending cancellation).
* ``close`` is synchronous and immediate: the worker sees EOF at once, which is how an engine
  learns that its client went away; a task blocked on the socket is woken first.
"""

from __future__ import annotations

import enum
import select
import socket
from typing import NamedTuple

import trio

from cortex.upstream.errors import Phase, UpstreamBroken, UpstreamConnectError, UpstreamTimeout
from cortex.upstream.request_head import Headers, request_bytes
from cortex.upstream.response_parser import ResponseReader
from cortex.wait_deadlines import WaitDeadlines

RECEIVE_SIZE = 65_536
_wait_readable = trio.lowlevel.wait_readable
_checkpoint_if_cancelled = trio.lowlevel.checkpoint_if_cancelled
_current_time = trio.current_time


class NotReady(enum.Enum):
    NOT_READY = "not ready"


NOT_READY = NotReady.NOT_READY


class ResponseHead(NamedTuple):
    status_code: int
    headers: Headers  # lower-case names, values stripped, order kept
    http_version: bytes  # b"1.1"
    reason: bytes


class UpstreamConnection:
    """A keep-alive connection; owned by one exchange at a time (the pool hands it out)."""

    __slots__ = (
        "_closed",
        "_deadlines",
        "_expired",
        "_poller",
        "_reader",
        "exchanges",
        "generation",
        "idle_since",
        "origin",
        "response_started",
        "socket",
    )

    def __init__(self, origin: str, sock: socket.socket, generation: int = 0,
                 deadlines: WaitDeadlines | None = None) -> None:
        sock.setblocking(False)
        self.origin = origin
        self.socket = sock
        self.exchanges = 0  # completed exchanges: > 0 means this connection is being reused
        self.idle_since = 0.0
        self.generation = generation  # the pool's per-origin generation when it was opened
        self.response_started = False
        self._reader: ResponseReader | None = None  # the current exchange's response
        self._closed = False
        self._poller = select.poll()  # "readable right now?" without a trio wait
        self._poller.register(sock.fileno(), select.POLLIN)
        self._deadlines = deadlines
        self._expired = False  # the deadline of the current wait passed

    @property
    def closed(self) -> bool:
        return self._closed

    async def send_request(self, method: bytes, target: bytes, headers: Headers,
                           body: bytes) -> None:
        """Send the head and the whole body (``headers`` already carry content-length)."""
        data = request_bytes(method, target, headers, body)  # BadRequest: nothing sent
        self.response_started = False
        await _checkpoint_if_cancelled()
        try:
            sent = self.socket.send(data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            raise self._broken("send", exc) from None
        # built while the worker reads the request (nothing reads the socket before this)
        self._reader = ResponseReader(head_only=method == b"HEAD")
        if sent < len(data):  # the send buffer is full: wait for room for the rest
            await self._send_rest(memoryview(data)[sent:])

    async def _send_rest(self, view: memoryview) -> None:
        sock = self.socket
        try:
            while view:
                await trio.lowlevel.wait_writable(sock)
                try:
                    view = view[sock.send(view):]
                except BlockingIOError:
                    pass
        except (OSError, trio.ClosedResourceError) as exc:
            raise self._broken("send", exc) from None

    async def receive_head(self, timeout_s: float) -> ResponseHead:
        """Wait for the final response head (1xx heads are skipped), ``timeout_s`` in all."""
        reader = self._reader
        assert reader is not None, "send_request first"
        deadlines = self._deadlines  # its ``now`` is trio's clock, read in one frame
        deadline = (_current_time() if deadlines is None else deadlines.now()) + timeout_s
        while not reader.head_done:
            if reader.error is not None:
                raise UpstreamBroken(reader.error, origin=self.origin, phase="head",
                                     response_started=self.response_started)
            if not self._read_now("head"):
                await self._wait(deadline, "head", f"no response head within {timeout_s:g} s")
        return ResponseHead(reader.status, reader.headers, reader.http_version, reader.reason)

    async def receive_body(self, timeout_s: float) -> bytes | None:
        """The next body bytes, ``None`` at the end of the response.

        Bytes already received, or readable right now, are returned without waiting;
        otherwise the wait for the socket is bounded by ``timeout_s`` (the gap between two
        chunks of a stream).
        """
        while True:
            chunk = self.body_now()
            if chunk is not NOT_READY:
                return chunk
            await _checkpoint_if_cancelled()
            if not self._read_now("body"):
                deadlines = self._deadlines
                now = _current_time() if deadlines is None else deadlines.now()
                await self._wait(now + timeout_s, "body",
                                 f"no body bytes for {timeout_s:g} s")

    def body_now(self) -> bytes | None | NotReady:
        """``receive_body`` without I/O: body bytes already received, ``None`` if the response
        ended, ``NOT_READY`` if the socket must be read (or waited for) first."""
        reader = self._reader
        assert reader is not None, "send_request first"
        if reader.has_body:
            return reader.take_body()
        if reader.error is not None:
            raise UpstreamBroken(reader.error, origin=self.origin, phase="body",
                                 response_started=True)
        return None if reader.complete else NOT_READY

    def _read_now(self, phase: Phase) -> bool:
        """One non-blocking read into the reader (EOF included); False if nothing is there."""
        try:
            data = self.socket.recv(RECEIVE_SIZE)
        except BlockingIOError:
            return False
        except OSError as exc:
            raise self._broken(phase, exc) from None
        if data:
            self.response_started = True
        assert self._reader is not None
        self._reader.feed(data)
        return True

    async def _wait(self, deadline: float, phase: Phase, timeout_message: str) -> None:
        """Until the socket is readable; ``UpstreamTimeout`` past ``deadline``."""
        deadlines = self._deadlines
        try:
            if deadlines is None or not deadlines.running:
                with trio.CancelScope(deadline=deadline) as scope:
                    await _wait_readable(self.socket)
                if not scope.cancelled_caught:
                    return
            else:
                self._expired = False
                deadlines.watch(self, deadline)
                try:
                    await _wait_readable(self.socket)
                    return
                except trio.ClosedResourceError:
                    if not self._expired:
                        raise
                finally:
                    deadlines.unwatch(self)
        except (OSError, trio.ClosedResourceError) as exc:
            raise self._broken(phase, exc) from None
        raise UpstreamTimeout(timeout_message, origin=self.origin, phase=phase,
                              response_started=self.response_started)

    def expire(self) -> None:
        """Called by ``WaitDeadlines``: the current wait is over time; wake it."""
        self._expired = True
        trio.lowlevel.notify_closing(self.socket)

    def body_ended(self) -> bool:
        """Whether the response's end was received and no body bytes wait to be taken (no
        I/O): the caller has seen the whole body."""
        reader = self._reader
        return (reader is not None and reader.complete and reader.error is None
                and not reader.has_body)

    def drain_buffered(self) -> bool:
        """Consume body bytes already received, without I/O: did the response end?"""
        reader = self._reader
        if reader is None:
            return False
        reader.take_body()
        return reader.complete and reader.error is None

    def finish_exchange(self) -> bool:
        """After a fully read response: may this connection carry another exchange?"""
        reader = self._reader
        if self._closed or reader is None or not reader.reusable:
            return False
        self._reader = None
        self.exchanges += 1
        return True

    def looks_closed(self) -> bool:
        """An idle connection that is readable has EOF or stray bytes: it cannot be used.

        A non-blocking peek on the idle socket (one ``poll`` call, ~1 µs — and needed: stray
        bytes would otherwise be read as the next response); a connection the worker closes
        after this check is still caught by the pool's single retry.
        """
        return self._closed or bool(self._poller.poll(0))

    def close(self) -> None:
        """Close the socket now (synchronous; idempotent)."""
        if not self._closed:
            self._closed = True
            try:
                trio.lowlevel.notify_closing(self.socket)  # a task blocked on it wakes up
            except RuntimeError:
                pass  # outside trio (no run left to wake anything in)
            self.socket.close()

    def _broken(self, phase: Phase, cause: object) -> UpstreamBroken:
        return UpstreamBroken(str(cause) or type(cause).__name__, origin=self.origin,
                              phase=phase, response_started=self.response_started)


async def open_connection(origin: str, host: str, port: int, timeout_s: float,
                          generation: int = 0,
                          deadlines: WaitDeadlines | None = None) -> UpstreamConnection:
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
        # The connection drives the socket itself: take the descriptor out of trio's wrapper.
        sock = socket.socket(fileno=stream.socket.detach())
        return UpstreamConnection(origin, sock, generation, deadlines)
    assert scope.cancelled_caught
    raise UpstreamConnectError(f"connect timeout after {timeout_s:g} s", origin=origin,
                               phase="connect")
