"""SGLang's continuous-batching scheduler, one engine rank, as a pure model.

Pure (no trio, no ZeroMQ, no clock). Implements ``cortex.sim.batching.core.BatchingEngine``;
every rule below was read in SGLang 0.5.23's source (``shared/protocols/engine-scheduling.md``
§7-§9). The radix cache it drives is ``cortex.sim.batching.sglang_radix``.

One ``step`` is one scheduler iteration, either a prefill batch or a decode batch:

1. The request cut by the last prefill batch (the *chunked* request) has its computed chunk
   inserted into the tree (``stash_chunked_request``).
2. A prefill batch is built (``get_new_batch_prefill``): the chunked request first (its next
   chunk), then the waiting queue in order (``fcfs``; ``lpm`` sorts it by longest cached prefix
   when at most 128 wait). Each waiting request is matched against the tree (capped at its
   length - 1 and ``read_limit``, in whole pages) and admitted by ``PrefillAdder``'s test:
   ``extend + min(max_new - outputs, 4096) + page_size < available + evictable - reserves``,
   where the reserves start at ``sum over running of min(max_new - outputs, 4096) x
   new_token_ratio`` and grow by each admitted ``extend + page (+ max_new)``; a failure stops
   the pass (head of line). An extend longer than the chunk budget left is cut to whole pages
   and becomes the chunked request (one at a time; it reserves no decode tokens). The pass
   also stops at ``max_prefill_tokens``, at ``chunked_prefill_size`` and at
   ``max_running_requests``. A memory failure or the running cap sets ``batch_is_full``: no
   prefill is tried again until a request leaves (one that finishes in a decode is noticed
   when the next decode filters the batch, so admission resumes a pass later), a chunk is
   stashed, or the engine idles.
3. If a prefill batch formed it runs, and decode waits; otherwise every running request
   decodes one token. Decode first needs a page for each request whose KV ends on a page
   boundary; the tree is evicted for the shortfall; if that is not enough, running requests
   are retracted: fewest output tokens first, ties the longest prompt, one at a time (each
   followed by evicting until ``20 x remaining`` tokens are free) until the rest fit. A
   retracted request loses its KV without its decode tokens being cached (what it inserted at
   prefill stays), goes to the back of the queue, and is recomputed (prompt + outputs) on
   re-admission; ``new_token_ratio`` becomes ``(outputs + 20 x n) / (sum max_new + 1)``.
   Without retraction ``new_token_ratio`` decays linearly from ``0.7 x conservativeness`` to
   0.14 of that over 600 decode steps; an idle engine resets it.
4. After a prefill batch, each request whose prompt was completed gets a token (its first, or
   the next after a retraction) and its computed sequence is inserted into the tree and locked
   (``cache_unfinished_req``); a decode adds one token per request. A request that produced its
   last token is released: its sequence (prompt + outputs whose KV exists) is inserted, its
   lock dropped, its other pages freed (``cache_finished_req``). Decode tokens are never
   inserted while a request runs.

PD roles (``disaggregation/prefill.py`` and ``decode.py``, as far as the model needs them;
rules in ``cortex.sim.batching.core``):

* ``hold_kv`` (prefill mode): when it finishes, what it computed is inserted into the tree
  (``cache_unfinished_req``, after the forward: its events go out with that prefill batch) and
  stays locked with its other pages while the KV is sent; ``release`` is the transfer's end
  (``cache_finished_req``: the lock dropped, the rest freed). A release also clears
  ``batch_is_full`` (the prefill loop resets it every pass).
* ``kv_received`` (decode mode): the request waits in a pre-allocation queue, admitted at the
  start of each iteration, in order, while the running cap allows and the prefill adder's
  memory test passes for its whole prompt (SGLang's ``DecodePreallocQueue`` reserves decode
  room its own way, ``num_reserved_decode_tokens``; the adder's test stands for it here). It
  gets pages for the prompt and joins the running batch; its first token comes from the next
  decode batch (SGLang hands over the prefill's first token in a ``PREBUILT`` pass without a
  forward; the model decodes it, one decode step later). No radix cache on decode (SGLang's
  default, ``--disaggregation-decode-enable-radix-cache`` off): the prompt is never matched
  nor inserted, even after a retraction (recomputed by a prefill batch, still outside the
  tree), so it publishes nothing and its ``cached_tokens`` is 0.

A step's outcome names each token once: in ``first_tokens`` (the first) or ``tokens`` (any
other, a re-prefill's included); a request whose last token it was is also in ``finished``.

Events (``cortex.sim.sglang_events``): queued as the tree changes (stores at insert, removals
at eviction) and published — returned in ``StepOutcome.events`` — after every prefill batch and
every ``decode_log_interval``-th decode batch (counted over the engine's life); the rest wait
for ``idle_events``. ``cached_tokens`` (``StepOutcome.scheduled``, at a request's first
scheduling) is its prefix hit then; SGLang adds ``prefix - already computed`` per extend,
which is 0 for later chunks, and stops counting at a retraction.

Invariants (``audit`` checks the first and third, the property tests the rest):

* the pool is never over-committed: tree tokens + pages held outside the tree <= the pool
  (``max_total_tokens`` floored to pages); a request's pages outside the tree are
  ``ceil(computed / page) x page - tokens of its locked tree path``;
* every request produces exactly ``output_tokens`` tokens; a finished request holds nothing
  (a ``hold_kv`` one: until released);
* each tree node's ``lock_ref`` = the requests whose locked path runs through it;
* at most one chunked request.

Left out, and why: overlap scheduling (the default event loop prepares batch N+1 while N runs,
which moves inserts and releases by about a step; the batch sequence here is the plain
loop's); ``--enable-mixed-chunk`` (off by default); matching every waiting request on every
pass under ``fcfs`` (SGLang does it for load reporting, which also refreshes those prefixes'
LRU times; too slow with thousands waiting, so only admission matches here); ``lpm``'s
in-batch prefix deprioritisation, priority scheduling and the other policies; the
``AllBlocksCleared`` SGLang may queue at start-up (unconfirmed). Where SGLang would fail or
abort — a request the pool can never hold (``add`` refuses it), a lone running request that
cannot decode (retracted here), a chunk that finds no room (it waits) — the model keeps going.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from cortex.errors import ConfigError
from cortex.ledger.kv_events import Event
from cortex.sim.batching.core import SimRequest, StepOutcome, TruthEntry
from cortex.sim.batching.sglang_radix import Namespace, RadixNode, SglangRadixTree
from cortex.sim.engine_hashes import SglangChainHasher
from cortex.sim.output_text import output_token_id
from cortex.sim.sglang_events import SglangEventQueue
from cortex.sim.step_time import Chunk, StepProfile, StepWork

SchedulePolicy = Literal["fcfs", "lpm"]

CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_DECODE_STEPS = 20  # global_config.retract_decode_steps
LPM_MAX_WAITING = 128  # above it, lpm sorts nothing (fcfs)


@dataclass(frozen=True, slots=True)
class SglangBatchingConfig:
    """The scheduler's knobs, SGLang's defaults where it has one (``server_args``)."""

    max_total_tokens: int  # KV pool in tokens (profiled from mem_fraction_static, or set)
    chunked_prefill_size: int = 8192  # H100/H200 default (4096 < 60 GiB); -1: no chunking
    max_prefill_tokens: int = 16384
    max_running_requests: int | None = None  # None: SGLang's rule (see ``running_cap``)
    context_len: int = 32768  # the model's; only the running-cap rule reads it
    page_size: int = 1  # CUDA default; backends force 16-128 (engine-scheduling.md §8.4)
    schedule_policy: SchedulePolicy = "fcfs"
    schedule_conservativeness: float = 1.0
    decode_log_interval: int = 40

    def __post_init__(self) -> None:
        problems = []
        if self.page_size < 1:
            problems.append("page_size must be >= 1")
        if self.max_total_tokens < 2 * max(self.page_size, 1):
            problems.append("max_total_tokens must hold at least two pages")
        if self.chunked_prefill_size != -1 and self.chunked_prefill_size < max(self.page_size, 1):
            problems.append("chunked_prefill_size must be -1 or at least one page")
        if self.max_prefill_tokens < 1:
            problems.append("max_prefill_tokens must be >= 1")
        if self.max_running_requests is not None and self.max_running_requests < 1:
            problems.append("max_running_requests must be >= 1")
        if self.context_len < 1:
            problems.append("context_len must be >= 1")
        if self.schedule_policy not in ("fcfs", "lpm"):
            problems.append(f"schedule_policy {self.schedule_policy!r} is not fcfs or lpm")
        if not self.schedule_conservativeness > 0:
            problems.append("schedule_conservativeness must be > 0")
        if self.decode_log_interval < 1:
            problems.append("decode_log_interval must be >= 1")
        if problems:
            raise ConfigError(problems)

    @property
    def capacity_tokens(self) -> int:
        """The pool, in whole pages."""
        return self.max_total_tokens // self.page_size * self.page_size

    @property
    def running_cap(self) -> int:
        """``resolve_max_num_reqs``: the given cap, or ``clamp(pool / context_len x 512, 2048,
        4096)``; either way at most half the pool in tokens."""
        if self.max_running_requests is not None:
            wanted = self.max_running_requests
        else:
            wanted = max(min(int(self.max_total_tokens / self.context_len * 512), 4096), 2048)
        return max(min(wanted, self.max_total_tokens // 2), 1)


@dataclass(slots=True, eq=False)
class _Req:
    request: SimRequest
    namespace: Namespace
    state: Literal["received", "waiting", "chunked", "running", "held"] = "waiting"
    outputs: int = 0  # tokens produced so far
    computed: int = 0  # tokens whose KV exists
    node: RadixNode | None = None  # locked: KV of tokens [0, node.end) is the tree's
    private: int = 0  # pool tokens (whole pages) held outside the tree
    scheduled: bool = False
    extend: int = 0  # tokens the prefill being built computes
    cut: bool = False  # that prefill stops before the sequence's end (chunked)
    output_ids: tuple[int, ...] = ()

    @property
    def tree_tokens(self) -> int:
        return 0 if self.node is None else self.node.end

    @property
    def uses_tree(self) -> bool:
        """Matched against and inserted into the radix cache (a received prompt: never)."""
        return not self.request.kv_received


@dataclass(slots=True)
class _PrefillBudget:
    """``PrefillAdder``'s budgets for one pass."""

    rem_chunk: int | None
    rem_input: int
    total_offset: float
    current_offset: int = 0


class _Verdict(enum.Enum):
    """``AddReqResult``: what the pass does after a request."""

    CONTINUE = enum.auto()
    NO_TOKEN = enum.auto()  # memory: stop, and the batch is full
    OTHER = enum.auto()  # a token budget: stop


@dataclass(slots=True)
class _Pass:
    """What one iteration reports."""

    scheduled: dict[int, int] = field(default_factory=dict)
    first_tokens: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)


class SglangBatchingEngine:
    """One SGLang engine rank under continuous batching (see the module docstring)."""

    def __init__(
        self,
        config: SglangBatchingConfig,
        profile: StepProfile,
        hasher: SglangChainHasher,
        *,
        output_token: Callable[[int], int] = output_token_id,
    ) -> None:
        self.config = config
        self.profile = profile
        self._page = config.page_size
        self._capacity = config.capacity_tokens
        self._running_cap = config.running_cap
        self._output_token = output_token
        self._events = SglangEventQueue()
        self._tree = SglangRadixTree(hasher, config.page_size, self._events)
        self._ratio_init = min(INIT_NEW_TOKEN_RATIO * config.schedule_conservativeness, 1.0)
        self._ratio_min = min(self._ratio_init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self._ratio_decay = (self._ratio_init - self._ratio_min) / NEW_TOKEN_RATIO_DECAY_STEPS
        self._start()

    def _start(self) -> None:
        self._reqs: dict[int, _Req] = {}
        self._waiting: list[_Req] = []
        self._received: list[_Req] = []  # kv_received, waiting for their pages
        self._running: list[_Req] = []
        self._chunked: _Req | None = None
        self._stash_pending = False
        self._private = 0  # sum of _Req.private
        self._ratio = self._ratio_init
        self._batch_is_full = False
        # requests left: at a prefill's end (seen when the batch merges, at the next pass's
        # start) or in a decode or abort (seen when the next decode filters the running batch)
        self._left_at_prefill = False
        self._left_running = False
        self._decode_batches = 0

    # ------------------------------------------------------------ the interface

    def add(self, request: SimRequest) -> None:
        if request.request_id in self._reqs:
            raise ValueError(f"request {request.request_id} is already in the engine")
        if request.output_tokens < 1 or not request.tokens:
            raise ValueError("a request needs a prompt token and at least one output token")
        if len(request.tokens) + request.output_tokens + self._page >= self._capacity:
            raise ValueError(
                f"request {request.request_id} needs {len(request.tokens)} + "
                f"{request.output_tokens} tokens: the {self._capacity}-token pool never "
                "admits it")
        req = _Req(request, (request.lora_name, request.cache_salt))
        self._reqs[request.request_id] = req
        if request.kv_received:
            req.state = "received"
            self._received.append(req)
        else:
            self._waiting.append(req)

    def abort(self, request_id: int) -> None:
        req = self._reqs.pop(request_id, None)
        if req is None:
            return
        if req.state == "waiting":
            self._waiting.remove(req)
            return
        if req.state == "received":
            self._received.remove(req)
            return
        if req.state == "held":
            self._release(req, insert=True)
            self._batch_is_full = False
            return
        if req is self._chunked:
            self._chunked = None
            self._stash_pending = False
        else:
            self._running.remove(req)
        self._release(req, insert=True)
        self._left_running = True

    def release(self, request_id: int) -> None:
        """The transfer of a held request's KV ended: ``cache_finished_req`` (its lock dropped,
        its other pages freed)."""
        req = self._reqs.get(request_id)
        if req is None or req.state != "held":
            return
        del self._reqs[request_id]
        self._release(req, insert=True)
        self._batch_is_full = False

    def local_hit(self, request: SimRequest) -> int:
        """0: SGLang's decode keeps no radix cache for what it receives."""
        if not request.kv_received:
            raise ValueError("local_hit is defined for kv_received requests only")
        return 0

    def step(self) -> StepOutcome | None:
        outcome = self._iterate()
        if outcome is None:
            self._on_idle()
            if self._waiting or self._received or self._chunked is not None:
                outcome = self._iterate()
        return outcome

    def idle_events(self) -> list[Event]:
        return self._events.take()

    def clear(self) -> list[Event]:
        """SGLang's flush: refused (nothing happens, no event) while a request is queued or
        running; else the tree empties and ``AllBlocksCleared`` follows any queued events."""
        if self._reqs:
            return []
        self._tree.reset()
        self._events.record_all_cleared()
        return self._events.take()

    def reset(self) -> None:
        self._tree.reset()
        self._events.clear()
        self._start()

    def truth(self) -> set[TruthEntry]:
        return self._tree.truth()

    @property
    def waiting(self) -> int:
        return len(self._waiting) + len(self._received)

    @property
    def running(self) -> int:
        return len(self._running) + (self._chunked is not None)

    @property
    def kv_usage(self) -> float:
        return (self.used_tokens - self._tree.evictable_tokens) / self._capacity

    # ------------------------------------------------------------ pool, for tests and metrics

    @property
    def capacity_tokens(self) -> int:
        return self._capacity

    @property
    def used_tokens(self) -> int:
        """Pool tokens in use: the tree's (evictable or not) and the requests' own pages."""
        return self._tree.size_tokens + self._private

    @property
    def new_token_ratio(self) -> float:
        return self._ratio

    def audit(self) -> list[str]:
        """Every broken invariant (empty when sound). Walks the whole tree: for tests."""
        problems = self._tree.audit()
        if self.used_tokens > self._capacity:
            problems.append(f"pool over-committed: {self.used_tokens} > {self._capacity}")
        if self._private != sum(r.private for r in self._reqs.values()):
            problems.append("private pages miscounted")
        locks: dict[int, int] = {}
        for req in self._reqs.values():
            expect = -(-req.computed // self._page) * self._page - req.tree_tokens
            if req.private != expect:
                problems.append(f"request {req.request.request_id}: {req.private} private "
                                f"tokens, {expect} expected")
            node = req.node
            while node is not None and node.parent is not None:
                locks[id(node)] = locks.get(id(node), 0) + 1
                node = node.parent
        for node in self._tree.nodes():
            if node.lock_ref != locks.get(id(node), 0):
                problems.append(f"node {node.serial}: lock_ref {node.lock_ref}, "
                                f"{locks.get(id(node), 0)} holders")
        return problems

    # ------------------------------------------------------------ one iteration

    def _iterate(self) -> StepOutcome | None:
        if self._left_at_prefill:
            self._batch_is_full = False
            self._left_at_prefill = False
        if self._stash_pending:
            self._stash_pending = False
            chunked = self._chunked
            if chunked is not None:
                self._checkpoint(chunked)
            self._batch_is_full = False
        report = _Pass()
        self._admit_received(report)
        batch = self._schedule_prefill(report)
        if batch:
            return self._run_prefill(batch, report)
        if self._left_running:  # update_running_batch: the batch shrank
            self._batch_is_full = False
            self._left_running = False
        if self._running:
            return self._run_decode(report)
        return None

    def _on_idle(self) -> None:
        self._ratio = self._ratio_init
        self._batch_is_full = False

    # ------------------------------------------------------------ prefill

    def _admit_received(self, report: _Pass) -> None:
        """Received requests in order get pages for their prompt and join the running batch
        while the running cap and the adder's memory test allow (head of line)."""
        received = self._received
        if not received:
            return
        page = self._page
        budget = _PrefillBudget(
            rem_chunk=None, rem_input=0,
            total_offset=sum(
                min(r.request.output_tokens - r.outputs, CLIP_MAX_NEW_TOKENS)
                for r in self._running) * self._ratio)
        admitted = 0
        for req in received:
            if len(self._running) >= self._running_cap:
                break
            prompt = len(req.request.tokens)
            max_new = min(req.request.output_tokens, CLIP_MAX_NEW_TOKENS)
            if prompt + max_new + page >= self._remaining_total(budget):
                break
            self._make_room(-(-prompt // page) * page)
            assert -(-prompt // page) * page <= self._available, "admitted past the pool"
            req.computed = prompt
            self._set_private(req)
            req.state = "running"
            req.scheduled = True
            report.scheduled[req.request.request_id] = 0
            self._running.append(req)
            self._reserve(budget, prompt, max_new)
            admitted += 1
        del received[:admitted]

    def _schedule_prefill(self, report: _Pass) -> list[_Req]:
        chunked = self._chunked
        if (self._batch_is_full or not self._waiting) and chunked is None:
            return []
        allowed = self._running_cap - len(self._running)
        if allowed <= 0 and chunked is None:
            self._batch_is_full = True
            return []
        if self.config.schedule_policy == "lpm" and len(self._waiting) <= LPM_MAX_WAITING:
            hits = {id(r): self._match(r, self._fill(r)).end for r in self._waiting}
            self._waiting.sort(key=lambda r: -hits[id(r)])
        chunk_size = self.config.chunked_prefill_size
        budget = _PrefillBudget(
            rem_chunk=None if chunk_size == -1 else chunk_size,
            rem_input=self.config.max_prefill_tokens,
            total_offset=sum(
                min(r.request.output_tokens - r.outputs, CLIP_MAX_NEW_TOKENS)
                for r in self._running) * self._ratio,
        )
        batch: list[_Req] = []
        if chunked is not None:
            if not self._add_chunked(budget, chunked):
                return []  # no room for the next chunk: the chunked request waits
            batch.append(chunked)
        for req in self._waiting:
            if len(batch) >= allowed:
                self._batch_is_full = True
                break
            verdict = self._add_one(budget, req, batch, report)
            if verdict is not _Verdict.CONTINUE:
                if verdict is _Verdict.NO_TOKEN:
                    self._batch_is_full = True
                break
        admitted = len(batch) - (chunked is not None)
        if admitted:
            taken = {id(r) for r in batch}
            self._waiting = [r for r in self._waiting if id(r) not in taken]
        if chunked is not None and not chunked.cut:
            self._chunked = None
            chunked.state = "running"
        for req in batch[len(batch) - admitted:]:
            if req.cut:
                self._chunked = req
                req.state = "chunked"
            else:
                req.state = "running"
        return batch

    def _add_chunked(self, budget: _PrefillBudget, req: _Req) -> bool:
        """``add_chunked_req``: the chunked request's next chunk, as big as the chunk budget,
        ``remaining_total`` and (here) the free pages allow."""
        assert budget.rem_chunk is not None
        page = self._page
        rest = len(req.request.tokens) + req.outputs - req.computed
        limit = min(budget.rem_chunk, int(self._remaining_total(budget)))
        if limit <= 0:
            limit = budget.rem_chunk
        room = self._available + self._tree.evictable_tokens
        if rest <= limit and -(-rest // page) * page <= room:
            extend, cut = rest, False
        else:
            extend, cut = min(limit, room) // page * page, True
            if extend <= 0:
                return False
        req.extend, req.cut = extend, cut
        max_new = 0 if cut else min(req.request.output_tokens - req.outputs, CLIP_MAX_NEW_TOKENS)
        self._reserve(budget, extend, max_new)
        return True

    def _add_one(
        self, budget: _PrefillBudget, req: _Req, batch: list[_Req], report: _Pass
    ) -> _Verdict:
        """``PrefillAdder.add_one_req`` for a waiting request: match, test, commit."""
        page = self._page
        fill = self._fill(req)
        node = self._match(req, fill)
        prefix = node.end
        extend = len(fill) - prefix
        max_new = min(req.request.output_tokens - req.outputs, CLIP_MAX_NEW_TOKENS)
        self._tree.lock(node)  # the adder's temporary lock, kept when committed
        if extend + max_new + page >= self._remaining_total(budget):
            self._tree.unlock(node)
            return _Verdict.NO_TOKEN
        paged = -(-extend // page) * page
        cut = False
        if budget.rem_chunk is None:
            if batch and paged >= budget.rem_input:
                self._tree.unlock(node)
                return _Verdict.OTHER
        elif paged > budget.rem_chunk:
            extend = budget.rem_chunk // page * page
            if extend <= 0:
                self._tree.unlock(node)
                return _Verdict.OTHER
            cut, max_new = True, 0
        req.node = node
        req.computed = prefix
        self._set_private(req)
        req.extend, req.cut = extend, cut
        batch.append(req)
        if not req.scheduled:
            req.scheduled = True
            report.scheduled[req.request.request_id] = prefix
        self._reserve(budget, extend, max_new)
        if self._remaining_total(budget) <= 0 or (
                self._available + self._tree.evictable_tokens - budget.current_offset <= 0):
            return _Verdict.NO_TOKEN
        if budget.rem_input <= 0 or (budget.rem_chunk is not None and budget.rem_chunk <= 0):
            return _Verdict.OTHER
        return _Verdict.CONTINUE

    def _reserve(self, budget: _PrefillBudget, extend: int, max_new: int) -> None:
        paged = -(-extend // self._page) * self._page
        budget.total_offset += paged + self._page + max_new
        budget.current_offset += paged + self._page
        budget.rem_input -= paged
        if budget.rem_chunk is not None:
            budget.rem_chunk -= paged

    def _remaining_total(self, budget: _PrefillBudget) -> float:
        return self._available + self._tree.evictable_tokens - budget.total_offset

    def _run_prefill(self, batch: list[_Req], report: _Pass) -> StepOutcome:
        page = self._page
        need = sum(-(-(r.computed + r.extend) // page) * page - -(-r.computed // page) * page
                   for r in batch)
        self._make_room(need + (len(batch) * page if page > 1 else 0))
        assert need <= self._available, "the prefill adder admitted more than the pool holds"
        chunks = []
        for req in batch:
            chunks.append(Chunk(tokens=req.extend, context=req.computed))
            req.computed += req.extend
            self._set_private(req)
        for req in batch:
            rid = req.request.request_id
            if req.cut:
                self._stash_pending = True
                continue
            req.outputs += 1
            (report.first_tokens if req.outputs == 1 else report.tokens).append(rid)
            if req.outputs == req.request.output_tokens:
                self._finish(req, report)
                self._left_at_prefill = True
            else:
                self._checkpoint(req)
                self._running.append(req)
        return self._outcome(StepWork(chunks=tuple(chunks)), report, self._events.take())

    # ------------------------------------------------------------ decode

    def _run_decode(self, report: _Pass) -> StepOutcome:
        running = self._running
        if self._decode_fits(running):
            self._ratio = max(self._ratio - self._ratio_decay, self._ratio_min)
        else:
            self._retract(report)
            running = self._running
        events: list[Event] = []
        if not running:  # even the last request could not decode: all retracted
            return self._outcome(StepWork(), report, events)
        page = self._page
        context = 0
        for req in running:
            context += req.computed + 1
            if req.computed % page == 0:
                req.private += page
                self._private += page
        work = StepWork(decodes=len(running), decode_context=context)
        still: list[_Req] = []
        for req in running:
            req.computed += 1
            req.outputs += 1
            (report.first_tokens if req.outputs == 1 else report.tokens).append(
                req.request.request_id)
            if req.outputs == req.request.output_tokens:
                self._finish(req, report)
                self._left_running = True
            else:
                still.append(req)
        self._running = still
        self._decode_batches += 1
        if self._decode_batches % self.config.decode_log_interval == 0:
            events = self._events.take()
        return self._outcome(work, report, events)

    def _decode_fits(self, reqs: list[_Req]) -> bool:
        """``check_decode_mem``: a page for every request whose KV ends on a page boundary,
        evicting the tree for the shortfall."""
        need = self._page * sum(1 for r in reqs if r.computed % self._page == 0)
        self._make_room(need)
        return self._available >= need

    def _retract(self, report: _Pass) -> None:
        """``retract_decode``: give up the fewest-output requests (ties: longest prompt) until
        the others can decode; at least one is retracted, and one is kept if it fits."""
        running = self._running
        order = sorted(range(len(running)),
                       key=lambda i: (running[i].outputs, -len(running[i].request.tokens)),
                       reverse=True)
        first = True
        while first or not self._decode_fits([running[i] for i in order]):
            if len(order) == 1 and self._decode_fits([running[order[0]]]):
                break
            first = False
            req = running[order.pop()]
            self._release(req, insert=False)
            req.state = "waiting"
            self._waiting.append(req)
            report.preempted.append(req.request.request_id)
            self._make_room(len(order) * RETRACT_DECODE_STEPS)
            if not order:
                break
        kept = sorted(order)
        self._running = [running[i] for i in kept]
        self._batch_is_full = False  # the batch shrank
        if self._running:
            decoded = sum(r.outputs for r in self._running)
            max_new = sum(r.request.output_tokens for r in self._running)
            self._ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(self._running))
                              / (max_new + 1))

    # ------------------------------------------------------------ KV bookkeeping

    @property
    def _available(self) -> int:
        return self._capacity - self._tree.size_tokens - self._private

    def _make_room(self, tokens: int) -> None:
        """Evict the tree for what ``tokens`` lacks of free pool (``evict_to_free_tokens``)."""
        short = tokens - self._available
        if short > 0:
            self._tree.evict(short)

    def _set_private(self, req: _Req) -> None:
        held = -(-req.computed // self._page) * self._page - req.tree_tokens
        self._private += held - req.private
        req.private = held

    def _fill(self, req: _Req) -> tuple[int, ...]:
        """The tokens a prefill of ``req`` computes: its prompt and the outputs it has."""
        return self._sequence(req, len(req.request.tokens) + req.outputs)

    def _sequence(self, req: _Req, length: int) -> tuple[int, ...]:
        prompt = req.request.tokens
        outputs = length - len(prompt)
        if outputs <= 0:
            return prompt[:length]
        if len(req.output_ids) < outputs:
            start = len(req.output_ids)
            req.output_ids += tuple(self._output_token(i) for i in range(start, outputs))
        return prompt + req.output_ids[:outputs]

    def _match(self, req: _Req, fill: tuple[int, ...]) -> RadixNode:
        if not req.uses_tree:
            return self._tree.root(req.namespace)
        limit = len(fill) - 1
        if req.request.read_limit is not None:
            limit = min(limit, req.request.read_limit)
        return self._tree.match(req.namespace, fill, max(limit, 0))

    def _checkpoint(self, req: _Req) -> None:
        """``cache_unfinished_req``: insert what ``req`` computed (whole pages) and move its
        lock to the new end of its path."""
        length = req.computed // self._page * self._page
        if length <= req.tree_tokens or not req.uses_tree:
            return
        node = self._tree.insert(req.namespace, self._sequence(req, length))
        self._tree.lock(node)
        if req.node is not None:
            self._tree.unlock(req.node)
        req.node = node
        self._set_private(req)

    def _release(self, req: _Req, *, insert: bool) -> None:
        """``release_kv_cache``: optionally insert what ``req`` computed, drop its lock, free
        its pages."""
        if insert and req.uses_tree:
            length = req.computed // self._page * self._page
            if length > req.tree_tokens:
                self._tree.insert(req.namespace, self._sequence(req, length))
        if req.node is not None:
            self._tree.unlock(req.node)
            req.node = None
        self._private -= req.private
        req.private = 0
        req.computed = 0

    def _finish(self, req: _Req, report: _Pass) -> None:
        report.finished.append(req.request.request_id)
        if req.request.hold_kv:  # its KV waits for the decode side: locked until release
            self._checkpoint(req)
            req.state = "held"
            return
        self._release(req, insert=True)
        del self._reqs[req.request.request_id]

    def _outcome(self, work: StepWork, report: _Pass, events: list[Event]) -> StepOutcome:
        return StepOutcome(
            seconds=self.profile.seconds(work),
            work=work,
            scheduled=report.scheduled,
            first_tokens=report.first_tokens,
            tokens=report.tokens,
            finished=report.finished,
            preempted=report.preempted,
            events=events,
        )
