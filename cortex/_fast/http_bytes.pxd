# cython: language_level=3
"""Byte classes of HTTP/1.1 heads for the compiled whole-message passes (``http_request``,
``http_response``): what each accepts without handing the message to llhttp."""


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
