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
"""

from __future__ import annotations

import time
from email.utils import formatdate
from http import HTTPStatus

from cortex.front.messages import Headers

DROPPED = frozenset({
    b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade",
    b"date", b"server",
})
NO_BODY_STATUS = frozenset({204, 304})
REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}


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
