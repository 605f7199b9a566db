"""The ledger's entry budget: least-recently-touched eviction, deepest first, amortized, counted,
and never a false hit (``ledger.pyx`` rules R6/R7, ``LedgerBook`` budget rules)."""

from __future__ import annotations

import random

import pytest

from cortex._fast.blockkeys import block_keys, namespace_seed
from cortex._fast.ledger import ALL_MEDIA, BlockTree
from cortex.errors import ConfigError
from cortex.ledger import LedgerBook, LedgerSettings
from cortex.ledger.kv_events import BlockRemoved, BlockStored, EngineFamily, EventBatch

SEED = namespace_seed("m")
BLOCK = 2


def chain(tree: BlockTree, target: int, first_hash: int, tokens: list[int], now: int,
          parent: int | None = None) -> list[int]:
    """Store ``tokens`` as one event of consecutive hashes; their keys."""
    n = len(tokens) // BLOCK
    hashes = list(range(first_hash, first_hash + n))
    assert tree.store(target, parent, hashes, tokens, SEED, now=now) == n
    return block_keys(tokens, BLOCK, SEED)


def prompt(tag: int, blocks: int) -> list[int]:
    return [tag * 1000 + i for i in range(blocks * BLOCK)]


def test_the_least_recently_touched_chain_goes_first():
    tree = BlockTree(BLOCK, max_entries=12, low_water=0.75)
    old = chain(tree, 0, 100, prompt(1, 4), now=1)
    mid = chain(tree, 1, 200, prompt(2, 4), now=2)
    new = chain(tree, 0, 300, prompt(3, 4), now=3)
    assert tree.entries == 12 and tree.evicted_entries == 0
    newest = chain(tree, 2, 400, prompt(4, 1), now=4)  # 13 > 12: down to 9
    assert tree.entries == 9 and tree.evicted_entries == 4 and tree.evictions == 1
    assert tree.target_keys(0) == set(new)
    assert tree.target_keys(1) == set(mid)
    assert tree.target_keys(2) == set(newest)
    assert tree.match(old) == {}
    assert tree.nodes == 9  # the evicted nodes are freed


def test_same_age_goes_deepest_first_so_no_target_holds_a_child_without_its_parent():
    tree = BlockTree(BLOCK, max_entries=10, low_water=0.5)
    keys = chain(tree, 0, 100, prompt(1, 10), now=1)
    chain(tree, 1, 200, prompt(2, 1), now=2)  # 11 > 10: down to 5
    assert tree.entries == 5
    assert tree.target_keys(0) == set(keys[:4])
    assert tree.match(keys) == {0: 4}


def test_extending_a_chain_touches_its_whole_path():
    tree = BlockTree(BLOCK, max_entries=9, low_water=0.5)
    tokens = prompt(1, 6)
    first = chain(tree, 0, 100, tokens[: 3 * BLOCK], now=1)
    other = chain(tree, 1, 200, prompt(2, 3), now=2)
    # The conversation goes on later: its first blocks count as touched now.
    assert tree.store(0, 102, [103, 104, 105], tokens[3 * BLOCK:], SEED, now=3) == 3
    assert tree.entries == 9
    chain(tree, 2, 300, prompt(3, 1), now=4)  # 10 > 9: down to 4
    assert tree.target_keys(1) == set()
    assert tree.match(block_keys(tokens, BLOCK, SEED)) == {0: 3}  # its path first, tail gone
    assert set(first) <= tree.target_keys(0)
    assert tree.match(other) == {}


def test_a_shared_node_loses_every_holder_and_every_medium():
    tree = BlockTree(BLOCK, max_entries=6, low_water=0.5)
    tokens = prompt(1, 2)
    chain(tree, 0, 100, tokens, now=1)
    chain(tree, 1, 500, tokens, now=1)
    assert tree.store(1, None, [500, 501], tokens, SEED, medium=2, now=1) == 2
    assert tree.entries == 6
    chain(tree, 2, 900, prompt(2, 1), now=2)  # 7 > 6: down to 3
    assert tree.entries <= 3
    for target in (0, 1):
        assert tree.target_entries(target) == 0 or tree.target_keys(target, ALL_MEDIA)
    assert tree.target_keys(1, ALL_MEDIA) <= set(block_keys(tokens, BLOCK, SEED)[:1])


def test_events_naming_evicted_hashes_are_unknown_ones():
    tree = BlockTree(BLOCK, max_entries=4, low_water=0.5)
    keys = chain(tree, 0, 100, prompt(1, 2), now=1)
    chain(tree, 1, 200, prompt(2, 2), now=2)
    chain(tree, 1, 300, prompt(3, 1), now=3)  # 5 > 4: down to 2, target 0 goes
    assert tree.target_entries(0) == 0
    assert tree.remove(0, [100, 101]) == 2 and tree.unknown_removal == 2
    assert tree.store(0, 101, [102], prompt(1, 3)[2 * BLOCK:], SEED, now=4) == -1
    assert tree.unknown_parent == 1
    # Stored again from its root, the chain is back and matches.
    assert tree.store(0, None, [100, 101], prompt(1, 2), SEED, now=5) == 2
    assert tree.match(keys)[0] == 2


def test_eviction_is_amortized_and_memory_stays_bounded():
    budget = 2_000
    tree = BlockTree(16, max_entries=budget, low_water=0.9)
    rng = random.Random(7)
    peak_memory = 0
    stored = 0
    for event in range(20_000):  # 20x the budget in 8-block events on 4 targets
        tokens = [rng.randrange(1 << 20) for _ in range(8 * 16)]
        hashes = [rng.getrandbits(64) for _ in range(8)]
        stored += tree.store(event % 4, None, hashes, tokens, SEED, now=event)
        assert tree.entries <= budget
        if event == 1_000:
            settled = tree.memory_bytes
        if event > 1_000:
            peak_memory = max(peak_memory, tree.memory_bytes)
    assert stored == 160_000
    assert tree.evicted_entries == stored - tree.entries
    # Each eviction frees ~10% of the budget: ~(160,000 - 2,000) / 200 of them, not one per
    # store.
    assert 700 <= tree.evictions <= 800
    assert tree.nodes <= budget
    assert peak_memory <= 2 * settled


def test_budget_is_checked_and_can_be_changed():
    with pytest.raises(ValueError):
        BlockTree(BLOCK, max_entries=10, low_water=0.0)
    with pytest.raises(ValueError):
        BlockTree(BLOCK).set_budget(10, 1.5)
    tree = BlockTree(BLOCK)
    assert tree.max_entries == 0
    for i in range(5):
        chain(tree, 0, 100 * i, prompt(i, 2), now=i)
    assert tree.entries == 10 and tree.evict(10) == 0
    assert tree.evict(6) == 4 and tree.entries == 6 and tree.evicted_entries == 4
    tree.set_budget(6, 1.0)
    chain(tree, 1, 900, prompt(9, 1), now=9)
    assert tree.entries == 6


def test_evicting_everything_leaves_an_empty_tree():
    tree = BlockTree(BLOCK)
    for i in range(3):
        chain(tree, i, 100 * i, prompt(i, 3), now=i)
    assert tree.evict(0) == 9
    assert (tree.entries, tree.nodes, tree.targets()) == (0, 0, [])
    chain(tree, 0, 100, prompt(0, 3), now=7)
    assert tree.entries == 3


# ------------------------------------------------------------------ LedgerBook


def stored(hashes, tokens, parent=None, block_size=BLOCK) -> BlockStored:
    return BlockStored(block_hashes=list(hashes), parent_hash=parent, token_ids=list(tokens),
                       block_size=block_size)


def batch(*events) -> EventBatch:
    return EventBatch(ts=0.0, events=tuple(events), dp_rank=0)


def test_book_stamps_each_batch_with_its_own_clock():
    book = LedgerBook(max_entries=8, low_water=0.5)
    a = book.register("w0", 0, EngineFamily.VLLM, "m")
    b = book.register("w1", 0, EngineFamily.VLLM, "m")
    book.apply(a, batch(stored([1, 2, 3, 4], prompt(1, 4))))
    book.apply(b, batch(stored([5, 6, 7, 8], prompt(2, 4))))
    assert book.entries == 8 and book.evicted_entries == 0
    result = book.apply(b, batch(stored([9], prompt(3, 1))))  # 9 > 8: down to 4
    assert result.stored_blocks == 1
    assert book.entries <= 4 and book.evicted_entries == 9 - book.entries
    assert book.target_entries(a) == 0  # the oldest batch went first
    assert book.evictions == 1
    assert book.apply(a, batch(BlockRemoved(block_hashes=[1]))).unknown_removal == 1


def test_book_budget_spans_every_tree():
    book = LedgerBook(max_entries=20, low_water=0.5)
    a = book.register("w0", 0, EngineFamily.VLLM, "m")
    b = book.register("w1", 0, EngineFamily.SGLANG, "m")
    for i in range(30):
        who = a if i % 2 else b
        book.apply(who, batch(stored([10 * i + 1, 10 * i + 2], prompt(i, 2), block_size=BLOCK)))
        assert book.entries <= 20
    assert book.target_entries(a) > 0 and book.target_entries(b) > 0
    assert book.evicted_entries == 60 - book.entries
    assert book.tree(EngineFamily.VLLM, "m", BLOCK).evicted_entries > 0
    assert book.tree(EngineFamily.SGLANG, "m", BLOCK).evicted_entries > 0


def test_book_without_budget_never_evicts():
    book = LedgerBook()
    a = book.register("w0", 0, EngineFamily.VLLM, "m")
    for i in range(50):
        book.apply(a, batch(stored([i], prompt(i, 1))))
    assert book.entries == 50 and book.evicted_entries == 0
    with pytest.raises(ValueError):
        LedgerBook(max_entries=0)
    with pytest.raises(ValueError):
        LedgerBook(max_entries=5, low_water=2.0)


def test_settings_of_the_ledger_section():
    settings = LedgerSettings()
    assert settings.max_entries == 20_000_000 and settings.low_water == pytest.approx(0.95)
    assert LedgerSettings(max_entries=None).max_entries is None
    with pytest.raises(ConfigError) as caught:
        LedgerSettings(max_entries=0, evict_fraction=1.0)
    assert len(caught.value.problems) == 2
