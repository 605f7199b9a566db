"""Writing one response of the lean HTTP/1.1 server onto a client connection.

* A ``bytes`` body goes out with the head in one write (one ``send_all``), with
  ``content-length``. An iterator body is written chunk by chunk (chunked, or close-delimited
  for HTTP/1.0, unless the handler set ``content-length``); each chunk is written before the
  next is awaited. A chunked head goes out at once (an SSE client sees it before the first
  event), with the body's first chunk when the body already holds it (``chunk_ready``); a
  ``content-length`` head waits for the first chunk and shares its write. If the
  iterator raises after the head went out, the connection is closed without the terminating
  chunk; before (a held head), the client gets the error's JSON answer instead. A handler's
  ``content-length`` must match the bytes it yields: a mismatch is a handler bug (500 if the
  head was still held, else the connection is closed).
* Response heads follow ``cortex.front.response_head`` (server-owned ``date`` and ``server``,
  no hop-by-hop headers); one the handler got wrong (``UnsendableResponse``) is a logged 500.
  A response carrying ``connection: close`` — asked by the client (``connection: close``,
  HTTP/1.0), after a handler bug, or while the server drains — ends the connection.
* ``after_sent`` (``cortex.front.messages``) runs once the response is written or its writing
  failed; one that raises is logged on ``cortex.front`` and counted as a handler error.
* What the response came to stays readable until the next ``begin()`` (for the exchange
  record, ``cortex.front.exchange``; the connection calls ``begin`` before it runs the
  handler, so a handler cancelled before any answer shows nothing sent): the handler's
  response ``headers``, ``status`` and ``head_at`` of the head that went out (``None``
  before), ``body_bytes`` written, ``ending`` (``complete``, ``upstream_broke``, ``refused``
  for ``send_error_and_close``, ``error`` for a handler bug; ``client_gone`` while the write
  was still going on when it raised).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from cortex.errors import CortexError
from cortex.front.errors_http import InternalServerError, error_response
from cortex.front.exchange import CLIENT_GONE, COMPLETE, ERROR, REFUSED, UPSTREAM_BROKE
from cortex.front.messages import Headers, HttpRequest, HttpResponse
from cortex.front.response_head import NO_BODY_STATUS, UnsendableResponse, response_head
from cortex.front.transport import SocketTransport, StreamTransport

if TYPE_CHECKING:
    from cortex.front.shared import ServerShared

log = logging.getLogger("cortex.front")

_LAST_CHUNK = b"0\r\n\r\n"


class ResponseWriter:
    """Writes the responses of one connection (the connection decides when)."""

    __slots__ = ("_send", "_shared", "body_bytes", "ending", "head_at", "headers", "status")

    def __init__(self, transport: SocketTransport | StreamTransport,
                 shared: ServerShared) -> None:
        self._send = transport.send_all
        self._shared = shared
        self.headers: Headers = []
        self.status: int | None = None
        self.head_at: float | None = None
        self.body_bytes = 0
        self.ending = COMPLETE

    async def send(self, request: HttpRequest, response: HttpResponse, *, close: bool) -> bool:
        """Writes ``response`` (after ``begin``); True if the connection may serve another
        request."""
        body = response.body
        self.headers = response.headers
        try:
            if isinstance(body, (bytes, bytearray, memoryview)):
                return await self._send_whole(request, response, body, close)
            return await self._stream_body(request, response, body, close)
        finally:
            if response.after_sent is not None:
                self._run_after_sent(request, response.after_sent)

    def begin(self) -> None:
        """A response starts: nothing went out yet."""
        self.headers = []
        self.status = self.head_at = None
        self.body_bytes = 0
        self.ending = CLIENT_GONE  # until a way out says otherwise

    def _head_out(self, status: int) -> None:
        """The head of ``status`` goes out now."""
        self._shared.counters.count_status(status)
        self.status = status
        self.head_at = time.perf_counter()

    def _run_after_sent(self, request: HttpRequest, after_sent: Callable[[], None]) -> None:
        try:
            after_sent()
        except Exception:
            log.exception("after_sent of %s %s failed", request.method.decode("latin-1"),
                          request.path.decode("latin-1", "replace"))
            self._shared.counters.handler_errors += 1

    async def _send_whole(self, request: HttpRequest, response: HttpResponse,
                          body: bytes | bytearray | memoryview, close: bool) -> bool:
        """Head and body in one write."""
        status = response.status
        try:
            head = response_head(status, response.headers, self._shared.server_header, close,
                                 len(body))[0]
        except UnsendableResponse:
            return await self._handler_bug(request, "unsendable response", head_sent=False)
        self._head_out(status)
        if body and request.method != b"HEAD" and status not in NO_BODY_STATUS:
            await self._send(head + body)
            self.body_bytes = len(body)
        else:
            await self._send(head)
        self.ending = COMPLETE
        return not close

    async def _stream_body(self, request: HttpRequest, response: HttpResponse,
                           body: AsyncIterator[bytes], close: bool) -> bool:
        """Streams an iterator body. With a handler-set ``content-length`` the head waits for
        the first chunk and goes out with it in one write (a proxied JSON answer is then one
        send, as for a ``bytes`` body); a chunked stream (SSE) gets its head at once."""
        held = False
        try:
            status = response.status
            no_body = request.method == b"HEAD" or status in NO_BODY_STATUS
            try:
                # without content-length: chunked for HTTP/1.1, else close-delimited (an
                # HTTP/1.0 client never keeps the connection)
                head, length, chunked = response_head(
                    status, response.headers, self._shared.server_header, close, None,
                    chunked_ok=request.http_version == b"1.1")
            except UnsendableResponse:
                return await self._handler_bug(request, "unsendable response head",
                                               head_sent=False)
            held = length is not None and not no_body
            sent = 0
            if not held:
                try:
                    ready = None if no_body else _chunk_ready(body)
                except Exception:  # noqa: BLE001 (any failure of the body is a handler bug)
                    return await self._handler_bug(request, "response body failed",
                                                   head_sent=False)
                self._head_out(status)
                if ready:
                    sent = len(ready)
                    head += _chunk_frame(ready) if chunked else ready
                await self._send(head)
                self.body_bytes = sent
            if no_body:
                self.ending = COMPLETE
                return not close
            chunks = body.__aiter__()
            while True:
                try:
                    chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    break
                except CortexError as exc:
                    if held:  # nothing sent yet: the client gets a proper error
                        await self.send_error_and_close(exc)
                        self.ending = UPSTREAM_BROKE
                        return False
                    log.warning("response body of %s failed after the head: %r",
                                request.path.decode("latin-1", "replace"), exc)
                    self.ending = UPSTREAM_BROKE
                    return False
                except Exception:  # noqa: BLE001 (any failure of the body is a handler bug)
                    return await self._handler_bug(request, "response body failed",
                                                   head_sent=not held)
                if not chunk:
                    continue
                sent += len(chunk)
                if chunked:
                    data = _chunk_frame(chunk)
                elif length is not None and sent > length:
                    return await self._handler_bug(request, "body exceeds content-length",
                                                   head_sent=not held)
                else:
                    data = chunk
                if held:
                    held = False
                    self._head_out(status)
                    data = head + data
                await self._send(data)
                self.body_bytes = sent
            if length is not None and sent < length:
                return await self._handler_bug(request, "body shorter than content-length",
                                               head_sent=not held)
            if held:  # an empty body with content-length: 0
                self._head_out(status)
                await self._send(head)
            elif chunked:
                await self._send(_LAST_CHUNK)
            self.ending = COMPLETE
            return not close and (chunked or length is not None)
        finally:
            aclose = getattr(body, "aclose", None)
            if aclose is not None:
                await aclose()

    async def send_error_and_close(self, error: CortexError) -> bool:
        """Answers ``error`` instead of the response whose head was not sent; closes after."""
        response = error_response(error)
        head = response_head(response.status, response.headers, self._shared.server_header,
                             True, len(response.body))[0]
        self._head_out(response.status)
        await self._send(head + response.body)
        self.body_bytes = len(response.body)
        self.ending = REFUSED
        return False

    async def _handler_bug(self, request: HttpRequest, what: str, *, head_sent: bool) -> bool:
        """Logs and counts a response the handler got wrong; answers 500 if no head went out.
        The connection is closed afterwards (returns False)."""
        log.error("%s on %s %s", what, request.method.decode("latin-1"),
                  request.path.decode("latin-1", "replace"),
                  exc_info=sys.exc_info()[0] is not None)
        self._shared.counters.handler_errors += 1
        if not head_sent:
            await self.send_error_and_close(InternalServerError())
        self.ending = ERROR
        return False


def _chunk_frame(chunk: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(chunk), chunk)


def _chunk_ready(body: AsyncIterator[bytes]) -> bytes | None:
    """The chunk ``body`` already holds (``chunk_ready``, ``cortex.front.messages``), if any."""
    ready = getattr(body, "chunk_ready", None)
    return None if ready is None else ready()
