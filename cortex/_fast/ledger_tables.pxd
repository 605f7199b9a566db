# cython: language_level=3
"""The C structures under ``ledger.BlockTree``: nodes, holder sets, and two maps (holder-set
operations: ``ledger_holders.pxd``).

Memory layout (no Python object per entry; everything lives in malloc'd arrays):

* ``Node`` (40 bytes, in one pool indexed by u32): the block key, the parent's index, how many
  live children it has, a last-touched stamp and its holder set.
* Holder set: the (target, per-medium count) pairs of a node, **sorted by target**. Up to two
  live inside the node; more move to a heap array (capacity doubles, halves when a quarter full,
  moves back inside at two). ``count[m]`` = how many of the target's engine hashes in medium
  ``m`` point at the node (almost always 0 or 1; saturates at 255, see ``holder_sub`` in
  ``ledger.pyx``). A holder exists iff some count is non-zero.
* ``KeyMap``: block key -> node, open addressing with linear probing over u64 slots
  ``(key >> 32) << 32 | (node + 1)`` (0 = empty). The home slot comes from the key's high half,
  which the slot keeps, so growing and deleting never touch the nodes; a probe compares the
  stored half first and the node's full key only on a match.
* ``TargetMap``: one target's engine hash -> (node, refcount per medium), open addressing with
  linear probing over 16-byte entries, Fibonacci-hashed home (engine hashes in tests are small
  ints). ``refs`` packs four u8 refcounts (byte m = medium m); ``refs == 0`` marks an empty slot.

Both maps delete by backward shift (no tombstones), grow at 3/4 load and shrink below 1/8, so
every lookup stays O(1) expected and a full scan of a map is O(its live entries).

Large arrays (the node pool, the maps once they pass 2 MiB) are mapped directly with
transparent huge pages requested: ``match`` touches a few random slots and nodes per level, and
with 4 KiB pages each of those loads would also miss the TLB.
"""

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, realloc
from libc.string cimport memcpy
from posix.mman cimport (
    MADV_HUGEPAGE,
    MAP_ANONYMOUS,
    MAP_FAILED,
    MAP_PRIVATE,
    PROT_READ,
    PROT_WRITE,
    madvise,
    mmap,
    mremap,
    munmap,
)

cdef enum:
    N_MEDIA = 4
    INLINE_HOLDERS = 2
    MAX_HOLDERS = 65535
    MIN_TABLE = 8
    HUGE_BYTES = 1 << 21  # arrays this large are mmap'd with huge pages requested

cdef extern from *:
    """
    #define CORTEX_NO_NODE ((uint32_t)0xFFFFFFFFu)
    #define CORTEX_FREE_MARK ((uint32_t)0xFFFFFFFFu)
    #define CORTEX_MAX_POOL_NODES ((uint32_t)0xFFFFFFF0u)
    #if defined(__GNUC__) || defined(__clang__)
    #define cortex_prefetch(p) __builtin_prefetch((const void*)(p), 0, 3)
    #else
    #define cortex_prefetch(p) ((void)(p))
    #endif
    """
    const uint32_t NO_NODE "CORTEX_NO_NODE"
    const uint32_t FREE_MARK "CORTEX_FREE_MARK"  # Node.children of a node on the free list
    const uint32_t MAX_POOL_NODES "CORTEX_MAX_POOL_NODES"  # node indices stay below
    const int MREMAP_MAYMOVE
    void cortex_prefetch(const void* p) noexcept nogil


ctypedef struct Holder:
    uint16_t target
    uint8_t count[4]  # per medium: the target's hashes in that medium pointing at the node

ctypedef union HolderSlots:
    Holder small[2]  # INLINE_HOLDERS
    Holder* heap

ctypedef struct Node:
    uint64_t key
    uint32_t parent  # NO_NODE at the root; next free node while on the free list
    uint32_t children  # live nodes whose parent is this one
    uint32_t stamp  # ``now`` of the last store that touched the node, modulo 2**32
    uint16_t n_holders
    uint16_t heap_cap  # 0: the holders live in ``holders.small``
    HolderSlots holders

ctypedef struct KeyMap:
    uint64_t* slots
    size_t cap  # power of two
    size_t count

ctypedef struct Entry:
    uint64_t hash
    uint32_t node
    uint32_t refs  # byte m: refcount of (target, medium m, hash); 0 = empty slot

ctypedef struct TargetMap:
    Entry* slots  # NULL until the target stores something
    uint32_t cap  # 0 or a power of two
    uint32_t shift  # 64 - log2(cap)
    uint32_t used  # occupied slots (engine hashes held)
    uint64_t entries  # (hash, medium) pairs held


# ----------------------------------------------------------------------------- big arrays

cdef inline void* big_calloc(size_t nbytes) noexcept nogil:
    """Zeroed memory; NULL when out of memory. Free with ``big_free(p, nbytes)``."""
    cdef void* p
    if nbytes < HUGE_BYTES:
        return calloc(nbytes, 1)
    p = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    if p == MAP_FAILED:
        return NULL
    madvise(p, nbytes, MADV_HUGEPAGE)
    return p


cdef inline void big_free(void* p, size_t nbytes) noexcept nogil:
    if p == NULL:
        return
    if nbytes < HUGE_BYTES:
        free(p)
    else:
        munmap(p, nbytes)


cdef inline void* big_grow(void* p, size_t old_bytes, size_t new_bytes) noexcept nogil:
    """Grow a ``big_calloc`` array, keeping its contents (the new tail is not zeroed); NULL
    (and ``p`` untouched) when out of memory."""
    cdef void* q
    if new_bytes < HUGE_BYTES:
        return realloc(p, new_bytes)
    if old_bytes >= HUGE_BYTES:
        q = mremap(p, old_bytes, new_bytes, MREMAP_MAYMOVE)
        if q == MAP_FAILED:
            return NULL
        madvise(q, new_bytes, MADV_HUGEPAGE)
        return q
    q = big_calloc(new_bytes)
    if q != NULL:
        if old_bytes:
            memcpy(q, p, old_bytes)
        free(p)
    return q


# ----------------------------------------------------------------------------- key map

cdef inline size_t key_home(uint64_t key, size_t cap) noexcept nogil:
    return <size_t>(key >> 32) & (cap - 1)


cdef inline uint64_t key_slot(uint64_t key, uint32_t node) noexcept nogil:
    return (key & 0xFFFFFFFF00000000ULL) | (<uint64_t>node + 1)


cdef inline uint32_t keymap_find(const KeyMap* km, const Node* nodes, uint64_t key) noexcept nogil:
    """Node of ``key`` or NO_NODE."""
    cdef size_t mask = km.cap - 1
    cdef size_t i = key_home(key, km.cap)
    cdef uint64_t high = key & 0xFFFFFFFF00000000ULL
    cdef uint64_t slot
    cdef uint32_t node
    while True:
        slot = km.slots[i]
        if slot == 0:
            return NO_NODE
        if (slot & 0xFFFFFFFF00000000ULL) == high:
            node = <uint32_t>(slot & 0xFFFFFFFFu) - 1
            if nodes[node].key == key:
                return node
        i = (i + 1) & mask


cdef inline uint32_t keymap_candidate(const KeyMap* km, uint64_t key) noexcept nogil:
    """First node whose key shares ``key``'s high half (the caller checks the full key), or
    NO_NODE; touches only the slots, so it can run while the node is still being prefetched."""
    cdef size_t mask = km.cap - 1
    cdef size_t i = key_home(key, km.cap)
    cdef uint64_t high = key & 0xFFFFFFFF00000000ULL
    cdef uint64_t slot
    while True:
        slot = km.slots[i]
        if slot == 0:
            return NO_NODE
        if (slot & 0xFFFFFFFF00000000ULL) == high:
            return <uint32_t>(slot & 0xFFFFFFFFu) - 1
        i = (i + 1) & mask


cdef inline int keymap_rehash(KeyMap* km, size_t new_cap) noexcept nogil:
    """Move every slot into a fresh table of ``new_cap`` slots; -1 (table unchanged) when out of
    memory."""
    cdef uint64_t* fresh = <uint64_t*>big_calloc(new_cap * sizeof(uint64_t))
    cdef size_t i, j, mask = new_cap - 1
    cdef uint64_t slot
    if fresh == NULL:
        return -1
    for i in range(km.cap):
        slot = km.slots[i]
        if slot:
            j = key_home(slot, new_cap)
            while fresh[j]:
                j = (j + 1) & mask
            fresh[j] = slot
    big_free(km.slots, km.cap * sizeof(uint64_t))
    km.slots = fresh
    km.cap = new_cap
    return 0


cdef inline int keymap_insert(KeyMap* km, uint64_t key, uint32_t node) except -1:
    """Insert a key known to be absent."""
    cdef size_t i, mask
    if (km.count + 1) * 4 > km.cap * 3 and keymap_rehash(km, km.cap * 2) < 0:
        raise MemoryError()
    mask = km.cap - 1
    i = key_home(key, km.cap)
    while km.slots[i]:
        i = (i + 1) & mask
    km.slots[i] = key_slot(key, node)
    km.count += 1
    return 0


cdef inline void keymap_delete(KeyMap* km, uint64_t key, uint32_t node) noexcept nogil:
    """Delete the slot of (key, node), which must be present; backward-shift the run after it."""
    cdef size_t mask = km.cap - 1
    cdef size_t i = key_home(key, km.cap)
    cdef size_t j, home
    cdef uint64_t wanted = key_slot(key, node)
    cdef uint64_t slot
    while km.slots[i] != wanted:
        if km.slots[i] == 0:
            return
        i = (i + 1) & mask
    j = i
    while True:
        j = (j + 1) & mask
        slot = km.slots[j]
        if slot == 0:
            break
        home = key_home(slot, km.cap)
        # The entry at j may move to the hole at i unless its home lies cyclically in (i, j].
        if (i <= j and (home <= i or home > j)) or (i > j and home <= i and home > j):
            km.slots[i] = slot
            i = j
    km.slots[i] = 0
    km.count -= 1
    if km.cap > MIN_TABLE and km.count * 8 < km.cap:
        keymap_rehash(km, km.cap // 2)  # on failure the larger table stays: still correct


# ----------------------------------------------------------------------------- target map

cdef inline size_t hash_home(uint64_t engine_hash, uint32_t shift) noexcept nogil:
    return <size_t>((engine_hash * 11400714819323198485ULL) >> shift)


cdef inline Entry* targetmap_find(const TargetMap* tm, uint64_t engine_hash) noexcept nogil:
    cdef size_t mask, i
    if tm.cap == 0:
        return NULL
    mask = tm.cap - 1
    i = hash_home(engine_hash, tm.shift)
    while True:
        if tm.slots[i].refs == 0:
            return NULL
        if tm.slots[i].hash == engine_hash:
            return &tm.slots[i]
        i = (i + 1) & mask


cdef inline uint32_t log2_of(size_t power) noexcept nogil:
    cdef uint32_t bits = 0
    while (<size_t>1 << bits) < power:
        bits += 1
    return bits


cdef inline int targetmap_rehash(TargetMap* tm, uint32_t new_cap) noexcept nogil:
    """Move every entry into a fresh table of ``new_cap`` slots; -1 (table unchanged) when out
    of memory."""
    cdef Entry* fresh = <Entry*>big_calloc(new_cap * sizeof(Entry))
    cdef uint32_t shift = 64 - log2_of(new_cap)
    cdef size_t i, j, mask = new_cap - 1
    if fresh == NULL:
        return -1
    for i in range(tm.cap):
        if tm.slots[i].refs:
            j = hash_home(tm.slots[i].hash, shift)
            while fresh[j].refs:
                j = (j + 1) & mask
            fresh[j] = tm.slots[i]
    big_free(tm.slots, tm.cap * sizeof(Entry))
    tm.slots = fresh
    tm.cap = new_cap
    tm.shift = shift
    return 0


cdef inline int targetmap_insert(TargetMap* tm, uint64_t engine_hash, uint32_t node,
                                 uint32_t refs) except -1:
    """Insert a hash known to be absent (``refs`` non-zero)."""
    cdef size_t i, mask
    cdef uint32_t want = 0
    if tm.cap == 0:
        want = MIN_TABLE
    elif (tm.used + 1) * 4 > tm.cap * 3:
        want = tm.cap * 2
    if want and targetmap_rehash(tm, want) < 0:
        raise MemoryError()
    mask = tm.cap - 1
    i = hash_home(engine_hash, tm.shift)
    while tm.slots[i].refs:
        i = (i + 1) & mask
    tm.slots[i].hash = engine_hash
    tm.slots[i].node = node
    tm.slots[i].refs = refs
    tm.used += 1
    return 0


cdef inline void targetmap_delete(TargetMap* tm, Entry* entry) noexcept nogil:
    """Delete ``entry`` (a slot of ``tm``); backward-shift the run after it."""
    cdef size_t mask = tm.cap - 1
    cdef size_t i = <size_t>(entry - tm.slots)
    cdef size_t j = i, home
    while True:
        j = (j + 1) & mask
        if tm.slots[j].refs == 0:
            break
        home = hash_home(tm.slots[j].hash, tm.shift)
        if (i <= j and (home <= i or home > j)) or (i > j and home <= i and home > j):
            tm.slots[i] = tm.slots[j]
            i = j
    tm.slots[i].refs = 0
    tm.used -= 1
    if tm.cap > MIN_TABLE and tm.used * 8 < tm.cap:
        targetmap_rehash(tm, tm.cap // 2)  # on failure the larger table stays: still correct
