# cython: language_level=3
"""A whole, plain HTTP/1.x request read in one compiled pass (contract: ``http_request.pyi``).

The reference is ``cortex.front.request_parser.RequestParser`` (llhttp through ``httptools``,
eight Python callbacks per request); ``tests/property`` proves that whatever this pass accepts,
that parser reads the same way. Anything outside a strict subset — an unfinished request, a
chunked or ``Expect``/``Upgrade`` request, a byte llhttp might read differently, a request over
a limit — returns ``None`` and goes to llhttp, which answers it (or refuses it) as before.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.string cimport memcmp

from cortex._fast.http_bytes cimport (
    connection_tokens,
    content_length,
    head_end,
    header_line,
    lowered,
    named,
)

# Methods read here (others, CONNECT included, go to llhttp).
cdef dict _METHODS = {m: m for m in (b"GET", b"POST", b"HEAD", b"PUT", b"DELETE", b"OPTIONS",
                                     b"PATCH")}
cdef bytes _V11 = b"1.1"
cdef bytes _V10 = b"1.0"
cdef bytes _EMPTY = b""


def parse_request(bytes data, Py_ssize_t max_header_count, Py_ssize_t max_header_bytes,
                  Py_ssize_t max_body_bytes):
    """``(method, target, headers, body, http_version, keep_alive, consumed)`` of the request
    at the start of ``data``, or ``None`` (llhttp reads it instead)."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(data)
    cdef Py_ssize_t i, j, n, name_end = 0, value_start = 0, value_end = 0, head_size
    cdef Py_ssize_t length = -1, hosts = 0, count = 0, body_start
    cdef int connection = 0
    cdef bint v11
    cdef bytes name, value, target, body
    cdef list headers = []
    if size < 18 or not (65 <= p[0] <= 90):
        return None
    body_start = head_end(p, size, 0)
    if body_start < 0:
        return None
    # Request line: METHOD SP target SP HTTP/1.x CR LF.
    i = 0
    while i < 8 and 65 <= p[i] <= 90:
        i += 1
    if p[i] != 32:
        return None
    method = _METHODS.get(PyBytes_FromStringAndSize(<const char*>p, i))
    if method is None:
        return None
    j = i + 1
    if p[j] != 47:  # a target in origin form: '/' first
        return None
    while 0x21 <= p[j] <= 0x7E:  # visible ASCII
        j += 1
    if p[j] != 32 or j + 10 > body_start - 2:
        return None
    target = PyBytes_FromStringAndSize(<const char*>p + i + 1, j - i - 1)
    j += 1
    if memcmp(p + j, b"HTTP/1.", 7) != 0 or p[j + 8] != 13 or p[j + 9] != 10:
        return None
    if p[j + 7] == 49:
        v11 = True
    elif p[j + 7] == 48:
        v11 = False
    else:
        return None
    head_size = 12 + PyBytes_GET_SIZE(target) + PyBytes_GET_SIZE(method)  # the llhttp path's
    i = j + 10                                                             # measure (h11's)
    while i < body_start - 2:
        j = header_line(p, i, &name_end, &value_start, &value_end)
        if j < 0:
            return None
        n = name_end - i
        count += 1
        head_size += n + (value_end - value_start) + 4
        if count > max_header_count or head_size > max_header_bytes:
            return None  # the llhttp path refuses it (431)
        name = lowered(p + i, n)
        value = PyBytes_FromStringAndSize(<const char*>p + value_start, value_end - value_start)
        headers.append((name, value))
        i = j
        if named(name, b"host", 4):
            hosts += 1
        elif named(name, b"content-length", 14):
            if length >= 0:
                return None
            length = content_length(p, value_start, value_end)
            if length < 0 or length > max_body_bytes:
                return None  # the llhttp path reads or refuses it (400, 413)
        elif named(name, b"connection", 10):
            connection |= connection_tokens(value)
            if connection & 2:
                return None
        elif (named(name, b"transfer-encoding", 17) or named(name, b"expect", 6)
              or named(name, b"upgrade", 7) or named(name, b"proxy-connection", 16)):
            return None
    if i != body_start - 2 or head_size > max_header_bytes:
        return None
    if hosts > 1 or (hosts == 0 and v11):
        return None  # the llhttp path refuses it (400)
    if length < 0:
        length = 0
    if size - body_start < length:
        return None  # the body is not all in yet
    body = (PyBytes_FromStringAndSize(<const char*>p + body_start, length) if length
            else _EMPTY)
    return (method, target, headers, body, _V11 if v11 else _V10,
            v11 and not (connection & 1), body_start + length)
