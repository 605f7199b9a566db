"""Requests of one connection, parsed from bytes by llhttp (``httptools``). Pure: no I/O.

``RequestParser.feed(data)`` parses whatever arrived; complete requests queue up in
``requests`` (with whether the connection may be kept after each), and the first request that
cannot be read sets ``error`` (a ``CortexError`` leaf to answer) — after the complete requests
before it, which are still answered in order (pipelining). The I/O shell
(``cortex.front.connection``) owns the deadlines and the socket; it reads the state below.

Rules (the same as the h11 server had, where llhttp and h11 differ it is said):

* Header names are lower-cased; values lose trailing spaces and tabs (llhttp drops the leading
  ones). Trailers of a chunked body are read and dropped.
* Limits: more than ``max_header_count`` headers, or a head (method + target + headers, as h11
  measured it) over ``max_header_bytes`` → 431. An unfinished head is measured by the reads
  that carry it: the read in which it began counts whole unless a previous request also ended
  in it (then only its parsed fields count), so a pipelined head may pass the limit by less
  than one read before it is refused. A declared ``content-length`` over ``max_body_bytes`` →
  413 at once (before any ``100 Continue``); a chunked body → 413 the moment it passes it,
  or the moment a chunk's declared size would take it past (``ffffffffffffffff`` is refused
  when its size line is in, not when the body deadline passes). llhttp does not say a chunk's
  size, so the size line is read back from the last bytes fed (``_CHUNK_TAIL`` of them):
  a size line longer than that (extensions) is checked only by the bytes that follow.
* Malformed input → 400 (``BadRequest``), never anything else: what llhttp refuses (bad request
  line or method, a method it does not know, bare CR or LF, obs-fold, invalid header bytes,
  bad chunk framing, both ``content-length`` and ``transfer-encoding`` — request smuggling),
  HTTP versions other than 1.0 and 1.1, an HTTP/1.1 request without exactly one ``host``
  (h11's rule), and a ``transfer-encoding`` other than one ``chunked``.
* Keep-alive (h11's rule, not llhttp's): HTTP/1.1 without ``connection: close``. After a
  request that ends the connection, further bytes are not parsed.
* ``Expect: 100-continue`` on an HTTP/1.1 request sets ``expects_continue`` for the current
  request; the shell sends ``100 Continue`` if it still waits for body bytes.
* An upgrade request (``connection: upgrade`` + ``upgrade``, or ``CONNECT``) is served as a
  plain request, as h11 did: llhttp stops at its head, so its body (if any) is read by a fresh
  parser primed with the same framing, and parsing goes on after it.
* A whole plain request at a message boundary (the common case: one read carries it) is read
  by one compiled pass (``cortex._fast.http_request``, property-tested to read exactly what
  llhttp reads here, refusing nothing itself); anything else goes to llhttp as it comes.

State the shell reads: ``requests`` (deque of ``(HttpRequest, keep_alive)``), ``error``,
``in_message`` (bytes of an unfinished request are in), ``head_done`` (its head is complete,
its body is not), ``expects_continue``, ``body_bytes`` (body bytes of the current request).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from httptools import HttpParserCallbackError, HttpParserError, HttpParserUpgrade
from httptools import HttpRequestParser as _LlhttpParser

from cortex._fast.http_request import parse_request
from cortex.errors import BadRequest, CortexError, PayloadTooLarge
from cortex.front.errors_http import HeaderFieldsTooLarge
from cortex.front.limits import ServerLimits
from cortex.front.messages import Headers, HttpRequest

if TYPE_CHECKING:
    from cortex.front.shared import ServerCounters

_VERSIONS = {"1.1": b"1.1", "1.0": b"1.0"}
_CHUNK_TAIL = 256  # bytes of a chunked body kept to read a chunk's size line back
_TRAILING_SPACE = (32, 9)  # a header value's last byte: space, tab


class _Refusal(Exception):
    """Raised inside a parser callback to stop parsing with ``error``."""

    def __init__(self, error: CortexError) -> None:
        self.error = error


class _Stop(Exception):
    """Raised inside a parser callback to stop parsing after a request that ends the
    connection (llhttp would go on with its own keep-alive rule)."""


class RequestParser:
    """Turns the bytes of one connection into complete ``HttpRequest``s (rules above)."""

    def __init__(self, limits: ServerLimits, counters: ServerCounters,
                 client: tuple[str, int] | None, *, compiled: bool = True) -> None:
        """``compiled=False``: every byte through llhttp (the compiled pass's reference)."""
        self._compiled = compiled
        self._limits = limits
        self._counters = counters
        self._client = client
        self._parser = _LlhttpParser(self)
        self.requests: deque[tuple[HttpRequest, bool]] = deque()
        self.error: CortexError | None = None
        self.stopped = False  # an error, or a request that ends the connection: no more parsing
        self.in_message = False
        self.head_done = False
        self.expects_continue = False
        self.body_bytes = 0
        self._completed = 0  # requests completed so far (to measure unfinished heads)
        self._head_size = 0  # of the current head, from its parsed fields
        self._head_read = 0  # of the current unfinished head, from the reads carrying it
        self._method = b""
        self._version = b"1.1"
        self._target = b""
        self._headers: Headers = []
        self._body: list[bytes] = []
        self._keep_alive = True
        self._resume_body: bytes | None = None  # framing of an upgrade request's body
        self._priming = False  # a fresh parser reads the synthetic head of a resumed body
        # chunked body: the last bytes fed, and the chunk whose size line is not checked yet
        self._chunk_tail: bytes | None = None  # None: not in a chunked body
        self._chunk_unchecked = False  # a chunk's size line was read by llhttp, not by us
        self._chunk_data = 0  # data bytes of the current chunk seen so far

    def feed(self, data: bytes) -> None:
        """Parses ``data``; updates ``requests``, ``error`` and the state flags."""
        if self.stopped:
            return
        was_in_head = self.in_message and not self.head_done
        completed = self._completed
        if (self._compiled and not self.in_message and self._resume_body is None
                and type(data) is bytes):
            # whole plain requests at a message boundary: one compiled pass each (llhttp, which
            # never sees them, stays at the boundary for whatever follows)
            limits = self._limits
            while True:
                whole = parse_request(data, limits.max_header_count, limits.max_header_bytes,
                                      limits.max_body_bytes)
                if whole is None:
                    break
                method, target, headers, body, version, keep_alive, consumed = whole
                self.requests.append((HttpRequest(method, target, headers, body, self._client,
                                                  version), keep_alive))
                self._completed += 1
                if not keep_alive:
                    self.stopped = True  # the connection ends after it: ignore the rest
                    return
                if consumed == len(data):
                    return
                data = data[consumed:]  # (a head left unfinished in it is measured by its
                # parsed fields: a request ended in this read, as llhttp would have counted)
        try:
            self._parser.feed_data(data)
        except HttpParserUpgrade as upgrade:
            upgrade_at = upgrade.args[0]
        except HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, _Refusal):
                self._fail(cause.error)
            elif not isinstance(cause, _Stop):
                raise cause from None  # a bug in a callback: the shell logs it
            return
        except HttpParserError as exc:
            if not self.stopped:  # (llhttp refuses bytes after a request that ends the
                self._malformed(str(exc))  # connection: they are ignored, not an error)
            return
        else:
            if self.in_message and not self.head_done:
                self._measure_unfinished_head(len(data), was_in_head, completed)
            elif self._chunk_tail is not None:
                self._check_chunk_size(data)
            return
        # Outside the ``except`` block: a callback error of the fresh parser must not have the
        # upgrade as its context (httptools puts the callback's own exception there, and a
        # raise inside an ``except`` block would replace it with the upgrade).
        self._after_upgrade(data, upgrade_at)

    def _measure_unfinished_head(self, size: int, was_in_head: bool, completed: int) -> None:
        if self._completed == completed:
            # No request ended in this read: all of it belongs to the head (if the head began
            # in it, at most a few CRLFs before the request line do not).
            self._head_read = self._head_read + size if was_in_head else size
        if max(self._head_read, self._head_size) > self._limits.max_header_bytes:
            self._fail(HeaderFieldsTooLarge(
                f"request head larger than {self._limits.max_header_bytes} bytes"))

    def _check_chunk_size(self, data: bytes) -> None:
        """After a read inside a chunked body: a chunk whose size line came in this read is
        refused now if its declared size would take the body past the limit."""
        before = self._chunk_tail or b""
        self._chunk_tail = (data if len(data) >= _CHUNK_TAIL
                            else before + data)[-_CHUNK_TAIL:]
        if not self._chunk_unchecked:
            return
        self._chunk_unchecked = False
        # llhttp read the size line (and its CRLF) in this read; the chunk's data follows it
        end = len(data) - self._chunk_data
        start = data.rfind(b"\n", 0, end - 1) + 1
        if start > 0:
            line = data[start:end]
        else:  # the line began in an earlier read
            line = before + data[:end]
            start = line.rfind(b"\n", 0, len(line) - 1) + 1
            if start == 0:
                return  # longer than the tail kept: the data will tell
            line = line[start:]
        try:
            size = int(line.split(b";", 1)[0].strip(b" \t\r\n"), 16)
        except ValueError:
            return  # (llhttp accepted it, so this cannot happen; the data would tell)
        limit = self._limits.max_body_bytes
        if self.body_bytes - self._chunk_data + size > limit:
            self._fail(PayloadTooLarge(
                f"request body larger than {limit} bytes (a chunk of {size} bytes declared)"))

    def _fail(self, error: CortexError) -> None:
        counters = self._counters
        if isinstance(error, PayloadTooLarge):  # 413 and 431
            counters.too_large += 1
        else:
            counters.count_bad_request(error)
        self.error = error
        self.stopped = True

    def _malformed(self, reason: str) -> None:
        self._fail(BadRequest(f"malformed request: {reason}", reason="malformed_http"))

    def _refuse_malformed(self, reason: str) -> None:
        raise _Refusal(BadRequest(f"malformed request: {reason}", reason="malformed_http"))

    # -- llhttp callbacks (run inside feed) -------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._priming:
            return
        self.in_message = True
        self.head_done = False
        self.expects_continue = False
        self.body_bytes = 0
        self._head_size = 12  # " ", " HTTP/1.1", CRLF, as h11 counted
        self._head_read = 0
        self._target = b""
        self._headers = []
        self._body = []

    def on_url(self, piece: bytes) -> None:
        if self._priming:
            return
        self._target += piece
        self._head_size += len(piece)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.head_done or self._priming:
            return  # a trailer of a chunked body (dropped), or the synthetic head
        if value and value[-1] in _TRAILING_SPACE:
            value = value.rstrip(b" \t")
        headers = self._headers
        headers.append((name.lower(), value))
        limits = self._limits
        if len(headers) > limits.max_header_count:
            raise _Refusal(HeaderFieldsTooLarge(
                f"more than {limits.max_header_count} request headers"))
        self._head_size += len(name) + len(value) + 4
        if self._head_size > limits.max_header_bytes:
            raise _Refusal(HeaderFieldsTooLarge(
                f"request head larger than {limits.max_header_bytes} bytes"))

    def on_headers_complete(self) -> None:
        if self._priming:
            self._priming = False
            return
        parser = self._parser
        version = _VERSIONS.get(parser.get_http_version())
        if version is None:
            self._refuse_malformed(f"HTTP version {parser.get_http_version()} not supported")
        method = parser.get_method()
        self._head_size += len(method)
        if self._head_size > self._limits.max_header_bytes:
            raise _Refusal(HeaderFieldsTooLarge(
                f"request head larger than {self._limits.max_header_bytes} bytes"))
        self._method = method
        self._version = version
        self.head_done = True
        keep_alive = version == b"1.1"
        hosts = 0
        length: bytes | None = None
        chunked = False
        for name, value in self._headers:
            if name == b"host":
                hosts += 1
            elif name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                if chunked or value.lower() != b"chunked":
                    self._refuse_malformed("only Transfer-Encoding: chunked is supported")
                chunked = True
            elif name == b"connection":
                if b"close" in _comma_tokens(value):
                    keep_alive = False
            elif (name == b"expect" and version == b"1.1"
                  and b"100-continue" in _comma_tokens(value)):
                self.expects_continue = True
        if hosts > 1 or (hosts == 0 and version == b"1.1"):
            self._refuse_malformed("an HTTP/1.1 request needs exactly one Host header")
        if length is not None and int(length) > self._limits.max_body_bytes:
            raise _Refusal(PayloadTooLarge(
                f"request body larger than {self._limits.max_body_bytes} bytes"))
        self._keep_alive = keep_alive
        if chunked:
            self._chunk_tail = b""  # (the head's last bytes come with the read: see feed)
        if parser.should_upgrade() and (chunked or (length is not None and int(length) > 0)):
            # llhttp skips the body of an upgrade request: a fresh parser reads it.
            self._resume_body = (b"transfer-encoding: chunked" if chunked
                                 else b"content-length: " + length)  # type: ignore[operator]

    def on_body(self, data: bytes) -> None:
        size = self.body_bytes + len(data)
        if size > self._limits.max_body_bytes:
            raise _Refusal(PayloadTooLarge(
                f"request body larger than {self._limits.max_body_bytes} bytes"))
        self.body_bytes = size
        self._chunk_data += len(data)
        self._body.append(data)

    def on_chunk_header(self) -> None:
        self._chunk_unchecked = True
        self._chunk_data = 0

    def on_chunk_complete(self) -> None:
        self._chunk_unchecked = False

    def on_message_complete(self) -> None:
        if self._resume_body is not None:
            return  # an upgrade request whose body follows (see _after_upgrade)
        body = self._body
        request = HttpRequest(self._method, self._target, self._headers,
                              body[0] if len(body) == 1 else b"".join(body), self._client,
                              self._version)
        self._body = []  # the request owns it now (an idle connection keeps no body)
        self.requests.append((request, self._keep_alive))
        self._completed += 1
        self.in_message = False
        self.head_done = False
        self._chunk_tail = None
        self._chunk_unchecked = False
        if not self._keep_alive:
            self.stopped = True  # the connection ends after this request: ignore the rest
            raise _Stop

    def _after_upgrade(self, data: bytes, offset: int) -> None:
        """llhttp stopped after an upgrade request's head: go on with a fresh parser."""
        self._parser = _LlhttpParser(self)
        framing = self._resume_body
        if framing is not None:
            self._resume_body = None
            self._priming = True
            self._parser.feed_data(b"PUT / HTTP/1.1\r\nhost: x\r\n" + framing + b"\r\n\r\n")
            if self._chunk_tail is not None:
                self._chunk_tail = b"\n"  # the body starts a line
        if not self.stopped and offset < len(data):
            self.feed(data[offset:])


def _comma_tokens(value: bytes) -> list[bytes]:
    return [token.strip() for token in value.lower().split(b",")]
