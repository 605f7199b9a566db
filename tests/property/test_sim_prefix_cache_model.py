"""Replaying a simulated cache's events into a plain model reproduces the cache's truth.

This is the promise the simulator makes to Cortex: a consumer that applies every event in
order (keeping a copy count per engine hash, since vLLM may store and remove one hash twice)
knows exactly which prefixes the engine holds (``tests.kv_event_replay``).
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from cortex.ledger.kv_events import BlockRemoved, BlockStored, EngineFamily
from cortex.sim.engine_hashes import VllmChainHasher, make_chain_hasher
from cortex.sim.prefix_cache import FreeOrder, SglangPrefixCache, TruthEntry, VllmPrefixCache
from tests.kv_event_replay import EventModel


def _expected_hit_tokens(
    truth: set[TruthEntry], ns: tuple[str | None, str | None], tokens: Sequence[int], size: int
) -> int:
    cap = max(len(tokens) - 1, 0) // size
    hit = 0
    while hit < cap and (*ns, tuple(tokens[: (hit + 1) * size])) in truth:
        hit += 1
    return hit * size


NAMESPACES = [(None, None), (None, "salt"), ("lora-a", None), ("lora-a", "salt")]
requests = st.tuples(
    st.lists(st.integers(0, 2), max_size=10),
    st.sampled_from(NAMESPACES),
    st.booleans(),  # hold the blocks until a later step
)
operations = st.lists(st.one_of(requests, st.just("clear"), st.just("release")), max_size=25)


def _run(cache: VllmPrefixCache | SglangPrefixCache, ops: list[object], vllm: bool) -> None:
    model = EventModel()
    leases: list[int] = []
    size = cache.block_size
    for op in ops:
        if op == "clear":
            events = cache.clear()
        elif op == "release":
            if leases:
                cache.release(leases.pop(0))
            events = []
        else:
            tokens, ns, hold = op  # type: ignore[misc]
            before = cache.truth()
            result = cache.admit(tokens, lora_name=ns[0], cache_salt=ns[1], hold=hold)
            assert result.cached_tokens == _expected_hit_tokens(before, ns, tokens, size)
            if result.lease is not None:
                leases.append(result.lease)
            events = result.events
            kinds = [type(e) for e in events]
            stores = kinds.count(BlockStored)
            assert stores <= 1 and (not stores or kinds[-1] is BlockStored)
            removals = [e for e in events if isinstance(e, BlockRemoved)]
            if vllm:
                assert all(len(e.block_hashes) == 1 for e in removals)
            else:
                assert len(removals) <= 1
        for event in events:
            model.apply(event)
        truth = cache.truth()
        assert model.truth() == truth
        assert cache.used_blocks <= cache.capacity_blocks
        if not vllm:  # radix: never an orphan, every cached page's ancestors are cached
            for lora, salt, path in truth:
                for end in range(size, len(path), size):
                    assert (lora, salt, path[:end]) in truth


@settings(max_examples=150, deadline=None)
@given(
    ops=operations,
    size=st.integers(1, 3),
    capacity=st.integers(0, 8),
    order=st.sampled_from(["tail_first", "head_first"]),
)
def test_vllm_events_reproduce_truth(
    ops: list[object], size: int, capacity: int, order: FreeOrder
) -> None:
    hasher = make_chain_hasher(EngineFamily.VLLM, (0, 33))
    assert isinstance(hasher, VllmChainHasher)
    cache = VllmPrefixCache(hasher, block_size=size, capacity_blocks=capacity, free_order=order)
    _run(cache, ops, vllm=True)


@settings(max_examples=150, deadline=None)
@given(ops=operations, size=st.integers(1, 3), capacity=st.integers(0, 8))
def test_sglang_events_reproduce_truth(ops: list[object], size: int, capacity: int) -> None:
    hasher = make_chain_hasher(EngineFamily.SGLANG, (0, 5, 23))
    cache = SglangPrefixCache(hasher, block_size=size, capacity_blocks=capacity)
    _run(cache, ops, vllm=False)
