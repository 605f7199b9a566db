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
* R6 — recency: a store stamps every node it touches with ``now`` and so do the ancestors of its
  parent (walking up while they are older), so a node is never older than its descendants
  (while ``now`` does not go backwards). ``clock`` is the newest ``now`` seen; a node's age is
  ``clock - stamp`` modulo 2**32.
* R7 — entry budget: with ``max_entries`` > 0, a store that leaves more entries than that evicts
  down to ``low_water * max_entries``: every entry of the oldest nodes (all their holders, all
  media, exactly as BlockRemoved of each target's hashes naming them would), oldest first; among
  nodes of the same age, deepest first, so by R6 eviction never takes a node from a target
  while leaving a descendant. Evicted entries are counted
  (``evicted_entries``); later events naming evicted hashes are unknown ones (counted, ignored;
  a store under an evicted parent is skipped). Eviction only removes, so it never makes a false
  hit. Cost: up to seven sequential passes over the node pool and two over every target map
  (plus one delete per evicted entry) per eviction, amortized over the ``(1 - low_water) * max_entries`` entries it frees.

* R9 — incremental eviction: an eviction of a tree whose round (``evict_work``: three passes
  over the node pool and one over every target map) exceeds ``sync_work`` visits is spread
  over the stores that follow: it starts when entries come within ``slack = (max_entries -
  low_water * max_entries) // 2`` of the budget, aims at ``low_water * max_entries - slack``
  (so one eviction still frees the evicted fraction) and each store advances it by
  ``step_work`` visits (default: enough to end a round before the stores since its start
  could fill a quarter of the slack, at least 4096); only a store that would leave more than
  ``max_entries`` finishes it at once — and if the round cannot (the nodes it spares, touched
  since it began, exceed the budget), ends it and evicts by R7 — so ``max_entries`` stays a
  hard bound. A round takes
  ages at its start: an age histogram (radix select, as R7) gives the cutoff at which at least
  the excess is as old or older, a pass marks those nodes, then a sweep of the target maps
  evicts every entry naming a marked node (ties included: it may go lower by the entries of one
  stamp); nodes a store touched since the round began are spared. Rounds repeat while entries
  are above the low water. Between
  steps a target may briefly hold a node without its evicted ancestor (a miss for it, never a
  false hit); a store under such a node keeps that hole until its path ages out. Smaller trees
  and ``evict()`` use R7 at once.
* R8 — images: ``export_target`` lists a target's entries with every node they name and those
  nodes' ancestors (parents first), so ``import_target`` into an empty target of any tree of
  the same block size (and key namespace) rebuilds exactly the same entries, keys and paths.

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


cdef int _double_path(uint32_t** path, uint32_t* capacity) except -1:
    """Double a walk's path buffer, keeping its contents (``*path`` unchanged on failure)."""
    cdef uint32_t* grown = <uint32_t*>realloc(path[0], 2 * capacity[0] * sizeof(uint32_t))
    if grown == NULL:
        raise MemoryError()
    path[0] = grown
    capacity[0] *= 2
    return 0


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
            node = self._node_of(keys[i], parent)
            self.pool[node].stamp = stamp
            self._attach(tm, <uint16_t>target, self.words[i], node, medium)
            parent = node
        if self.max_entries:
            self._keep_budget(n)
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
        return self._evict(goal)

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
        return self._evict_step(work)

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

    def export_target(self, int target):
        """The target's part of the tree, enough to rebuild it exactly (R8): ``(node_keys,
        node_parents, entry_hashes, entry_nodes, entry_refs)`` as native-order bytes of u64,
        u32, u64, u32, u32. Nodes are every node an entry names plus their ancestors, parents
        before children; ``node_parents[i]`` is 1 + the index of node i's parent in the list, 0
        for a root. Entry j is engine hash ``entry_hashes[j]`` naming node ``entry_nodes[j]``
        with the packed per-medium refcounts ``entry_refs[j]``. O(the target's entries + their
        ancestors)."""
        _check_target(target)
        cdef TargetMap* tm
        cdef uint32_t cap = 0, i, node, up, n_path, n_nodes = 0, n_ent = 0, path_cap = 256
        cdef uint32_t* index = NULL
        cdef uint32_t* path = NULL
        cdef bytearray keys_out, parents_out, hashes_out, nodes_out, refs_out
        cdef uint64_t* keys_p
        cdef uint32_t* parents_p
        cdef uint64_t* hashes_p
        cdef uint32_t* nodes_p
        cdef uint32_t* refs_p
        if <uint32_t>target < self.n_maps:
            cap = self.maps[target].cap
        if cap == 0:
            return b"", b"", b"", b"", b""
        tm = &self.maps[target]
        keys_out = bytearray(<size_t>self.n_nodes * sizeof(uint64_t))
        parents_out = bytearray(<size_t>self.n_nodes * sizeof(uint32_t))
        hashes_out = bytearray(<size_t>tm.used * sizeof(uint64_t))
        nodes_out = bytearray(<size_t>tm.used * sizeof(uint32_t))
        refs_out = bytearray(<size_t>tm.used * sizeof(uint32_t))
        keys_p = <uint64_t*><char*>keys_out
        parents_p = <uint32_t*><char*>parents_out
        hashes_p = <uint64_t*><char*>hashes_out
        nodes_p = <uint32_t*><char*>nodes_out
        refs_p = <uint32_t*><char*>refs_out
        index = <uint32_t*>malloc(<size_t>self.pool_top * sizeof(uint32_t))
        path = <uint32_t*>malloc(path_cap * sizeof(uint32_t))
        if index == NULL or path == NULL:
            free(index)
            free(path)
            raise MemoryError()
        try:
            memset(index, 0xFF, <size_t>self.pool_top * sizeof(uint32_t))
            for i in range(cap):
                if not tm.slots[i].refs:
                    continue
                node = tm.slots[i].node
                # Walk up to a listed node (or past the root), then list the path top-down.
                n_path = 0
                up = node
                while up != NO_NODE and index[up] == NO_NODE:
                    if n_path == path_cap:
                        _double_path(&path, &path_cap)
                    path[n_path] = up
                    n_path += 1
                    up = self.pool[up].parent
                while n_path:
                    n_path -= 1
                    up = path[n_path]
                    keys_p[n_nodes] = self.pool[up].key
                    parents_p[n_nodes] = (0 if self.pool[up].parent == NO_NODE
                                          else index[self.pool[up].parent] + 1)
                    index[up] = n_nodes
                    n_nodes += 1
                hashes_p[n_ent] = tm.slots[i].hash
                nodes_p[n_ent] = index[node]
                refs_p[n_ent] = tm.slots[i].refs
                n_ent += 1
        finally:
            free(index)
            free(path)
        return (bytes(keys_out[:n_nodes * sizeof(uint64_t)]),
                bytes(parents_out[:n_nodes * sizeof(uint32_t)]),
                bytes(hashes_out[:n_ent * sizeof(uint64_t)]),
                bytes(nodes_out[:n_ent * sizeof(uint32_t)]),
                bytes(refs_out[:n_ent * sizeof(uint32_t)]))

    def import_target(self, int target, const uint64_t[::1] node_keys,
                      const uint32_t[::1] node_parents, const uint64_t[::1] entry_hashes,
                      const uint32_t[::1] entry_nodes, const uint32_t[::1] entry_refs,
                      long long now=0):
        """Rebuild the target's entries from ``export_target``'s arrays (as typed buffers, e.g.
        ``memoryview(b).cast("Q")``) into a target holding nothing (R8); every node listed is
        stamped ``now``. The number of entries added. ValueError, with the tree unchanged
        (stamps aside), when the arrays are inconsistent, name a hash twice, disagree with the
        tree (a key already present under another parent) or the target holds entries."""
        _check_target(target)
        cdef Py_ssize_t n = node_keys.shape[0], e = entry_hashes.shape[0], i
        cdef uint32_t p, node, existing, parent_node, cap
        cdef uint32_t stamp = <uint32_t>now
        cdef uint64_t added = 0
        cdef int m
        cdef uint8_t* used = NULL
        cdef uint32_t* placed = NULL
        cdef TargetMap* tm
        if node_parents.shape[0] != n or entry_nodes.shape[0] != e or entry_refs.shape[0] != e:
            raise ValueError("snapshot arrays of different lengths")
        if <uint32_t>target < self.n_maps and self.maps[target].entries:
            raise ValueError(f"target {target} already holds entries")
        if e == 0:
            return 0
        used = <uint8_t*>calloc(n if n else 1, 1)
        placed = <uint32_t*>malloc((n if n else 1) * sizeof(uint32_t))
        if used == NULL or placed == NULL:
            free(used)
            free(placed)
            raise MemoryError()
        try:
            # Checks first (R5): parents listed earlier, entries naming listed nodes with some
            # refcount, every node named by an entry or a child, keys already in the tree under
            # the same parent as in the snapshot.
            for i in range(e):
                if entry_nodes[i] >= <uint64_t>n or entry_refs[i] == 0:
                    raise ValueError(f"snapshot entry {i} names no node or holds nothing")
                used[entry_nodes[i]] = 1
            for i in range(n):
                p = node_parents[i]
                if p > <uint32_t>i:
                    raise ValueError(f"snapshot node {i} listed before its parent")
                if p:
                    used[p - 1] = 1
            for i in range(n):
                if not used[i]:
                    raise ValueError(f"snapshot node {i} is neither held nor a parent")
                existing = keymap_find(&self.keys, self.pool, node_keys[i])
                placed[i] = existing
                if existing == NO_NODE:
                    continue
                p = node_parents[i]
                parent_node = NO_NODE if p == 0 else placed[p - 1]
                if self.pool[existing].parent != parent_node or (p and parent_node == NO_NODE):
                    raise ValueError(f"snapshot node {i}: its key sits under another parent")
            if <int32_t>(stamp - self.clock) > 0:
                self.clock = stamp
            tm = self._map_of(target)
            # Sized for every entry first: the entries come in the exporting map's slot order,
            # sorted by home, which would pile into one probe run of a table still growing.
            cap = MIN_TABLE
            while <uint64_t>cap * 3 < <uint64_t>(e + 1) * 4:
                cap *= 2
            if cap > tm.cap and targetmap_rehash(tm, cap) < 0:
                raise MemoryError()
            for i in range(n):
                p = node_parents[i]
                if placed[i] == NO_NODE:
                    placed[i] = self._node_of(node_keys[i], NO_NODE if p == 0 else placed[p - 1])
                self.pool[placed[i]].stamp = stamp
            for i in range(e):
                node = placed[entry_nodes[i]]
                if targetmap_find(tm, entry_hashes[i]) != NULL:
                    self._undo_import(target, placed, n)
                    raise ValueError(f"snapshot names engine hash {entry_hashes[i]} twice")
                targetmap_insert(tm, entry_hashes[i], node, entry_refs[i])
                tm.entries += media_count(entry_refs[i])
                self.n_entries += media_count(entry_refs[i])
                added += media_count(entry_refs[i])
                for m in range(4):
                    if (entry_refs[i] >> (8 * m)) & 0xFF:
                        self._holder_add(node, <uint16_t>target, m)
        finally:
            free(used)
            free(placed)
        if self.max_entries and self.n_entries > self.max_entries:
            self.ev_active = False
            self.ev_phase = 0
            self._evict(<uint64_t>(self.max_entries * self.low_water))
        return added

    cdef void _undo_import(self, int target, const uint32_t* placed, Py_ssize_t n) noexcept:
        """Drop what a failed import attached, then the nodes it created (R3 holds after)."""
        cdef Py_ssize_t i
        self.clear_target(target)
        for i in range(n - 1, -1, -1):
            self._release(placed[i])

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

    cdef int _keep_budget(self, uint64_t stored) except -1:
        """R9 for the tree's own budget, after a store of ``stored`` blocks."""
        cdef uint64_t cap = self.max_entries
        cdef uint64_t goal = <uint64_t>(cap * self.low_water)
        cdef uint64_t slack = (cap - goal) // 2 if cap > goal else 0
        cdef uint64_t work
        if not self.ev_active:
            if self.n_entries + slack <= cap:
                return 0
            if self.evict_work <= self.sync_work:
                if self.n_entries > cap:
                    self._evict(goal)
                return 0
            self.ev_active = True
            self.ev_phase = 0
            self.ev_goal = goal
            self.ev_depth = slack
            self.ev_round_work = self.evict_work
        if self.n_entries > cap:
            work = UNLIMITED_WORK
        elif self.step_work:
            work = self.step_work
        else:
            work = step_work(self.ev_round_work, stored, slack)
        self._evict_step(work)
        if self.n_entries > cap:
            # The hard bound: a round spares the nodes touched since it began, and when
            # those alone exceed the budget the episode cannot get under it. End the episode
            # and evict by the current ages at once (R7).
            self.ev_active = False
            self.ev_phase = 0
            self._evict(goal)
        return 0

    cdef bint _evict_step(self, uint64_t work) except -1:
        """R9: up to ``work`` visits of the running episode; True when it is over."""
        cdef uint64_t* hist
        cdef uint32_t i, end, top
        cdef int32_t age
        cdef Py_ssize_t b
        cdef TargetMap* tm
        cdef Entry* entry
        cdef Node* nd
        while True:
            if self.ev_phase == 0:
                if self.n_entries <= self.ev_goal:
                    self.ev_active = False
                    return True
                if work == 0:
                    return False
                if self.ev_hist == NULL:
                    self.ev_hist = <uint64_t*>malloc(65536 * sizeof(uint64_t))
                    if self.ev_hist == NULL:
                        raise MemoryError()
                memset(self.ev_hist, 0, 65536 * sizeof(uint64_t))
                self.ev_c0 = self.clock
                self.ev_excess = self.n_entries - self.ev_goal + self.ev_depth
                self.ev_acc = 0
                self.ev_cursor = 0
                self.ev_round_evicted = 0
                self.ev_phase = 1
            hist = self.ev_hist
            if self.ev_phase == 4:
                # Marks of the nodes at least ev_cutoff old, so the sweep reads a byte per
                # entry instead of the node (a node touched since is spared by its stamp).
                top = self.ev_marks_len
                end = top if <uint64_t>(top - self.ev_cursor) <= work else self.ev_cursor + <uint32_t>work
                for i in range(self.ev_cursor, end):
                    nd = &self.pool[i]
                    age = <int32_t>(self.ev_c0 - nd.stamp)
                    self.ev_marks[i] = (nd.n_holders != 0 and nd.children != FREE_MARK
                                        and age >= 0 and <uint32_t>age >= self.ev_cutoff)
                work -= min(work, <uint64_t>(end - self.ev_cursor) + 1)
                self.ev_cursor = end
                if end < top:
                    return False
                self.ev_phase = 3
                self.ev_cursor = 0
                self.ev_map = 0
                self.ev_map_cap = self.maps[0].cap if self.n_maps else 0
                continue
            if self.ev_phase == 1 or self.ev_phase == 2:
                # The age histogram (radix select as in ``_evict_round``), ages taken at ev_c0;
                # nodes touched since (age < 0) are new and not counted.
                top = self.pool_top
                end = top if <uint64_t>(top - self.ev_cursor) <= work else self.ev_cursor + <uint32_t>work
                for i in range(self.ev_cursor, end):
                    nd = &self.pool[i]
                    if nd.n_holders and nd.children != FREE_MARK:
                        age = <int32_t>(self.ev_c0 - nd.stamp)
                        if age < 0:
                            continue
                        if self.ev_phase == 1:
                            hist[<uint32_t>age >> 16] += _node_entries(nd)
                        elif <uint32_t>age >> 16 == self.ev_hb:
                            hist[<uint32_t>age & 0xFFFF] += _node_entries(nd)
                work -= min(work, <uint64_t>(end - self.ev_cursor) + 1)
                self.ev_cursor = end
                if end < self.pool_top:
                    return False
                b = 0xFFFF
                while b > 0 and self.ev_acc + hist[b] < self.ev_excess:
                    self.ev_acc += hist[b]
                    b -= 1
                memset(hist, 0, 65536 * sizeof(uint64_t))
                self.ev_cursor = 0
                if self.ev_phase == 1:
                    self.ev_hb = <uint32_t>b
                    self.ev_phase = 2
                else:
                    self.ev_cutoff = (self.ev_hb << 16) | <uint32_t>b
                    free(self.ev_marks)
                    self.ev_marks_len = self.pool_top
                    self.ev_marks = <uint8_t*>malloc(self.ev_marks_len + 1)
                    if self.ev_marks == NULL:
                        raise MemoryError()
                    self.ev_phase = 4
                continue
            # Phase 3: every entry naming a node at least ev_cutoff old goes, map by map.
            while self.ev_map < self.n_maps:
                tm = &self.maps[self.ev_map]
                if tm.cap != self.ev_map_cap:  # grown or shrunk since: start it again
                    self.ev_cursor = 0
                    self.ev_map_cap = tm.cap
                while self.ev_cursor < tm.cap:
                    if work == 0:
                        return False
                    work -= 1
                    entry = &tm.slots[self.ev_cursor]
                    if entry.refs and entry.node < self.ev_marks_len and self.ev_marks[entry.node]:
                        age = <int32_t>(self.ev_c0 - self.pool[entry.node].stamp)
                        if age >= 0 and <uint32_t>age >= self.ev_cutoff:
                            self._evict_entry(tm, <uint16_t>self.ev_map, entry)
                            if tm.cap != self.ev_map_cap:  # shrunk: start it again
                                self.ev_cursor = 0
                                self.ev_map_cap = tm.cap
                            continue  # the slot now holds the next of its run: look again
                    self.ev_cursor += 1
                self.ev_map += 1
                self.ev_cursor = 0
                self.ev_map_cap = self.maps[self.ev_map].cap if self.ev_map < self.n_maps else 0
            self.ev_phase = 0
            self.evictions += 1
            free(self.ev_marks)
            self.ev_marks = NULL
            self.ev_marks_len = 0
            if self.ev_round_evicted == 0 and self.n_entries > self.ev_goal:
                self.ev_active = False  # nothing old enough left (cannot happen: excess > 0)
                return True

    cdef void _evict_entry(self, TargetMap* tm, uint16_t target, Entry* entry) noexcept:
        """Drop one map entry (every medium) as BlockRemoved of its hash would."""
        cdef uint32_t refs = entry.refs, node = entry.node
        cdef int m, dropped = media_count(refs)
        targetmap_delete(tm, entry)
        tm.entries -= dropped
        self.n_entries -= dropped
        self.evicted_entries += dropped
        self.ev_round_evicted += dropped
        for m in range(4):
            if (refs >> (8 * m)) & 0xFF:
                self._holder_sub(tm, node, target, m)
        self._release(node)

    cdef uint64_t _evict(self, uint64_t goal) except? 0xFFFFFFFFFFFFFFFF:
        """R7: evict the oldest nodes' entries until ``n_entries <= goal``."""
        cdef uint64_t before = self.n_entries, progress
        cdef uint64_t* hist
        cdef uint8_t* marks
        if before <= goal:
            return 0
        hist = <uint64_t*>calloc(65536, sizeof(uint64_t))
        marks = <uint8_t*>malloc(self.pool_top if self.pool_top else 1)
        if hist == NULL or marks == NULL:
            free(hist)
            free(marks)
            raise MemoryError()
        try:
            while self.n_entries > goal:
                progress = self.n_entries
                self._evict_round(goal, hist, marks)
                if self.n_entries == progress:
                    break  # nothing left to evict (cannot happen while entries > 0)
        finally:
            free(hist)
            free(marks)
        self.evictions += 1
        self.evicted_entries += before - self.n_entries
        return before - self.n_entries

    cdef int _evict_round(self, uint64_t goal, uint64_t* hist, uint8_t* marks) except -1:
        cdef uint64_t excess = self.n_entries - goal, acc = 0
        cdef uint32_t i, age, cutoff, top = self.pool_top, n_marked
        cdef Py_ssize_t hb, lb
        cdef Node* nd
        # The cutoff age: fewer than ``excess`` entries are older, at least ``excess`` are as
        # old or older. A radix select on the high then the low half of the age, each node
        # weighted by its entries.
        memset(hist, 0, 65536 * sizeof(uint64_t))
        for i in range(top):
            nd = &self.pool[i]
            if nd.n_holders and nd.children != FREE_MARK:
                hist[<uint32_t>(self.clock - nd.stamp) >> 16] += _node_entries(nd)
        hb = 65535
        while hb > 0 and acc + hist[hb] < excess:
            acc += hist[hb]
            hb -= 1
        memset(hist, 0, 65536 * sizeof(uint64_t))
        for i in range(top):
            nd = &self.pool[i]
            if nd.n_holders and nd.children != FREE_MARK:
                age = <uint32_t>(self.clock - nd.stamp)
                if age >> 16 == <uint32_t>hb:
                    hist[age & 0xFFFF] += _node_entries(nd)
        lb = 65535
        while lb > 0 and acc + hist[lb] < excess:
            acc += hist[lb]
            lb -= 1
        cutoff = (<uint32_t>hb << 16) | <uint32_t>lb
        # Every node strictly older than the cutoff (by R6 so are its descendants).
        memset(marks, 0, top)
        n_marked = 0
        for i in range(top):
            nd = &self.pool[i]
            if (nd.n_holders and nd.children != FREE_MARK
                    and <uint32_t>(self.clock - nd.stamp) > cutoff):
                marks[i] = 1
                n_marked += 1
        if n_marked:
            self._drop_marked(marks, top)
        if self.n_entries > goal:
            self._evict_deepest(goal, cutoff, hist, marks)
        return 0

    cdef int _evict_deepest(self, uint64_t goal, uint32_t cutoff, uint64_t* hist,
                            uint8_t* marks) except -1:
        """Among nodes of age ``cutoff``, evict the deepest first until ``n_entries <= goal``
        (depth from the root: a node's descendants of the same age are deeper, so they go
        first). One pass finds the depths (memoized walks up), one selects, one marks."""
        cdef uint32_t top = self.pool_top, i, up, d, n_path
        cdef uint64_t need = self.n_entries - goal, acc = 0
        cdef Py_ssize_t db
        cdef Node* nd
        cdef uint32_t path_cap = 256
        cdef uint32_t* path = <uint32_t*>malloc(path_cap * sizeof(uint32_t))
        cdef uint32_t* depth = <uint32_t*>calloc(top if top else 1, sizeof(uint32_t))
        if depth == NULL or path == NULL:
            free(depth)
            free(path)
            raise MemoryError()
        try:
            memset(hist, 0, 65536 * sizeof(uint64_t))
            for i in range(top):
                nd = &self.pool[i]
                if not (nd.n_holders and nd.children != FREE_MARK
                        and <uint32_t>(self.clock - nd.stamp) == cutoff):
                    continue
                # Walk up to a node of known depth (or past the root), then fill the path.
                n_path = 0
                up = i
                while up != NO_NODE and depth[up] == 0:
                    if n_path == path_cap:
                        _double_path(&path, &path_cap)
                    path[n_path] = up
                    n_path += 1
                    up = self.pool[up].parent
                d = 0 if up == NO_NODE else depth[up]
                while n_path:
                    n_path -= 1
                    d += 1
                    depth[path[n_path]] = d
                hist[depth[i] if depth[i] < 65535 else 65535] += _node_entries(nd)
            db = 65535
            while db > 0 and acc + hist[db] < need:
                acc += hist[db]
                db -= 1
            memset(marks, 0, top)
            for i in range(top):
                nd = &self.pool[i]
                if not (nd.n_holders and nd.children != FREE_MARK
                        and <uint32_t>(self.clock - nd.stamp) == cutoff):
                    continue
                d = depth[i] if depth[i] < 65535 else 65535
                if d > <uint32_t>db:
                    marks[i] = 1
                elif d == <uint32_t>db and acc < need:
                    marks[i] = 1
                    acc += _node_entries(nd)
            self._drop_marked(marks, top)
        finally:
            free(depth)
            free(path)
        return 0

    cdef int _drop_marked(self, const uint8_t* marks, uint32_t top) except -1:
        """Drop every entry naming a marked node, then the nodes' holders (R1-R3 hold after)."""
        cdef uint32_t t, i, doomed
        cdef uint64_t dropped
        cdef uint64_t* hashes = NULL
        cdef TargetMap* tm
        cdef Node* nd
        for t in range(self.n_maps):
            tm = &self.maps[t]
            doomed = 0
            dropped = 0
            for i in range(tm.cap):
                if tm.slots[i].refs and marks[tm.slots[i].node]:
                    if doomed == 0:
                        hashes = <uint64_t*>malloc(tm.used * sizeof(uint64_t))
                        if hashes == NULL:
                            raise MemoryError()
                    hashes[doomed] = tm.slots[i].hash
                    doomed += 1
                    dropped += media_count(tm.slots[i].refs)
            if not doomed:
                continue
            # Deleted one by one (backward shift; the map shrinks itself when sparse): the
            # survivors, most of the map, stay where they are.
            for i in range(doomed):
                targetmap_delete(tm, targetmap_find(tm, hashes[i]))
            free(hashes)
            tm.entries -= dropped
            self.n_entries -= dropped
        for i in range(top):
            if marks[i]:
                nd = &self.pool[i]
                if nd.heap_cap:
                    free(nd.holders.heap)
                    self.holder_bytes -= nd.heap_cap * sizeof(Holder)
                    nd.heap_cap = 0
                nd.n_holders = 0
                self._release(i)
        return 0

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


cdef enum:
    SYNC_WORK = 1 << 16  # R9: evictions of trees this small stay synchronous
    MIN_STEP_WORK = 1 << 12

cdef uint64_t UNLIMITED_WORK = 0xFFFFFFFFFFFFFFFF


cdef inline uint64_t step_work(uint64_t round_work, uint64_t stored, uint64_t slack) noexcept:
    """R9: visits per store so that a round (``round_work`` visits) ends well before the stores
    since its start (``stored`` blocks each) fill half the slack."""
    cdef uint64_t work = (4 * round_work * (stored if stored else 1)) // (slack if slack else 1)
    return work if work > MIN_STEP_WORK else MIN_STEP_WORK


cdef inline uint64_t _node_entries(Node* nd) noexcept nogil:
    """Entries naming the node (holder counts, which saturate at 255: a selection weight)."""
    cdef Holder* hs = holders_of(nd)
    cdef uint64_t total = 0
    cdef Py_ssize_t j
    cdef int m
    for j in range(nd.n_holders):
        for m in range(4):
            total += hs[j].count[m]
    return total


cdef inline int _check_target(int target) except -1:
    if target < 0 or target >= MAX_TARGETS:
        raise ValueError(f"target {target} outside [0, {MAX_TARGETS})")
    return 0


cdef inline int _check_medium(int medium) except -1:
    if medium < 0 or medium > 3:
        raise ValueError(f"medium {medium} outside [0, 3]")
    return 0
