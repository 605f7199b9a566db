# Included by ``ledger.pyx``: target images, the ledger's part of a snapshot (a peer replica's
# warm start): ``BlockTree.export_target`` and ``BlockTree.import_target``. Functions of the tree
# written as its methods (first argument ``BlockTree self``): a cdef class body cannot include a
# file.
#
# * R8 — images: ``export_target`` lists a target's entries with every node they name and those
#   nodes' ancestors (parents first), so ``import_target`` into an empty target of any tree of the
#   same block size (and key namespace) rebuilds exactly the same entries, keys and paths.


cdef tuple _export_target(BlockTree self, int target):
    """``BlockTree.export_target``."""
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


cdef object _import_target(BlockTree self, int target, const uint64_t[::1] node_keys,
                           const uint32_t[::1] node_parents, const uint64_t[::1] entry_hashes,
                           const uint32_t[::1] entry_nodes, const uint32_t[::1] entry_refs,
                           long long now):
    """``BlockTree.import_target``."""
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
        tm = _map_of(self, target)
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
                placed[i] = _node_of(self, node_keys[i], NO_NODE if p == 0 else placed[p - 1])
            self.pool[placed[i]].stamp = stamp
        for i in range(e):
            node = placed[entry_nodes[i]]
            if targetmap_find(tm, entry_hashes[i]) != NULL:
                _undo_import(self, target, placed, n)
                raise ValueError(f"snapshot names engine hash {entry_hashes[i]} twice")
            targetmap_insert(tm, entry_hashes[i], node, entry_refs[i])
            tm.entries += media_count(entry_refs[i])
            self.n_entries += media_count(entry_refs[i])
            added += media_count(entry_refs[i])
            for m in range(4):
                if (entry_refs[i] >> (8 * m)) & 0xFF:
                    _holder_add(self, node, <uint16_t>target, m)
    finally:
        free(used)
        free(placed)
    if self.max_entries and self.n_entries > self.max_entries:
        self.ev_active = False
        self.ev_phase = 0
        _evict(self, <uint64_t>(self.max_entries * self.low_water))
    return added


cdef void _undo_import(BlockTree self, int target, const uint32_t* placed,
                       Py_ssize_t n) noexcept:
    """Drop what a failed import attached, then the nodes it created (R3 holds after)."""
    cdef Py_ssize_t i
    self.clear_target(target)
    for i in range(n - 1, -1, -1):
        _release(self, placed[i])
