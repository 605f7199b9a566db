"""The SGLang batching model under random traffic: it never over-commits its pool, every
request produces exactly its tokens, a consumer replaying the published events ends up with
the engine's truth whenever everything is published, and a hit is never one the cache did
not hold. PD requests mixed in: a ``hold_kv`` one keeps its pages until released, a
``kv_received`` one is never matched (cached 0), never computes its prompt unless retracted,
and adds nothing to the tree."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from cortex.ledger.kv_events import AllBlocksCleared, BlockRemoved, Event
from cortex.sim.batching.core import SimRequest, TruthEntry
from cortex.sim.batching.sglang import SglangBatchingConfig, SglangBatchingEngine
from cortex.sim.engine_hashes import SglangChainHasher
from cortex.sim.output_text import output_token_id
from cortex.sim.step_time import StepProfile

PROFILE = StepProfile("test", step_s=0.01, prefill_token_s=0.001, attention_pair_s=1e-6,
                      decode_seq_s=0.002, decode_kv_token_s=1e-5)
NAMESPACES = [(None, None), (None, "salt"), ("ad", None)]


class Replay:
    """The simplest consumer: engine hash -> the path it names (SGLang stores a page once)."""

    def __init__(self) -> None:
        self.entries: dict[int, TruthEntry] = {}

    def apply(self, event: Event) -> None:
        if isinstance(event, AllBlocksCleared):
            self.entries.clear()
        elif isinstance(event, BlockRemoved):
            for block_hash in event.block_hashes:
                del self.entries[block_hash]  # a removal names a stored page
        else:
            path: tuple[int, ...] = ()
            if event.parent_hash is not None:
                path = self.entries[event.parent_hash][2]  # the parent is still stored
            size = event.block_size
            for index, block_hash in enumerate(event.block_hashes):
                path += tuple(event.token_ids[index * size : (index + 1) * size])
                assert block_hash not in self.entries, "a page stored twice"
                self.entries[block_hash] = (event.lora_name, event.cache_salt, path)

    def truth(self) -> set[TruthEntry]:
        return set(self.entries.values())


@dataclass
class Ledger:
    """What the test knows of each request."""

    requests: dict[int, SimRequest] = field(default_factory=dict)
    produced: dict[int, int] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)
    aborted: set[int] = field(default_factory=set)
    in_prefill: set[int] = field(default_factory=set)  # (re)scheduled, no token since
    released: set[int] = field(default_factory=set)

    def holding(self) -> list[int]:
        return [rid for rid in self.finished - self.released - self.aborted
                if self.requests[rid].hold_kv]


def _hit_bound(
    known: set[TruthEntry], request: SimRequest, page: int
) -> int:
    cap = len(request.tokens) - 1
    if request.read_limit is not None:
        cap = min(cap, request.read_limit)
    hit = 0
    ns = (request.lora_name, request.cache_salt)
    while hit + page <= cap and (*ns, request.tokens[: hit + page]) in known:
        hit += page
    return hit


def _pages(request: SimRequest, produced: int, page: int) -> set[TruthEntry]:
    """The pages a prefill of ``request`` computes: its prompt and the outputs it has."""
    tokens = request.tokens + tuple(output_token_id(i) for i in range(produced))
    return {(request.lora_name, request.cache_salt, tokens[:end])
            for end in range(page, len(tokens) + 1, page)}


def _step(engine: SglangBatchingEngine, ledger: Ledger, replay: Replay, page: int) -> bool:
    # a chunk stashed at this pass's start is cached for the admissions of the same pass
    known = engine.truth()
    for rid in ledger.in_prefill:
        known |= _pages(ledger.requests[rid], ledger.produced[rid], page)
    outcome = engine.step()
    assert engine.audit() == []
    assert engine.used_tokens <= engine.capacity_tokens
    if outcome is None:
        return False
    assert outcome.seconds == PROFILE.seconds(outcome.work) and not outcome.work.empty or (
        outcome.preempted and outcome.work.empty)
    for rid, cached in outcome.scheduled.items():
        request = ledger.requests[rid]
        assert cached % page == 0
        assert cached <= _hit_bound(known, request, page)
        if request.kv_received:  # its KV is there: no prefill; a decode batch's first token
            assert cached == 0
            assert rid in outcome.preempted or (
                (rid in outcome.first_tokens) == (not outcome.work.chunks))
            continue
        ledger.in_prefill.add(rid)
    for rid in outcome.first_tokens:
        assert ledger.produced[rid] == 0
        ledger.produced[rid] = 1
        ledger.in_prefill.discard(rid)
    for rid in outcome.tokens:
        assert 0 < ledger.produced[rid] < ledger.requests[rid].output_tokens
        ledger.produced[rid] += 1
        ledger.in_prefill.discard(rid)
    ledger.in_prefill.update(outcome.preempted)  # recomputed from its prompt and outputs
    for rid in outcome.finished:
        assert ledger.produced[rid] == ledger.requests[rid].output_tokens
        assert rid not in ledger.finished
        ledger.finished.add(rid)
    for event in outcome.events:
        replay.apply(event)
    return True


BASES = [(), (1, 2, 0, 1, 2, 0, 1, 2), (2, 2, 1, 0, 0, 1, 1)]  # shared prefixes: hits
prompts = st.builds(
    lambda base, rest: base + tuple(rest),
    st.sampled_from(BASES), st.lists(st.integers(0, 2), max_size=8),
).filter(bool)
adds = st.tuples(
    st.just("add"),
    prompts,
    st.integers(1, 30),
    st.sampled_from(NAMESPACES),
    st.one_of(st.none(), st.integers(0, 6)),
    st.sampled_from(["", "", "hold", "received"]),  # PD: hold_kv or kv_received
)
operations = st.lists(
    st.one_of(
        adds, adds, adds,  # traffic enough to fill the pool
        st.tuples(st.just("step"), st.integers(1, 6)),
        st.tuples(st.just("abort"), st.integers(0, 30)),
        st.tuples(st.just("release"), st.integers(0, 30)),
        st.just(("idle",)),
        st.just(("clear",)),
    ),
    min_size=4,
    max_size=40,
)


def _run(config: SglangBatchingConfig, ops: list[tuple[object, ...]]) -> Ledger:
    engine = SglangBatchingEngine(config, PROFILE, SglangChainHasher())
    page = config.page_size
    ledger, replay = Ledger(), Replay()
    for op in ops:
        if op[0] == "add":
            _, tokens, outputs, ns, read_limit, pd = op
            rid = len(ledger.requests)
            request = SimRequest(rid, tokens, outputs, ns[0], ns[1], read_limit,  # type: ignore[arg-type,index]
                                 hold_kv=pd == "hold", kv_received=pd == "received")
            if len(tokens) + outputs + page >= engine.capacity_tokens:  # type: ignore[arg-type]
                continue  # add refuses what the pool can never hold (tested elsewhere)
            engine.add(request)
            ledger.requests[rid] = request
            ledger.produced[rid] = 0
        elif op[0] == "step":
            for _ in range(op[1]):  # type: ignore[call-overload]
                _step(engine, ledger, replay, page)
        elif op[0] == "abort":
            rid = op[1]
            if rid in ledger.requests and rid not in ledger.finished:
                engine.abort(rid)  # type: ignore[arg-type]
                ledger.aborted.add(rid)  # type: ignore[arg-type]
                ledger.in_prefill.discard(rid)  # type: ignore[arg-type]
            assert engine.audit() == []
        elif op[0] == "release":
            engine.release(op[1])  # type: ignore[arg-type]
            if op[1] in ledger.finished:
                ledger.released.add(op[1])  # type: ignore[arg-type]
            assert engine.audit() == []
        elif op[0] == "idle":
            for event in engine.idle_events():
                replay.apply(event)
            assert replay.truth() == engine.truth()
        else:
            events = engine.clear()  # refused (no events) while requests are in the engine
            for event in events:
                replay.apply(event)
            if events:
                assert isinstance(events[-1], AllBlocksCleared) and engine.truth() == set()
                assert replay.truth() == set()

    def release_held() -> None:
        for rid in ledger.holding():
            engine.release(rid)
            ledger.released.add(rid)

    steps = 0
    while True:  # held pages are released when what waits needs them (a lease would end)
        if not _step(engine, ledger, replay, page):
            if not engine.waiting:
                break
            assert ledger.holding(), "requests wait in an idle engine that holds nothing"
            release_held()
        elif steps % 100 == 99:
            release_held()
        steps += 1
        assert steps < 5000, "the engine does not drain"
    release_held()
    assert engine.step() is None
    for event in engine.idle_events():
        replay.apply(event)
    assert replay.truth() == engine.truth()
    assert engine.waiting == engine.running == 0 and engine.kv_usage == 0.0
    for rid, request in ledger.requests.items():
        if rid not in ledger.aborted:
            assert rid in ledger.finished and ledger.produced[rid] == request.output_tokens
    return ledger


@settings(max_examples=200, deadline=None)
@given(
    ops=operations,
    page=st.integers(1, 3),
    pool=st.integers(24, 64),
    chunk=st.sampled_from([-1, 4, 6, 16]),
    max_prefill=st.sampled_from([8, 16384]),
    running_cap=st.sampled_from([None, 1, 3]),
    policy=st.sampled_from(["fcfs", "lpm"]),
    conservativeness=st.sampled_from([0.02, 0.1, 0.3, 1.0]),
    interval=st.integers(1, 4),
)
def test_random_traffic_keeps_every_promise(
    ops: list[tuple[object, ...]], page: int, pool: int, chunk: int, max_prefill: int,
    running_cap: int | None, policy: str, conservativeness: float, interval: int,
) -> None:
    _run(SglangBatchingConfig(
        max_total_tokens=pool, chunked_prefill_size=max(chunk, page) if chunk != -1 else -1,
        max_prefill_tokens=max_prefill, max_running_requests=running_cap, page_size=page,
        schedule_policy=policy,  # type: ignore[arg-type]
        schedule_conservativeness=conservativeness, decode_log_interval=interval), ops)


@settings(max_examples=100, deadline=None)
@given(
    arrivals=st.lists(st.tuples(adds, st.integers(0, 3)), min_size=2, max_size=12),
    page=st.integers(1, 2),
    pool=st.integers(30, 48),
)
def test_memory_pressure_retracts_and_still_keeps_every_promise(
    arrivals: list[tuple[tuple[object, ...], int]], page: int, pool: int,
) -> None:
    """Requests arriving step by step under a low reserve over-fill the pool: decode retracts."""
    ops: list[tuple[object, ...]] = []
    for add, steps in arrivals:
        ops += [add, ("step", steps)]
    _run(SglangBatchingConfig(max_total_tokens=pool, chunked_prefill_size=8, page_size=page,
                              schedule_conservativeness=0.02, decode_log_interval=3), ops)
