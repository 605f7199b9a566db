# cython: language_level=3
"""A response head of the lean HTTP server in one compiled pass (contract: ``http_head.pyi``).

The reference is ``cortex.front.response_head`` (``response_headers`` then ``encode_head``,
plus the writer's ``content-length`` scan for a streamed body); ``tests/property`` proves
them equal, byte for byte and refusal for refusal.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.string cimport memcmp

from cortex._fast.http_bytes cimport is_tchar

cdef bytes _CRLF = b"\r\n"
cdef bytes _SEP = b": "
cdef bytes _CONTENT_LENGTH = b"content-length"
cdef frozenset _DROPPED = frozenset({
    b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade",
    b"date", b"server",
})

# Byte classes as tables for ``_all_in``/``_none_in``: RFC 9110 tchar (``http_bytes.is_tchar``,
# the one definition the request and response passes read too), digits, and the bytes no
# header value may hold (CR, LF, NUL)
cdef unsigned char _TCHAR[256]
cdef unsigned char _DIGIT[256]
cdef unsigned char _NOT_IN_VALUE[256]
for _code in range(256):
    _TCHAR[_code] = is_tchar(_code)
    _DIGIT[_code] = 48 <= _code <= 57
    _NOT_IN_VALUE[_code] = _code in (0, 10, 13)


cdef bint _all_in(bytes data, const unsigned char* table):
    """Every byte of ``data`` is in ``table``'s class (False for no bytes at all)."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data), i
    if n == 0:
        return False
    for i in range(n):
        if not table[p[i]]:
            return False
    return True


cdef bint _none_in(bytes data, const unsigned char* table):
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data), i
    for i in range(n):
        if table[p[i]]:
            return False
    return True


cdef bint _has_upper(bytes name):
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(name)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(name), i
    for i in range(n):
        if 65 <= p[i] <= 90:
            return True
    return False


cdef bint _dropped(bytes lower):
    """Hop-by-hop, ``date``, ``server`` or ``proxy-*``: the server's own."""
    cdef Py_ssize_t n = PyBytes_GET_SIZE(lower)
    cdef const char* p = PyBytes_AS_STRING(lower)
    if n == 0 or p[0] not in b"ckptuds":
        return False
    if n >= 6 and memcmp(p, b"proxy-", 6) == 0:
        return True
    return lower in _DROPPED


cdef bint _is_content_length(bytes lower):
    return (PyBytes_GET_SIZE(lower) == 14
            and memcmp(PyBytes_AS_STRING(lower), b"content-length", 14) == 0)


def build_head(bytes status_line, list handler_headers, bytes date, bytes server, bint close,
               Py_ssize_t length, bint no_body_status, bint chunked_if_unframed):
    if not (_none_in(date, _NOT_IN_VALUE) and _none_in(server, _NOT_IN_VALUE)):
        raise ValueError("a header value contains CR, LF or NUL")
    cdef list parts = [status_line, b"date: ", date, _CRLF, b"server: ", server, _CRLF]
    cdef bint whole = length >= 0
    cdef object found = None  # a Python int: any number of digits, as the reference takes
    cdef bytes lower, value
    for name, raw_value in handler_headers:
        lower = <bytes?>name
        if _has_upper(lower):
            lower = lower.lower()
        if _dropped(lower):
            continue
        value = <bytes?>raw_value
        if _is_content_length(lower):
            if whole or no_body_status:
                continue
            if not _all_in(value, _DIGIT):
                raise ValueError(f"content-length {value!r}")
            found = int(value)
        if not _all_in(lower, _TCHAR):
            raise ValueError(f"header name {lower!r} is not a token")
        if not _none_in(value, _NOT_IN_VALUE):
            raise ValueError("a header value contains CR, LF or NUL")
        parts += (lower, _SEP, value, _CRLF)
    if whole and not no_body_status:
        parts += (b"content-length: ", b"%d" % length, _CRLF)
    if close:
        parts += (b"connection: close", _CRLF)
    cdef bint chunked = (not whole and not no_body_status and found is None
                         and chunked_if_unframed)
    if chunked:
        parts += (b"transfer-encoding: chunked", _CRLF)
    parts.append(_CRLF)
    return b"".join(parts), (length if whole else found), chunked
