# cython: language_level=3
"""``PageFold``: SGLang's per-token pages folded into Cortex's coarse blocks, in C.

Contract: ``page_fold.pyi``; rules F1-F4 and the reference twin: ``cortex.ledger.page_fold``
(the property test compares the two operation by operation).

Storage: each generation is an open-addressing table (linear probing, power-of-two size, at most
7/8 full, grown by doubling, never deleted from: a generation is dropped whole), 24 bytes a slot:
hash, parent hash, position, token. An empty slot has position ``EMPTY``.
"""

cimport cython
from cpython cimport array
from libc.stdint cimport uint32_t, uint64_t
from libc.stdlib cimport free, malloc

import array as py_array

cdef uint32_t EMPTY = 0xFFFFFFFF
cdef uint64_t MAX_POSITION = 0xFFFFFFFE
cdef Py_ssize_t FIRST_SLOTS = 1024

cdef struct Slot:
    uint64_t key
    uint64_t parent
    uint32_t position
    uint32_t token

cdef struct Table:
    Slot* slots
    Py_ssize_t cap  # a power of two
    Py_ssize_t used


cdef inline uint64_t _mix(uint64_t x) noexcept nogil:
    # splitmix64's finalizer: SGLang's hashes are already random, other inputs may not be
    x ^= x >> 30
    x *= <uint64_t>0xBF58476D1CE4E5B9
    x ^= x >> 27
    x *= <uint64_t>0x94D049BB133111EB
    x ^= x >> 31
    return x


cdef int _table_init(Table* t, Py_ssize_t cap) except -1:
    cdef Py_ssize_t i
    t.slots = <Slot*>malloc(cap * sizeof(Slot))
    if t.slots == NULL:
        raise MemoryError()
    for i in range(cap):
        t.slots[i].position = EMPTY
    t.cap = cap
    t.used = 0
    return 0


cdef inline Slot* _table_find(Table* t, uint64_t key) noexcept nogil:
    cdef Py_ssize_t mask = t.cap - 1
    cdef Py_ssize_t i = <Py_ssize_t>(_mix(key) & <uint64_t>mask)
    while True:
        if t.slots[i].position == EMPTY:
            return NULL
        if t.slots[i].key == key:
            return &t.slots[i]
        i = (i + 1) & mask


cdef inline Slot* _table_slot(Table* t, uint64_t key) noexcept nogil:
    """The slot holding ``key``, or the empty slot where it goes."""
    cdef Py_ssize_t mask = t.cap - 1
    cdef Py_ssize_t i = <Py_ssize_t>(_mix(key) & <uint64_t>mask)
    while t.slots[i].position != EMPTY and t.slots[i].key != key:
        i = (i + 1) & mask
    return &t.slots[i]


cdef int _table_grow(Table* t) except -1:
    cdef Table bigger
    cdef Py_ssize_t i
    cdef Slot* slot
    _table_init(&bigger, t.cap * 2)
    for i in range(t.cap):
        if t.slots[i].position != EMPTY:
            slot = _table_slot(&bigger, t.slots[i].key)
            slot[0] = t.slots[i]
    bigger.used = t.used
    free(t.slots)
    t[0] = bigger
    return 0


@cython.final
cdef class PageFold:
    cdef readonly Py_ssize_t granularity
    cdef readonly Py_ssize_t capacity
    cdef public long long forgotten
    cdef public long long conflicts
    cdef Table young
    cdef Table old

    def __cinit__(self, Py_ssize_t granularity, Py_ssize_t capacity):
        self.young.slots = NULL
        self.old.slots = NULL
        if granularity < 2:
            raise ValueError(f"granularity must be >= 2, got {granularity}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.granularity = granularity
        self.capacity = capacity
        _table_init(&self.young, FIRST_SLOTS)
        _table_init(&self.old, FIRST_SLOTS)

    def __dealloc__(self):
        free(self.young.slots)
        free(self.old.slots)

    @property
    def entries(self):
        return self.young.used + self.old.used

    @property
    def memory_bytes(self):
        """Bytes of the two generations' tables."""
        return (self.young.cap + self.old.cap) * sizeof(Slot)

    cdef int _insert(self, uint64_t key, uint64_t parent, uint32_t position,
                     uint32_t token) except -1:
        cdef Slot* slot = _table_slot(&self.young, key)
        cdef Table dropped
        if slot.position == EMPTY:
            if (self.young.used + 1) * 8 > self.young.cap * 7:
                _table_grow(&self.young)
                slot = _table_slot(&self.young, key)
            self.young.used += 1
        slot.key = key
        slot.parent = parent
        slot.position = position
        slot.token = token
        if self.young.used >= self.capacity:  # F1: young becomes old, old is forgotten
            self.forgotten += self.old.used
            dropped = self.old
            self.old = self.young
            try:
                _table_init(&self.young, FIRST_SLOTS)
            except MemoryError:
                self.young = dropped  # keep a valid table
                raise
            free(dropped.slots)
        return 0

    cdef int _lookup(self, uint64_t key, Slot* out) except -1:
        """1 and the entry in ``out`` when known (promoted from old to young, F1), else 0."""
        cdef Slot* found = _table_find(&self.young, key)
        if found != NULL:
            out[0] = found[0]
            return 1
        found = _table_find(&self.old, key)
        if found == NULL:
            return 0
        out[0] = found[0]
        self._insert(out.key, out.parent, out.position, out.token)
        return 1

    def fold(self, parent, hashes, tokens):
        """F2: (coarse parent or None, coarse hashes array('Q'), their tokens array('I')), or
        None when the run cannot be placed."""
        cdef Py_ssize_t n = len(hashes)
        if len(tokens) != n:
            raise ValueError(f"{len(tokens)} token ids for {n} pages of 1 token")
        cdef uint64_t[::1] run_hashes = _u64_view(hashes)
        cdef uint32_t[::1] run_tokens = _u32_view(tokens)
        cdef Py_ssize_t size = self.granularity
        cdef uint64_t start = 0, block_start = 0, position, before = 0
        cdef Slot entry, found
        cdef uint64_t parent_hash = 0
        cdef Py_ssize_t gathered = 0, i, blocks
        cdef array.array out_hashes, out_tokens
        cdef uint32_t[::1] block_tokens
        cdef object coarse_parent = None
        if parent is None:
            if <uint64_t>n > MAX_POSITION:
                return None
        else:
            parent_hash = <uint64_t>parent
            if not self._lookup(parent_hash, &found):
                return None
            start = <uint64_t>found.position + 1
            if start + <uint64_t>n > MAX_POSITION:
                return None
            block_start = start - start % <uint64_t>size
            gathered = <Py_ssize_t>(start - block_start)
            entry = found
            position = start - 1
            # the partly filled block's tokens go to its end of the scratch, backwards
            block_tokens = _scratch(size)
            while position >= block_start:
                if entry.position != position:
                    self.conflicts += 1
                    return None
                block_tokens[position - block_start] = entry.token
                if position == block_start:
                    break
                if not self._lookup(entry.parent, &entry):
                    return None
                position -= 1
            if block_start > 0:
                coarse_parent = parent if start == block_start else entry.parent
            before = parent_hash
        # coarse blocks completed by the run: positions p in [start, start + n) with p + 1 a
        # multiple of the size
        blocks = <Py_ssize_t>((start + <uint64_t>n) // <uint64_t>size - start // <uint64_t>size)
        out_hashes = array.clone(_U64_TEMPLATE, blocks, zero=False)
        out_tokens = array.clone(_U32_TEMPLATE, blocks * size, zero=False)
        cdef uint64_t* hashes_out = <uint64_t*>out_hashes.data.as_ulonglongs
        cdef uint32_t* tokens_out = <uint32_t*>out_tokens.data.as_uints
        cdef Py_ssize_t written = 0, filled = 0
        if gathered and blocks:
            for i in range(gathered):
                tokens_out[i] = block_tokens[i]
            filled = gathered
        for i in range(n):
            position = start + <uint64_t>i
            self._insert(run_hashes[i], before, <uint32_t>position, run_tokens[i])
            if written < blocks:
                tokens_out[written * size + filled] = run_tokens[i]
                filled += 1
                if filled == size:
                    hashes_out[written] = run_hashes[i]
                    written += 1
                    filled = 0
            before = run_hashes[i]
        return coarse_parent, out_hashes, out_tokens

    def keep(self, hashes):
        """F3: the hashes that end a coarse block or are unknown, array('Q')."""
        cdef Py_ssize_t n = len(hashes), i, kept = 0
        cdef uint64_t[::1] view = _u64_view(hashes)
        cdef array.array out = array.clone(_U64_TEMPLATE, n, zero=False)
        cdef uint64_t* data = <uint64_t*>out.data.as_ulonglongs
        cdef Slot* found
        cdef uint64_t size = <uint64_t>self.granularity
        for i in range(n):
            found = _table_find(&self.young, view[i])
            if found == NULL:
                found = _table_find(&self.old, view[i])
            if found == NULL or (<uint64_t>found.position + 1) % size == 0:
                data[kept] = view[i]
                kept += 1
        array.resize(out, kept)
        return out


cdef array.array _U64_TEMPLATE = py_array.array("Q")
cdef array.array _U32_TEMPLATE = py_array.array("I")
cdef uint32_t[::1] _SCRATCH = py_array.array("I", [0])


cdef uint32_t[::1] _scratch(Py_ssize_t size):
    global _SCRATCH
    if _SCRATCH.shape[0] < size:
        _SCRATCH = py_array.array("I", bytes(4 * size))
    return _SCRATCH


cdef uint64_t[::1] _u64_view(values):
    """``values`` as u64: an array('Q') (or any u64 buffer) as it is, else converted by
    ``array`` (OverflowError out of range)."""
    try:
        return values
    except (TypeError, ValueError):
        return py_array.array("Q", values)


cdef uint32_t[::1] _u32_view(values):
    """``values`` as u32: an array('I') as it is, else converted (OverflowError past u32)."""
    try:
        return values
    except (TypeError, ValueError):
        return py_array.array("I", values)
