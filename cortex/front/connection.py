"""One client connection of the lean HTTP/1.1 server: h11 over a trio stream.

A connection runs request/response cycles one after another until either side wants it closed.

Reading a request (the handler only ever sees a complete, checked ``HttpRequest``):

* Deadlines are absolute, so a client dribbling bytes cannot extend them (slowloris). The first
  head must be complete ``header_timeout_s`` after the connection was accepted. Between
  requests an idle keep-alive connection waits at most ``keepalive_idle_s`` for the first byte,
  then is closed quietly; once a byte is in (or pipelined bytes were already buffered), the head
  must be complete within ``header_timeout_s``. The whole body must be in within
  ``body_timeout_s`` of the head. A missed deadline is answered 408 and the connection closed.
* The head is bounded by ``max_header_bytes`` (h11's incomplete-event limit, and the size of
  the parsed head) and ``max_header_count``: 431 and close. A declared ``content-length`` above
  ``max_body_bytes`` is refused up front with 413 (no ``100 Continue`` is sent); a chunked body
  is counted as it arrives and refused the moment it passes the limit.
* Malformed input (h11's ``RemoteProtocolError``) is answered with h11's status hint (400) and
  the connection closed; it is counted, never a 500. A client that closes mid-request is simply
  dropped. Every refusal closes the connection after a bounded lingering close, so the client
  can read the answer before the socket goes away.
* ``Expect: 100-continue`` is answered with ``100 Continue`` just before the body is read.

Running the handler and answering:

* One reader task per connection owns the receiving side for the connection's whole life: it
  feeds h11 and wakes the main task (which parses, runs the handler and writes). It stays at
  most one read (64 KiB) ahead of what the main task asked for, then TCP back-pressure holds
  the client. So while the handler runs and the response is sent, pipelined bytes wait in
  h11's buffer for the next cycle, and end of stream or a reset — the client is gone — cancels
  the handler or the body streaming (trio ``Cancelled``). A client that half-closes counts as
  gone. The body iterator's ``aclose()`` always runs. (A reader per connection rather than a
  watcher task per request: ~25% less server CPU per request on a trivial response.)
* ``CortexError`` → ``error_response``; any other exception is a bug: logged on
  ``cortex.front``, counted, answered 500 and the connection closed.
* A ``bytes`` body goes out with the head in one write, with ``content-length``. An iterator
  body is written chunk by chunk (chunked, or close-delimited for HTTP/1.0, unless the handler
  set ``content-length``); each chunk is written before the next is awaited. A chunked head
  goes out at once (an SSE client sees it before the first event); a ``content-length`` head
  waits for the first chunk and shares its write. If the iterator raises after the head went
  out, the connection is closed without the terminating chunk; before (a held head), the
  client gets the error's JSON answer instead.
* Response heads follow ``cortex.front.response_head`` (server-owned ``date`` and ``server``,
  no hop-by-hop headers). While the server drains, every answer carries ``connection: close``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import h11
import trio

from cortex.errors import BadRequest, CortexError, PayloadTooLarge
from cortex.front.errors_http import (
    HeaderFieldsTooLarge,
    InternalServerError,
    RequestTimeout,
    error_response,
)
from cortex.front.messages import Headers, HttpRequest, HttpResponse
from cortex.front.response_head import NO_BODY_STATUS, REASONS, response_headers

if TYPE_CHECKING:
    from cortex.front.server import ServerShared

log = logging.getLogger("cortex.front")

READ_SIZE = 65_536
LINGER_S = 2.0  # a refused client gets this long to read the answer before the socket closes
_LINGER_BYTES = 1 << 20

def _head(status: int, headers: Headers) -> h11.Response:
    return h11.Response(status_code=status, headers=headers, reason=REASONS.get(status, b""))


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


class HttpConnection:
    """Serves one accepted stream until it closes; ``run`` never raises for client behaviour.

    ``stream`` is any half-closeable trio stream (a ``SocketStream`` in production, memory
    streams in component tests); ``client`` is the peer address handed to requests."""

    def __init__(self, stream: trio.abc.HalfCloseableStream, shared: ServerShared,
                 client: tuple[str, int] | None = None) -> None:
        self.stream = stream
        self._stream = stream
        self._shared = shared
        self._h11 = h11.Connection(h11.SERVER,
                                   max_incomplete_event_size=shared.limits.max_header_bytes)
        self._client = client
        self._opened_at = trio.current_time()
        self._cycles = 0
        self._peer_closed = False
        # The reader task owns the receiving side: it feeds h11 and wakes the main task.
        self._data_lot = trio.lowlevel.ParkingLot()  # the main task waits here for bytes
        self._reader_lot = trio.lowlevel.ParkingLot()  # the reader waits here when ahead
        self._unasked = 0  # bytes fed since the main task last asked for more
        self._eof = False  # end of stream (or reset) fed to h11
        self._discard = False  # lingering close: drop what arrives
        self._respond_scope: trio.CancelScope | None = None  # cancelled if the client leaves

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_stream)
                try:
                    while await self._cycle():
                        self._h11.start_next_cycle()
                        self._cycles += 1
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # reset while we wrote outside a response: nothing to answer
                finally:
                    nursery.cancel_scope.cancel()
        except Exception:
            log.exception("connection from %s failed", self._client)
        finally:
            await trio.aclose_forcefully(self._stream)

    async def _read_stream(self) -> None:
        """The reader task: keeps at most ``READ_SIZE`` bytes ahead of what the main task
        asked for, so a client leaving is noticed even while its request is handled."""
        stream = self._stream
        while True:
            while self._unasked >= READ_SIZE and not self._discard:
                await self._reader_lot.park()
            try:
                data = await stream.receive_some(READ_SIZE)
            except trio.BrokenResourceError:
                data = b""
            except trio.ClosedResourceError:
                return
            if self._discard:
                self._unasked += len(data)
                if not data or self._unasked > _LINGER_BYTES:
                    self._eof = True
                    self._data_lot.unpark_all()
                    return
                continue
            self._h11.receive_data(data)
            if data:
                self._unasked += len(data)
            else:
                self._eof = True
                if self._respond_scope is not None:
                    self._peer_closed = True
                    self._respond_scope.cancel()
            self._data_lot.unpark_all()
            if not data:
                return

    async def _cycle(self) -> bool:
        """One request/response; True when the connection may serve another request."""
        try:
            request = await self._read_request()
        except _Refused as refused:
            if refused.error is not None:
                await self._refuse(refused.error)
            return False
        if request is None:
            return False
        return await self._respond(request)

    # -- reading ----------------------------------------------------------------------------

    async def _read_request(self) -> HttpRequest | None:
        """The next complete request, None if the connection ended quietly, or ``_Refused``."""
        conn = self._h11
        limits = self._shared.limits
        counters = self._shared.counters
        # Until the first byte of a request is in, the connection is idle: drain() closes it.
        # The first request's head is due header_timeout_s after the accept; a later one may
        # idle keepalive_idle_s, and its head is then due header_timeout_s after its first byte.
        waiting = not conn.trailing_data[0]
        if self._cycles == 0:
            deadline = self._opened_at + limits.header_timeout_s
        elif waiting:
            deadline = trio.current_time() + limits.keepalive_idle_s
        else:
            deadline = trio.current_time() + limits.header_timeout_s
        while True:
            event = self._next_event()
            if event is h11.NEED_DATA:
                if waiting:
                    if not await self._wait_idle(deadline):
                        if self._cycles == 0 and not self._shared.draining:
                            counters.header_timeouts += 1
                            raise _Refused(RequestTimeout("request head not received in time"))
                        return None
                    waiting = False
                    if self._cycles > 0:
                        deadline = trio.current_time() + limits.header_timeout_s
                elif not await self._wait_data(deadline):
                    counters.header_timeouts += 1
                    raise _Refused(RequestTimeout("request head not received in time"))
            elif type(event) is h11.Request:
                break
            else:  # ConnectionClosed: the client closed between requests
                return None

        headers = list(event.headers)
        if len(headers) > limits.max_header_count:
            counters.too_large += 1
            raise _Refused(HeaderFieldsTooLarge(
                f"more than {limits.max_header_count} request headers"))
        head_bytes = len(event.method) + len(event.target) + 12 + sum(
            len(name) + len(value) + 4 for name, value in headers)
        if head_bytes > limits.max_header_bytes:
            counters.too_large += 1
            raise _Refused(HeaderFieldsTooLarge(
                f"request head larger than {limits.max_header_bytes} bytes"))
        body = await self._read_body(headers)
        return HttpRequest(event.method, event.target, headers, body, self._client,
                           event.http_version)

    async def _read_body(self, headers: Headers) -> bytes:
        conn = self._h11
        limits = self._shared.limits
        counters = self._shared.counters
        for name, value in headers:
            if name == b"content-length" and int(value) > limits.max_body_bytes:
                counters.too_large += 1
                raise _Refused(PayloadTooLarge(
                    f"request body larger than {limits.max_body_bytes} bytes"))
        event = self._next_event()
        if type(event) is h11.EndOfMessage:
            return b""
        if conn.they_are_waiting_for_100_continue:
            await self._stream.send_all(
                conn.send(h11.InformationalResponse(status_code=100, headers=[])))
        deadline = trio.current_time() + limits.body_timeout_s
        parts: list[bytes] = []
        size = 0
        while True:
            if event is h11.NEED_DATA:
                if not await self._wait_data(deadline):
                    counters.body_timeouts += 1
                    raise _Refused(RequestTimeout("request body not received in time"))
            elif type(event) is h11.Data:
                size += len(event.data)
                if size > limits.max_body_bytes:
                    counters.too_large += 1
                    raise _Refused(PayloadTooLarge(
                        f"request body larger than {limits.max_body_bytes} bytes"))
                parts.append(event.data)
            elif type(event) is h11.EndOfMessage:
                return parts[0] if len(parts) == 1 else b"".join(parts)
            event = self._next_event()

    def _next_event(self) -> object:
        try:
            return self._h11.next_event()
        except h11.RemoteProtocolError as exc:
            if self._h11.trailing_data[1]:
                raise _Refused(None) from None  # the client closed mid-request
            counters = self._shared.counters
            if exc.error_status_hint == 431:  # h11's limit on an incomplete head
                counters.too_large += 1
                raise _Refused(HeaderFieldsTooLarge(
                    f"request head larger than {self._shared.limits.max_header_bytes} bytes")
                ) from None
            counters.bad_requests += 1
            raise _Refused(BadRequest(f"malformed request: {exc}")) from None

    async def _wait_data(self, deadline: float) -> bool:
        """Waits for the reader to feed more bytes (or end of stream) into h11; False when
        the deadline passed first."""
        if self._eof:
            return True  # h11 knows; its next event says what it means
        self._unasked = 0
        self._reader_lot.unpark_all()
        with trio.move_on_at(deadline):
            await self._data_lot.park()
            return True
        return False

    async def _wait_idle(self, deadline: float) -> bool:
        """Waits for the first bytes of the next request; False after the idle deadline or
        once the server drains (an idle connection is closed then)."""
        shared = self._shared
        if shared.draining:
            return False
        with trio.CancelScope(deadline=deadline) as scope:
            shared.idle_scopes.add(scope)
            try:
                return await self._wait_data(math.inf)
            finally:
                shared.idle_scopes.discard(scope)
        return False

    # -- answering --------------------------------------------------------------------------

    async def _respond(self, request: HttpRequest) -> bool:
        shared = self._shared
        shared.counters.requests += 1
        shared.in_flight += 1
        keep_alive = False
        answered = False
        try:
            with trio.CancelScope() as scope:
                self._respond_scope = scope
                if self._eof:
                    scope.cancel()  # the client left before its request was handled
                try:
                    keep_alive = await self._handle(request)
                    answered = True
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self._peer_closed = True  # the client went away while we wrote to it
        finally:
            self._respond_scope = None
            shared.in_flight -= 1
        if not answered:
            if self._peer_closed or self._eof:
                shared.counters.client_gone += 1
            return False
        # While draining, a request already buffered behind this one is still answered (with
        # connection: close); an idle wait for a new one ends at once (_wait_idle).
        return keep_alive and self._h11.our_state is h11.DONE

    async def _handle(self, request: HttpRequest) -> bool:
        """Runs the handler and sends its response; True if the connection may be kept."""
        keep_alive = True
        try:
            response = await self._shared.handler(request)
        except CortexError as exc:
            response = error_response(exc)
        except Exception as exc:
            cortex_error = _only_cortex_error(exc)
            if cortex_error is not None:
                return await self._send_response(request, error_response(cortex_error), True)
            log.exception("handler failed on %s %s", request.method.decode("latin-1"),
                          request.path.decode("latin-1", "replace"))
            self._shared.counters.handler_errors += 1
            response = error_response(InternalServerError())
            keep_alive = False
        return await self._send_response(request, response, keep_alive) and keep_alive

    async def _send_response(self, request: HttpRequest, response: HttpResponse,
                             keep_alive: bool) -> bool:
        body = response.body
        close = not keep_alive or self._shared.draining
        no_body = request.method == b"HEAD" or response.status in NO_BODY_STATUS
        if isinstance(body, (bytes, bytearray, memoryview)):
            headers = self._response_headers(response, close, len(body))
            try:
                data = self._h11.send(_head(response.status, headers))
                if body and not no_body:
                    data += self._h11.send(h11.Data(data=body))
                data += self._h11.send(h11.EndOfMessage())
            except h11.LocalProtocolError:
                return await self._handler_bug(request, "unsendable response")
            self._shared.counters.count_status(response.status)
            await self._stream.send_all(data)
            return True
        return await self._stream_body(request, response, body, close, no_body)

    async def _stream_body(self, request: HttpRequest, response: HttpResponse,
                           body: AsyncIterator[bytes], close: bool, no_body: bool) -> bool:
        """Streams an iterator body. With a handler-set ``content-length`` the head waits for
        the first chunk and goes out with it in one write (a proxied JSON answer is then one
        send, as for a ``bytes`` body); a chunked stream (SSE) gets its head at once."""
        conn = self._h11
        try:
            headers = self._response_headers(response, close, None)
            try:
                head_event = _head(response.status, headers)
            except h11.LocalProtocolError:
                return await self._handler_bug(request, "unsendable response head")
            held = no_body is False and any(
                name == b"content-length" for name, _ in headers)
            if not held:
                self._shared.counters.count_status(response.status)
                await self._stream.send_all(conn.send(head_event))
            if not no_body:
                chunks = body.__aiter__()
                while True:
                    try:
                        chunk = await chunks.__anext__()
                    except StopAsyncIteration:
                        break
                    except CortexError as exc:
                        if held:  # nothing sent yet: the client gets a proper error
                            return await self._send_error_and_close(exc)
                        log.warning("response body of %s failed after the head: %r",
                                    request.path.decode("latin-1", "replace"), exc)
                        return False
                    except Exception:
                        return await self._handler_bug(request, "response body failed")
                    if not chunk:
                        continue
                    data = b""
                    if held:
                        held = False
                        self._shared.counters.count_status(response.status)
                        data = conn.send(head_event)
                    try:
                        data += conn.send(h11.Data(data=chunk))
                    except h11.LocalProtocolError:
                        return await self._handler_bug(request, "body exceeds content-length")
                    await self._stream.send_all(data)
            data = b""
            if held:
                self._shared.counters.count_status(response.status)
                data = conn.send(head_event)
            try:
                data += conn.send(h11.EndOfMessage())
            except h11.LocalProtocolError:
                return await self._handler_bug(request, "body shorter than content-length")
            if data:
                await self._stream.send_all(data)
            return True
        finally:
            aclose = getattr(body, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _send_error_and_close(self, error: CortexError) -> bool:
        """Answers ``error`` instead of the response whose head was not sent; closes after."""
        conn = self._h11
        response = error_response(error)
        headers = self._response_headers(response, True, len(response.body))
        data = conn.send(_head(response.status, headers))
        data += conn.send(h11.Data(data=response.body)) + conn.send(h11.EndOfMessage())
        self._shared.counters.count_status(response.status)
        await self._stream.send_all(data)
        return False

    async def _handler_bug(self, request: HttpRequest, what: str) -> bool:
        """Logs and counts a response the handler got wrong; answers 500 if no head went out.
        The connection is closed afterwards (returns False)."""
        log.exception("%s on %s %s", what, request.method.decode("latin-1"),
                      request.path.decode("latin-1", "replace"))
        self._shared.counters.handler_errors += 1
        if self._h11.our_state is h11.SEND_RESPONSE:
            return await self._send_error_and_close(InternalServerError())
        return False

    def _response_headers(self, response: HttpResponse, close: bool,
                          length: int | None) -> Headers:
        return response_headers(response.status, response.headers, self._shared.server_header,
                                close, length)

    async def _refuse(self, error: CortexError) -> None:
        """Answers a request that could not be read, then closes gracefully (bounded)."""
        conn = self._h11
        response = error_response(error)
        with trio.move_on_after(LINGER_S):
            self._discard = True
            self._reader_lot.unpark_all()
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                headers = self._response_headers(response, True, len(response.body))
                data = conn.send(_head(response.status, headers))
                data += conn.send(h11.Data(data=response.body))
                data += conn.send(h11.EndOfMessage())
                self._shared.counters.count_status(response.status)
                try:
                    await self._stream.send_all(data)
                    await self._stream.send_eof()
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
            # Lingering close: the reader drops what the client still sends (up to a bound),
            # so closing with unread bytes does not reset the connection before the client
            # read the answer.
            while not self._eof:
                await self._data_lot.park()
