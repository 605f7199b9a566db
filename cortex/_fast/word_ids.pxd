# cython: language_level=3
"""``WordIds``: the fast encoder's word cache as one C table (contract: ``word_ids.pyi``).

``ascii_words`` ``cimport``s it to read a piece's words straight out of the table, without a
``str`` per word: it hashes every word of the piece first and prefetches each one's slot
(``prefetch``), then reads them (``find_hashed``), so the cache misses of a message's words
overlap instead of queueing one behind the other."""

from libc.stdint cimport uint16_t, uint32_t, uint64_t

cdef extern from "xxhash.h" nogil:
    ctypedef uint64_t XXH64_hash_t
    XXH64_hash_t XXH3_64bits(const void* data, size_t length)

cdef extern from *:
    """
    #define CORTEX_PREFETCH(address) __builtin_prefetch(address)
    """
    void CORTEX_PREFETCH(const void* address) nogil


cdef enum:
    NEAR_CHARS = 12  # a word of at most this many bytes ...
    NEAR_IDS = 3     # ... and this many ids lives in its own slot


cdef struct FarWord:
    uint32_t word_at  # offset of the word's bytes in ``chars``
    uint32_t ids_at   # offset of its ids in ``ids``


cdef struct NearWord:
    char chars[NEAR_CHARS]
    uint32_t ids[NEAR_IDS]


cdef union WordBody:
    FarWord far
    NearWord near


cdef struct WordSlot:  # 32 bytes: two to a cache line (the slots are 64-byte aligned)
    uint32_t check     # the hash's high half, never 0; 0: the slot is empty
    uint16_t word_len
    uint16_t ids_len
    WordBody body      # ``near`` when word_len <= NEAR_CHARS and ids_len <= NEAR_IDS


cdef inline uint64_t word_hash(const char* word, Py_ssize_t length) noexcept nogil:
    return XXH3_64bits(word, <size_t>length)


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

    cdef inline void prefetch(self, uint64_t h) noexcept:
        CORTEX_PREFETCH(&self.slots[h & <uint64_t>self.mask])

    cdef const uint32_t* find_hashed(self, const char* word, Py_ssize_t length, uint64_t h,
                                     Py_ssize_t* ids_len) noexcept
    cdef int _reserve(self, size_t chars, size_t ids) except -1
    cdef int _grow(self) except -1
