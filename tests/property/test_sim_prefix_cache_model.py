"""Replaying a simulated cache's events into a plain model reproduces the cache's truth.

This is the promise the simulator makes to Cortex: a consumer that applies every event in
order (keeping a copy count per engine hash, since vLLM may store and remove one hash twice)
knows exactly which prefixes the engine holds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from cortex.events.model import AllBlocksCleared, BlockRemoved, BlockStored, EngineFamily, Event
from cortex.sim.engine_hashes import VllmChainHasher, make_chain_hasher
from cortex.sim.prefix_cache import FreeOrder, SglangPrefixCache, TruthEntry, VllmPrefixCache

Key = tuple[tuple[str | None, str | None], int]


class EventModel:
    """The simplest consumer: (namespace, hash) -> path, with a copy count."""

    def __init__(self) -> None:
        self.copies: Counter[Key] = Counter()
        self.entry: dict[Key, TruthEntry] = {}

    def apply(self, event: Event) -> None:
        if isinstance(event, AllBlocksCleared):
            self.copies.clear()
            self.entry.clear()
        elif isinstance(event, BlockRemoved):
            matches = [k for k in self.copies if k[1] in event.block_hashes]
            assert len(matches) == len(set(event.block_hashes)), "removal of an unknown hash"
            for key in matches:
                self.copies[key] -= 1
                if self.copies[key] == 0:
                    del self.copies[key], self.entry[key]
        else:
            ns = (event.lora_name, event.cache_salt)
            path: tuple[int, ...] = ()
            if event.parent_hash is not None:
                path = self.entry[(ns, event.parent_hash)][2]
            size = event.block_size
            for index, block_hash in enumerate(event.block_hashes):
                path += tuple(event.token_ids[index * size : (index + 1) * size])
                key = (ns, block_hash)
                assert self.entry.setdefault(key, (*ns, path)) == (*ns, path)
                self.copies[key] += 1

    def truth(self) -> set[TruthEntry]:
        return set(self.entry.values())


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
