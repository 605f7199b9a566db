"""Contract of the Cython unit ``cortex._fast.http_response``: a whole worker response in one
pass.

``parse_response(data)`` returns ``(status, reason, headers, body, keep_alive)`` when ``data``
is exactly one whole HTTP/1.1 response (status 200-599 but 204 and 304, a reason of visible
ASCII, spaces and tabs; token header names, plain values; one ``content-length`` of 1-15
digits and exactly that many body bytes after the head; no ``transfer-encoding``, ``upgrade``,
``proxy-connection`` or ``connection: upgrade``) — and then
``cortex.upstream.response_parser.ResponseReader`` fed ``data`` reads exactly that response
(names lower-cased, values without surrounding spaces and tabs, complete, reusable when
``keep_alive``: no ``close`` token in ``connection``) — else ``None``.
"""

def parse_response(data: bytes) -> tuple[int, bytes, list[tuple[bytes, bytes]], bytes,
                                         bool] | None: ...
