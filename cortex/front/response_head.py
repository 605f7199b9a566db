"""The head of every response the lean server writes: status reason, headers. Pure.

Rules:

* The server owns ``date`` (formatted once per second) and ``server``; a handler's own are
  dropped, as are hop-by-hop headers (``connection``, ``keep-alive``, ``transfer-encoding``,
  ``te``, ``trailer``, ``upgrade``, ``proxy-*``): framing and keep-alive are the server's.
* Header names go out lower-case.
* ``length`` given (a ``bytes`` body): ``content-length`` is that length, whatever the handler
  said. ``length`` None (an iterator body): the handler's ``content-length`` is kept, else the
  body is chunked. 204 and 304 never carry ``content-length``.
* ``close`` adds ``connection: close``.
* ``encode_head`` writes the head as HTTP/1.1 bytes (status line with the standard reason, or
  none for an unknown status). It refuses (``UnsendableResponse``) what h11 refused and what
  could split a response: a status outside 200–999, a header name that is not a token, a value
  with CR, LF or NUL.
* ``response_head`` is what the writer calls: the same head in one compiled pass
  (``cortex._fast.http_head``, property-tested equal to ``encode_head(response_headers(...))``
  and to the streamed body's ``content-length`` rules below): ~3 µs instead of 6–8 warm for
  six headers, against ~23 µs the two took in the running server. For a streamed body
  (``length`` None) it also reads the handler's ``content-length`` (digits only, else
  ``UnsendableResponse``; the body then goes out unframed) and, without one, adds
  ``transfer-encoding: chunked`` when ``chunked_ok`` (an HTTP/1.1 client).
"""

from __future__ import annotations

import re
import time
from email.utils import formatdate
from http import HTTPStatus

from cortex._fast.http_head import build_head
from cortex.front.messages import Headers

DROPPED = frozenset({
    b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade",
    b"date", b"server",
})
NO_BODY_STATUS = frozenset({204, 304})
REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}
_STATUS_LINES = {status: b"HTTP/1.1 %d %s\r\n" % (status, reason)
                 for status, reason in REASONS.items() if status >= 200}
_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")
_known_names: set[bytes] = set()  # header names already checked to be tokens (bounded)
_KNOWN_NAMES_MAX = 4096


class UnsendableResponse(ValueError):
    """The handler's response cannot be written as HTTP/1.1 (see ``encode_head``)."""


class DateHeader:
    """The ``date`` value, formatted once per second."""

    second = -1
    value = b""

    @classmethod
    def now(cls) -> bytes:
        second = int(time.time())
        if second != cls.second:
            cls.value = formatdate(second, usegmt=True).encode()
            cls.second = second
        return cls.value


def response_headers(status: int, handler_headers: Headers, server: bytes, close: bool,
                     length: int | None) -> Headers:
    """The headers to send for a response (see the rules above)."""
    headers: Headers = [(b"date", DateHeader.now()), (b"server", server)]
    for name, value in handler_headers:
        lower = name.lower()
        if lower in DROPPED or lower.startswith(b"proxy-"):
            continue
        if lower == b"content-length" and (length is not None or status in NO_BODY_STATUS):
            continue
        headers.append((lower, value))
    if length is not None and status not in NO_BODY_STATUS:
        headers.append((b"content-length", b"%d" % length))
    if close:
        headers.append((b"connection", b"close"))
    return headers


def encode_head(status: int, headers: Headers) -> bytes:
    """The response head as bytes: status line, ``name: value`` lines, blank line."""
    line = _STATUS_LINES.get(status)
    if line is None:
        if not 200 <= status <= 999:
            raise UnsendableResponse(f"status {status} is not a final HTTP status")
        line = b"HTTP/1.1 %d \r\n" % status
    parts = [line]
    for name, value in headers:
        if name not in _known_names:
            if _TOKEN.fullmatch(name) is None:
                raise UnsendableResponse(f"header name {name!r} is not a token")
            if len(_known_names) < _KNOWN_NAMES_MAX:
                _known_names.add(name)
        parts.append(name + b": " + value + b"\r\n")
    parts.append(b"\r\n")
    head = b"".join(parts)
    # Names are tokens, so a CR, LF or NUL beyond the line ends can only come from a value.
    lines = len(parts)
    if head.count(b"\n") != lines or head.count(b"\r") != lines or b"\0" in head:
        raise UnsendableResponse("a header value contains CR, LF or NUL")
    return head


def response_head(status: int, handler_headers: Headers, server: bytes, close: bool,
                  length: int | None, chunked_ok: bool = False
                  ) -> tuple[bytes, int | None, bool]:
    """``(head, length, chunked)`` of a response (see the rules above): ``length`` is the
    given one for a ``bytes`` body, else the handler's ``content-length`` (or None)."""
    line = _STATUS_LINES.get(status)
    if line is None:
        if not 200 <= status <= 999:
            raise UnsendableResponse(f"status {status} is not a final HTTP status")
        line = b"HTTP/1.1 %d \r\n" % status
    try:
        head, found, chunked = build_head(
            line, handler_headers, DateHeader.now(), server, close,
            -1 if length is None else length, status in NO_BODY_STATUS, chunked_ok)
    except ValueError as error:
        raise UnsendableResponse(str(error)) from None
    return head, found, chunked
