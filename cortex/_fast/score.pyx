# cython: language_level=3
"""The scheduler's common cases (``exact_kv`` and ``load_aware``) over C columns of worker load.

Contract: ``cortex/_fast/score.pyi``. The Python policies (``cortex.scheduling``) are the
reference; this unit finds the same candidates with the same float operations in the same
order, so decisions agree exactly (property test ``test_scheduling_fast_equals_reference``).

Invariants:

* ``slots[i]`` mirrors ``views[i]`` of the last synced tuple: a view is read again only when a
  different object sits at its position (views are frozen; a change is a new object).
* Ties follow the request's tie order (``cost.tie_before``): ``splitmix64(whash ^ seed)``,
  ``whash`` being ``cost.worker_hash`` of the name (read once per slot), then ``rank``, which
  orders workers by name, so the name fallback needs no string comparison in the loop.
"""

from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject
from cpython.long cimport PyLong_AsLong
from libc.math cimport ceil, INFINITY
from libc.stdint cimport uint64_t
from libc.stdlib cimport free, malloc

from cortex.scheduling.cost import worker_hash

DEF UNKNOWN = -1

cdef struct Slot:
    long in_flight
    long queued
    long engine_queue  # UNKNOWN when the engine does not report it
    double kv_usage  # < 0 when unknown
    double rate  # prefill tokens/s, the configured default applied
    double s_per_token
    double load_s  # exact_kv's request-independent TTFT part (LoadSeconds)
    double kv_room  # cost.kv_room: prompt tokens the KV pool has room for (INFINITY: unknown)
    int role  # 0 both, 1 prefill, 2 decode
    bint healthy
    bint ready
    long rank
    uint64_t whash  # cost.worker_hash(name)


cdef inline uint64_t _tie_rank(uint64_t whash, uint64_t seed):
    """``cost.tie_rank``: splitmix64's finalizer over the name hash and the request's seed."""
    cdef uint64_t z = (whash ^ seed) + <uint64_t>0x9E3779B97F4A7C15ULL
    z = (z ^ (z >> 30)) * <uint64_t>0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * <uint64_t>0x94D049BB133111EBULL
    return z ^ (z >> 31)


cdef inline bint _tie_before(Slot* a, Slot* b, uint64_t seed):
    """``cost.tie_before``: whether ``a`` comes before ``b`` in the tie order of ``seed``."""
    cdef uint64_t mine = _tie_rank(a.whash, seed), theirs = _tie_rank(b.whash, seed)
    return mine < theirs or (mine == theirs and a.rank < b.rank)


cdef class DecisionTable:
    cdef Slot* slots
    cdef Py_ssize_t n
    cdef Py_ssize_t capacity
    cdef list views
    cdef list names
    cdef list targets
    cdef object last
    cdef object ready_state
    cdef object both, prefill, decode
    cdef double default_rate, decode_s, engine_queue_s, step_s, step_budget, overflow_weight
    cdef double band  # cost.CostConfig.tie_band_s (0: none)
    cdef bint steps
    cdef double max_in_flight, max_queued, max_engine_queue, max_kv
    cdef double factor, slack
    cdef bint capped

    def __cinit__(self, *, ready_state, roles, double default_rate, double decode_s,
                  double engine_queue_s, limits, factor, double slack, double step_s=0.0,
                  long step_budget=0, double overflow_weight=0.0, double band=0.0):
        self.slots = NULL
        self.n = 0
        self.capacity = 0
        self.views = []
        self.names = []
        self.targets = []
        self.last = None
        self.ready_state = ready_state
        self.both, self.prefill, self.decode = roles
        self.default_rate = default_rate
        self.decode_s = decode_s
        self.engine_queue_s = engine_queue_s
        self.steps = step_budget > 0  # cost.CostConfig.steps
        self.step_s = step_s
        self.step_budget = step_budget
        self.overflow_weight = overflow_weight
        self.band = band
        self.max_in_flight, self.max_queued, self.max_engine_queue, self.max_kv = limits
        self.capped = factor is not None
        self.factor = factor if factor is not None else 0.0
        self.slack = slack

    def __dealloc__(self):
        free(self.slots)

    cdef int _role_code(self, object role) except -1:
        if role is self.both:
            return 0
        if role is self.prefill:
            return 1
        if role is self.decode:
            return 2
        raise ValueError(f"unknown role {role!r}")

    cdef int _read(self, Py_ssize_t i, object view) except -1:
        cdef Slot* s = &self.slots[i]
        cdef object rate = view.prefill_tokens_per_s
        cdef object engine_queue = view.engine_queue
        cdef object kv_usage = view.kv_usage
        s.in_flight = view.in_flight
        s.queued = view.queued_prefill_tokens
        s.engine_queue = UNKNOWN if engine_queue is None else <long>engine_queue
        s.kv_usage = -1.0 if kv_usage is None else <double>kv_usage
        cdef double step, room
        s.rate = <double>rate if rate else self.default_rate
        # Same operations, same order as cost.LoadSeconds.prepare (and cost.step_terms).
        if self.steps:
            step = self.step_s + self.decode_s * s.in_flight
            room = self.step_budget - s.in_flight
            if room < self.step_budget * 0.25:
                room = self.step_budget * 0.25
            s.s_per_token = 1.0 / s.rate + step / room
            s.load_s = s.queued * s.s_per_token + step
        else:
            s.s_per_token = 1.0 / s.rate
            s.load_s = s.queued * s.s_per_token + self.decode_s * s.in_flight
        if s.engine_queue != UNKNOWN:
            s.load_s += self.engine_queue_s * s.engine_queue
        # cost.kv_room
        cdef object pool = view.kv_tokens
        if not pool or self.overflow_weight <= 0:
            s.kv_room = INFINITY
        else:
            s.kv_room = (<double>pool * (1.0 - (s.kv_usage if s.kv_usage >= 0.0 else 0.0))
                         - <double>s.queued)
        s.role = self._role_code(view.role)
        s.healthy = bool(view.healthy)
        s.ready = view.ledger_state is self.ready_state
        self.views[i] = view
        self.targets[i] = view.targets
        return 0

    cdef int _rebuild(self, tuple views) except -1:
        cdef Py_ssize_t n = len(views), i
        if n > self.capacity:
            free(self.slots)
            self.slots = <Slot*>malloc(max(n, 1) * sizeof(Slot))
            if self.slots == NULL:
                self.capacity = 0
                self.n = 0
                raise MemoryError()
            self.capacity = n
        self.n = n
        self.views = [None] * n
        self.targets = [None] * n
        self.names = [view.worker for view in views]
        order = sorted(range(n), key=self.names.__getitem__)
        for i in range(n):
            self._read(i, views[i])
        for position, i in enumerate(order):
            self.slots[i].rank = position
            self.slots[i].whash = worker_hash(self.names[i])
        return 0

    cdef int _sync(self, tuple views) except -1:
        cdef Py_ssize_t i
        cdef object view
        if views is self.last:
            return 0
        if len(views) != self.n:
            self._rebuild(views)
        else:
            for i in range(self.n):
                view = views[i]
                if view is not self.views[i]:
                    if view.worker != self.names[i]:
                        self._rebuild(views)
                        break
                    self._read(i, view)
        self.last = views
        return 0

    cdef long _blocks(self, Py_ssize_t i, dict target_blocks):
        """Leading blocks the ledger credits worker ``i`` with (best DP rank); 0 if untrusted."""
        cdef tuple targets = <tuple>self.targets[i]
        cdef PyObject* found
        cdef long best = 0, value
        cdef object target
        if not self.slots[i].ready:
            return 0
        for target in targets:
            found = PyDict_GetItem(target_blocks, target)
            if found != NULL:
                value = PyLong_AsLong(<object>found)
                if value > best:
                    best = value
        return best

    def pick(self, tuple views, dict target_blocks, long token_count, long block_size,
             object role, uint64_t seed, object keys=None):
        """One decision's candidates, or a verdict that the Python chain must decide.
        ``seed`` is the request's tie-order seed (``cost.tie_seed``); ``keys`` its block keys
        (with a band: the band's seed, ``cost.band_seed``).

        Returns one of:
          ("none",)                      no eligible or no open worker (reference raises)
          ("exact", cheap, cheap_cost, cheap_blocks, cheap_s_per_token,
           long, long_cost, long_blocks, band)
                                         exact_kv applies; long is None without a hit holder;
                                         band (worker, blocks): the cost band's pick, or None
          ("load_aware", worker)         every open ledger trusted, no hit
          ("chain",)                     neither applies: p2c / round robin decide
        """
        cdef Py_ssize_t i, n_open = 0
        cdef int wanted = self._role_code(role)
        cdef Slot* s
        cdef long total_in_flight = 0, blocks, uncached
        cdef double cap, mean, value, over
        cdef bint any_hit = False, all_ready = True
        cdef Py_ssize_t cheap = -1, long_ = -1, best
        cdef double cheap_cost = INFINITY, long_cost = INFINITY, limit
        cdef long cheap_blocks = 0, long_blocks = 0, longest = 0, most
        cdef uint64_t band_seed
        cdef object band
        cdef long* hit
        cdef double* val
        self._sync(views)
        hit = <long*>malloc(max(self.n, 1) * sizeof(long))
        val = <double*>malloc(max(self.n, 1) * sizeof(double))
        if hit == NULL or val == NULL:
            free(hit)
            free(val)
            raise MemoryError()
        try:
            # Eligible and open workers (Scheduler.decide), their trusted hits (worker_matches).
            for i in range(self.n):
                s = &self.slots[i]
                hit[i] = -1  # -1: not open
                if not s.healthy or (s.role != 0 and s.role != wanted):
                    continue
                if (s.in_flight >= self.max_in_flight or s.queued >= self.max_queued
                        or (s.engine_queue != UNKNOWN and s.engine_queue >= self.max_engine_queue)
                        or (s.kv_usage >= 0.0 and s.kv_usage >= self.max_kv)):
                    continue
                n_open += 1
                total_in_flight += s.in_flight
                hit[i] = self._blocks(i, target_blocks)
                if hit[i]:
                    any_hit = True
                    if hit[i] > longest:
                        longest = hit[i]
                if not s.ready:
                    all_ready = False
            if n_open == 0:
                return ("none",)
            if not any_hit and not all_ready:
                return ("chain",)
            # BoundedLoad.cap over the open workers, this request included.
            if self.capped:
                mean = (total_in_flight + 1) / <double>n_open
                cap = ceil(self.factor * mean)
                if mean + self.slack > cap:
                    cap = mean + self.slack
            else:
                cap = INFINITY
            for i in range(self.n):
                val[i] = INFINITY  # not a candidate (not open, or over the cap)
                if hit[i] < 0:
                    continue
                s = &self.slots[i]
                if s.in_flight + 1 > cap:
                    continue
                blocks = hit[i]
                uncached = token_count - blocks * block_size
                if uncached < 0:
                    uncached = 0
                if any_hit or self.steps:  # ExactKv.decide's value; cost.cost's step form
                    value = s.load_s + uncached * s.s_per_token
                else:  # cost.cost, as LoadAware's cheapest computes it
                    value = (s.queued + uncached) / s.rate + self.decode_s * s.in_flight
                    if s.engine_queue != UNKNOWN:
                        value += self.engine_queue_s * s.engine_queue
                # the KV-pressure charge (cost.kv_overflow)
                over = <double>token_count - s.kv_room
                if over > token_count - uncached:
                    over = token_count - uncached
                if over > 0:
                    value += self.overflow_weight * over * s.s_per_token
                val[i] = value
                if value < cheap_cost or (value == cheap_cost and cheap >= 0
                                          and _tie_before(s, &self.slots[cheap], seed)):
                    cheap, cheap_cost, cheap_blocks = i, value, blocks
                if blocks and (blocks > long_blocks or blocks == long_blocks and (
                        value < long_cost or value == long_cost
                        and _tie_before(s, &self.slots[long_], seed))):
                    long_, long_cost, long_blocks = i, value, blocks
            if cheap < 0:
                return ("chain",)  # unreachable: some open worker is at or below the mean
            band = None
            best = cheap
            if self.band > 0:  # cost.in_band: the band's most blocks, first in its tie order
                band_seed = <uint64_t>keys[longest] if longest < len(keys) else seed
                limit = cheap_cost + self.band
                most = 0
                for i in range(self.n):
                    if val[i] <= limit and hit[i] > most:
                        most = hit[i]
                best = -1
                for i in range(self.n):
                    if val[i] <= limit and hit[i] == most and (best < 0 or _tie_before(
                            &self.slots[i], &self.slots[best], band_seed)):
                        best = i
                band = (self.names[best], hit[best])
            if not any_hit:
                return ("load_aware", self.names[best])
            return ("exact", self.names[cheap], cheap_cost, cheap_blocks,
                    self.slots[cheap].s_per_token,
                    None if long_ < 0 else self.names[long_], long_cost, long_blocks, band)
        finally:
            free(hit)
            free(val)
