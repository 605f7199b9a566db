"""The SGLang radix tree on its own: runs of pages, silent splits, locks, LRU leaf eviction."""

from __future__ import annotations

from cortex.ledger.kv_events import BlockRemoved, BlockStored
from cortex.sim.batching.sglang_radix import SglangRadixTree
from cortex.sim.engine_hashes import SglangChainHasher
from cortex.sim.sglang_events import SglangEventQueue

HASHER = SglangChainHasher()
NS = (None, None)


def _tree(page: int = 1) -> tuple[SglangRadixTree, SglangEventQueue]:
    events = SglangEventQueue()
    return SglangRadixTree(HASHER, page, events), events


def _hashes(tokens: tuple[int, ...], page: int = 1) -> list[int]:
    return [h.value for h in HASHER(tokens, page)]


def test_a_prompt_is_one_node_and_a_diverging_insert_splits_it_silently() -> None:
    tree, events = _tree()
    a = tuple(range(1000))
    node = tree.insert(NS, a)
    assert node.end == 1000 and len(list(tree.nodes())) == 1
    assert events.take() == [BlockStored(_hashes(a), None, list(a), 1, medium="GPU")]
    b = a[:600] + (7, 8)
    leaf = tree.insert(NS, b)
    assert leaf.end == 602 and len(list(tree.nodes())) == 3  # head, a's tail, b's tail
    assert events.take() == [BlockStored(_hashes(b)[600:], _hashes(a)[599], [7, 8], 1,
                                         medium="GPU")]
    assert tree.match(NS, a + (1,), 10_000).end == 1000
    assert tree.match(NS, b, 601).end == 601  # splits again, still silently
    assert events.take() == [] and tree.audit() == [] and tree.size_tokens == 1002


def test_matches_and_inserts_keep_to_whole_pages() -> None:
    tree, events = _tree(page=4)
    tree.insert(NS, tuple(range(10)))  # 8 tokens: two pages
    assert tree.size_tokens == 8
    assert tree.match(NS, tuple(range(10)), 9).end == 8
    assert tree.match(NS, (0, 1, 2, 3, 4, 5, 9, 9), 8).end == 4  # diverges inside page 2
    assert tree.match(NS, tuple(range(10)), 7).end == 4
    assert all(e.block_size == 4 for e in events.take() if isinstance(e, BlockStored))
    assert tree.audit() == []


def test_eviction_takes_unlocked_leaves_least_recently_touched_first() -> None:
    tree, events = _tree()
    shared = (1, 2, 3)
    x = tree.insert(NS, shared + (10, 11))
    y = tree.insert(NS, shared + (20,))
    z = tree.insert(NS, (30, 31))
    events.take()
    tree.match(NS, shared + (10, 11, 12), 5)  # touches x's path: y, then z are older
    tree.lock(y)
    assert tree.evictable_tokens == 2 + 2  # x's tail and z; y's path is locked
    assert tree.evict(1) == 2  # whole nodes: z (2 tokens)
    assert events.take() == [BlockRemoved(_hashes((30, 31)), medium="GPU")]
    assert tree.evict(100) == 2  # x's tail; y and the shared head are locked
    tree.unlock(y)
    assert tree.evict(100) == 4  # y's tail, then its parent, now a leaf
    removed = events.take()
    assert removed == [BlockRemoved(
        _hashes(shared + (10, 11))[3:] + _hashes(shared + (20,))[3:] + _hashes(shared),
        medium="GPU")]
    assert not z.alive and not x.alive and tree.size_tokens == 0 and tree.audit() == []


def test_namespaces_are_separate_trees() -> None:
    tree, _ = _tree()
    tree.insert(("ad", None), (1, 2, 3))
    assert tree.match(NS, (1, 2, 3, 4), 3).end == 0
    assert tree.match(("ad", None), (1, 2, 3, 4), 3).end == 3
    assert tree.truth() == {("ad", None, (1,)), ("ad", None, (1, 2)), ("ad", None, (1, 2, 3))}
    tree.reset()
    assert tree.truth() == set() and tree.size_tokens == tree.evictable_tokens == 0
