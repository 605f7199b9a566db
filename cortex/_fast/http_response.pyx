# cython: language_level=3
"""A whole, plain worker response read in one compiled pass (contract: ``http_response.pyi``).

The reference is ``cortex.upstream.response_parser.ResponseReader`` on llhttp (``httptools``,
a Python callback per header and per event); ``tests/property`` proves that whatever this pass
accepts, that reader reads the same way. Anything else — an unfinished or chunked response, a
byte past its end, a head llhttp might read apart — returns ``None`` and goes to llhttp.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.string cimport memcmp

from cortex._fast.http_bytes cimport (
    connection_tokens,
    content_length,
    head_end,
    header_line,
    is_plain_value,
    lowered,
    named,
)

cdef bytes _EMPTY = b""


def parse_response(bytes data):
    """``(status, reason, headers, body, keep_alive)`` when ``data`` is exactly one whole plain
    HTTP/1.1 response with a ``content-length``, else ``None``."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(data)
    cdef Py_ssize_t i, j, k, name_end = 0, value_start = 0, value_end = 0, body_start
    cdef Py_ssize_t length = -1
    cdef int status, connection = 0
    cdef bytes name, value, reason
    cdef list headers = []
    if size < 19 or memcmp(p, b"HTTP/1.1 ", 9) != 0:
        return None
    body_start = head_end(p, size, 9)
    if body_start < 0:
        return None
    # Status line: HTTP/1.1 SP 3DIGIT SP reason CR LF; 1xx, 204 and 304 go to llhttp.
    for k in range(9, 12):
        if not 48 <= p[k] <= 57:
            return None
    status = (p[9] - 48) * 100 + (p[10] - 48) * 10 + (p[11] - 48)
    if status < 200 or status > 599 or status == 204 or status == 304 or p[12] != 32:
        return None
    i = 13
    while is_plain_value(p[i]):
        i += 1
    if p[i] != 13 or p[i + 1] != 10:
        return None
    reason = PyBytes_FromStringAndSize(<const char*>p + 13, i - 13)
    i += 2
    while i < body_start - 2:
        j = header_line(p, i, &name_end, &value_start, &value_end)
        if j < 0:
            return None
        name = lowered(p + i, name_end - i)
        value = PyBytes_FromStringAndSize(<const char*>p + value_start, value_end - value_start)
        headers.append((name, value))
        i = j
        if named(name, b"content-length", 14):
            if length >= 0:
                return None
            length = content_length(p, value_start, value_end)
            if length < 0:
                return None
        elif named(name, b"connection", 10):
            connection |= connection_tokens(value)
            if connection & 2:
                return None
        elif (named(name, b"transfer-encoding", 17) or named(name, b"upgrade", 7)
              or named(name, b"proxy-connection", 16)):
            return None
    if i != body_start - 2 or length < 0 or size - body_start != length:
        return None  # no length, a body not all in, or bytes past the end
    body = (PyBytes_FromStringAndSize(<const char*>p + body_start, length) if length
            else _EMPTY)
    return status, reason, headers, body, not (connection & 1)
