# Included by ``ledger.pyx``: the tree's storage, which every other part changes through these
# functions. The node pool (a free list threaded through ``parent``), the key map (block key ->
# node), one target map per target (engine hash -> entry: node and per-medium refcounts) and
# each node's holder set; finding or creating a node, attaching an entry, releasing nodes
# (rules R1-R3 of ``ledger.pyx`` hold after each call), and the scratch buffers the calls share.
# Functions of the tree written as its methods (first argument ``BlockTree self``): a cdef
# class body cannot include a file.


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


cdef Py_ssize_t _load_words(BlockTree self, object values) except -1:
    """Copy a sequence of u64 (list, any sequence, or a buffer of uint64) to ``words``."""
    cdef Py_ssize_t n = len(values)
    _grow(<void**>&self.words, &self.words_cap, n, sizeof(uint64_t))
    copy_u64s(values, self.words, n)
    return n


cdef TargetMap* _map_of(BlockTree self, int target) except NULL:
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


cdef uint32_t _node_of(BlockTree self, uint64_t key, uint32_t parent) except? 0xFFFFFFFF:
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


cdef int _attach(BlockTree self, TargetMap* tm, uint16_t target, uint64_t engine_hash,
                 uint32_t node, int medium) except -1:
    """Record that ``target`` holds ``engine_hash`` (-> ``node``) in ``medium``."""
    cdef uint32_t shift = 8 * medium, old_node, old_refs
    cdef int m
    cdef Entry* entry = targetmap_find(tm, engine_hash)
    if entry == NULL:
        targetmap_insert(tm, engine_hash, node, 1u << shift)
        tm.entries += 1
        self.n_entries += 1
        return _holder_add(self, node, target, medium)
    if entry.node == node:
        if (entry.refs >> shift) & 0xFF:
            self.duplicate_store += 1
            if (entry.refs >> shift) & 0xFF != 0xFF:
                entry.refs += 1u << shift
            return 0
        entry.refs |= 1u << shift
        tm.entries += 1
        self.n_entries += 1
        return _holder_add(self, node, target, medium)
    # Same engine hash, different key: the old entry (every medium) is replaced. The new
    # node gets its holder before the old one is released, so no release can free it.
    self.hash_conflict += 1
    old_node, old_refs = entry.node, entry.refs
    entry.node = node
    entry.refs = 1u << shift
    tm.entries += 1 - media_count(old_refs)
    self.n_entries += 1 - media_count(old_refs)
    _holder_add(self, node, target, medium)
    for m in range(4):
        if (old_refs >> (8 * m)) & 0xFF:
            _holder_sub(self, tm, old_node, target, m)
    _release(self, old_node)
    return 0


cdef inline int _holder_add(BlockTree self, uint32_t node, uint16_t target,
                            int medium) except -1:
    return holder_add(&self.pool[node], target, medium, &self.holder_bytes)


cdef inline void _holder_sub(BlockTree self, TargetMap* tm, uint32_t node, uint16_t target,
                             int medium) noexcept:
    holder_sub(&self.pool[node], node, tm, target, medium, &self.holder_bytes)


cdef void _release(BlockTree self, uint32_t node) noexcept:
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

