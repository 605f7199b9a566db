# cython: language_level=3
"""A whole, plain HTTP/1.x request read in one compiled pass (contract: ``http_request.pyi``).

The reference is ``cortex.front.request_parser.RequestParser`` (llhttp through ``httptools``,
eight Python callbacks per request); ``tests/property`` proves that whatever this pass accepts,
that parser reads the same way. Anything outside a strict subset — an unfinished request, a
chunked or ``Expect``/``Upgrade`` request, a byte llhttp might read differently, a request over
a limit — returns ``None`` and goes to llhttp, which answers it (or refuses it) as before.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.string cimport memchr, memcmp

from cortex._fast.http_bytes cimport is_plain_value, is_tchar, lower

# Methods read here (others, CONNECT included, go to llhttp).
cdef dict _METHODS = {m: m for m in (b"GET", b"POST", b"HEAD", b"PUT", b"DELETE", b"OPTIONS",
                                     b"PATCH")}
cdef bytes _V11 = b"1.1"
cdef bytes _V10 = b"1.0"
cdef bytes _EMPTY = b""


cdef inline bint _named(bytes name, const char* lower, Py_ssize_t m):
    """``name`` (lower-cased already) is ``lower``."""
    return PyBytes_GET_SIZE(name) == m and memcmp(PyBytes_AS_STRING(name), lower, m) == 0


cdef int _connection(bytes value) except -1:
    """1 if a ``connection`` value holds ``close``; 2 if it holds ``upgrade`` (llhttp's
    business); else 0. Tokens as the llhttp path cuts them (``request_parser._comma_tokens``)."""
    tokens = [token.strip() for token in value.lower().split(b",")]
    if b"upgrade" in tokens:
        return 2
    return 1 if b"close" in tokens else 0


def parse_request(bytes data, Py_ssize_t max_header_count, Py_ssize_t max_header_bytes,
                  Py_ssize_t max_body_bytes):
    """``(method, target, headers, body, http_version, keep_alive, consumed)`` of the request
    at the start of ``data``, or ``None`` (llhttp reads it instead)."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(data)
    cdef const unsigned char* found
    cdef Py_ssize_t i, j, k, n, name_start, name_end, value_start, value_end, head_size
    cdef Py_ssize_t length = -1, hosts = 0, count = 0, body_start
    cdef int connection = 0
    cdef bint v11
    cdef unsigned char c
    cdef char* lowered
    cdef bytes name, value, target, body
    cdef list headers = []
    if size < 18 or not (65 <= p[0] <= 90):
        return None
    # the whole head is in: it ends at the first CR LF CR LF
    i = 0
    while True:
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
    # Below, every scan stops at the head's last CR at the latest (CR is in no byte class).
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
        # name ':' OWS value OWS CR LF; no obs-fold (a name starts with a token character)
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
        count += 1
        head_size += n + (value_end - value_start) + 4
        if count > max_header_count or head_size > max_header_bytes:
            return None  # the llhttp path refuses it (431)
        name = PyBytes_FromStringAndSize(NULL, n)
        lowered = PyBytes_AS_STRING(name)
        for k in range(n):
            lowered[k] = lower(p[name_start + k])
        value = PyBytes_FromStringAndSize(<const char*>p + value_start, value_end - value_start)
        headers.append((name, value))
        if _named(name, b"host", 4):
            hosts += 1
        elif _named(name, b"content-length", 14):
            if length >= 0 or value_end == value_start or value_end - value_start > 15:
                return None
            length = 0
            for k in range(value_start, value_end):
                c = p[k]
                if not 48 <= c <= 57:
                    return None
                length = length * 10 + (c - 48)
            if length > max_body_bytes:
                return None  # the llhttp path refuses it (413)
        elif _named(name, b"connection", 10):
            connection |= _connection(value)
            if connection & 2:
                return None
        elif (_named(name, b"transfer-encoding", 17) or _named(name, b"expect", 6)
              or _named(name, b"upgrade", 7) or _named(name, b"proxy-connection", 16)):
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
