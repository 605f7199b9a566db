# Included by ``ledger.pyx``: the entry budget, i.e. eviction of the least-recently-touched
# entries, at once (R7: ``_evict``) or spread over the stores that follow (R9: ``_keep_budget``,
# ``_evict_step``). Both only remove entries through the storage of ``ledger_nodes.pxi``, so
# R1-R3 hold after every call; they rely on R6 (a node is never older than its descendants).
# Functions of the tree written as its methods (first argument ``BlockTree self``): a cdef
# class body cannot include a file.
#
# * R7 — entry budget: with ``max_entries`` > 0, a store that leaves more entries than that evicts
#   down to ``low_water * max_entries``: every entry of the oldest nodes (all their holders, all
#   media, exactly as BlockRemoved of each target's hashes naming them would), oldest first; among
#   nodes of the same age, deepest first, so by R6 eviction never takes a node from a target while
#   leaving a descendant. Evicted entries are counted (``evicted_entries``); later events naming
#   evicted hashes are unknown ones (counted, ignored; a store under an evicted parent is skipped).
#   Eviction only removes, so it never makes a false hit. Cost: up to seven sequential passes over
#   the node pool and two over every target map (plus one delete per evicted entry) per eviction,
#   amortized over the ``(1 - low_water) * max_entries`` entries it frees.
# * R9 — incremental eviction: an eviction of a tree whose round (``evict_work``: three passes
#   over the node pool and one over every target map) exceeds ``sync_work`` visits is spread over
#   the stores that follow: it starts when entries come within ``slack = (max_entries - low_water *
#   max_entries) // 2`` of the budget, aims at ``low_water * max_entries - slack`` (so one eviction
#   still frees the evicted fraction) and each store advances it by ``step_work`` visits (default:
#   enough to end a round before the stores since its start could fill a quarter of the slack, at
#   least 4096); only a store that would leave more than ``max_entries`` finishes it at once — and
#   if the round cannot (the nodes it spares, touched since it began, exceed the budget), ends it
#   and evicts by R7 — so ``max_entries`` stays a hard bound. A round takes ages at its start: an
#   age histogram (radix select, as R7) gives the cutoff at which at least the excess is as old or
#   older, a pass marks those nodes, then a sweep of the target maps evicts every entry naming a
#   marked node (ties included: it may go lower by the entries of one stamp); nodes a store touched
#   since the round began are spared. Rounds repeat while entries are above the low water. Between
#   steps a target may briefly hold a node without its evicted ancestor (a miss for it, never a
#   false hit); a store under such a node keeps that hole until its path ages out. Smaller trees and
#   ``evict()`` use R7 at once.


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


cdef int _keep_budget(BlockTree self, uint64_t stored) except -1:
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
                _evict(self, goal)
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
    _evict_step(self, work)
    if self.n_entries > cap:
        # The hard bound: a round spares the nodes touched since it began, and when
        # those alone exceed the budget the episode cannot get under it. End the episode
        # and evict by the current ages at once (R7).
        self.ev_active = False
        self.ev_phase = 0
        _evict(self, goal)
    return 0


cdef bint _evict_step(BlockTree self, uint64_t work) except -1:
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
                        _evict_entry(self, tm, <uint16_t>self.ev_map, entry)
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


cdef void _evict_entry(BlockTree self, TargetMap* tm, uint16_t target,
                       Entry* entry) noexcept:
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
            _holder_sub(self, tm, node, target, m)
    _release(self, node)


cdef uint64_t _evict(BlockTree self, uint64_t goal) except? 0xFFFFFFFFFFFFFFFF:
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
            _evict_round(self, goal, hist, marks)
            if self.n_entries == progress:
                break  # nothing left to evict (cannot happen while entries > 0)
    finally:
        free(hist)
        free(marks)
    self.evictions += 1
    self.evicted_entries += before - self.n_entries
    return before - self.n_entries


cdef int _evict_round(BlockTree self, uint64_t goal, uint64_t* hist,
                      uint8_t* marks) except -1:
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
        _drop_marked(self, marks, top)
    if self.n_entries > goal:
        _evict_deepest(self, goal, cutoff, hist, marks)
    return 0


cdef int _evict_deepest(BlockTree self, uint64_t goal, uint32_t cutoff, uint64_t* hist,
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
        _drop_marked(self, marks, top)
    finally:
        free(depth)
        free(path)
    return 0


cdef int _drop_marked(BlockTree self, const uint8_t* marks, uint32_t top) except -1:
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
            _release(self, i)
    return 0
