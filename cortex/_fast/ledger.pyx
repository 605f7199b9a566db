# cython: language_level=3
"""``BlockTree``: which target holds which block, as a tree of Cortex block keys.

Contract: ``ledger.pyi``. Structures: ``ledger_tables.pxd`` (nodes, maps),
``ledger_holders.pxd`` (holder sets), ``ledger_walk.pxd`` (the match walk's memory access).
Single owner, never blocks.

Parts, one concept each, all in this one extension module: the ``.pxi`` files are included
textually at the end of this file, so every call between parts stays a direct C call that the
compiler may inline (a cdef class body cannot include a file, so the parts are functions of the
tree written as its methods, first argument ``BlockTree self``):

* ``ledger.pyx`` (this file) — the rules below, the ``BlockTree`` class (its fields, the
  Python-facing methods and properties: store, remove, clear_target, queries, budget settings)
  and the argument checks (R5);
* ``ledger_nodes.pxi`` — the storage: node pool, key map, target maps and holder sets; finding
  or creating a node, attaching an entry, releasing nodes (R1-R3), the scratch buffers;
* ``ledger_match.pxi`` — ``match``, the request path's walk down the tree;
* ``ledger_evict.pxi`` — the entry budget: eviction at once (R7) and incremental (R9);
* ``ledger_image.pxi`` — target images for snapshots: ``export_target``, ``import_target`` (R8).

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
* R6 — recency: a store stamps every node it touches with ``now`` and so do the ancestors of its
  parent (walking up while they are older), so a node is never older than its descendants
  (while ``now`` does not go backwards). ``clock`` is the newest ``now`` seen; a node's age is
  ``clock - stamp`` modulo 2**32.
* R7 — entry budget, R9 — incremental eviction: ``ledger_evict.pxi``.
* R8 — images: ``ledger_image.pxi``.

Costs: store O(blocks x holders of the touched nodes + ancestors stamped), remove O(hashes), clear_target O(the
target's entries), match O(depth x targets still matching) with the key-map and node loads of
the next levels prefetched while the current level is processed.
"""

cimport cython
from libc.stdint cimport int32_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
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
    targetmap_rehash,
)
from cortex._fast.ledger_walk cimport Walk, walk_node, walk_start
from cortex._fast.pyints cimport copy_tokens, copy_u64s, cortex_new_dict

GPU_ONLY = 1 << 0  # Medium.GPU
ALL_MEDIA = 0b1111

cdef enum:
    MAX_TARGETS = 65535


@cython.final
cdef class BlockTree:
    cdef readonly Py_ssize_t block_size
    cdef readonly unsigned long long unknown_parent
    cdef readonly unsigned long long unknown_removal
    cdef readonly unsigned long long duplicate_store
    cdef readonly unsigned long long hash_conflict
    cdef readonly unsigned long long evicted_entries
    cdef readonly unsigned long long evictions  # eviction rounds (R7: each down to the low water)
    cdef readonly unsigned long long max_entries  # 0: no budget
    cdef readonly double low_water
    cdef readonly uint32_t clock  # newest ``now`` seen (modulo 2**32)
    # R9: trees whose eviction work (``evict_work``) is at most this evict synchronously.
    cdef readonly unsigned long long sync_work
    # R9: visits per store of an incremental eviction; 0: sized from the slack (step_work()).
    cdef readonly unsigned long long step_work
    # Incremental eviction (R9): an episode runs rounds until ``ev_goal`` is reached; a round
    # is phase 1 (age histogram, high half), 2 (low half), 3 (sweep of the target maps).
    cdef bint ev_active
    cdef int ev_phase
    cdef uint64_t ev_goal, ev_depth, ev_excess, ev_acc, ev_round_work, ev_round_evicted
    cdef uint32_t ev_c0, ev_hb, ev_cutoff, ev_cursor, ev_map, ev_map_cap, ev_marks_len
    cdef uint64_t* ev_hist
    cdef uint8_t* ev_marks  # phase 3: nodes at least ev_cutoff old (at ev_c0)

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

    def __cinit__(self, Py_ssize_t block_size, unsigned long long max_entries=0,
                  double low_water=0.95):
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self.set_budget(max_entries, low_water)
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
        free(self.ev_hist)
        free(self.ev_marks)

    # ------------------------------------------------------------------------- public API

    def store(self, int target, parent_hash, block_hashes, token_ids, uint64_t seed,
              int medium=0, bint reproducible=True, long long now=0):
        """Apply one BlockStored; the number of blocks stored, or -1 for an unknown parent."""
        _check_target(target)
        _check_medium(medium)
        cdef Py_ssize_t n = _load_words(self, block_hashes)
        cdef Py_ssize_t bs = self.block_size
        cdef Py_ssize_t i
        if reproducible:
            if len(token_ids) != n * bs:
                raise ValueError(
                    f"{len(token_ids)} token ids for {n} blocks of {bs} tokens")
            _grow(<void**>&self.tokens, &self.tokens_cap, n * bs, sizeof(uint32_t))
            copy_tokens(token_ids, self.tokens, n * bs)
        cdef uint64_t parent_wanted = 0 if parent_hash is None else <uint64_t>parent_hash
        cdef TargetMap* tm = _map_of(self, target)
        cdef Entry* found
        cdef uint32_t parent = NO_NODE, node
        cdef uint64_t parent_key = 0, key
        cdef bint has_parent = False
        cdef uint64_t* keys
        cdef uint32_t stamp = <uint32_t>now, up
        if <int32_t>(stamp - self.clock) > 0:
            self.clock = stamp
        if parent_hash is not None:
            found = targetmap_find(tm, parent_wanted)
            if found == NULL:
                self.unknown_parent += 1
                return -1
            parent = found.node
            parent_key = self.pool[parent].key
            has_parent = True
            up = parent  # R6: the parent's path is touched too
            while up != NO_NODE and <int32_t>(stamp - self.pool[up].stamp) > 0:
                self.pool[up].stamp = stamp
                up = self.pool[up].parent
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
            node = _node_of(self, keys[i], parent)
            self.pool[node].stamp = stamp
            _attach(self, tm, <uint16_t>target, self.words[i], node, medium)
            parent = node
        if self.max_entries:
            _keep_budget(self, n)
        return n

    def set_budget(self, unsigned long long max_entries, double low_water=0.95,
                   unsigned long long sync_work=SYNC_WORK, unsigned long long step_work=0):
        """Entry budget (0: none), the fraction of it an eviction goes down to (R7), the size
        under which evictions stay synchronous and the visits per store of an incremental one
        (0: sized from the slack) (R9); takes effect at the next store."""
        if not 0.0 < low_water <= 1.0:
            raise ValueError(f"low_water must be in (0, 1], got {low_water}")
        self.max_entries = max_entries
        self.low_water = low_water
        self.sync_work = sync_work
        self.step_work = step_work
        self.ev_active = False
        self.ev_phase = 0

    def evict(self, unsigned long long goal):
        """Evict least-recently-touched entries until at most ``goal`` are left (R7); the
        number evicted. Ends an incremental eviction in progress."""
        self.ev_active = False
        self.ev_phase = 0
        return _evict(self, goal)

    def evict_step(self, unsigned long long goal, unsigned long long work,
                   unsigned long long depth=0):
        """Advance an incremental eviction towards ``goal`` entries by about ``work`` node and
        map-slot visits (R9), each round aiming ``depth`` entries lower; True once at most
        ``goal`` are left and no round is running."""
        if not self.ev_active:
            self.ev_active = True
            self.ev_phase = 0
            self.ev_round_work = self.evict_work
        self.ev_goal = goal
        self.ev_depth = depth
        return _evict_step(self, work)

    @property
    def evict_work(self):
        """Node and map-slot visits of one eviction round: 3 x node pool + every map's slots."""
        cdef uint64_t total = 3 * <uint64_t>self.pool_top
        cdef uint32_t t
        for t in range(self.n_maps):
            total += self.maps[t].cap
        return total

    @property
    def evicting(self):
        """Whether an incremental eviction is in progress (R9)."""
        return bool(self.ev_active)

    def remove(self, int target, block_hashes, int medium=0):
        """Apply one BlockRemoved; the number of hashes the target did not hold."""
        _check_target(target)
        _check_medium(medium)
        cdef Py_ssize_t n = _load_words(self, block_hashes)
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
            _holder_sub(self, tm, node, <uint16_t>target, medium)
            _release(self, node)
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
                _release(self, node)
        big_free(slots, cap * sizeof(Entry))
        self.n_entries -= dropped
        return dropped

    def match(self, keys, uint32_t media=GPU_ONLY):
        """{target: leading blocks of ``keys`` it holds in ``media``} for targets holding >= 1."""
        return _match(self, keys, media)

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

    def export_target(self, int target):
        """The target's part of the tree, enough to rebuild it exactly (R8): ``(node_keys,
        node_parents, entry_hashes, entry_nodes, entry_refs)`` as native-order bytes of u64,
        u32, u64, u32, u32. Nodes are every node an entry names plus their ancestors, parents
        before children; ``node_parents[i]`` is 1 + the index of node i's parent in the list, 0
        for a root. Entry j is engine hash ``entry_hashes[j]`` naming node ``entry_nodes[j]``
        with the packed per-medium refcounts ``entry_refs[j]``. O(the target's entries + their
        ancestors)."""
        return _export_target(self, target)

    def import_target(self, int target, const uint64_t[::1] node_keys,
                      const uint32_t[::1] node_parents, const uint64_t[::1] entry_hashes,
                      const uint32_t[::1] entry_nodes, const uint32_t[::1] entry_refs,
                      long long now=0):
        """Rebuild the target's entries from ``export_target``'s arrays (as typed buffers, e.g.
        ``memoryview(b).cast("Q")``) into a target holding nothing (R8); every node listed is
        stamped ``now``. The number of entries added. ValueError, with the tree unchanged
        (stamps aside), when the arrays are inconsistent, name a hash twice, disagree with the
        tree (a key already present under another parent) or the target holds entries."""
        return _import_target(self, target, node_keys, node_parents, entry_hashes,
                              entry_nodes, entry_refs, now)

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


cdef inline int _check_target(int target) except -1:
    if target < 0 or target >= MAX_TARGETS:
        raise ValueError(f"target {target} outside [0, {MAX_TARGETS})")
    return 0


cdef inline int _check_medium(int medium) except -1:
    if medium < 0 or medium > 3:
        raise ValueError(f"medium {medium} outside [0, 3]")
    return 0


# The parts (see above).
include "ledger_nodes.pxi"
include "ledger_match.pxi"
include "ledger_evict.pxi"
include "ledger_image.pxi"
