# cython: language_level=3
"""Where a segmenter pass's added tokens occur in a text: candidates found with
``PyUnicode_FindChar``, tried with the pass's pattern. Contract: ``token_spans.pyi``."""

from cpython.unicode cimport PyUnicode_GET_LENGTH

cdef extern from "Python.h":
    ctypedef unsigned int Py_UCS4
    Py_ssize_t PyUnicode_FindChar(object, Py_UCS4, Py_ssize_t, Py_ssize_t, int) except -2


def token_spans(object pattern, tuple firsts, str text, Py_ssize_t pos, Py_ssize_t end,
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
