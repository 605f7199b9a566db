# cython: language_level=3
"""``BlockTree``: which target holds which block, as a tree of Cortex block keys.

Contract: ``ledger.pyi``. Structures: ``ledger_tables.pxd`` (nodes, maps),
``ledger_holders.pxd`` (holder sets), ``ledger_walk.pxd`` (the match walk's memory access).
Single owner, never blocks.

Rules (they hold whenever no method is running):

* R1 — holders: target ``t`` is in node ``n``'s holder set iff ``t``'s map has an entry pointing
  at ``n`` with a non-zero refcount; the holder's ``count[m]`` is the number of such entries
  with a non-zero refcount in medium ``m`` (saturating at 255; an exact recount replaces a
  saturated count when it is decremented).
* R2 — entries: a map entry exists iff one of its four refcounts is non-zero; ``entries``
  counts (target, medium, hash) triples with a non-zero refcount. Refcounts saturate at 255:
  a hash stored more than 255 times more than it was removed is dropped early (a miss, never
  a false hit).
* R3 — tree: a node exists iff it has a holder or a live child. ``children`` counts the live
  nodes whose ``parent`` is this node, so an interior block evicted before its descendants
  (vLLM does that) stays as a holderless node until its last descendant goes. The key map holds
  exactly the live nodes. Free nodes carry ``children == FREE_MARK`` so releasing them again is a
  no-op.
* R4 — isolation: an operation on target ``t`` reads and writes only ``t``'s map and ``t``'s
  holders (plus node lifetimes).
* R5 — atomic inputs: every argument is converted and checked before anything changes, so a
  bad argument raises and leaves the tree as it was.

Costs: store O(blocks x holders of the touched nodes), remove O(hashes), clear_target O(the
target's entries), match O(depth x targets still matching) with the key-map and node loads of
the next levels prefetched while the current level is processed.
"""

cimport cython
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp, memset

from cortex._fast.blockkeys cimport key_scratch_bytes, opaque_block_key, token_block_key
from cortex._fast.ledger_holders cimport (
    holder_add,
    holder_delete,
    holder_media,
    holder_search,
    holder_sub,
    holders_of,
    keep_holding,
    media_bytes,
    media_count,
)
from cortex._fast.ledger_tables cimport (
    FREE_MARK,
    MAX_POOL_NODES,
    MIN_TABLE,
    NO_NODE,
    Entry,
    Holder,
    KeyMap,
    Node,
    TargetMap,
    big_calloc,
    big_free,
    big_grow,
    cortex_prefetch,
    hash_home,
    key_home,
    keymap_delete,
    keymap_find,
    keymap_insert,
    targetmap_delete,
    targetmap_find,
    targetmap_insert,
)
from cortex._fast.ledger_walk cimport Walk, walk_node, walk_start
from cortex._fast.pyints cimport copy_tokens, copy_u64s, cortex_new_dict

GPU_ONLY = 1 << 0  # Medium.GPU
ALL_MEDIA = 0b1111

cdef enum:
    MAX_TARGETS = 65535


cdef int _grow(void** buffer, size_t* capacity, size_t needed, size_t item) except -1:
    """Make a scratch array hold at least ``needed`` items (contents not preserved)."""
    cdef size_t cap = capacity[0] if capacity[0] else 64
    cdef void* fresh
    if needed <= capacity[0]:
        return 0
    while cap < needed:
        cap *= 2
    fresh = malloc(cap * item)
    if fresh == NULL:
        raise MemoryError()
    free(buffer[0])
    buffer[0] = fresh
    capacity[0] = cap
    return 0


@cython.final
cdef class BlockTree:
    cdef readonly Py_ssize_t block_size
    cdef readonly unsigned long long unknown_parent
    cdef readonly unsigned long long unknown_removal
    cdef readonly unsigned long long duplicate_store
    cdef readonly unsigned long long hash_conflict

    cdef Node* pool
    cdef uint32_t pool_cap, pool_top, free_head, n_nodes
    cdef KeyMap keys
    cdef TargetMap* maps
    cdef uint32_t n_maps
    cdef uint64_t n_entries
    cdef size_t holder_bytes
    # Scratch, reused by every call: engine hashes or match keys, tokens, key input bytes,
    # match candidates and the targets still matching.
    cdef uint64_t* words
    cdef size_t words_cap
    cdef uint32_t* tokens
    cdef size_t tokens_cap
    cdef uint8_t* key_input
    cdef uint64_t* event_keys
    cdef size_t event_keys_cap
    cdef uint32_t* candidates
    cdef size_t candidates_cap
    cdef uint16_t* active
    cdef size_t active_cap
    cdef uint16_t* dropped
    cdef size_t dropped_cap

    def __cinit__(self, Py_ssize_t block_size):
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self.free_head = NO_NODE
        self.key_input = <uint8_t*>malloc(key_scratch_bytes(block_size))
        self.keys.slots = <uint64_t*>big_calloc(MIN_TABLE * sizeof(uint64_t))
        self.keys.cap = MIN_TABLE
        if self.key_input == NULL or self.keys.slots == NULL:
            raise MemoryError()

    def __dealloc__(self):
        cdef uint32_t i
        if self.pool != NULL:
            for i in range(self.pool_top):
                if self.pool[i].heap_cap:
                    free(self.pool[i].holders.heap)
        if self.maps != NULL:
            for i in range(self.n_maps):
                big_free(self.maps[i].slots, self.maps[i].cap * sizeof(Entry))
        big_free(self.pool, self.pool_cap * sizeof(Node))
        free(self.maps)
        big_free(self.keys.slots, self.keys.cap * sizeof(uint64_t))
        free(self.words)
        free(self.tokens)
        free(self.key_input)
        free(self.event_keys)
        free(self.candidates)
        free(self.active)
        free(self.dropped)

    # ------------------------------------------------------------------------- public API

    def store(self, int target, parent_hash, block_hashes, token_ids, uint64_t seed,
              int medium=0, bint reproducible=True, long long now=0):
        """Apply one BlockStored; the number of blocks stored, or -1 for an unknown parent."""
        _check_target(target)
        _check_medium(medium)
        cdef Py_ssize_t n = self._load_words(block_hashes)
        cdef Py_ssize_t bs = self.block_size
        cdef Py_ssize_t i
        if reproducible:
            if len(token_ids) != n * bs:
                raise ValueError(
                    f"{len(token_ids)} token ids for {n} blocks of {bs} tokens")
            _grow(<void**>&self.tokens, &self.tokens_cap, n * bs, sizeof(uint32_t))
            copy_tokens(token_ids, self.tokens, n * bs)
        cdef uint64_t parent_wanted = 0 if parent_hash is None else <uint64_t>parent_hash
        cdef TargetMap* tm = self._map_of(target)
        cdef Entry* found
        cdef uint32_t parent = NO_NODE, node
        cdef uint64_t parent_key = 0, key
        cdef bint has_parent = False
        cdef uint64_t* keys
        if parent_hash is not None:
            found = targetmap_find(tm, parent_wanted)
            if found == NULL:
                self.unknown_parent += 1
                return -1
            parent = found.node
            parent_key = self.pool[parent].key
            has_parent = True
        # Keys first (CPU only), prefetching the key-map and target-map slots each block will
        # probe, so the event's random loads overlap instead of stalling one after another.
        _grow(<void**>&self.event_keys, &self.event_keys_cap, n, sizeof(uint64_t))
        keys = self.event_keys
        key = parent_key
        for i in range(n):
            if reproducible:
                key = token_block_key(has_parent, key, self.tokens + i * bs, bs, seed,
                                      self.key_input)
            else:
                key = opaque_block_key(has_parent, key, self.words[i], seed, self.key_input)
            has_parent = True
            keys[i] = key
            cortex_prefetch(&self.keys.slots[key_home(key, self.keys.cap)])
            if tm.cap:
                cortex_prefetch(&tm.slots[hash_home(self.words[i], tm.shift)])
        for i in range(n):
            node = self._node_of(keys[i], parent)
            self.pool[node].stamp = <uint32_t>now
            self._attach(tm, <uint16_t>target, self.words[i], node, medium)
            parent = node
        return n

    def remove(self, int target, block_hashes, int medium=0):
        """Apply one BlockRemoved; the number of hashes the target did not hold."""
        _check_target(target)
        _check_medium(medium)
        cdef Py_ssize_t n = self._load_words(block_hashes)
        cdef Py_ssize_t i, unknown = 0
        cdef TargetMap* tm
        cdef Entry* entry
        cdef uint32_t shift = 8 * medium, node
        if <uint32_t>target >= self.n_maps:
            self.unknown_removal += n
            return n
        tm = &self.maps[target]
        for i in range(n):
            entry = targetmap_find(tm, self.words[i])
            if entry == NULL or not (entry.refs >> shift) & 0xFF:
                unknown += 1
                continue
            entry.refs -= 1u << shift
            if (entry.refs >> shift) & 0xFF:
                continue
            node = entry.node
            tm.entries -= 1
            self.n_entries -= 1
            if entry.refs == 0:
                targetmap_delete(tm, entry)
            self._holder_sub(tm, node, <uint16_t>target, medium)
            self._release(node)
        self.unknown_removal += unknown
        return unknown

    def clear_target(self, int target):
        """Drop every entry of the target; the number of entries dropped."""
        _check_target(target)
        if <uint32_t>target >= self.n_maps or self.maps[target].cap == 0:
            return 0
        cdef TargetMap* tm = &self.maps[target]
        cdef Entry* slots = tm.slots
        cdef uint32_t cap = tm.cap, i, node
        cdef uint64_t dropped = tm.entries
        cdef Py_ssize_t pos
        tm.slots = NULL
        tm.cap = tm.used = tm.shift = 0
        tm.entries = 0
        for i in range(cap):
            if slots[i].refs:
                node = slots[i].node
                # Several hashes may point at one node: the first visit removes the holder and
                # may free the node; later visits find no holder and a FREE_MARK (R3).
                pos = holder_search(&self.pool[node], <uint16_t>target)
                if pos >= 0:
                    holder_delete(&self.pool[node], pos, &self.holder_bytes)
                self._release(node)
        big_free(slots, cap * sizeof(Entry))
        self.n_entries -= dropped
        return dropped

    def match(self, keys, uint32_t media=GPU_ONLY):
        """{target: leading blocks of ``keys`` it holds in ``media``} for targets holding >= 1."""
        cdef Py_ssize_t n = self._load_words(keys)
        cdef dict result
        if n == 0 or self.n_nodes == 0:
            return {}
        cdef uint32_t want = media_bytes(media)
        cdef uint64_t* ks = self.words
        cdef Py_ssize_t i, a, j, kept, n_active = 0, n_holders
        cdef uint32_t node
        cdef Node* nd
        cdef Holder* hs
        cdef Holder* prev_hs
        cdef Py_ssize_t prev_n_holders
        cdef uint16_t t
        cdef Walk walk
        _grow(<void**>&self.candidates, &self.candidates_cap, n, sizeof(uint32_t))
        walk_start(&walk, self.pool, self.pool_top, &self.keys, ks, self.candidates, n)
        node = walk_node(&walk, 0, NO_NODE)
        if node == NO_NODE:
            return {}
        nd = &self.pool[node]
        _grow(<void**>&self.active, &self.active_cap, nd.n_holders, sizeof(uint16_t))
        _grow(<void**>&self.dropped, &self.dropped_cap, nd.n_holders, sizeof(uint16_t))
        hs = holders_of(nd)
        prev_hs, prev_n_holders = hs, nd.n_holders
        for j in range(nd.n_holders):
            if holder_media(&hs[j]) & want:
                self.active[n_active] = hs[j].target
                n_active += 1
        result = cortex_new_dict(n_active)
        # Invariant of this loop: ``active`` is sorted and only shrinks — a target drops out
        # at its first miss (recorded with the number of levels it matched) and never rejoins.
        i = 1
        while i < n and n_active:
            node = walk_node(&walk, i, node)
            if node == NO_NODE:
                break
            nd = &self.pool[node]
            hs = holders_of(nd)
            n_holders = nd.n_holders
            if n_holders == prev_n_holders and memcmp(hs, prev_hs, n_holders * sizeof(Holder)) == 0:
                # The same holders (and media) as the level above, a superset of ``active``:
                # nobody drops out. Typical inside a prefix shared by many targets.
                i += 1
                continue
            prev_hs, prev_n_holders = hs, n_holders
            kept = keep_holding(nd, self.active, n_active, want, self.dropped)
            for a in range(n_active - kept):
                result[self.dropped[a]] = i
            n_active = kept
            i += 1
        for a in range(n_active):
            result[self.active[a]] = i
        return result

    def target_keys(self, int target, uint32_t media=ALL_MEDIA):
        """Every key the target holds in ``media`` (tests and snapshots)."""
        _check_target(target)
        cdef set keys = set()
        cdef uint32_t want = media_bytes(media), i
        cdef TargetMap* tm
        if <uint32_t>target < self.n_maps:
            tm = &self.maps[target]
            for i in range(tm.cap):
                if tm.slots[i].refs & want:
                    keys.add(self.pool[tm.slots[i].node].key)
        return keys

    def holds(self, int target, uint64_t block_hash, int medium=-1):
        """Whether the target holds ``block_hash`` in ``medium`` (-1: in any medium)."""
        _check_target(target)
        if medium != -1:
            _check_medium(medium)
        if <uint32_t>target >= self.n_maps:
            return False
        cdef Entry* entry = targetmap_find(&self.maps[target], block_hash)
        if entry == NULL:
            return False
        return medium == -1 or ((entry.refs >> (8 * medium)) & 0xFF) != 0

    def target_entries(self, int target):
        _check_target(target)
        return self.maps[target].entries if <uint32_t>target < self.n_maps else 0

    def targets(self):
        """Targets holding at least one entry, ascending."""
        cdef uint32_t t
        return [t for t in range(self.n_maps) if self.maps[t].entries]

    @property
    def nodes(self):
        return self.n_nodes

    @property
    def entries(self):
        return self.n_entries

    @property
    def memory_bytes(self):
        cdef size_t total = (
            <size_t>self.pool_cap * sizeof(Node)
            + self.keys.cap * sizeof(uint64_t)
            + <size_t>self.n_maps * sizeof(TargetMap)
            + self.holder_bytes
            + self.words_cap * sizeof(uint64_t)
            + self.tokens_cap * sizeof(uint32_t)
            + key_scratch_bytes(self.block_size)
            + self.event_keys_cap * sizeof(uint64_t)
            + self.candidates_cap * sizeof(uint32_t)
            + (self.active_cap + self.dropped_cap) * sizeof(uint16_t)
        )
        cdef uint32_t t
        for t in range(self.n_maps):
            total += <size_t>self.maps[t].cap * sizeof(Entry)
        return total

    def __repr__(self):
        return (f"BlockTree(block_size={self.block_size}, nodes={self.n_nodes}, "
                f"entries={self.n_entries}, targets={len(self.targets())})")

    # ------------------------------------------------------------------------- internals

    cdef Py_ssize_t _load_words(self, object values) except -1:
        """Copy a sequence of u64 (list, any sequence, or a buffer of uint64) to ``words``."""
        cdef Py_ssize_t n = len(values)
        _grow(<void**>&self.words, &self.words_cap, n, sizeof(uint64_t))
        copy_u64s(values, self.words, n)
        return n

    cdef TargetMap* _map_of(self, int target) except NULL:
        cdef uint32_t cap
        cdef TargetMap* grown
        if <uint32_t>target >= self.n_maps:
            cap = self.n_maps * 2 if self.n_maps else 16
            if cap <= <uint32_t>target:
                cap = target + 1
            if cap > MAX_TARGETS:
                cap = MAX_TARGETS
            grown = <TargetMap*>realloc(self.maps, cap * sizeof(TargetMap))
            if grown == NULL:
                raise MemoryError()
            memset(grown + self.n_maps, 0, (cap - self.n_maps) * sizeof(TargetMap))
            self.maps = grown
            self.n_maps = cap
        return &self.maps[target]

    cdef uint32_t _node_of(self, uint64_t key, uint32_t parent) except? 0xFFFFFFFF:
        """The node of ``key``, created under ``parent`` when the key is new."""
        cdef uint32_t node = keymap_find(&self.keys, self.pool, key)
        cdef Node* grown
        cdef size_t cap
        if node != NO_NODE:
            return node
        if self.free_head != NO_NODE:
            node = self.free_head
            self.free_head = self.pool[node].parent
        else:
            if self.pool_top == self.pool_cap:
                cap = <size_t>self.pool_cap * 2 if self.pool_cap else 64
                if cap > MAX_POOL_NODES:
                    cap = MAX_POOL_NODES
                if cap <= self.pool_top:
                    raise MemoryError("block tree node pool is full")
                grown = <Node*>big_grow(self.pool, self.pool_cap * sizeof(Node),
                                        cap * sizeof(Node))
                if grown == NULL:
                    raise MemoryError()
                self.pool = grown
                self.pool_cap = <uint32_t>cap
            node = self.pool_top
            self.pool_top += 1
        keymap_insert(&self.keys, key, node)
        memset(&self.pool[node], 0, sizeof(Node))
        self.pool[node].key = key
        self.pool[node].parent = parent
        if parent != NO_NODE:
            self.pool[parent].children += 1
        self.n_nodes += 1
        return node

    cdef int _attach(self, TargetMap* tm, uint16_t target, uint64_t engine_hash, uint32_t node,
                     int medium) except -1:
        """Record that ``target`` holds ``engine_hash`` (-> ``node``) in ``medium``."""
        cdef uint32_t shift = 8 * medium, old_node, old_refs
        cdef int m
        cdef Entry* entry = targetmap_find(tm, engine_hash)
        if entry == NULL:
            targetmap_insert(tm, engine_hash, node, 1u << shift)
            tm.entries += 1
            self.n_entries += 1
            return self._holder_add(node, target, medium)
        if entry.node == node:
            if (entry.refs >> shift) & 0xFF:
                self.duplicate_store += 1
                if (entry.refs >> shift) & 0xFF != 0xFF:
                    entry.refs += 1u << shift
                return 0
            entry.refs |= 1u << shift
            tm.entries += 1
            self.n_entries += 1
            return self._holder_add(node, target, medium)
        # Same engine hash, different key: the old entry (every medium) is replaced. The new
        # node gets its holder before the old one is released, so no release can free it.
        self.hash_conflict += 1
        old_node, old_refs = entry.node, entry.refs
        entry.node = node
        entry.refs = 1u << shift
        tm.entries += 1 - media_count(old_refs)
        self.n_entries += 1 - media_count(old_refs)
        self._holder_add(node, target, medium)
        for m in range(4):
            if (old_refs >> (8 * m)) & 0xFF:
                self._holder_sub(tm, old_node, target, m)
        self._release(old_node)
        return 0

    cdef inline int _holder_add(self, uint32_t node, uint16_t target, int medium) except -1:
        return holder_add(&self.pool[node], target, medium, &self.holder_bytes)

    cdef inline void _holder_sub(self, TargetMap* tm, uint32_t node, uint16_t target,
                                 int medium) noexcept:
        holder_sub(&self.pool[node], node, tm, target, medium, &self.holder_bytes)

    cdef void _release(self, uint32_t node) noexcept:
        """Free ``node`` and then its ancestors while they have no holder and no child (R3)."""
        cdef uint32_t parent
        cdef Node* nd
        while node != NO_NODE:
            nd = &self.pool[node]
            if nd.n_holders or nd.children:
                return
            parent = nd.parent
            keymap_delete(&self.keys, nd.key, node)
            nd.children = FREE_MARK
            nd.parent = self.free_head
            self.free_head = node
            self.n_nodes -= 1
            if parent != NO_NODE:
                self.pool[parent].children -= 1
            node = parent


cdef inline int _check_target(int target) except -1:
    if target < 0 or target >= MAX_TARGETS:
        raise ValueError(f"target {target} outside [0, {MAX_TARGETS})")
    return 0


cdef inline int _check_medium(int medium) except -1:
    if medium < 0 or medium > 3:
        raise ValueError(f"medium {medium} outside [0, 3]")
    return 0
