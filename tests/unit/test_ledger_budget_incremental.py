"""Incremental eviction (ledger.pyx R9): the budget stays a hard bound while the work of an
eviction is spread over many stores, least recently touched entries still go first, and a
finished eviction leaves no target holding a block without its prefix."""

from __future__ import annotations

import random

from cortex._fast.blockkeys import block_keys, namespace_seed
from cortex._fast.ledger import BlockTree
from cortex.ledger import LedgerBook
from cortex.ledger.kv_events import BlockStored, EngineFamily, EventBatch

BLOCK = 4
SEED = namespace_seed("m")
CHAIN = 16


def chain(n: int) -> tuple[list[int], list[int]]:
    rng = random.Random(n)
    tokens = [rng.randrange(1 << 20) for _ in range(CHAIN * BLOCK)]
    return [n * 1000 + i for i in range(CHAIN)], tokens


def store_chains(tree: BlockTree, count: int, budget: int) -> tuple[int, int]:
    """Chains of 16 blocks, each by one of two targets, each a later ``now``; checks the bound
    after every store. Returns (blocks stored, stores that left an eviction running)."""
    stored = running = 0
    for n in range(count):
        hashes, tokens = chain(n)
        for start in range(0, CHAIN, 4):
            parent = hashes[start - 1] if start else None
            got = tree.store(n % 2, parent, hashes[start:start + 4],
                             tokens[start * BLOCK:(start + 4) * BLOCK], SEED, now=n + 1)
            if got > 0:
                stored += got
            assert tree.entries <= budget
            running += tree.evicting
    return stored, running


def held_prefix(tree: BlockTree, n: int) -> tuple[int, int]:
    """(blocks of chain n its target holds, leading blocks match credits it with)."""
    hashes, tokens = chain(n)
    held = sum(tree.holds(n % 2, h) for h in hashes)
    return held, tree.match(block_keys(tokens, BLOCK, SEED)).get(n % 2, 0)


def test_an_eviction_spans_many_stores_and_the_budget_is_never_exceeded():
    tree = BlockTree(BLOCK)
    tree.set_budget(2000, 0.5, sync_work=0, step_work=64)
    stored, running = store_chains(tree, 400, 2000)
    assert running > 10  # work spread over stores, not done in the store that crossed
    assert tree.evicted_entries == stored - tree.entries
    assert tree.evictions >= 3
    assert tree.nodes <= 2000


def test_least_recently_touched_chains_go_first_and_none_keeps_a_hole():
    tree = BlockTree(BLOCK)
    tree.set_budget(2000, 0.5, sync_work=0, step_work=64)
    store_chains(tree, 400, 2000)
    while tree.evicting:  # let the running eviction end (its work spent by stores)
        tree.evict_step(750, 1 << 30)
    assert held_prefix(tree, 0) == (0, 0)  # the oldest are gone
    assert held_prefix(tree, 399) == (CHAIN, CHAIN)  # the newest are whole
    for n in range(400):
        held, matched = held_prefix(tree, n)
        assert held == matched  # whatever is held of a chain is a prefix of it
    survivors = [n for n in range(400) if held_prefix(tree, n)[0]]
    assert survivors == list(range(survivors[0], 400))  # exactly the most recent ones


def test_a_store_that_would_exceed_the_budget_finishes_the_eviction_at_once():
    tree = BlockTree(BLOCK)
    tree.set_budget(500, 0.5, sync_work=0, step_work=1)  # far too little work per store
    stored, _ = store_chains(tree, 200, 500)
    assert tree.evicted_entries == stored - tree.entries


def test_touched_nodes_are_spared_by_a_running_round():
    tree = BlockTree(BLOCK)
    tree.set_budget(10_000, 0.5)
    for n in range(40):
        hashes, tokens = chain(n)
        tree.store(0, None, hashes, tokens, SEED, now=n + 1)
    assert not tree.evict_step(320, 8)  # a round started: its ages are taken now
    hashes, tokens = chain(0)
    tree.store(0, hashes[-1], [99_999], [1] * BLOCK, SEED, now=100)  # touches chain 0's path
    while not tree.evict_step(320, 1 << 20):
        pass
    assert held_prefix(tree, 0) == (CHAIN, CHAIN)  # touched after the round began: kept
    assert held_prefix(tree, 1) == (0, 0)


def test_a_large_book_evicts_incrementally_within_its_budget():
    book = LedgerBook(max_entries=3000, low_water=0.5)
    book.sync_work, book.step_work = 0, 256
    a = book.register("a", 0, EngineFamily.VLLM, "m")
    b = book.register("b", 0, EngineFamily.SGLANG, "m")  # another tree
    stored = running = 0
    for n in range(500):
        hashes, tokens = chain(n)
        event = BlockStored(hashes, None, tokens, BLOCK)
        stored += book.apply(a if n % 2 else b, EventBatch(0.0, (event,), 0)).stored_blocks
        assert book.entries <= 3000
        running += bool(book._evicting)
    assert running > 10
    assert book.evicted_entries == stored - book.entries
    assert book.target_entries(a) > 0 and book.target_entries(b) > 0
