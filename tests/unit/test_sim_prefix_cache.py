"""Capacity, hits and eviction order of the two simulated prefix caches."""

from __future__ import annotations

import pytest

from cortex.ledger.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EngineFamily
from cortex.sim.engine_hashes import SglangChainHasher, VllmChainHasher, make_chain_hasher
from cortex.sim.prefix_cache import FreeOrder, SglangPrefixCache, VllmPrefixCache


def _vllm(
    capacity: int, block_size: int = 2, free_order: FreeOrder = "tail_first"
) -> VllmPrefixCache:
    hasher = make_chain_hasher(EngineFamily.VLLM, (0, 33))
    assert isinstance(hasher, VllmChainHasher)
    return VllmPrefixCache(
        hasher, block_size=block_size, capacity_blocks=capacity, free_order=free_order
    )


def _sglang(capacity: int, block_size: int = 2) -> SglangPrefixCache:
    return SglangPrefixCache(SglangChainHasher(), block_size=block_size, capacity_blocks=capacity)


def _hashes(cache: VllmPrefixCache | SglangPrefixCache, tokens: list[int]) -> list[int]:
    return [h.value for h in cache.hasher(tokens, cache.block_size)]


def test_vllm_stores_once_per_request_and_evicts_lru_tail_first() -> None:
    cache = _vllm(capacity=3)
    a1, a2, b3 = _hashes(cache, [1, 2, 3, 4, 5, 6])
    (x1,) = _hashes(cache, [7, 8])
    (_, c2) = _hashes(cache, [1, 2, 9, 10])

    first = cache.admit([1, 2, 3, 4, 99])  # the partial trailing block is never stored
    assert first.cached_tokens == 0
    assert first.events == [
        BlockStored([a1, a2], None, [1, 2, 3, 4], 2, medium="GPU", group_idx=0,
                    kv_cache_spec_kind="full_attention")
    ]
    second = cache.admit([1, 2, 3, 4, 5, 6])
    assert second.cached_tokens == 4
    assert [type(e) for e in second.events] == [BlockStored]
    assert second.events[0].block_hashes == [b3] and second.events[0].parent_hash == a2
    # full: free queue is B3, A2, A1 (a finished request frees its tail first)
    third = cache.admit([7, 8])
    assert third.events[0] == BlockRemoved([b3], medium="GPU", group_idx=0)
    assert isinstance(third.events[1], BlockStored) and third.events[1].block_hashes == [x1]
    fourth = cache.admit([1, 2, 9, 10])  # hits A1 (protected), evicts A2
    assert fourth.cached_tokens == 2
    assert fourth.events[0] == BlockRemoved([a2], medium="GPU", group_idx=0)
    assert fourth.events[1].block_hashes == [c2]  # type: ignore[union-attr]
    assert cache.used_blocks == 3
    assert cache.truth() == {(None, None, p) for p in ((1, 2), (7, 8), (1, 2, 9, 10))}


def test_vllm_head_first_freeing_evicts_parents_before_children() -> None:
    cache = _vllm(capacity=2, free_order="head_first")
    a1, a2 = _hashes(cache, [1, 2, 3, 4])
    cache.admit([1, 2, 3, 4])
    evicting = cache.admit([7, 8])  # free queue A1, A2: the parent goes first
    assert evicting.events[0] == BlockRemoved([a1], medium="GPU", group_idx=0)
    assert (None, None, (1, 2, 3, 4)) in cache.truth()  # an orphan: cached, unreachable
    assert (None, None, (1, 2)) not in cache.truth()
    again = cache.admit([1, 2, 3, 4, 5])
    assert again.cached_tokens == 0  # the prefix walk stops at the missing parent
    assert again.events == [
        BlockRemoved([a2], medium="GPU", group_idx=0),
        BlockRemoved([_hashes(cache, [7, 8])[0]], medium="GPU", group_idx=0),
        BlockStored([a1, a2], None, [1, 2, 3, 4], 2, medium="GPU", group_idx=0,
                    kv_cache_spec_kind="full_attention"),
    ]
    with pytest.raises(ValueError):
        _vllm(capacity=1, free_order="random")  # type: ignore[arg-type]


def test_vllm_fully_cached_prompt_recomputes_and_restores_its_last_block() -> None:
    cache = _vllm(capacity=4)
    a1, a2 = _hashes(cache, [1, 2, 3, 4])
    cache.admit([1, 2, 3, 4])
    again = cache.admit([1, 2, 3, 4])
    assert again.cached_tokens == 2
    assert again.events == [
        BlockStored([a2], a1, [3, 4], 2, medium="GPU", group_idx=0,
                    kv_cache_spec_kind="full_attention")
    ]
    assert cache.used_blocks == 3  # two physical copies of A2
    evicting = cache.admit([7, 8, 9, 10, 11, 12])
    removed = [e.block_hashes for e in evicting.events if isinstance(e, BlockRemoved)]
    assert removed == [[a2], [a2]]  # the same hash removed twice, one event per block
    assert cache.truth() == {(None, None, (1, 2))} | {
        (None, None, (7, 8, 9, 10, 11, 12)[:end]) for end in (2, 4, 6)
    }


def test_vllm_held_blocks_are_not_evicted_and_overflow_is_not_cached() -> None:
    cache = _vllm(capacity=3)
    held = cache.admit([1, 2, 3, 4], hold=True)
    assert held.lease is not None
    spill = cache.admit([5, 6, 7, 8, 9, 10])  # only one block fits beside the held two
    assert [type(e) for e in spill.events] == [BlockStored]
    assert spill.events[0].token_ids == [5, 6]  # type: ignore[union-attr]
    assert cache.used_blocks == 3
    cache.release(held.lease)
    after = cache.admit([11, 12, 13, 14])
    assert [len(e.block_hashes) for e in after.events if isinstance(e, BlockRemoved)] == [1, 1]
    assert (None, None, (1, 2, 3, 4)) not in cache.truth()
    cache.release(held.lease)  # a second release is a no-op


def test_vllm_namespaces_and_event_metadata() -> None:
    cache = _vllm(capacity=10)
    plain = cache.admit([1, 2, 3, 4])
    salted = cache.admit([1, 2, 3, 4], cache_salt="s")
    lora = cache.admit([1, 2, 3, 4], lora_name="ad", cache_salt="s")
    assert salted.cached_tokens == 0 and lora.cached_tokens == 0
    stored = lora.events[0]
    assert isinstance(stored, BlockStored)
    assert (stored.lora_name, stored.lora_id, stored.cache_salt) == ("ad", 1, "s")
    plain_stored = plain.events[0]
    assert isinstance(plain_stored, BlockStored)
    assert set(stored.block_hashes).isdisjoint(plain_stored.block_hashes)
    assert lora.hash_digests.keys() == set(stored.block_hashes)
    assert cache.truth() == {
        (ns_lora, ns_salt, path)
        for ns_lora, ns_salt in ((None, None), (None, "s"), ("ad", "s"))
        for path in ((1, 2), (1, 2, 3, 4))
    }


def test_sglang_evicts_leaves_first_and_coalesces_removals() -> None:
    cache = _sglang(capacity=3)
    a1, a2 = _hashes(cache, [1, 2, 3, 4])
    (_, c2) = _hashes(cache, [1, 2, 5, 6])
    (x1,) = _hashes(cache, [7, 8])
    y = _hashes(cache, [9, 10, 11, 12, 13, 14])

    assert cache.admit([1, 2, 3, 4]).events == [
        BlockStored([a1, a2], None, [1, 2, 3, 4], 2, medium="GPU")
    ]
    second = cache.admit([1, 2, 5, 6])
    assert second.cached_tokens == 2
    assert second.events == [BlockStored([c2], a1, [5, 6], 2, medium="GPU")]
    third = cache.admit([7, 8])  # A2 is the least recently used leaf
    assert third.events[0] == BlockRemoved([a2], medium="GPU")
    everything = cache.admit([9, 10, 11, 12, 13, 14])
    # C2 (leaf, older) before its ancestor A1, then X1; all in one event
    assert everything.events == [
        BlockRemoved([c2, a1, x1], medium="GPU"),
        BlockStored(y, None, [9, 10, 11, 12, 13, 14], 2, medium="GPU"),
    ]


def test_sglang_matched_pages_are_not_stored_again() -> None:
    cache = _sglang(capacity=8)
    cache.admit([1, 2, 3, 4])
    again = cache.admit([1, 2, 3, 4])
    assert again.cached_tokens == 2  # the last token is recomputed
    assert again.events == []
    salted = cache.admit([1, 2, 3, 4], cache_salt="t", lora_name="ad")
    stored = salted.events[0]
    assert isinstance(stored, BlockStored) and stored.cache_salt == "t"
    assert stored.lora_name == "ad" and stored.lora_id is None and salted.hash_digests == {}


def test_sglang_locked_path_survives_and_only_fitting_pages_are_cached() -> None:
    cache = _sglang(capacity=3)
    a1, a2 = _hashes(cache, [1, 2, 3, 4])
    held = cache.admit([1, 2, 3, 4], hold=True)
    assert held.lease is not None
    spill = cache.admit([5, 6, 7, 8])  # one page fits beside the two locked ones
    assert spill.events == [BlockStored(_hashes(cache, [5, 6]), None, [5, 6], 2, medium="GPU")]
    squeezed = cache.admit([9, 10, 11, 12])  # only [5, 6] can go: one page stored
    assert squeezed.events[0] == BlockRemoved(_hashes(cache, [5, 6]), medium="GPU")
    assert squeezed.events[1].token_ids == [9, 10]  # type: ignore[union-attr]
    cache.release(held.lease)
    assert cache.admit([13, 14]).events[0] == BlockRemoved([a2], medium="GPU")
    last = cache.admit([15, 16, 17, 18])
    assert last.events[0] == BlockRemoved([a1] + _hashes(cache, [9, 10]), medium="GPU")
    assert cache.truth() == {(None, None, p) for p in ((13, 14), (15, 16), (15, 16, 17, 18))}


@pytest.mark.parametrize("make", [_vllm, _sglang])
def test_clear_and_reset(make) -> None:  # type: ignore[no-untyped-def]
    cache = make(capacity=4)
    held = cache.admit([1, 2, 3, 4], hold=True)
    assert cache.clear() == [AllBlocksCleared()]
    assert cache.truth() == set() and cache.used_blocks == 0
    cache.release(held.lease)
    cache.admit([1, 2])
    cache.reset()
    assert cache.truth() == set() and cache.used_blocks == 0
    assert cache.admit([1, 2, 3]).cached_tokens == 0


@pytest.mark.parametrize("make", [_vllm, _sglang])
def test_zero_capacity_and_bad_config(make) -> None:  # type: ignore[no-untyped-def]
    cache = make(capacity=0)
    assert cache.admit([1, 2, 3, 4]).events == []
    with pytest.raises(ValueError):
        make(capacity=-1)
    with pytest.raises(ValueError):
        make(capacity=1, block_size=0)
