"""One client connection of the lean HTTP/1.1 server: llhttp (``httptools``) over a trio stream.

A connection runs request/response cycles one after another until either side wants it closed.

Reading a request (the handler only ever sees a complete, checked ``HttpRequest``):

* Deadlines are absolute, so a client dribbling bytes cannot extend them (slowloris). The first
  head must be complete ``header_timeout_s`` after the connection was accepted. Between
  requests an idle keep-alive connection waits at most ``keepalive_idle_s`` for the first byte,
  then is closed quietly; once a byte is in (or pipelined bytes were already buffered), the head
  must be complete within ``header_timeout_s``. The whole body must be in within
  ``body_timeout_s`` of the head. A missed deadline is answered 408 and the connection closed.
* Parsing, limits and what counts as malformed are ``cortex.front.request_parser``'s rules:
  431 for a head over ``max_header_bytes`` or ``max_header_count``, 413 for a body over
  ``max_body_bytes`` (a declared one up front, before any ``100 Continue``), 400 for malformed
  input — counted, never a 500. A client that closes mid-request is simply dropped. Every
  refusal closes the connection after a bounded lingering close, so the client can read the
  answer before the socket goes away. Requests pipelined before a refused one are answered
  first, in order.
* ``Expect: 100-continue`` is answered with ``100 Continue`` just before the body is read.

Running the handler and answering:

* The main task reads the socket itself when it needs bytes: one non-blocking ``recv`` first,
  and ``trio.lowlevel.wait_readable`` only if nothing is there (a request that is already in
  costs one ``recv``, no trip through trio's scheduler and no other task). Once a response
  has run ``limits.client_watch_after_s`` (the server's ``WaitDeadlines`` task keeps that
  deadline: a dict store per request; without that task, at once), and while its handler
  runs or its body streams, a watcher task (one per connection, parked otherwise) reads
  instead, at most one read (64 KiB) ahead of what the main task last asked for, then TCP
  back-pressure holds the client. So pipelined requests wait (parsed, or still in the socket)
  for the next cycle, and a reset — the client is gone — cancels the handler or the body
  streaming (trio ``Cancelled``), as does a write that fails. End of stream alone is not a
  disconnect: a client may half-close after sending its request (``shutdown(SHUT_WR)``,
  legal in HTTP/1.1) and still read the answer, so the request is answered (then the
  connection closes); a client that closed for good is found out by the first write that
  fails (``limits.eof_is_gone`` restores end of stream as gone, for clients known never to
  half-close). The body iterator's ``aclose()`` always runs. When the response is done the watcher is woken
  out of its wait with ``notify_closing`` (no cancel scope) and parks again. A short answer is
  sent before the watcher would start and costs no task switch for it (waking the watcher at
  every response's start cost 8–20% of the server's CPU per request at 64 connections); a
  client that leaves a long one is noticed that much later, which delays cancelling the
  engine's work by as much. (Before: a reader task owned the receiving side all the time —
  two task switches and a hand-off per request.) The cycles share one cancel scope
  (``_serve``), not one per request; a wait for a head or body byte has its own
  (``move_on_at``) only when it has to wait. The idle deadline is kept by the server's
  ``WaitDeadlines`` task (a dict store per wait; it cancels the cycles' scope when the
  deadline passes), not by setting the scope's deadline (~7 µs a request in trio); a
  connection served without that task running falls back to the scope's deadline. A stream
  that is not a socket (memory streams in component tests) is read with ``receive_some``
  instead, the watcher's wait then ended by its own cancel scope.
* ``CortexError`` → ``error_response``; any other exception is a bug: logged on
  ``cortex.front``, counted, answered 500 and the connection closed.
* Writing the response: ``cortex.front.response_writer``.
* With an exchange hook (``cortex.front.exchange``), each request — handled, or refused before
  it could be read — is told to it once when it is over, with its outcome.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING

import trio

from cortex.errors import CortexError
from cortex.front.errors_http import InternalServerError, RequestTimeout, error_response
from cortex.front.exchange import CANCELLED, CLIENT_GONE, ERROR, REFUSED, Exchange, ExchangeHook
from cortex.front.messages import HttpRequest
from cortex.front.request_parser import RequestParser
from cortex.front.response_writer import ResponseWriter
from cortex.front.transport import READ_SIZE, SocketTransport, StreamTransport, transport_for

if TYPE_CHECKING:
    from cortex.front.shared import ServerShared

log = logging.getLogger("cortex.front")

LINGER_S = 2.0  # a refused client gets this long to read the answer before the socket closes
_LINGER_BYTES = 1 << 20
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def _only_cortex_error(exc: Exception) -> CortexError | None:
    """The first leaf of an exception group made only of Cortex errors (a handler's nursery
    wraps what its tasks raise), else None."""
    if not isinstance(exc, BaseExceptionGroup):
        return None
    matched, rest = exc.split(CortexError)
    if matched is None or rest is not None:
        return None
    while isinstance(matched, BaseExceptionGroup):
        matched = matched.exceptions[0]
    return matched


class _Refused(Exception):
    """Internal: the request cannot be read; answer ``error`` (if any) and close."""

    def __init__(self, error: CortexError | None) -> None:
        self.error = error


class _Rescope(Exception):
    """Internal: the idle deadline passed just as a request arrived; serve it in a new scope."""


class _WatchLater:
    """A connection's response deadline in the server's ``WaitDeadlines``: when it passes, the
    watcher starts reading (``client_watch_after_s``)."""

    __slots__ = ("_connection",)

    def __init__(self, connection: HttpConnection) -> None:
        self._connection = connection

    def expire(self) -> None:
        self._connection.start_watching()


class HttpConnection:
    """Serves one accepted stream until it closes; ``run`` never raises for client behaviour.

    ``stream`` is any half-closeable trio stream (a ``SocketStream`` in production, memory
    streams in component tests); ``client`` is the peer address handed to requests."""

    def __init__(self, stream: trio.abc.HalfCloseableStream, shared: ServerShared,
                 client: tuple[str, int] | None = None) -> None:
        self.stream = stream
        self._stream = stream
        self._shared = shared
        self._parser = RequestParser(shared.limits, shared.counters, client)
        self._client = client
        self._opened_at = shared.deadlines.now()
        self._cycles = 0
        self._peer_closed = False
        self._transport: SocketTransport | StreamTransport = transport_for(stream)
        self._writer = ResponseWriter(self._transport, shared)
        self._ahead = 0  # bytes the watcher read since the main task last asked for more
        self._eof = False  # end of stream (or reset) seen
        self._scope = trio.CancelScope()  # the cycles' scope (see _serve)
        self._responding = False  # a handler runs or a response is sent: the watcher reads
        self._parked_watcher: trio.lowlevel.Task | None = None  # waits to be rescheduled
        self._watcher_waiting = False  # the watcher is inside transport.wait()
        self._interrupted = False  # the main task ended the watcher's wait (not a close)
        self._watch_later = _WatchLater(self)  # its key in the server's WaitDeadlines
        # for the exchange hook: REFUSED or ERROR when the handler raised instead of answering
        self._verdict: str | None = None

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch)
                try:
                    await self._serve()
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # reset while we wrote outside a response: nothing to answer
                finally:
                    nursery.cancel_scope.cancel()
        except Exception:
            log.exception("connection from %s failed", self._client)
        finally:
            await trio.aclose_forcefully(self._stream)

    async def _serve(self) -> None:
        """Runs request/response cycles until the connection ends. They run under one cancel
        scope, not one per request: the idle deadline cancels it (through the server's
        ``WaitDeadlines``, or its own deadline set only while the connection waits idle for a
        request), and the watcher cancels it when the client leaves during a response.
        Either ends the connection (after a 408 for a first head that never came), unless a
        request arrived just as the idle deadline passed: a new scope then serves it."""
        while True:
            with trio.CancelScope() as scope:
                self._scope = scope
                try:
                    while await self._cycle():
                        self._cycles += 1
                    return
                except _Rescope:
                    continue
            if self._eof:
                return  # the client left during a response (_respond counted it)
            if self._cycles == 0 and not self._shared.draining:  # the idle deadline passed
                self._shared.counters.header_timeouts += 1
                await self._refuse(RequestTimeout("request head not received in time"))
            return

    def wake_idle(self) -> None:
        """The server drains: an idle connection wakes up and closes (see _feed_idle)."""
        self._scope.cancel()

    def expire(self) -> None:
        """Called by the server's ``WaitDeadlines``: the idle deadline passed (see _serve)."""
        self._scope.cancel()

    def start_watching(self) -> None:
        """The watcher reads from now until the response is done (if it is still going on)."""
        watcher = self._parked_watcher
        if watcher is not None and self._responding:
            self._parked_watcher = None
            trio.lowlevel.reschedule(watcher)

    def _abort_parked_watcher(self, _raise_cancel: object) -> trio.lowlevel.Abort:
        self._parked_watcher = None
        return trio.lowlevel.Abort.SUCCEEDED

    async def _watch(self) -> None:
        """The watcher task: reads while the main task responds, at most ``READ_SIZE`` bytes
        ahead of what the main task asked for, so a client leaving is noticed even while its
        request is handled; parked otherwise."""
        transport = self._transport
        parser = self._parser
        while True:
            while not self._responding or self._ahead >= READ_SIZE:
                self._parked_watcher = trio.lowlevel.current_task()
                await trio.lowlevel.wait_task_rescheduled(self._abort_parked_watcher)
            data = transport.read_now()
            if data is None:
                self._watcher_waiting = True
                try:
                    data = await transport.wait()
                except trio.ClosedResourceError:
                    if not self._interrupted:
                        return  # the stream was closed: the connection ends
                    continue  # the response is done: park (or watch the next one)
                finally:
                    self._watcher_waiting = False
                    self._interrupted = False
                if data is None:
                    continue  # readable (if the response is still going on)
                if not self._responding:
                    transport.unread(data)  # the main task reads again: the bytes are its
                    continue
            if data:
                self._ahead += len(data)
                parser.feed(data)
            else:  # end of stream: no more requests, but the client may still be reading
                self._eof = True
                if transport.reset or self._shared.limits.eof_is_gone:  # gone for good
                    self._peer_closed = True
                    self._scope.cancel()
                return

    async def _cycle(self) -> bool:
        """One request/response; True when the connection may serve another request."""
        parser = self._parser
        if parser.requests:  # already in (pipelined, or arrived while we answered)
            await trio.lowlevel.checkpoint()  # (a fast pipelining client yields to others)
            request, keep_alive = parser.requests.popleft()
        else:
            try:
                pending = await self._read_request()
            except _Refused as refused:
                if refused.error is not None:
                    await self._refuse(refused.error)
                return False
            if pending is None:
                return False
            request, keep_alive = pending
        return await self._respond(request, keep_alive)

    # -- reading ----------------------------------------------------------------------------

    async def _read_request(self) -> tuple[HttpRequest, bool] | None:
        """The next complete request and whether the client keeps the connection after it;
        None if the connection ended quietly; or ``_Refused``."""
        parser = self._parser
        limits = self._shared.limits
        counters = self._shared.counters
        now = self._shared.deadlines.now  # trio's clock
        # Until the first byte of a request is in, the connection is idle: drain() closes it.
        # The first request's head is due header_timeout_s after the accept; a later one may
        # idle keepalive_idle_s, and its head is then due header_timeout_s after its first byte.
        started = parser.in_message
        if self._cycles == 0:
            deadline = self._opened_at + limits.header_timeout_s
        elif started:
            deadline = now() + limits.header_timeout_s
        else:
            deadline = now() + limits.keepalive_idle_s
        body_deadline: float | None = None
        while True:
            if parser.requests:
                return parser.requests.popleft()
            if parser.error is not None:
                raise _Refused(parser.error)
            if self._eof:
                if parser.in_message:
                    raise _Refused(None)  # the client closed mid-request
                return None  # the client closed between requests
            if parser.head_done:
                if body_deadline is None:
                    body_deadline = now() + limits.body_timeout_s
                    if parser.expects_continue and parser.body_bytes == 0:
                        await self._transport.send_all(_CONTINUE)
                if not await self._feed(body_deadline):
                    counters.body_timeouts += 1
                    raise _Refused(RequestTimeout("request body not received in time"))
            elif not parser.in_message:
                if not await self._feed_idle(deadline):
                    return None  # the server drains
            else:
                if not started:
                    started = True
                    if self._cycles > 0:
                        deadline = now() + limits.header_timeout_s
                if not await self._feed(deadline):
                    counters.header_timeouts += 1
                    raise _Refused(RequestTimeout("request head not received in time"))

    def _take(self, data: bytes) -> None:
        self._ahead = 0
        if data:
            self._parser.feed(data)
        else:
            self._eof = True

    async def _wait(self) -> bytes:
        """Waits for bytes (``b""``: end of stream) the main task reads itself."""
        transport = self._transport
        while True:
            data = await transport.wait()
            if data is None:
                data = transport.read_now()
            if data is not None:
                return data

    async def _feed(self, deadline: float) -> bool:
        """Feeds the next bytes (or end of stream) into the parser: one read if something is
        there, else a wait; False when the deadline passed first."""
        data = self._transport.read_now()
        if data is None:
            with trio.move_on_at(deadline):
                data = await self._wait()
            if data is None:
                return False
        self._take(data)
        return True

    async def _feed_idle(self, deadline: float) -> bool:
        """Feeds the first bytes of the next request; False once the server drains (an idle
        connection is closed then). At ``deadline`` (or when drain() wakes it) the cycles'
        scope is cancelled (``_serve`` ends the connection)."""
        shared = self._shared
        if shared.draining:
            # a request the client sent behind the last one (still in the socket when no
            # watcher read it during that response) is answered; nothing more is waited for
            data = self._transport.read_now()
            if not data:
                return False
            self._take(data)
            return True
        data = self._transport.read_now()
        if data is None:
            scope = self._scope
            deadlines = shared.deadlines
            watched = deadlines.running
            if watched:
                deadlines.watch(self, deadline)
            else:
                scope.deadline = deadline
            shared.idle_connections.add(self)
            try:
                data = await self._wait()
            finally:
                if watched:
                    deadlines.unwatch(self)
                else:
                    scope.deadline = math.inf
                shared.idle_connections.discard(self)
            if scope.cancel_called:
                self._take(data)
                raise _Rescope  # woken by bytes, but the deadline passed before we ran
            self._take(data)
        else:
            self._take(data)
            await trio.lowlevel.checkpoint()  # (a client always ahead yields to others)
        return True

    # -- answering --------------------------------------------------------------------------

    async def _respond(self, request: HttpRequest, keep_alive: bool) -> bool:
        shared = self._shared
        shared.counters.requests += 1
        shared.in_flight += 1
        answered = False
        deadlines = shared.deadlines
        watch_after_s = shared.limits.client_watch_after_s
        watch_later = deadlines.running and watch_after_s > 0
        hook = shared.on_exchange
        self._writer.begin()
        if hook is not None:
            started = time.perf_counter()
            self._verdict = None
        if self._eof and (self._transport.reset or shared.limits.eof_is_gone):
            self._scope.cancel()  # the client left before its request was handled
        elif self._eof:  # half-closed after its request: answered, nothing more to read
            keep_alive = False
        else:
            self._responding = True
            if watch_later:
                deadlines.watch(self._watch_later, deadlines.now() + watch_after_s)
            else:
                self.start_watching()
        try:
            keep_alive = await self._handle(request, keep_alive)
            answered = True
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._peer_closed = True  # the client went away while we wrote to it
        finally:
            self._responding = False
            if watch_later:
                deadlines.unwatch(self._watch_later)
            if self._watcher_waiting and not self._interrupted:
                self._interrupted = True
                self._transport.interrupt()  # the main task reads again
            shared.in_flight -= 1
            gone = not answered and (self._peer_closed or self._eof)
            if gone:
                shared.counters.client_gone += 1
            if hook is not None:
                outcome = ((self._verdict or self._writer.ending) if answered
                           else CLIENT_GONE if gone else CANCELLED)
                self._tell(hook, request, started, outcome)
        if not answered:
            return False
        # While draining, a request already sent behind this one (parsed, or still in the
        # socket) is still answered (with connection: close); an idle wait for a new one ends
        # at once (_feed_idle).
        return keep_alive

    async def _handle(self, request: HttpRequest, keep_alive: bool) -> bool:
        """Runs the handler and sends its response; True if the connection may be kept."""
        try:
            response = await self._shared.handler(request)
        except CortexError as exc:
            self._shared.counters.count_bad_request(exc)
            response = error_response(exc)
            self._verdict = REFUSED
        except Exception as exc:
            cortex_error = _only_cortex_error(exc)
            if cortex_error is not None:
                self._shared.counters.count_bad_request(cortex_error)
                response = error_response(cortex_error)
                self._verdict = REFUSED
            else:
                log.exception("handler failed on %s %s", request.method.decode("latin-1"),
                              request.path.decode("latin-1", "replace"))
                self._shared.counters.handler_errors += 1
                response = error_response(InternalServerError())
                self._verdict = ERROR
                keep_alive = False
        return await self._writer.send(request, response,
                                       close=not keep_alive or self._shared.draining)

    def _tell(self, hook: ExchangeHook, request: HttpRequest | None, started: float,
              outcome: str) -> None:
        """Hands the exchange hook what ``request`` came to (``cortex.front.exchange``)."""
        writer = self._writer
        try:
            hook(Exchange(request, self._client, writer.status, writer.headers,
                          writer.body_bytes, outcome, started, writer.head_at,
                          time.perf_counter()))
        except Exception:
            log.exception("the exchange hook failed")
            self._shared.counters.handler_errors += 1

    async def _refuse(self, error: CortexError) -> None:
        """Answers a request that could not be read, then closes gracefully (bounded)."""
        hook = self._shared.on_exchange
        writer = self._writer
        writer.begin()
        started = time.perf_counter()
        with trio.move_on_after(LINGER_S):
            try:
                try:
                    await writer.send_error_and_close(error)
                finally:
                    if hook is not None:
                        self._tell(hook, None, started, writer.ending)
                await self._stream.send_eof()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            # Lingering close: drop what the client still sends (up to a bound), so closing
            # with unread bytes does not reset the connection before the client read the
            # answer.
            dropped = 0
            transport = self._transport
            while not self._eof and dropped <= _LINGER_BYTES:
                data = transport.read_now()
                if data is None:
                    data = await self._wait()
                if not data:
                    return
                dropped += len(data)
