"""BlockTree: the per-target maps, holder sets, node lifetimes and the match walk."""

from __future__ import annotations

from array import array

import pytest

from cortex._fast.blockkeys import block_keys, namespace_seed, opaque_key
from cortex._fast.ledger import ALL_MEDIA, GPU_ONLY, BlockTree
from cortex.ledger.kv_events import Medium

SEED = namespace_seed("model")
A = [1, 2, 3, 4, 5, 6, 7, 8]  # two blocks of 4
KA1, KA2 = block_keys(A, 4, SEED)
CPU = int(Medium.CPU)


def chain(tree: BlockTree, target: int, tokens: list[int], first_hash: int = 100, **kw) -> None:
    """Store ``tokens`` (whole blocks) as one event with hashes first_hash, first_hash + 1, ..."""
    n = len(tokens) // tree.block_size
    assert tree.store(target, None, list(range(first_hash, first_hash + n)), tokens, SEED, **kw) == n


def test_store_then_match_counts_leading_blocks_per_target():
    tree = BlockTree(4)
    chain(tree, 0, A + [9, 10, 11, 12])
    chain(tree, 1, A)
    keys = block_keys(A + [9, 10, 11, 12, 13, 14, 15, 16], 4, SEED)
    assert tree.match(keys) == {0: 3, 1: 2}
    assert tree.match(keys[:1]) == {0: 1, 1: 1}
    assert tree.match(keys[3:] + keys[:3]) == {}  # a walk stops at the first miss
    assert tree.match([]) == {}
    assert (tree.nodes, tree.entries, tree.targets()) == (3, 5, [0, 1])
    assert tree.target_keys(1) == {KA1, KA2}


def test_store_under_a_parent_hash_chains_from_the_parents_key():
    tree = BlockTree(4)
    assert tree.store(0, None, [11], A[:4], SEED) == 1
    assert tree.store(0, 11, [12], A[4:], SEED) == 1
    assert tree.match([KA1, KA2]) == {0: 2}


def test_unknown_parent_stores_nothing_and_is_counted():
    tree = BlockTree(4)
    tree.store(1, None, [11], A[:4], SEED)
    assert tree.store(0, 11, [12], A[4:], SEED) == -1  # 11 is target 1's, not target 0's
    assert (tree.unknown_parent, tree.entries, tree.target_entries(0)) == (1, 1, 0)


def test_unknown_removals_are_counted_and_ignored():
    tree = BlockTree(4)
    chain(tree, 0, A)
    assert tree.remove(0, [100, 555, 556]) == 2
    assert tree.remove(7, [100]) == 1
    assert tree.remove(0, [101], CPU) == 1  # held on the GPU only
    assert tree.unknown_removal == 4
    assert tree.target_keys(0) == {KA2}


def test_duplicate_store_needs_two_removals():
    tree = BlockTree(4)
    chain(tree, 0, A)
    chain(tree, 0, A)
    assert (tree.duplicate_store, tree.entries) == (2, 2)
    tree.remove(0, [100, 101])
    assert tree.match([KA1, KA2]) == {0: 2}
    tree.remove(0, [100, 101])
    assert (tree.match([KA1, KA2]), tree.entries, tree.nodes) == ({}, 0, 0)


def test_a_held_hash_stored_with_another_key_replaces_the_entry():
    tree = BlockTree(4)
    chain(tree, 0, A)
    tree.store(0, None, [101], [50, 51, 52, 53], SEED, CPU)  # hash 101 now names another block
    other = block_keys([50, 51, 52, 53], 4, SEED)[0]
    assert tree.hash_conflict == 1
    assert tree.target_keys(0) == {KA1, other}
    assert tree.target_keys(0, GPU_ONLY) == {KA1}
    assert tree.entries == 2
    assert tree.match([KA1, KA2]) == {0: 1}


def test_parent_evicted_before_its_child_keeps_the_path_but_breaks_the_match():
    tree = BlockTree(4)
    chain(tree, 0, A)
    tree.remove(0, [100])  # vLLM may evict the parent first
    assert tree.match([KA1, KA2]) == {}
    assert (tree.nodes, tree.target_keys(0)) == (2, {KA2})  # KA1 stays as an interior node
    tree.store(0, None, [100], A[:4], SEED)
    assert tree.match([KA1, KA2]) == {0: 2}
    tree.remove(0, [101, 100])
    assert tree.nodes == 0


def test_a_target_drops_out_at_its_first_miss_and_never_rejoins():
    tree = BlockTree(2)
    chain(tree, 0, [1, 2, 3, 4, 5, 6, 7, 8])
    tree.remove(0, [101])  # the second block
    keys = block_keys([1, 2, 3, 4, 5, 6, 7, 8], 2, SEED)
    assert tree.match(keys) == {0: 1}


def test_media_are_separate_entries_and_match_filters_them():
    tree = BlockTree(4)
    chain(tree, 0, A)
    chain(tree, 0, A, medium=CPU)  # the same hashes offloaded: new entries, not duplicates
    chain(tree, 1, A, medium=CPU)
    assert (tree.duplicate_store, tree.entries) == (0, 6)
    assert tree.match([KA1, KA2]) == {0: 2}
    assert tree.match([KA1, KA2], ALL_MEDIA) == {0: 2, 1: 2}
    assert tree.match([KA1, KA2], 1 << CPU) == {0: 2, 1: 2}
    tree.remove(0, [100, 101])  # GPU copies evicted
    assert tree.match([KA1, KA2]) == {}
    assert tree.match([KA1, KA2], ALL_MEDIA) == {0: 2, 1: 2}
    assert tree.holds(0, 100) and tree.holds(0, 100, CPU) and not tree.holds(0, 100, 0)


def test_clear_target_drops_only_that_target():
    tree = BlockTree(4)
    chain(tree, 0, A)
    chain(tree, 0, A, medium=CPU)
    chain(tree, 1, A)
    assert tree.clear_target(0) == 4
    assert tree.clear_target(0) == 0
    assert tree.clear_target(9) == 0
    assert (tree.entries, tree.targets(), tree.match([KA1, KA2])) == (2, [1], {1: 2})
    assert tree.clear_target(1) == 2
    assert (tree.nodes, tree.entries) == (0, 0)


def test_more_than_a_thousand_targets_share_a_prefix():
    tree = BlockTree(4)
    targets = list(range(0, 2 * 1500, 2)) + [65534]
    for target in targets:
        tree.store(target, None, [7, 8], A, SEED)
        tree.store(target, 8, [9], [target % 1000, 1, 2, 3], SEED)
    assert tree.match([KA1, KA2]) == {t: 2 for t in targets}
    private = block_keys([10, 1, 2, 3], 4, SEED, parent_key=KA2)[0]
    assert tree.match([KA1, KA2, private]) == {t: 2 for t in targets} | {10: 3, 1010: 3, 2010: 3}
    for target in targets[:-1]:
        tree.clear_target(target)
    assert tree.targets() == [65534]
    assert tree.match([KA1, KA2]) == {65534: 2}
    assert tree.nodes == 3


def test_match_takes_lists_tuples_and_uint64_buffers():
    tree = BlockTree(4)
    chain(tree, 3, A)
    for keys in ([KA1, KA2], (KA1, KA2), array("Q", [KA1, KA2]), array("L", [KA1, KA2])):
        assert tree.match(keys) == {3: 2}


def test_long_prompts_walk_every_level():
    tree = BlockTree(1)
    tokens = list(range(300))
    keys = block_keys(tokens, 1, SEED)
    for start in range(0, 300, 7):  # events of 7 blocks: the nodes of one chain are in runs
        parent = 1000 + start - 1 if start else None
        stop = min(300, start + 7)
        tree.store(0, parent, list(range(1000 + start, 1000 + stop)), tokens[start:stop], SEED)
    chain(tree, 1, list(range(150)), first_hash=5000)
    assert tree.match(keys) == {0: 300, 1: 150}
    tree.remove(0, [1000 + 200])
    assert tree.match(keys) == {0: 200, 1: 150}


def test_unreproducible_blocks_get_opaque_keys_that_never_match_tokens():
    tree = BlockTree(4)
    tree.store(0, None, [5, 6], [], SEED, reproducible=False)
    first = opaque_key(None, 5, SEED)
    assert tree.target_keys(0) == {first, opaque_key(first, 6, SEED)}
    assert tree.match([KA1, KA2]) == {}
    assert tree.match([first]) == {0: 1}


def test_many_hashes_of_one_target_naming_the_same_block():
    tree = BlockTree(4)
    for engine_hash in range(1, 301):  # more than a holder's 8-bit count can hold
        tree.store(0, None, [engine_hash], A[:4], SEED)
    assert (tree.nodes, tree.entries, tree.duplicate_store) == (1, 300, 0)
    tree.remove(0, list(range(1, 300)))
    assert tree.match([KA1]) == {0: 1}
    tree.remove(0, [300])
    assert (tree.match([KA1]), tree.nodes) == ({}, 0)


def test_refcounts_saturate_and_then_drop_early():
    tree = BlockTree(4)
    for _ in range(300):
        tree.store(0, None, [1], A[:4], SEED)
    assert tree.duplicate_store == 299
    assert tree.remove(0, [1] * 254) == 0
    assert tree.match([KA1]) == {0: 1}
    assert tree.remove(0, [1] * 3) == 2  # the 255th removal drops it: a miss, never a false hit
    assert tree.match([KA1]) == {}


@pytest.mark.parametrize(
    "call",
    [
        lambda t: t.store(-1, None, [1], A[:4], SEED),
        lambda t: t.store(65535, None, [1], A[:4], SEED),
        lambda t: t.store(0, None, [1], A[:4], SEED, 4),
        lambda t: t.store(0, None, [1, 2], A[:4], SEED),
        lambda t: t.store(0, None, [1], [1, 2, 3, -4], SEED),
        lambda t: t.store(0, None, [1], [1, 2, 3, 2**32], SEED),
        lambda t: t.store(0, None, [-1], A[:4], SEED),
        lambda t: t.store(0, 2**64, [1], A[:4], SEED),
        lambda t: t.remove(0, [2**64]),
        lambda t: t.match(["x"]),
    ],
)
def test_invalid_arguments_raise_and_change_nothing(call):
    tree = BlockTree(4)
    chain(tree, 0, A)
    before = (tree.nodes, tree.entries, tree.target_keys(0), tree.memory_bytes > 0)
    with pytest.raises((ValueError, OverflowError, TypeError)):
        call(tree)
    assert (tree.nodes, tree.entries, tree.target_keys(0), tree.memory_bytes > 0) == before
    assert tree.match([KA1, KA2]) == {0: 2}


def test_block_size_must_be_positive():
    with pytest.raises(ValueError):
        BlockTree(0)


def test_memory_is_accounted_and_returned():
    tree = BlockTree(4)
    empty = tree.memory_bytes
    for target in range(64):
        chain(tree, target, list(range(4 * 200)), first_hash=target * 1000)
    grown = tree.memory_bytes
    assert grown > empty + 200 * 40
    for target in range(64):
        tree.clear_target(target)
    assert (tree.nodes, tree.entries) == (0, 0)
    assert tree.memory_bytes < grown
