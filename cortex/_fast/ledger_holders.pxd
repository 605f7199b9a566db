# cython: language_level=3
"""Holder sets: which targets hold a node, in which media (structures: ``ledger_tables.pxd``).

A node's holders are sorted by target; each carries ``count[m]``, the number of the target's
engine hashes in medium ``m`` that point at the node (rule R1 of ``ledger.pyx``). Counts are u8
and saturate at 255: ``holder_sub`` then recounts exactly from the target's map, so a count is
never wrong, only occasionally slow to maintain (only when one target has 255+ hashes naming one
block). Media travel as packed bytes: byte m of a u32 belongs to medium m.
"""

from libc.stdint cimport uint8_t, uint16_t, uint32_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memmove, memset

from cortex._fast.ledger_tables cimport (
    INLINE_HOLDERS,
    MAX_HOLDERS,
    N_MEDIA,
    Holder,
    Node,
    TargetMap,
)


# ----------------------------------------------------------------------------- media bytes

cdef inline uint32_t media_bytes(uint32_t media_mask) noexcept nogil:
    """Medium bit mask -> byte mask over packed per-medium counters."""
    cdef uint32_t out = 0
    cdef int m
    for m in range(N_MEDIA):
        if media_mask & (1u << m):
            out |= 0xFFu << (8 * m)
    return out


cdef inline int media_count(uint32_t packed) noexcept nogil:
    """How many media have a non-zero counter in ``packed``."""
    cdef int m, n = 0
    for m in range(N_MEDIA):
        if (packed >> (8 * m)) & 0xFF:
            n += 1
    return n


cdef inline uint32_t holder_media(const Holder* h) noexcept nogil:
    cdef uint32_t packed
    memcpy(&packed, h.count, 4)
    return packed


# ----------------------------------------------------------------------------- holder sets

cdef inline Holder* holders_of(Node* nd) noexcept nogil:
    return nd.holders.heap if nd.heap_cap else nd.holders.small


cdef inline Py_ssize_t holder_search(Node* nd, uint16_t target) noexcept nogil:
    """Index of ``target`` in the node's sorted holders, or ``-(insertion point) - 1``."""
    cdef Holder* hs = holders_of(nd)
    cdef Py_ssize_t lo = 0, hi = nd.n_holders, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if hs[mid].target < target:
            lo = mid + 1
        else:
            hi = mid
    if lo < nd.n_holders and hs[lo].target == target:
        return lo
    return -lo - 1


cdef inline int holder_insert(Node* nd, Py_ssize_t pos, uint16_t target,
                              size_t* heap_bytes) except -1:
    """Insert a holder with zero counts at ``pos`` (from ``holder_search``)."""
    cdef size_t cap = nd.heap_cap if nd.heap_cap else INLINE_HOLDERS
    cdef size_t new_cap
    cdef Holder* grown
    cdef Holder* hs
    if nd.n_holders >= cap:
        new_cap = cap * 2 if cap * 2 < MAX_HOLDERS else MAX_HOLDERS
        grown = <Holder*>malloc(new_cap * sizeof(Holder))
        if grown == NULL:
            raise MemoryError()
        memcpy(grown, holders_of(nd), nd.n_holders * sizeof(Holder))
        if nd.heap_cap:
            free(nd.holders.heap)
            heap_bytes[0] -= nd.heap_cap * sizeof(Holder)
        nd.holders.heap = grown
        nd.heap_cap = <uint16_t>new_cap
        heap_bytes[0] += new_cap * sizeof(Holder)
    hs = holders_of(nd)
    memmove(hs + pos + 1, hs + pos, (nd.n_holders - pos) * sizeof(Holder))
    hs[pos].target = target
    memset(hs[pos].count, 0, 4)
    nd.n_holders += 1
    return 0


cdef inline void holder_delete(Node* nd, Py_ssize_t pos, size_t* heap_bytes) noexcept nogil:
    """Delete the holder at ``pos``; shrink or move the set back inside the node."""
    cdef Holder* hs = holders_of(nd)
    cdef Holder* heap
    cdef Holder* smaller
    cdef size_t half
    memmove(hs + pos, hs + pos + 1, (nd.n_holders - pos - 1) * sizeof(Holder))
    nd.n_holders -= 1
    if not nd.heap_cap:
        return
    if nd.n_holders <= INLINE_HOLDERS:
        heap = nd.holders.heap
        heap_bytes[0] -= nd.heap_cap * sizeof(Holder)
        nd.heap_cap = 0
        memcpy(nd.holders.small, heap, nd.n_holders * sizeof(Holder))
        free(heap)
    elif nd.n_holders * 4 < nd.heap_cap:
        half = nd.heap_cap // 2
        smaller = <Holder*>malloc(half * sizeof(Holder))
        if smaller != NULL:  # keeping the larger array is always correct
            memcpy(smaller, nd.holders.heap, nd.n_holders * sizeof(Holder))
            free(nd.holders.heap)
            heap_bytes[0] -= (nd.heap_cap - half) * sizeof(Holder)
            nd.holders.heap = smaller
            nd.heap_cap = <uint16_t>half


cdef inline int holder_add(Node* nd, uint16_t target, int medium, size_t* heap_bytes) except -1:
    """One more of ``target``'s hashes in ``medium`` points at the node."""
    cdef Py_ssize_t pos = holder_search(nd, target)
    cdef Holder* h
    if pos < 0:
        pos = -pos - 1
        holder_insert(nd, pos, target, heap_bytes)
    h = &holders_of(nd)[pos]
    if h.count[medium] != 0xFF:
        h.count[medium] += 1
    return 0


cdef inline void holder_sub(Node* nd, uint32_t node, const TargetMap* tm, uint16_t target,
                            int medium, size_t* heap_bytes) noexcept nogil:
    """One fewer of ``target``'s hashes in ``medium`` points at node ``nd`` (index ``node``);
    ``tm``, the target's map, is already updated. The holder goes when no count is left."""
    cdef Py_ssize_t pos = holder_search(nd, target)
    cdef Holder* h
    cdef uint32_t i, exact = 0
    if pos < 0:
        return
    h = &holders_of(nd)[pos]
    if h.count[medium] == 0xFF:  # saturated: count exactly
        for i in range(tm.cap):
            if tm.slots[i].node == node and (tm.slots[i].refs >> (8 * medium)) & 0xFF:
                exact += 1
        h.count[medium] = <uint8_t>(exact if exact < 0xFF else 0xFF)
    elif h.count[medium]:
        h.count[medium] -= 1
    if holder_media(h) == 0:
        holder_delete(nd, pos, heap_bytes)


cdef inline Py_ssize_t keep_holding(Node* nd, uint16_t* active, Py_ssize_t n_active,
                                    uint32_t want, uint16_t* dropped) noexcept nogil:
    """Keep in ``active`` (sorted) the targets that hold the node in the media of ``want``
    (packed bytes); the others go to ``dropped`` in order. Returns how many stayed."""
    cdef Holder* hs = holders_of(nd)
    cdef Py_ssize_t n_holders = nd.n_holders, a, j = 0, kept = 0, gone = 0
    cdef uint16_t t
    if n_holders > 8 * n_active:  # a few targets left in a wide node: binary search
        for a in range(n_active):
            t = active[a]
            j = holder_search(nd, t)
            if j >= 0 and holder_media(&hs[j]) & want:
                active[kept] = t
                kept += 1
            else:
                dropped[gone] = t
                gone += 1
        return kept
    for a in range(n_active):  # merge two sorted lists
        t = active[a]
        while j < n_holders and hs[j].target < t:
            j += 1
        if j < n_holders and hs[j].target == t and holder_media(&hs[j]) & want:
            active[kept] = t
            kept += 1
        else:
            dropped[gone] = t
            gone += 1
    return kept
