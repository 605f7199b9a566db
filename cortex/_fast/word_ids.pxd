# cython: language_level=3
"""``WordIds``: the fast encoder's word cache as one C table (contract: ``word_ids.pyi``).

``ascii_words`` ``cimport``s it to read a piece's words straight out of the table, without a
``str`` per word."""

from libc.stdint cimport uint16_t, uint32_t


cdef struct WordSlot:
    uint32_t check    # the hash's high half, never 0; 0: the slot is empty
    uint32_t word_at  # offset of the word's bytes in ``chars``
    uint32_t ids_at   # offset of its ids in ``ids``
    uint16_t word_len
    uint16_t ids_len


cdef class WordIds:
    cdef WordSlot* slots
    cdef Py_ssize_t mask         # slots - 1 (a power of two, at least twice count)
    cdef Py_ssize_t count
    cdef readonly Py_ssize_t max_entries
    cdef readonly Py_ssize_t max_word_chars
    cdef char* chars
    cdef size_t chars_used, chars_cap
    cdef uint32_t* ids
    cdef size_t ids_used, ids_cap

    cdef const uint32_t* find(self, const char* word, Py_ssize_t length,
                              Py_ssize_t* ids_len) noexcept
    cdef int _reserve(self, size_t chars, size_t ids) except -1
    cdef int _grow(self) except -1
