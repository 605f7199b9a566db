"""One worker response read from raw bytes: llhttp (``httptools``) plus the exchange's rules.

Sans-IO: ``feed(data)`` with the bytes received (``b""`` for EOF); the head, the body bytes and
the end appear on the object. One ``ResponseReader`` per exchange (a new one for the next
response on the same connection), so nothing of one exchange can leak into the next.

Rules:

* Interim ``1xx`` heads are skipped; the first final head fills ``status``, ``headers``
  (names lower-cased, values without surrounding blanks, order kept), ``http_version``
  (``b"1.1"``) and ``reason``. A ``101`` (no upgrade was asked for) is a protocol error.
* The body is framed as llhttp frames it: ``transfer-encoding: chunked`` (de-chunked),
  ``content-length``, or — neither — until the worker closes (then EOF is the end, and the
  connection is not reusable). A response to ``HEAD``, a ``204`` and a ``304`` have no body:
  the response ends with its head.
* ``take_body()`` hands over the body bytes received so far, joined, in order, exactly once.
* ``complete`` turns true at the end of the response. ``reusable`` is true only when the
  response is complete, both sides allowed keep-alive (llhttp's rule: HTTP/1.1 without
  ``connection: close``, HTTP/1.0 only with ``keep-alive``; never for a read-until-close
  body) and nothing else arrived — no EOF, no byte past the end.
* ``error`` is set (a message) when the bytes break HTTP, EOF cuts the response short, or the
  head grows past ``MAX_HEAD_BYTES``. Body bytes received before the fault are still handed
  out first; the reader accepts nothing more. Bytes past the end of a complete response
  never make an error: they only make the connection unusable.
* llhttp holds the reader's callbacks, so reader and parser form a reference cycle: the
  parser is dropped as soon as the response ends (complete, error or EOF), and a finished
  reader is freed by reference counting, not left to the cyclic collector (one cycle per
  exchange made it run ~every 70 requests).
* The head limit: ``MAX_HEAD_BYTES`` of response before the final head is complete (interim
  heads included), like h11's 16 KiB bound on an incomplete event.
* A response that arrives whole in the first read (a JSON answer), plain and framed by
  ``content-length``, is read in one compiled pass (``cortex._fast.http_response``,
  property-tested to read exactly what llhttp reads here); llhttp's parser is made only for
  anything else, on the first byte that needs it.
"""

from __future__ import annotations

import httptools

from cortex._fast.http_response import parse_response

MAX_HEAD_BYTES = 64 * 1024
_NO_BODY_STATUSES = frozenset({204, 304})
_PARSER_ERRORS = (httptools.HttpParserError, httptools.HttpParserUpgrade)


class ResponseReader:
    """The response to one request (``head_only`` for a ``HEAD``); feed it raw bytes."""

    __slots__ = (
        "_body",
        "_compiled",
        "_eof",
        "_head_bytes",
        "_head_done",
        "_head_only",
        "_keep_alive",
        "_parser",
        "_pending_headers",
        "_stray",
        "_until_eof",
        "complete",
        "error",
        "headers",
        "http_version",
        "reason",
        "status",
    )

    def __init__(self, *, head_only: bool = False, compiled: bool = True) -> None:
        """``compiled=False``: every byte through llhttp (the compiled pass's reference)."""
        self.status = 0  # 0 until the final head is complete
        self.headers: list[tuple[bytes, bytes]] = []
        self.http_version = b""
        self.reason = b""
        self.complete = False
        self.error: str | None = None
        self._parser: httptools.HttpResponseParser | None = None  # made when first needed
        self._compiled = compiled and not head_only
        self._body: list[bytes] = []
        self._head_only = head_only
        self._head_done = False
        self._keep_alive = False
        self._until_eof = False
        self._stray = False  # bytes or EOF past the end of the response
        self._eof = False
        self._head_bytes = 0
        self._pending_headers: list[tuple[bytes, bytes]] = []

    @property
    def head_done(self) -> bool:
        return self._head_done

    @property
    def reusable(self) -> bool:
        return (self.complete and self._keep_alive and not self._stray and not self._eof
                and self.error is None)

    @property
    def has_body(self) -> bool:
        """Body bytes are waiting in ``take_body``."""
        return bool(self._body)

    def take_body(self) -> bytes:
        """The body bytes received since the last call (``b""`` if none)."""
        body = self._body
        if not body:
            return b""
        self._body = []
        return body[0] if len(body) == 1 else b"".join(body)

    def feed(self, data: bytes) -> None:
        """Bytes received from the worker; ``b""`` means the worker closed the connection."""
        if self.error is not None or self._eof:
            return
        if not data:
            self._on_eof()
            return
        if self.complete:
            self._stray = True  # not part of this response: the connection cannot be reused
            return
        if not self._head_done:
            if self._compiled and self._head_bytes == 0 and type(data) is bytes:
                whole = parse_response(data)
                if whole is not None:
                    self.status, self.reason, self.headers, body, self._keep_alive = whole
                    self.http_version = b"1.1"
                    if body:
                        self._body.append(body)
                    self._head_done = self.complete = True
                    return
            self._head_bytes += len(data)
        parser = self._parser
        if parser is None:  # (not complete, no error, no EOF: none was needed yet)
            parser = self._parser = httptools.HttpResponseParser(self)
        try:
            parser.feed_data(data)
        except _PARSER_ERRORS as exc:
            if self.complete:
                self._stray = True
            else:
                self.error = f"invalid HTTP from the worker: {exc}" if str(exc) else (
                    f"invalid HTTP from the worker ({type(exc).__name__})")
            self._parser = None
            return
        if self.complete:
            self._parser = None
        elif not self._head_done and self._head_bytes > MAX_HEAD_BYTES:
            self.error = f"response head larger than {MAX_HEAD_BYTES} bytes"
            self._parser = None

    def _on_eof(self) -> None:
        self._eof = True
        self._parser = None
        if self.complete:
            return
        if self._head_done and self._until_eof:
            self.complete = True  # the worker's close is the end of this body
        else:
            self.error = "connection closed"

    # -- llhttp callbacks (they must not raise) ---------------------------------------------

    def on_message_begin(self) -> None:
        if self.complete:
            self._stray = True  # a second response: not one this exchange asked for

    def on_status(self, reason: bytes) -> None:
        self.reason += reason  # a status line split across reads arrives in pieces

    def on_header(self, name: bytes, value: bytes) -> None:
        self._pending_headers.append((name.lower(), value.strip(b" \t")))

    def on_headers_complete(self) -> None:
        parser = self._parser
        status = parser.get_status_code()
        headers, self._pending_headers = self._pending_headers, []
        if status < 200:
            self.reason = b""  # an interim head: forgotten (a 101 fails as an upgrade)
            return
        if self.complete:
            return  # the head of a stray second response
        self.status = status
        self.headers = headers
        self.http_version = parser.get_http_version().encode("ascii")
        self._head_done = True
        no_body = self._head_only or status in _NO_BODY_STATUSES
        self._keep_alive = parser.should_keep_alive() or (
            # llhttp cannot be told that a HEAD response has no body: without a
            # content-length it would wait for EOF and refuse keep-alive
            self._head_only and _keeps_alive(headers, self.http_version))
        if no_body:
            self.complete = True
        else:
            self._until_eof = _reads_until_eof(headers)

    def on_body(self, body: bytes) -> None:
        if self.complete:
            self._stray = True  # a body on a HEAD response: the connection is unusable
        else:
            self._body.append(body)

    def on_message_complete(self) -> None:
        if self._head_done:
            self.complete = True


def _reads_until_eof(headers: list[tuple[bytes, bytes]]) -> bool:
    """No ``content-length`` and no final ``chunked`` coding: the body ends at EOF."""
    chunked = False
    for name, value in headers:
        if name == b"content-length":
            return False
        if name == b"transfer-encoding":
            chunked = value.rsplit(b",", 1)[-1].strip().lower() == b"chunked"
    return not chunked


def _keeps_alive(headers: list[tuple[bytes, bytes]], http_version: bytes) -> bool:
    tokens: set[bytes] = set()
    for name, value in headers:
        if name == b"connection":
            tokens.update(t.strip().lower() for t in value.split(b","))
    if http_version == b"1.1":
        return b"close" not in tokens
    return http_version == b"1.0" and b"keep-alive" in tokens
