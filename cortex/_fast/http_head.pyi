"""Contract of the Cython unit ``cortex._fast.http_head``: a response head in one pass.

``build_head(status_line, handler_headers, date, server, close, length, no_body_status,
chunked_if_unframed)`` returns ``(head, length, chunked)`` equal to what
``cortex.front.response_head`` makes of the same response (its reference, property-tested):

* ``length >= 0`` (a ``bytes`` body of that length): ``encode_head(status,
  response_headers(status, handler_headers, server, close, length))``;
* ``length == -1`` (a streamed body): the headers of ``response_headers(..., None)``, then,
  unless ``no_body_status``, the last ``content-length`` among them parsed (all ASCII digits,
  else ``ValueError``) as the returned length (``None``: none), and ``transfer-encoding:
  chunked`` appended when there is none and ``chunked_if_unframed`` (HTTP/1.1); ``chunked``
  says whether it was.

``status_line`` is the status line with its CRLF, ``date`` the ``date`` value. What the
reference refuses (a header name that is not a token, a value with CR, LF or NUL, a streamed
body's ``content-length`` that is not digits) raises ``ValueError`` (the reference's
``UnsendableResponse`` is one), at the first such header. Names go out lower-case; a
non-``bytes`` name or value raises ``TypeError``.
"""

def build_head(status_line: bytes, handler_headers: list[tuple[bytes, bytes]], date: bytes,
               server: bytes, close: bool, length: int, no_body_status: bool,
               chunked_if_unframed: bool) -> tuple[bytes, int | None, bool]: ...
