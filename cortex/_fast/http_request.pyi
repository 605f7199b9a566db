"""Contract of the Cython unit ``cortex._fast.http_request``: a whole, plain request in one pass.

``parse_request(data, max_header_count, max_header_bytes, max_body_bytes)`` returns
``(method, target, headers, body, http_version, keep_alive, consumed)`` for the request at the
start of ``data`` — and then ``cortex.front.request_parser.RequestParser`` fed
``data[:consumed]`` reads exactly that request (header names lower-cased, values without
surrounding spaces and tabs, ``keep_alive`` by h11's rule) with no error — or ``None`` when the
request is not whole in ``data`` or falls outside the subset read here: a method other than
GET, POST, HEAD, PUT, DELETE, OPTIONS, PATCH; a target not starting with ``/`` or with a byte
outside visible ASCII; a version other than HTTP/1.0 and HTTP/1.1; a header name that is not a
token, a value byte outside visible ASCII, space and tab, obs-fold; ``transfer-encoding``,
``expect``, ``upgrade``, ``proxy-connection``, a ``connection`` naming ``upgrade``; a
``content-length`` that is not 1-15 digits or is repeated; a request over a limit, or without
exactly one ``host`` in HTTP/1.1 (the llhttp path answers those).
"""

def parse_request(data: bytes, max_header_count: int, max_header_bytes: int,
                  max_body_bytes: int) -> tuple[bytes, bytes, list[tuple[bytes, bytes]], bytes,
                                                bytes, bool, int] | None: ...
