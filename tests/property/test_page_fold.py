"""SGLang's one-token pages folded into coarse blocks (``cortex.ledger.page_fold``, F1-F4).

Two promises: the compiled ``PageFold`` does what its reference twin does, operation by
operation (same results, same counters, aging included); and a ledger folding the events of a
page-size-1 SGLang radix cache (the simulator's, real SHA-256 chain hashes) credits each worker
with exactly the coarse blocks the engine holds whole — never more, and with an index too small
to remember everything, never more still.
"""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cortex._fast.page_fold import PageFold
from cortex.ledger.book import LedgerBook
from cortex.ledger.kv_events import EngineFamily, EventBatch
from cortex.ledger.page_fold import PageFoldReference
from cortex.ledger.state import TargetState
from cortex.profile.request_keys import request_block_keys
from cortex.sim.engine_hashes import make_chain_hasher
from cortex.sim.prefix_cache import SglangPrefixCache

MODEL = "m"

# ------------------------------------------------------------------ the twins agree

# A run: (parent choice, hashes from a small pool so that they collide, tokens).
runs = st.tuples(
    st.one_of(st.none(), st.integers(0, 40)),  # None: root; else a hash seen or not
    st.lists(st.integers(0, 40), min_size=0, max_size=12),
)
operations = st.lists(st.one_of(st.tuples(st.just("fold"), runs),
                                st.tuples(st.just("keep"), st.lists(st.integers(0, 40)))),
                      max_size=40)


@settings(max_examples=300, deadline=None)
@given(ops=operations, size=st.integers(2, 5), capacity=st.integers(1, 30))
def test_the_compiled_fold_does_what_the_reference_does(
    ops: list[tuple[str, object]], size: int, capacity: int
) -> None:
    fast, reference = PageFold(size, capacity), PageFoldReference(size, capacity)
    for kind, arg in ops:
        if kind == "fold":
            parent, hashes = arg  # type: ignore[misc]
            tokens = [(h * 7 + 3) % 100 for h in hashes]
            got = fast.fold(parent, array("Q", hashes), tokens)
            want = reference.fold(parent, hashes, tokens)
            assert got == want
        else:
            assert list(fast.keep(arg)) == list(reference.keep(arg))  # type: ignore[arg-type]
        assert (fast.entries, fast.forgotten, fast.conflicts) == (
            reference.entries, reference.forgotten, reference.conflicts)
    assert fast.memory_bytes >= 24 * fast.entries


def test_bad_input_is_refused_before_anything_changes() -> None:
    for fold in (PageFold(4, 100), PageFoldReference(4, 100)):
        with pytest.raises(ValueError):
            fold.fold(None, [1, 2], [1])
        assert fold.entries == 0
    with pytest.raises(OverflowError):
        PageFold(4, 100).fold(None, [1], [1 << 32])
    with pytest.raises(ValueError):
        PageFold(1, 100)


# ------------------------------------------------------------------ a ledger over a real radix

def _cached_prefix(truth: set[tuple[object, ...]], tokens: list[int]) -> int:
    """Leading tokens of ``tokens`` the page-size-1 engine holds (its truth)."""
    held = 0
    while held < len(tokens) and (None, None, tuple(tokens[: held + 1])) in truth:
        held += 1
    return held


prompts = st.lists(st.integers(0, 3), min_size=1, max_size=24)


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(st.one_of(st.tuples(st.integers(0, 1), prompts), st.just("clear")),
                   max_size=20),
    size=st.integers(2, 5),
    capacity=st.integers(4, 40),
    index=st.sampled_from([1 << 20, 7]),
    probes=st.lists(prompts, min_size=1, max_size=6),
)
def test_a_folded_ledger_holds_the_coarse_blocks_the_engine_holds_whole(
    steps: list[object], size: int, capacity: int, index: int, probes: list[list[int]]
) -> None:
    hasher = make_chain_hasher(EngineFamily.SGLANG, (0, 5, 23))
    engines = [SglangPrefixCache(hasher, block_size=1, capacity_blocks=capacity)
               for _ in range(2)]
    book = LedgerBook(fold_entries=index)
    book.fold_pages(MODEL, size)
    targets = [book.register(f"w{i}", 0, EngineFamily.SGLANG, MODEL) for i in range(2)]
    for target in targets:
        book.set_state(target, TargetState.READY)
    for step in steps:
        if step == "clear":
            for engine, target in zip(engines, targets, strict=True):
                book.apply(target, EventBatch(0.0, tuple(engine.clear()), None))
            continue
        which, tokens = step  # type: ignore[misc]
        result = engines[which].admit(tokens)
        outcome = book.apply(targets[which], EventBatch(0.0, tuple(result.events), None))
        assert outcome.invalid_events == 0
    for tokens in probes + [t for s in steps if s != "clear" for t in [s[1]]]:  # type: ignore[index]
        keys = request_block_keys(tokens, size, MODEL)
        found = book.match(EngineFamily.SGLANG, MODEL, size, keys)
        for engine, target in zip(engines, targets, strict=True):
            whole = _cached_prefix(engine.truth(), tokens) // size
            if index > 100:  # nothing forgotten: exact to the coarse block
                assert found.get(target, 0) == whole
            else:  # a forgetful index only misses
                assert found.get(target, 0) <= whole


def test_vllm_stores_of_one_token_blocks_are_never_folded():
    """vLLM evicts parents before children: its one-token blocks stay in a tree of size 1."""
    book = LedgerBook()
    book.fold_pages(MODEL, 4)
    vllm = book.register("v", 0, EngineFamily.VLLM, MODEL)
    sglang = book.register("s", 0, EngineFamily.SGLANG, MODEL)
    from cortex.ledger.kv_events import BlockStored

    for target in (vllm, sglang):
        book.apply(target, EventBatch(0.0, (BlockStored([11, 12, 13, 14], None, [1, 2, 3, 4], 1),),
                                      None))
    assert book.target_keys(vllm).keys() == {1} and len(book.target_keys(vllm)[1]) == 4
    assert book.target_keys(sglang).keys() == {4} and len(book.target_keys(sglang)[4]) == 1
