# cython: language_level=3
"""The fast encoder's word cache: ASCII word -> token ids, in one open-addressing C table.

Contract: ``word_ids.pyi``. Why a table of its own rather than a ``dict``: reading a new
message's ~60 cached words through a dict costs a ``str`` slice, its hash and a tuple per word
(~90 ns each, most of the message's encode); here the splitter hashes the word's bytes where
they lie in the piece and copies the ids out (``ascii_words.DeepSeekV3Words.cached_ids``).

Layout, for the running server, where the table is out of the CPU's caches by the time a
request comes (other processes ran while it waited): each word costs one cache miss, and the
misses of a message's words overlap. 32-byte ``slots``, 64-byte aligned (linear probing; at
least twice as many as words, so a probe ends at an empty slot; they double as words arrive,
so a table of a few thousand words stays small). A word of at most ``NEAR_CHARS`` bytes with
at most ``NEAR_IDS`` ids — most words of prose — is held in its slot; a longer one points into
two arenas that only grow until ``clear``: ``chars`` (the words' bytes) and ``ids`` (their ids
as ``uint32``). A slot is found by the low bits of the word's XXH3 and checked by its high half
and the bytes. ``ascii_words`` hashes all the words of a piece and ``prefetch``es their slots
before it reads any. Full (``max_entries`` words) means cleared, as the dict it replaces was.
"""

from cpython.unicode cimport PyUnicode_GET_LENGTH
from libc.stdint cimport uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, realloc
from libc.string cimport memcmp, memcpy, memset

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object)
    void* PyUnicode_DATA(object)

cdef extern from "<stdlib.h>" nogil:
    void* aligned_alloc(size_t alignment, size_t size)

cdef enum:
    MAX_WORD_CHARS_LIMIT = 65535  # word_len and ids_len are uint16
    ARENA_START = 4096
    SLOTS_START = 1024
    SLOT_ALIGN = 64


cdef inline uint32_t _check(uint64_t h) noexcept nogil:
    return <uint32_t>(h >> 32) | 1  # never 0: 0 marks an empty slot


cdef inline bint _near(Py_ssize_t word_len, Py_ssize_t ids_len) noexcept nogil:
    return word_len <= NEAR_CHARS and ids_len <= NEAR_IDS


cdef WordSlot* _new_slots(Py_ssize_t count) except NULL:
    cdef size_t size = <size_t>count * sizeof(WordSlot)
    cdef WordSlot* slots = <WordSlot*>aligned_alloc(SLOT_ALIGN, size)
    if slots is NULL:
        raise MemoryError()
    memset(slots, 0, size)
    return slots


cdef class WordIds:
    def __cinit__(self, Py_ssize_t max_entries, Py_ssize_t max_word_chars):
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        if not 1 <= max_word_chars <= MAX_WORD_CHARS_LIMIT:
            raise ValueError(f"max_word_chars must be in 1..{MAX_WORD_CHARS_LIMIT}")
        if max_entries * max_word_chars >= (<Py_ssize_t>1 << 31):
            raise ValueError("max_entries * max_word_chars must stay below 2**31")
        self.slots = _new_slots(SLOTS_START)
        self.chars = <char*>calloc(ARENA_START, 1)
        self.ids = <uint32_t*>calloc(ARENA_START, sizeof(uint32_t))
        if self.chars is NULL or self.ids is NULL:
            raise MemoryError()
        self.mask = SLOTS_START - 1
        self.max_entries = max_entries
        self.max_word_chars = max_word_chars
        self.chars_cap = ARENA_START
        self.ids_cap = ARENA_START

    def __dealloc__(self):
        free(self.slots)
        free(self.chars)
        free(self.ids)

    def __len__(self):
        return self.count

    @property
    def memory_bytes(self):
        """Bytes the table holds allocated (slots and both arenas)."""
        return ((self.mask + 1) * sizeof(WordSlot) + self.chars_cap
                + self.ids_cap * sizeof(uint32_t))

    def clear(self):
        memset(self.slots, 0, (self.mask + 1) * sizeof(WordSlot))
        self.count = 0
        self.chars_used = 0
        self.ids_used = 0

    cdef const uint32_t* find_hashed(self, const char* word, Py_ssize_t length, uint64_t h,
                                     Py_ssize_t* ids_len) noexcept:
        """The ids of the ``length`` bytes at ``word`` whose ``word_hash`` is ``h``
        (``ids_len`` set), or NULL."""
        cdef uint32_t check = _check(h)
        cdef Py_ssize_t at = <Py_ssize_t>(h & <uint64_t>self.mask)
        cdef WordSlot* slot
        while True:
            slot = &self.slots[at]
            if slot.check == 0:
                return NULL
            if slot.check == check and slot.word_len == length:
                if _near(length, slot.ids_len):
                    if memcmp(slot.body.near.chars, word, <size_t>length) == 0:
                        ids_len[0] = slot.ids_len
                        return slot.body.near.ids
                elif memcmp(self.chars + slot.body.far.word_at, word, <size_t>length) == 0:
                    ids_len[0] = slot.ids_len
                    return self.ids + slot.body.far.ids_at
            at = (at + 1) & self.mask

    def get(self, str word):
        """The word's ids as a tuple, or ``None`` (not cached, or not ASCII)."""
        if not PyUnicode_IS_ASCII(word):
            return None
        cdef const char* data = <const char*>PyUnicode_DATA(word)
        cdef Py_ssize_t length = PyUnicode_GET_LENGTH(word)
        cdef Py_ssize_t count = 0, i
        cdef const uint32_t* found = self.find_hashed(data, length, word_hash(data, length),
                                                      &count)
        if found is NULL:
            return None
        return tuple([found[i] for i in range(count)])

    def put(self, str word, ids):
        """Cache ``ids`` for ``word``; False (nothing kept) for a word that is not ASCII, is
        empty or longer than ``max_word_chars``, or has more ids than ``max_word_chars``."""
        if not PyUnicode_IS_ASCII(word):
            return False
        cdef Py_ssize_t length = PyUnicode_GET_LENGTH(word)
        cdef Py_ssize_t n = len(ids)
        if length == 0 or length > self.max_word_chars or n > self.max_word_chars:
            return False
        cdef const char* data = <const char*>PyUnicode_DATA(word)
        cdef Py_ssize_t count = 0, i, at
        cdef uint64_t h = word_hash(data, length)
        cdef WordSlot* slot
        if self.find_hashed(data, length, h, &count) is not NULL:
            return True  # values are deterministic per word: the one kept is the same
        cdef uint32_t* staged = <uint32_t*>calloc(n if n else 1, sizeof(uint32_t))
        if staged is NULL:
            raise MemoryError()
        try:
            for i in range(n):
                staged[i] = <uint32_t>ids[i]  # OverflowError for a negative or huge id
            if self.count >= self.max_entries:
                self.clear()
            if 2 * (self.count + 1) > self.mask + 1:
                self._grow()
            at = <Py_ssize_t>(h & <uint64_t>self.mask)
            while self.slots[at].check != 0:
                at = (at + 1) & self.mask
            slot = &self.slots[at]
            if _near(length, n):
                memcpy(slot.body.near.chars, data, <size_t>length)
                memcpy(slot.body.near.ids, staged, <size_t>n * sizeof(uint32_t))
            else:
                self._reserve(<size_t>length, <size_t>n)
                memcpy(self.chars + self.chars_used, data, <size_t>length)
                memcpy(self.ids + self.ids_used, staged, <size_t>n * sizeof(uint32_t))
                slot.body.far.word_at = <uint32_t>self.chars_used
                slot.body.far.ids_at = <uint32_t>self.ids_used
                self.chars_used += length
                self.ids_used += n
            slot.word_len = <uint16_t>length
            slot.ids_len = <uint16_t>n
            slot.check = _check(h)  # last: a slot is taken only once it is whole
            self.count += 1
        finally:
            free(staged)
        return True

    cdef int _grow(self) except -1:
        """Twice the slots, every word re-placed (its hash recomputed from its bytes)."""
        cdef Py_ssize_t size = 2 * (self.mask + 1), i, at
        cdef WordSlot* old = self.slots
        cdef WordSlot* slots = _new_slots(size)
        cdef uint64_t h
        for i in range(self.mask + 1):
            if old[i].check == 0:
                continue
            if _near(old[i].word_len, old[i].ids_len):
                h = word_hash(old[i].body.near.chars, old[i].word_len)
            else:
                h = word_hash(self.chars + old[i].body.far.word_at, old[i].word_len)
            at = <Py_ssize_t>(h & <uint64_t>(size - 1))
            while slots[at].check != 0:
                at = (at + 1) & (size - 1)
            slots[at] = old[i]
        self.slots = slots
        self.mask = size - 1
        free(old)
        return 0

    cdef int _reserve(self, size_t chars, size_t ids) except -1:
        cdef size_t cap
        cdef void* grown
        if self.chars_used + chars > self.chars_cap:
            cap = self.chars_cap
            while self.chars_used + chars > cap:
                cap *= 2
            grown = realloc(self.chars, cap)
            if grown is NULL:
                raise MemoryError()
            self.chars = <char*>grown
            self.chars_cap = cap
        if self.ids_used + ids > self.ids_cap:
            cap = self.ids_cap
            while self.ids_used + ids > cap:
                cap *= 2
            grown = realloc(self.ids, cap * sizeof(uint32_t))
            if grown is NULL:
                raise MemoryError()
            self.ids = <uint32_t*>grown
            self.ids_cap = cap
        return 0
