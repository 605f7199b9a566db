# cython: language_level=3
"""Finding the node of each level of a match walk without waiting on memory.

``BlockTree.match`` needs node(level i) for i = 0, 1, ... until every target has dropped out.
Each lookup is a key-map probe and a node read: on a big tree, two cache misses per level,
256 levels per prompt. Two ways to hide them, chosen level by level:

* streaming — blocks stored by one event get consecutive nodes, so node(i) is usually
  node(i-1) + 1. That guess reads a line the walk streams through anyway (prefetched
  ``2 * AHEAD_CHAIN`` nodes ahead) and counts only when the node is live and has the key.
  The guess for level ``i + AHEAD_CHAIN - 1`` is checked early: when it fails, a chain break is
  coming, so that level's key-map slot is prefetched, and once the slot has arrived its node
  and the run of nodes after it (where streaming continues).
* pipelining — after two failed guesses in a row (chains scattered over the pool, e.g. blocks
  stored one per event), slots are prefetched ``AHEAD_SLOT`` levels ahead and nodes
  ``AHEAD_NODE`` levels ahead, until two guesses in a row work again.

Level 0 is looked up directly (the first blocks of prompts are the most shared, hence cached).

Per level state ``state[j]``: ``LEVEL_UNTOUCHED``, ``LEVEL_SLOT_FETCHED`` (slot prefetched),
``LEVEL_ABSENT`` (the probe found no slot for the key) or the candidate node the probe found
(its full key is compared on use). The tree does not change during a walk, so a level's state,
once set, stays true. Node indices stay below ``LEVEL_ABSENT`` (``MAX_POOL_NODES``).
"""

from libc.stdint cimport uint32_t, uint64_t
from libc.string cimport memset

from cortex._fast.ledger_tables cimport (
    FREE_MARK,
    NO_NODE,
    KeyMap,
    Node,
    cortex_prefetch,
    key_home,
    keymap_candidate,
    keymap_find,
)

cdef extern from *:
    """
    #define CORTEX_LEVEL_UNTOUCHED ((uint32_t)0xFFFFFFFFu)
    #define CORTEX_LEVEL_SLOT_FETCHED ((uint32_t)0xFFFFFFFEu)
    #define CORTEX_LEVEL_ABSENT ((uint32_t)0xFFFFFFFDu)
    """
    const uint32_t LEVEL_UNTOUCHED "CORTEX_LEVEL_UNTOUCHED"
    const uint32_t LEVEL_SLOT_FETCHED "CORTEX_LEVEL_SLOT_FETCHED"
    const uint32_t LEVEL_ABSENT "CORTEX_LEVEL_ABSENT"

cdef enum:
    AHEAD_SLOT = 24
    AHEAD_NODE = 12
    AHEAD_CHAIN = 8
    SWITCH_AFTER = 2  # guesses in a row (failed: pipeline on; working: pipeline off)

ctypedef struct Walk:
    const Node* pool
    uint32_t pool_top
    const KeyMap* keys
    const uint64_t* ks
    uint32_t* state
    Py_ssize_t n
    Py_ssize_t slot_next  # pipelining: levels below were handled by _fetch_slot
    Py_ssize_t candidate_next  # pipelining: levels below were handled by _read_slot
    int streak  # guesses that worked in a row
    int misses  # guesses that failed in a row
    bint pipelined


cdef inline void walk_start(Walk* w, const Node* pool, uint32_t pool_top, const KeyMap* keys,
                            const uint64_t* ks, uint32_t* state, Py_ssize_t n) noexcept nogil:
    w.pool, w.pool_top, w.keys, w.ks, w.state, w.n = pool, pool_top, keys, ks, state, n
    w.slot_next = w.candidate_next = 0
    w.streak = w.misses = 0
    w.pipelined = False  # level 0 is looked up directly; the pipeline starts after 2 misses
    memset(state, 0xFF, <size_t>n * sizeof(uint32_t))  # LEVEL_UNTOUCHED


cdef inline bint _is_node_of(const Walk* w, uint32_t node, uint64_t key) noexcept nogil:
    return (node < w.pool_top and w.pool[node].key == key
            and w.pool[node].children != FREE_MARK)


cdef inline void _fetch_slot(Walk* w, Py_ssize_t j) noexcept nogil:
    if w.state[j] == LEVEL_UNTOUCHED:
        cortex_prefetch(&w.keys.slots[key_home(w.ks[j], w.keys.cap)])
        w.state[j] = LEVEL_SLOT_FETCHED


cdef inline void _read_slot(Walk* w, Py_ssize_t j, bint new_run) noexcept nogil:
    """Read level j's slot and prefetch its candidate node; with ``new_run`` (a chain break
    seen while streaming) also the nodes after it, where streaming will continue."""
    cdef uint32_t c
    cdef const char* line
    cdef const char* end
    if w.state[j] == LEVEL_UNTOUCHED or w.state[j] == LEVEL_SLOT_FETCHED:
        c = keymap_candidate(w.keys, w.ks[j])
        if c == NO_NODE:
            w.state[j] = LEVEL_ABSENT
            return
        w.state[j] = c
        # The node (it may straddle two lines) and the head of the next one, which the
        # streaming guess for level j + 1 reads.
        line = <const char*>&w.pool[c]
        end = line + sizeof(Node) + 16
        if new_run and c + 2 * AHEAD_CHAIN < w.pool_top:
            end = <const char*>&w.pool[c + 2 * AHEAD_CHAIN]
        while line < end:
            cortex_prefetch(line)
            line += 64
        cortex_prefetch(end - 1)


cdef inline void _look_ahead(Walk* w, Py_ssize_t i, uint32_t prev) noexcept nogil:
    cdef Py_ssize_t j, stop
    if prev == NO_NODE:
        return
    if w.pipelined:
        stop = min(w.n, i + AHEAD_SLOT + 1)
        j = max(w.slot_next, i)
        while j < stop:
            _fetch_slot(w, j)
            j += 1
        w.slot_next = j
        stop = min(w.n, i + AHEAD_NODE + 1)
        j = max(w.candidate_next, i)
        while j < stop:
            _read_slot(w, j, False)
            j += 1
        w.candidate_next = j
        return
    j = i - 1 + AHEAD_CHAIN  # streaming from ``prev`` (level i - 1) would put it at prev + AHEAD_CHAIN
    if j < w.n and not _is_node_of(w, prev + AHEAD_CHAIN, w.ks[j]):
        _fetch_slot(w, j)
    if prev + 2 * AHEAD_CHAIN < w.pool_top:
        cortex_prefetch(&w.pool[prev + 2 * AHEAD_CHAIN])
    j = i + AHEAD_CHAIN // 2
    if j < w.n and w.state[j] == LEVEL_SLOT_FETCHED:
        _read_slot(w, j, True)


cdef inline uint32_t walk_node(Walk* w, Py_ssize_t i, uint32_t prev) noexcept nogil:
    """The node of level ``i`` (NO_NODE: no node has its key); ``prev`` is level i-1's node
    (NO_NODE for level 0). Levels must be asked in order."""
    cdef uint32_t c
    _look_ahead(w, i, prev)
    if prev != NO_NODE and _is_node_of(w, prev + 1, w.ks[i]):
        w.streak += 1
        w.misses = 0
        if w.streak >= SWITCH_AFTER:
            w.pipelined = False
        return prev + 1
    w.streak = 0
    w.misses += 1
    if w.misses >= SWITCH_AFTER:
        w.pipelined = True
    c = w.state[i]
    if c == LEVEL_ABSENT:
        return NO_NODE
    if c < LEVEL_ABSENT and w.pool[c].key == w.ks[i]:
        return c
    return keymap_find(w.keys, w.pool, w.ks[i])
