"""The vLLM flavour of the continuous-batching engine model: vLLM V1's scheduler (0.32), one
synchronous step at a time, over its block pool (``cortex.sim.batching.vllm_blocks``).

Pure. Facts from ``shared/protocols/engine-scheduling.md`` §1–§6 (read from vLLM 0.32's
``v1/core/sched/scheduler.py`` and ``v1/core/kv_cache_manager.py``). One ``step``:

1. Budget ``max_num_batched_tokens``. ``long_prefill_token_threshold`` (0 = off) caps any
   request's tokens in a step, except when only one request is running or waiting.
2. RUNNING requests first, in order (oldest admitted first): each asks for all its remaining
   tokens (a decode 1, an unfinished prefill the rest of its sequence), clipped to the cap and
   to the budget left: chunked prefill is whatever budget is left, never block-aligned. Its
   blocks are allocated (``allocate_slots``); if they do not fit, the newest running request
   (``running[-1]``) is preempted, repeatedly, until they do or the request preempted itself.
3. WAITING requests next (FCFS; preempted ones at the front), only if nothing was preempted in
   this step, while the budget lasts and fewer than ``max_num_seqs`` run. Each gets a prefix
   lookup (full blocks, at most ``num_tokens - 1`` tokens: the last token is recomputed for its
   logits; at most ``read_limit`` tokens). It is admitted only if its blocks fit: with
   ``reserve_full_isl`` those of its whole current sequence, not only of its first chunk; hits
   sitting in the free queue count as taken; ``watermark x num_gpu_blocks`` blocks stay free
   while anything runs. The first request that does not fit stops the loop (head-of-line).
4. Blocks are cached when they become full *as scheduled* (before the forward): one
   ``BlockStored`` per request per step, prompt and decode blocks alike; a reused free block
   that still has a hash is evicted then (``BlockRemoved``).
5. The forward: the step lasts ``profile.seconds(work)``. Every request whose scheduled tokens
   reach its sequence's end samples a token (output token ids: ``cortex.sim.output_text``);
   the one that reaches ``output_tokens`` finishes and frees its blocks (tail first).
6. The step's events are published as one batch at its end (``StepOutcome.events``).

A preempted request loses all its blocks (freed tail first; hashed ones stay cached, so it
usually re-hits them), goes to the front of the waiting queue, and recomputes prompt and
outputs so far on re-admission. ``cached_tokens`` is its hit at its first scheduling only.

PD roles (NixlConnector's scheduler side, as far as the model needs it; rules in
``cortex.sim.batching.core``):

* ``hold_kv`` (prefill, ``do_remote_decode``): when it finishes, ``request_finished`` delays the
  free of its blocks: they stay held (and cached) until ``release`` (the decode read them, or
  ``kv_lease_duration`` ran out), then are freed as a finished request's, tail first.
* ``kv_received`` (decode, ``do_remote_prefill``): admitted in the waiting pass like any other
  (FCFS, the prefix lookup, ``reserve_full_isl``, head of line), its blocks are allocated for
  the whole prompt and those full are cached at once (``BlockStored``); all its prompt but the
  last token counts as computed, and that last token is scheduled alone (one token of budget),
  as vLLM does once the KV has landed: the step samples the first output from it, which the
  step timing counts as a decode. The local hit is ``cached_tokens``. Here the KV lands before
  ``add`` (the shell waited the transfer), where vLLM allocates first and waits for the KV in
  ``WAITING_FOR_REMOTE_KVS``: the blocks are taken a transfer later than vLLM takes them.

Modelled as vLLM 0.32 with its defaults otherwise: FCFS policy, chunked prefill on, one KV
cache group (full attention), no speculative decoding, no KV connector, no LoRA slot limit
(``max_loras``), no KV connector beyond the PD hand-over above, no ``max_model_len``: a request that could never fit the pool is refused at
``add`` (vLLM's ``max_model_len`` never exceeds its KV capacity, and it refuses a request
longer than that), so every admitted request can finish. Async scheduling (vLLM's
default: step N+1 scheduled while step N runs, its events published with step N's) is not
modelled: steps are synchronous, so each batch holds its own step's events. ``clear`` answers
the reset at once, where vLLM publishes ``AllBlocksCleared`` with the next step's batch.

Invariants: blocks held never exceed the pool; a request is in exactly one of waiting and
running until it finishes or is aborted (then, with ``hold_kv``, held until released); a
running request holds
``ceil(num_computed / block_size)`` blocks between steps; every request produces exactly
``output_tokens`` tokens; ``truth()`` equals the replay of every event returned.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from cortex.errors import ConfigError
from cortex.ledger.kv_events import Event
from cortex.sim.batching.core import SimRequest, StepOutcome, TruthEntry
from cortex.sim.batching.vllm_blocks import BlockSource, KVBlock, VllmBlockPool
from cortex.sim.engine_hashes import BlockHash, VllmChainHasher
from cortex.sim.output_text import output_token_id
from cortex.sim.step_time import Chunk, StepProfile, StepWork


@dataclass(frozen=True, slots=True)
class VllmSchedulerConfig:
    """One vLLM engine rank's scheduling and KV cache settings (vLLM 0.32 names).

    Defaults are vLLM's for an online server on an H100/H200 (80 GB class, not A100):
    ``max_num_batched_tokens`` 8192 (2048 on smaller GPUs), ``max_num_seqs`` 1024 (256),
    ``block_size`` 16, ``watermark`` 0.0, ``long_prefill_token_threshold`` 0 (no cap),
    ``scheduler_reserve_full_isl`` True, prefix caching on. ``num_gpu_blocks`` has no default:
    vLLM sizes it by profiling (``--num-gpu-blocks-override`` sets it); it counts the null
    block, so ``num_gpu_blocks - 1`` blocks hold KV.
    """

    num_gpu_blocks: int
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 1024
    block_size: int = 16
    watermark: float = 0.0
    long_prefill_token_threshold: int = 0
    reserve_full_isl: bool = True
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        problems = []
        if self.num_gpu_blocks < 2:
            problems.append("num_gpu_blocks must be >= 2 (block 0 is the null block)")
        if self.block_size < 1:
            problems.append("block_size must be >= 1")
        if self.max_num_seqs < 1:
            problems.append("max_num_seqs must be >= 1")
        if self.max_num_batched_tokens < self.max_num_seqs:
            problems.append("max_num_batched_tokens must be >= max_num_seqs (as vLLM checks)")
        if not 0.0 <= self.watermark < 1.0:
            problems.append("watermark must be in [0, 1)")
        if self.long_prefill_token_threshold < 0:
            problems.append("long_prefill_token_threshold must be >= 0")
        if problems:
            raise ConfigError(problems)

    @property
    def watermark_blocks(self) -> int:
        return int(self.watermark * self.num_gpu_blocks)


@dataclass(slots=True, eq=False)
class _Sequence:
    """One request inside the engine."""

    request: SimRequest
    source: BlockSource  # its tokens: prompt, then the outputs sampled so far
    hashes: list[BlockHash] = field(default_factory=list)  # chain of its full blocks so far
    blocks: list[KVBlock] = field(default_factory=list)  # block table
    num_computed: int = 0  # tokens in KV (as scheduled)
    num_cached_blocks: int = 0  # leading blocks of the table that carry their hash
    produced: int = 0
    preemptions: int = 0
    held: bool = False  # finished, its blocks kept for a PD decode (hold_kv)

    @property
    def received(self) -> bool:
        """Its prompt's KV came from a prefill engine and it still has it (never preempted)."""
        return self.request.kv_received and self.preemptions == 0


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class VllmBatchingEngine:
    """One vLLM engine rank under continuous batching (see the module docstring)."""

    def __init__(
        self, config: VllmSchedulerConfig, profile: StepProfile, hasher: VllmChainHasher
    ) -> None:
        self.config = config
        self.profile = profile
        self.hasher = hasher
        self._pool = VllmBlockPool(
            config.num_gpu_blocks, config.block_size, enable_caching=config.enable_prefix_caching
        )
        self._waiting: deque[_Sequence] = deque()
        self._running: list[_Sequence] = []
        self._by_id: dict[int, _Sequence] = {}

    # ------------------------------------------------------------ BatchingEngine

    def add(self, request: SimRequest) -> None:
        """Queue ``request``. Refused (ValueError) if its id is in use, it is empty, or its
        final sequence (prompt + outputs but the last) needs more blocks than the pool has."""
        if request.request_id in self._by_id:
            raise ValueError(f"request {request.request_id} is already in the engine")
        if not request.tokens or request.output_tokens < 1:
            raise ValueError("a request needs >= 1 prompt token and >= 1 output token")
        final_tokens = len(request.tokens) + request.output_tokens - 1
        if _cdiv(final_tokens, self.config.block_size) > self._pool.usable_blocks:
            raise ValueError(
                f"request {request.request_id} needs {final_tokens} tokens of KV, more than "
                f"the pool's {self._pool.usable_blocks} blocks of {self.config.block_size}")
        source = BlockSource(
            list(request.tokens),
            lora_name=request.lora_name,
            lora_id=self.hasher.loras.lora_id(request.lora_name),
            cache_salt=request.cache_salt,
        )
        seq = _Sequence(request, source)
        self._by_id[request.request_id] = seq
        self._waiting.append(seq)

    def abort(self, request_id: int) -> None:
        seq = self._by_id.pop(request_id, None)
        if seq is None:
            return
        if seq.held:
            self._free(seq)
        elif seq in self._waiting:
            self._waiting.remove(seq)
        else:
            self._running.remove(seq)
            self._free(seq)

    def release(self, request_id: int) -> None:
        """A held request's blocks are let go (the decode read them, or the lease expired):
        freed tail first, as a finished request's."""
        seq = self._by_id.get(request_id)
        if seq is None or not seq.held:
            return
        del self._by_id[request_id]
        self._free(seq)

    def local_hit(self, request: SimRequest) -> int:
        """The prefix hit ``request`` would get if admitted now (full blocks, at most
        ``num_tokens - 1`` and ``read_limit`` tokens); nothing is touched."""
        if not self.config.enable_prefix_caching:
            return 0
        size = self.config.block_size
        limit = len(request.tokens) - 1
        if request.read_limit is not None and request.read_limit < limit:
            limit = request.read_limit
        max_blocks = limit // size
        if max_blocks <= 0:
            return 0
        hashes = self.hasher(request.tokens[: max_blocks * size], size, request.lora_name,
                             request.cache_salt)
        return len(self._pool.lookup(hashes)) * size

    def step(self) -> StepOutcome | None:
        """Schedule, run and publish one step; None when nothing can run."""
        if not self._running and not self._waiting:
            return None
        outcome = StepOutcome(seconds=0.0, work=StepWork())
        cap = self.config.long_prefill_token_threshold
        if len(self._running) + len(self._waiting) <= 1:
            cap = 0  # nobody to starve
        scheduled: list[tuple[_Sequence, int]] = []
        budget = self._schedule_running(cap, scheduled, outcome.preempted)
        if not outcome.preempted:
            self._admit_waiting(budget, cap, scheduled, outcome.scheduled)
        outcome.work = work = self._execute(scheduled, outcome)
        outcome.seconds = self.profile.seconds(work)
        outcome.events, outcome.hash_digests = self._pool.take_events()
        if work.empty and not outcome.events and not outcome.preempted:
            return None
        return outcome

    def idle_events(self) -> list[Event]:
        """vLLM publishes every step's events with that step: nothing is ever left over."""
        return []

    def clear(self) -> list[Event]:
        """vLLM's ``/reset_prefix_cache``: succeeds (``AllBlocksCleared``) only while no request
        holds blocks; otherwise changes nothing and says nothing."""
        if not self._pool.reset_prefix_cache():
            return []
        events, _ = self._pool.take_events()
        return events

    def reset(self, hasher: VllmChainHasher | None = None) -> None:
        """The engine restarted: requests, blocks and cache gone, silently; ``hasher`` replaces
        the old one when the new process hashes differently (a random NONE_HASH)."""
        if hasher is not None:
            self.hasher = hasher
        self._pool = VllmBlockPool(
            self.config.num_gpu_blocks,
            self.config.block_size,
            enable_caching=self.config.enable_prefix_caching,
        )
        self._waiting.clear()
        self._running.clear()
        self._by_id.clear()

    def truth(self) -> set[TruthEntry]:
        return self._pool.truth()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def kv_usage(self) -> float:
        return self._pool.usage

    @property
    def used_blocks(self) -> int:
        """Blocks held by requests (cached blocks nobody holds are free)."""
        return self._pool.num_used_blocks

    # ------------------------------------------------------------ scheduling

    def _schedule_running(
        self, cap: int, scheduled: list[tuple[_Sequence, int]], preempted: list[int]
    ) -> int:
        """Running requests in order, each its remaining tokens (clipped to ``cap`` and to the
        budget left), preempting the newest while blocks are short. Returns the budget left."""
        budget = self.config.max_num_batched_tokens
        size = self.config.block_size
        caching = self.config.enable_prefix_caching
        running = self._running
        index = 0
        while index < len(running) and budget > 0:
            seq = running[index]
            wanted = len(seq.source.tokens) - seq.num_computed
            if 0 < cap < wanted:
                wanted = cap
            wanted = min(wanted, budget)
            end = seq.num_computed + wanted
            if end <= len(seq.blocks) * size and (
                not caching or end // size <= seq.num_cached_blocks
            ):
                fits = True  # most decodes: room in its last block, which stays partial
            else:
                fits = self._allocate(seq, wanted, [], admitting=False)
            while not fits:
                victim = running.pop()
                self._preempt(victim)
                preempted.append(victim.request.request_id)
                if victim is seq:
                    break
                fits = self._allocate(seq, wanted, [], admitting=False)
            if not fits:
                break
            scheduled.append((seq, wanted))
            budget -= wanted
            index += 1
        return budget

    def _admit_waiting(
        self,
        budget: int,
        cap: int,
        scheduled: list[tuple[_Sequence, int]],
        first_scheduled: dict[int, int],
    ) -> None:
        """Waiting requests in order while budget and sequence slots last, each with its
        prefix hits; the first one whose blocks do not fit stops the admissions."""
        running = self._running
        waiting = self._waiting
        size = self.config.block_size
        while budget > 0 and waiting and len(running) < self.config.max_num_seqs:
            seq = waiting[0]
            hits = self._prefix_hits(seq)
            computed = len(hits) * size
            wanted = len(seq.source.tokens) - computed
            if seq.received:  # blocks for the whole prompt; only its last token is computed
                if not self._allocate(seq, wanted, hits, admitting=True):
                    break
                seq.num_computed = len(seq.source.tokens) - 1
                wanted = 1
            else:
                if 0 < cap < wanted:
                    wanted = cap
                wanted = min(wanted, budget)
                if not self._allocate(seq, wanted, hits, admitting=True):
                    break
                seq.num_computed = computed
            waiting.popleft()
            running.append(seq)
            if seq.preemptions == 0:
                first_scheduled[seq.request.request_id] = computed
            scheduled.append((seq, wanted))
            budget -= wanted

    def _prefix_hits(self, seq: _Sequence) -> list[KVBlock]:
        """Cached leading blocks of a waiting request, at most ``num_tokens - 1`` tokens (and
        ``read_limit``), in whole blocks."""
        if not self.config.enable_prefix_caching:
            return []
        limit = len(seq.source.tokens) - 1
        read_limit = seq.request.read_limit
        if read_limit is not None and read_limit < limit:
            limit = read_limit
        max_blocks = limit // self.config.block_size
        if max_blocks <= 0:
            return []
        self._extend_hashes(seq)
        return self._pool.lookup(seq.hashes[:max_blocks])

    def _allocate(
        self, seq: _Sequence, wanted: int, hits: list[KVBlock], *, admitting: bool
    ) -> bool:
        """vLLM's ``allocate_slots``: blocks for ``wanted`` more tokens (after ``hits``, the
        prefix hits of an admission), then cache the blocks that became full. False, changing
        nothing, when they do not fit."""
        size = self.config.block_size
        pool = self._pool
        held = len(seq.blocks) + len(hits)
        computed = seq.num_computed + len(hits) * size
        taken_hits = pool.count_free(hits) if hits else 0
        reserve = self.config.watermark_blocks if admitting and self._running else 0
        free = pool.num_free_blocks
        if admitting and self.config.reserve_full_isl:
            whole = max(_cdiv(len(seq.source.tokens), size) - held, 0) + taken_hits
            if whole + reserve > free:
                return False
        new = max(_cdiv(computed + wanted, size) - held, 0)
        if new + taken_hits + reserve > free:
            return False
        if hits:
            pool.touch(hits)
            seq.blocks.extend(hits)
            seq.num_cached_blocks = len(hits)
        if new:
            seq.blocks.extend(pool.get_new_blocks(new))
        if self.config.enable_prefix_caching:
            full = (computed + wanted) // size
            if full > seq.num_cached_blocks:
                self._extend_hashes(seq)
                pool.cache_full_blocks(
                    seq.blocks, seq.hashes, seq.num_cached_blocks, full, seq.source
                )
                seq.num_cached_blocks = full
        return True

    def _extend_hashes(self, seq: _Sequence) -> None:
        source = seq.source
        if len(seq.hashes) < len(source.tokens) // self.config.block_size:
            self.hasher.extend(
                seq.hashes, source.tokens, self.config.block_size,
                source.lora_name, source.cache_salt,
            )

    def _preempt(self, seq: _Sequence) -> None:
        """Recompute later: blocks freed, front of the waiting queue."""
        self._free(seq)
        seq.num_computed = 0
        seq.preemptions += 1
        self._waiting.appendleft(seq)

    def _free(self, seq: _Sequence) -> None:
        self._pool.free_blocks(reversed(seq.blocks))  # tail first: evicted first
        seq.blocks = []
        seq.num_cached_blocks = 0

    # ------------------------------------------------------------ forward and sampling

    def _execute(self, scheduled: list[tuple[_Sequence, int]], outcome: StepOutcome) -> StepWork:
        """The forward pass and sampling: the scheduled tokens count as computed; each request
        whose sequence is then all in KV samples a token; finished requests leave and free
        their blocks (a ``hold_kv`` one keeps them). Returns what the step computed: a decode
        is one token right after tokens already in KV, for a request that has produced or
        received its prompt's KV, and reads ``num_computed + 1`` KV tokens (its own
        included); anything else is a prefill chunk (a prompt's, or a preempted request's
        recompute)."""
        chunks: list[Chunk] = []
        decodes = 0
        decode_context = 0
        finished: list[_Sequence] = []
        for seq, wanted in scheduled:
            before = seq.num_computed
            seq.num_computed = computed = before + wanted
            tokens = seq.source.tokens
            if wanted == 1 and (seq.produced or seq.received) and computed == len(tokens):
                decodes += 1
                decode_context += computed
            else:
                chunks.append(Chunk(wanted, before))
            if computed < len(tokens):
                continue  # a prefill chunk that is not the last
            request_id = seq.request.request_id
            tokens.append(output_token_id(seq.produced))
            seq.produced += 1
            if seq.produced == 1:
                outcome.first_tokens.append(request_id)
            else:
                outcome.tokens.append(request_id)
            if seq.produced >= seq.request.output_tokens:
                outcome.finished.append(request_id)
                finished.append(seq)
        for seq in finished:
            if seq.request.hold_kv:
                seq.held = True  # freed by release (or abort)
                continue
            self._free(seq)
            del self._by_id[seq.request.request_id]
        if finished:
            done = set(finished)
            self._running = [seq for seq in self._running if seq not in done]
        return StepWork(tuple(chunks), decodes, decode_context)
