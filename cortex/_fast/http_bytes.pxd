# cython: language_level=3
"""HTTP/1.1 head scanning shared by the compiled whole-message passes (``http_request``,
``http_response``): byte classes and the pieces of a head each reads the same way. Every scan
stops at the head's last CR at the latest (CR is in no byte class), so a head known to end in
CR LF CR LF is never read past."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.string cimport memchr, memcmp


cdef inline bint is_tchar(unsigned char c) noexcept nogil:
    """RFC 9110 token character: ``! # $ % & ' * + - . ^ _ ` | ~``, digit, letter."""
    return (97 <= c <= 122 or 65 <= c <= 90 or 48 <= c <= 57 or c == 33 or 35 <= c <= 39
            or c == 42 or c == 43 or c == 45 or c == 46 or c == 94 or c == 95 or c == 96
            or c == 124 or c == 126)


cdef inline bint is_plain_value(unsigned char c) noexcept nogil:
    """A header value (or reason phrase) byte read here: visible ASCII, space, tab."""
    return 32 <= c <= 126 or c == 9


cdef inline char lower(unsigned char c) noexcept nogil:
    return <char>(c + 32 if 65 <= c <= 90 else c)


cdef inline Py_ssize_t head_end(const unsigned char* p, Py_ssize_t size,
                                Py_ssize_t i) noexcept nogil:
    """The index just past the first CR LF CR LF at or after ``i``, or -1 (the head is not all
    in)."""
    cdef const unsigned char* found
    while True:
        found = <const unsigned char*>memchr(p + i, 13, size - i)
        if found == NULL:
            return -1
        i = found - p
        if i + 3 >= size:
            return -1
        if p[i + 1] == 10 and p[i + 2] == 13 and p[i + 3] == 10:
            return i + 4
        i += 1


cdef inline Py_ssize_t header_line(const unsigned char* p, Py_ssize_t i, Py_ssize_t* name_end,
                                   Py_ssize_t* value_start, Py_ssize_t* value_end
                                   ) noexcept nogil:
    """The header line at ``i`` — ``name ":" OWS value OWS CR LF``, a token name, a plain value
    (without its surrounding spaces and tabs between ``value_start`` and ``value_end``) — and
    the index after its LF; -1 for a line the passes leave to llhttp (obs-fold included: a
    name starts with a token character)."""
    cdef Py_ssize_t start = i, end
    while is_tchar(p[i]):
        i += 1
    if i == start or p[i] != 58:  # ':'
        return -1
    name_end[0] = i
    i += 1
    while p[i] == 32 or p[i] == 9:
        i += 1
    value_start[0] = i
    while is_plain_value(p[i]):
        i += 1
    if p[i] != 13 or p[i + 1] != 10:
        return -1
    end = i
    while end > value_start[0] and (p[end - 1] == 32 or p[end - 1] == 9):
        end -= 1
    value_end[0] = end
    return i + 2


cdef inline bytes lowered(const unsigned char* p, Py_ssize_t n):
    """``p[:n]`` as new bytes, ASCII letters lower-cased."""
    cdef bytes out = PyBytes_FromStringAndSize(NULL, n)
    cdef char* at = PyBytes_AS_STRING(out)
    cdef Py_ssize_t k
    for k in range(n):
        at[k] = lower(p[k])
    return out


cdef inline bint named(bytes name, const char* lower_name, Py_ssize_t m):
    """``name`` (lower-cased already) is ``lower_name``."""
    return PyBytes_GET_SIZE(name) == m and memcmp(PyBytes_AS_STRING(name), lower_name, m) == 0


cdef inline Py_ssize_t content_length(const unsigned char* p, Py_ssize_t start,
                                      Py_ssize_t end) noexcept nogil:
    """A ``content-length`` value of 1 to 15 digits, or -1."""
    cdef Py_ssize_t length = 0, k
    if end == start or end - start > 15:
        return -1
    for k in range(start, end):
        if not 48 <= p[k] <= 57:
            return -1
        length = length * 10 + (p[k] - 48)
    return length


cdef inline int connection_tokens(bytes value) except -1:
    """A ``connection`` value: 2 if it names ``upgrade`` (llhttp's business), else 1 if it
    names ``close``, else 0 — tokens cut as the llhttp paths cut them."""
    tokens = [token.strip() for token in value.lower().split(b",")]
    if b"upgrade" in tokens:
        return 2
    return 1 if b"close" in tokens else 0
