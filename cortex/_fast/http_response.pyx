# cython: language_level=3
"""A whole, plain worker response read in one compiled pass (contract: ``http_response.pyi``).

The reference is ``cortex.upstream.response_parser.ResponseReader`` on llhttp (``httptools``,
a Python callback per header and per event); ``tests/property`` proves that whatever this pass
accepts, that reader reads the same way. Anything else — an unfinished or chunked response, a
byte past its end, a head llhttp might read apart — returns ``None`` and goes to llhttp.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.string cimport memchr, memcmp

from cortex._fast.http_bytes cimport is_plain_value, is_tchar, lower

cdef bytes _EMPTY = b""


cdef inline bint _named(bytes name, const char* lower_name, Py_ssize_t m):
    return PyBytes_GET_SIZE(name) == m and memcmp(PyBytes_AS_STRING(name), lower_name, m) == 0


def parse_response(bytes data):
    """``(status, reason, headers, body, keep_alive)`` when ``data`` is exactly one whole plain
    HTTP/1.1 response with a ``content-length``, else ``None``."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(data)
    cdef const unsigned char* found
    cdef Py_ssize_t i, k, n, name_start, name_end, value_start, value_end, body_start
    cdef Py_ssize_t length = -1
    cdef int status
    cdef bint close = False
    cdef unsigned char c
    cdef char* lowered
    cdef bytes name, value, reason
    cdef list headers = []
    if size < 19 or memcmp(p, b"HTTP/1.1 ", 9) != 0:
        return None
    i = 9
    while True:  # the head ends at the first CR LF CR LF
        found = <const unsigned char*>memchr(p + i, 13, size - i)
        if found == NULL:
            return None
        i = found - p
        if i + 3 >= size:
            return None
        if p[i + 1] == 10 and p[i + 2] == 13 and p[i + 3] == 10:
            break
        i += 1
    body_start = i + 4
    # Status line: HTTP/1.1 SP 3DIGIT SP reason CR LF (every scan below stops at the head's
    # last CR at the latest: CR is in no byte class). 1xx, 204 and 304 go to llhttp.
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
        name_start = i
        while is_tchar(p[i]):
            i += 1
        name_end = i
        if name_end == name_start or p[i] != 58:  # ':'
            return None
        i += 1
        while p[i] == 32 or p[i] == 9:
            i += 1
        value_start = i
        while is_plain_value(p[i]):
            i += 1
        if p[i] != 13 or p[i + 1] != 10:
            return None
        value_end = i
        while value_end > value_start and (p[value_end - 1] == 32 or p[value_end - 1] == 9):
            value_end -= 1
        i += 2
        n = name_end - name_start
        name = PyBytes_FromStringAndSize(NULL, n)
        lowered = PyBytes_AS_STRING(name)
        for k in range(n):
            lowered[k] = lower(p[name_start + k])
        value = PyBytes_FromStringAndSize(<const char*>p + value_start, value_end - value_start)
        headers.append((name, value))
        if _named(name, b"content-length", 14):
            if length >= 0 or value_end == value_start or value_end - value_start > 15:
                return None
            length = 0
            for k in range(value_start, value_end):
                c = p[k]
                if not 48 <= c <= 57:
                    return None
                length = length * 10 + (c - 48)
        elif _named(name, b"connection", 10):
            tokens = [token.strip() for token in value.lower().split(b",")]
            if b"upgrade" in tokens:
                return None
            close = close or b"close" in tokens
        elif (_named(name, b"transfer-encoding", 17) or _named(name, b"upgrade", 7)
              or _named(name, b"proxy-connection", 16)):
            return None
    if i != body_start - 2 or length < 0 or size - body_start != length:
        return None  # no length, a body not all in, or bytes past the end
    body = (PyBytes_FromStringAndSize(<const char*>p + body_start, length) if length
            else _EMPTY)
    return status, reason, headers, body, not close
