"""The vLLM batching model under random traffic keeps its promises at every step.

* blocks held never exceed the pool, and a step never exceeds its token budget or sequence cap;
* replaying every event published so far (``tests.kv_event_replay``) gives exactly ``truth()``;
* a request's ``cached_tokens`` are whole blocks, below its prompt length and its read limit,
  and name prefixes the cache really held;
* every request that is not aborted produces exactly ``output_tokens`` tokens (the first one
  reported once, as the first) and finishes; then the engine is idle and, once every
  ``hold_kv`` request is released, holds nothing;
* a ``kv_received`` request samples its first token in the step that first schedules it.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cortex.ledger.kv_events import BlockRemoved, EngineFamily
from cortex.sim.batching.core import SimRequest, StepOutcome
from cortex.sim.batching.vllm import VllmBatchingEngine, VllmSchedulerConfig
from cortex.sim.engine_hashes import VllmChainHasher, make_chain_hasher
from cortex.sim.step_time import StepProfile
from tests.kv_event_replay import EventModel

PROFILE = StepProfile("test", 0.001, 1e-5, 1e-8, 1e-4, 1e-7)
NAMESPACES = [(None, None), (None, "salt"), ("lora-a", None)]
MAX_STEPS = 5_000

configs = st.builds(
    lambda size, kv_tokens, seqs, extra, watermark, cap, reserve, caching: VllmSchedulerConfig(
        num_gpu_blocks=1 + -(-kv_tokens // size), block_size=size, max_num_seqs=seqs,
        max_num_batched_tokens=seqs + extra, watermark=watermark,
        long_prefill_token_threshold=cap, reserve_full_isl=reserve,
        enable_prefix_caching=caching),
    st.integers(1, 4),  # block_size
    st.integers(4, 48),  # tokens of KV the pool holds
    st.integers(1, 4),  # max_num_seqs
    st.integers(0, 12),  # budget beyond max_num_seqs
    st.sampled_from([0.0, 0.1, 0.3]),
    st.integers(0, 5),  # long_prefill_token_threshold
    st.booleans(),  # reserve_full_isl
    st.sampled_from([True, True, True, False]),  # prefix caching
)
PREFIXES = [(), (1, 1, 2, 0, 1, 2, 0, 0), (1, 1, 2, 0, 2, 2), (2, 0, 1)]  # shared by many
prompts = st.builds(
    lambda prefix, rest: prefix + tuple(rest) or (0,),
    st.sampled_from(PREFIXES),
    st.lists(st.integers(0, 2), max_size=8),
)
adds = st.tuples(
    st.just("add"),
    prompts,
    st.integers(1, 5),  # output_tokens
    st.sampled_from(NAMESPACES),
    st.one_of(st.none(), st.integers(0, 8)),  # read_limit
    st.sampled_from(["", "", "hold", "received"]),  # PD: hold_kv or kv_received
)
operations = st.lists(
    st.one_of(
        adds,
        adds,
        adds,
        st.tuples(st.just("step"), st.integers(1, 4)),
        st.tuples(st.just("abort"), st.integers(0, 30)),
        st.tuples(st.just("release"), st.integers(0, 30)),
        st.just(("clear",)),
    ),
    max_size=40,
)
bursts = st.lists(adds, min_size=1, max_size=8)  # requests queued before the first step


class Checker:
    def __init__(self, config: VllmSchedulerConfig) -> None:
        hasher = make_chain_hasher(EngineFamily.VLLM, (0, 32))
        assert isinstance(hasher, VllmChainHasher)
        self.config = config
        self.engine = VllmBatchingEngine(config, PROFILE, hasher)
        self.replay = EventModel()
        self.requests: dict[int, SimRequest] = {}
        self.produced: dict[int, int] = {}
        self.finished: set[int] = set()
        self.aborted: set[int] = set()
        self.released: set[int] = set()

    def add(self, request: SimRequest) -> None:
        size = self.config.block_size
        final = len(request.tokens) + request.output_tokens - 1
        fits = -(-final // size) <= self.config.num_gpu_blocks - 1
        try:
            self.engine.add(request)
        except ValueError:
            assert not fits
            return
        assert fits
        self.requests[request.request_id] = request
        self.produced[request.request_id] = 0

    def abort(self, request_id: int) -> None:
        self.engine.abort(request_id)
        if request_id in self.requests and request_id not in self.finished:
            self.aborted.add(request_id)

    def holding(self) -> list[int]:
        """Finished ``hold_kv`` requests not released (nor aborted) yet."""
        return [rid for rid in self.finished - self.released - self.aborted
                if self.requests[rid].hold_kv]

    def release(self, request_id: int) -> None:
        self.engine.release(request_id)  # a no-op unless it finished (and holds)
        if request_id in self.finished:
            self.released.add(request_id)

    def clear(self) -> None:
        held = self.engine.used_blocks
        events = self.engine.clear()
        assert bool(events) == (held == 0)
        for event in events:
            self.replay.apply(event)
        assert self.replay.truth() == self.engine.truth()

    def step(self) -> StepOutcome | None:
        engine = self.engine
        outcome = engine.step()
        if outcome is None:  # idle, or what waits needs blocks a held request keeps
            assert engine.running == 0 and (engine.waiting == 0 or self.holding())
            return None
        for event in outcome.events:
            if isinstance(event, BlockRemoved):
                assert len(event.block_hashes) == 1
            self.replay.apply(event)
        truth = engine.truth()
        assert self.replay.truth() == truth
        assert 0 <= engine.used_blocks <= self.config.num_gpu_blocks - 1
        assert 0.0 <= engine.kv_usage <= 1.0
        work = outcome.work
        for request_id in outcome.scheduled:  # its last prompt token, alone: its first output
            assert not self.requests[request_id].kv_received or (
                request_id in outcome.first_tokens)
        assert 0 < work.prefill_tokens + work.decodes <= self.config.max_num_batched_tokens or (
            work.empty and outcome.preempted)
        assert len(work.chunks) + work.decodes <= self.config.max_num_seqs
        assert engine.running <= self.config.max_num_seqs
        size = self.config.block_size
        for request_id, cached in outcome.scheduled.items():
            request = self.requests[request_id]
            assert cached % size == 0 and cached <= len(request.tokens) - 1
            assert request.read_limit is None or cached <= request.read_limit
            for end in range(size, cached + 1, size):  # held by the request: still cached
                assert (request.lora_name, request.cache_salt, request.tokens[:end]) in truth
        for request_id in outcome.first_tokens:
            assert self.produced[request_id] == 0
            self.produced[request_id] = 1
        for request_id in outcome.tokens:
            assert self.produced[request_id] >= 1
            self.produced[request_id] += 1
        for request_id in outcome.finished:
            assert self.produced[request_id] == self.requests[request_id].output_tokens
            self.finished.add(request_id)
        for request_id, count in self.produced.items():
            assert count <= self.requests[request_id].output_tokens
        return outcome

    def drain(self) -> None:
        """Step until idle, releasing the held requests when what waits cannot run without
        their blocks (idle, or preempting itself over and over: a lease would end it)."""
        for count in range(MAX_STEPS):
            if self.step() is None:
                if not self.engine.waiting:
                    break
                for request_id in self.holding():
                    self.release(request_id)
            elif count % 100 == 99:
                for request_id in self.holding():
                    self.release(request_id)
        else:
            raise AssertionError("the engine never went idle")
        assert self.finished == set(self.requests) - self.aborted
        for request_id in self.holding():
            self.release(request_id)
        assert self.engine.used_blocks == 0 and self.engine.step() is None


@settings(max_examples=300, deadline=None)
@given(config=configs, burst=bursts, ops=operations)
def test_vllm_batching_keeps_its_promises(
    config: VllmSchedulerConfig, burst: list[tuple[object, ...]], ops: list[tuple[object, ...]]
) -> None:
    checker = Checker(config)
    next_id = 0
    for op in burst + ops:
        if op[0] == "add":
            _, tokens, outputs, (lora, salt), read_limit, pd = op
            checker.add(SimRequest(next_id, tokens, outputs, lora, salt, read_limit,  # type: ignore[arg-type]
                                   hold_kv=pd == "hold", kv_received=pd == "received"))
            next_id += 1
        elif op[0] == "step":
            for _ in range(op[1]):  # type: ignore[misc]
                checker.step()
        elif op[0] == "abort":
            checker.abort(op[1])  # type: ignore[arg-type]
        elif op[0] == "release":
            checker.release(op[1])  # type: ignore[arg-type]
        else:
            checker.clear()
    checker.drain()
