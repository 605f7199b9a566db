# Included by ``ledger.pyx``: ``BlockTree.match``, the request path's read of the tree. The
# walk (``ledger_walk.pxd``) resolves each level's key to its node, prefetching the key-map and
# node loads of the next levels; the targets still matching only shrink, each dropping out at its
# first miss. Cost: O(depth x targets still matching). A function of the tree written as its
# method (first argument ``BlockTree self``): a cdef class body cannot include a file.


cdef dict _match(BlockTree self, object keys, uint32_t media):
    """``BlockTree.match``."""
    cdef Py_ssize_t n = _load_words(self, keys)
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
