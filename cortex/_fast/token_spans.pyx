# cython: language_level=3
"""Where a segmenter pass's added tokens occur in a text: candidates found with
``PyUnicode_FindChar``, tried with the pass's pattern. Contract: ``token_spans.pyi``."""

from cpython.unicode cimport PyUnicode_GET_LENGTH

cdef extern from "Python.h":
    ctypedef unsigned int Py_UCS4
    Py_ssize_t PyUnicode_FindChar(object, Py_UCS4, Py_ssize_t, Py_ssize_t, int) except -2


def token_spans(object pattern, tuple firsts, str text, Py_ssize_t pos, Py_ssize_t end,
                int max_misses):
    return _token_spans(pattern, firsts, text, pos, end, max_misses)


cdef list _spans(tuple one_pass, str text, Py_ssize_t pos, Py_ssize_t end, int max_misses):
    """The spans of a pass ``(pattern, firsts or None, ids)`` in ``text[pos:end]``."""
    pattern, firsts = one_pass[0], one_pass[1]
    if firsts is None:
        return [match.span() for match in pattern.finditer(text, pos, end)]
    return _token_spans(pattern, <tuple>firsts, text, pos, end, max_misses)


cdef int _split_pass(tuple passes, Py_ssize_t index, str text, Py_ssize_t pos, Py_ssize_t end,
                     list pieces, int max_misses) except -1:
    """Pieces of ``text[pos:end]`` by pass ``index``; its gaps go to the next pass, if any."""
    cdef tuple one_pass = <tuple>passes[index]
    cdef dict ids = <dict>one_pass[2]
    cdef bint last = index + 1 >= len(passes)
    cdef Py_ssize_t start = pos, cut, after
    cdef object token
    for span in _spans(one_pass, text, pos, end, max_misses):
        cut, after = span
        if cut > start:
            if last:
                pieces.append((text[start:cut], None))
            else:
                _split_pass(passes, index + 1, text, start, cut, pieces, max_misses)
        token = text[cut:after]
        pieces.append((token, ids[token]))
        start = after
    if start < end:
        if last:
            pieces.append((text[start:end], None))
        else:
            _split_pass(passes, index + 1, text, start, end, pieces, max_misses)
    return 0


def split_pieces(str text, tuple passes, int max_misses):
    """``text`` cut at the added tokens of ``passes`` (contract: ``token_spans.pyi``)."""
    cdef list pieces = []
    if not passes:
        if text:
            pieces.append((text, None))
        return pieces
    _split_pass(passes, 0, text, 0, len(text), pieces, max_misses)
    return pieces


cdef list _token_spans(object pattern, tuple firsts, str text, Py_ssize_t pos, Py_ssize_t end,
                       int max_misses):
    cdef Py_ssize_t count = len(firsts)
    cdef Py_ssize_t nexts[8]
    cdef Py_UCS4 chars[8]
    cdef Py_ssize_t index, candidate, at
    cdef list out = []
    cdef object match_at = pattern.match
    cdef object found
    if count < 1 or count > 8:
        raise ValueError("between 1 and 8 first characters")
    if end > PyUnicode_GET_LENGTH(text):
        end = PyUnicode_GET_LENGTH(text)
    for index in range(count):
        chars[index] = ord(firsts[index])
        nexts[index] = PyUnicode_FindChar(text, chars[index], pos, end, 1)  # -1: none left
    while True:
        candidate = end
        for index in range(count):
            at = nexts[index]
            if 0 <= at < candidate:
                candidate = at
        if candidate == end:
            return out
        found = match_at(text, candidate, end)
        if found is None:
            max_misses -= 1
            if max_misses < 0:  # first characters everywhere (markup): re's own scan
                out += [match.span() for match in pattern.finditer(text, pos, end)]
                return out
            pos = candidate + 1
        else:
            pos = found.end()
            out.append((candidate, pos))
        for index in range(count):
            if 0 <= nexts[index] < pos:
                nexts[index] = PyUnicode_FindChar(text, chars[index], pos, end, 1)
