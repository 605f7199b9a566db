"""Ledger images and snapshots: a target exported from one book and imported into another is
the same ledger (keys, paths, media, refcounts); anything inconsistent is refused whole."""

from __future__ import annotations

import random

import msgspec
import pytest

from cortex.ledger import ALL_MEDIA, GPU_ONLY, LedgerBook, TargetState
from cortex.ledger.kv_events import BlockRemoved, BlockStored, EngineFamily, EventBatch
from cortex.ledger.snapshot import (
    ExportedTarget,
    SnapshotError,
    StreamId,
    decode,
    encode,
    take_snapshot,
)

VLLM = EngineFamily.VLLM
MODEL = "m"


def batch(*events) -> EventBatch:
    return EventBatch(ts=0.0, events=tuple(events), dp_rank=0)


def random_book(rng: random.Random, targets: int = 3, steps: int = 300) -> LedgerBook:
    """Stores (chains under held parents, two block sizes, CPU medium sometimes, the same hash
    twice), removals (interior blocks too) across several targets."""
    book = LedgerBook()
    for t in range(targets):
        book.register(f"w{t}", 0, VLLM, MODEL)
    held: dict[int, list[int]] = {t: [] for t in range(targets)}
    for step in range(steps):
        t = rng.randrange(targets)
        if held[t] and rng.random() < 0.25:
            victim = rng.choice(held[t])
            book.apply(t, batch(BlockRemoved([victim])))
            continue
        parent = rng.choice(held[t]) if held[t] and rng.random() < 0.7 else None
        n = rng.randint(1, 3)
        hashes = [rng.randrange(1, 60) * 1000 + step * 10 + i for i in range(n)]
        if rng.random() < 0.1 and held[t]:
            hashes[0] = rng.choice(held[t])  # a held hash again (refcount, or a conflict)
        tokens = [rng.randrange(8) for _ in range(4 * n)]  # few tokens: shared prefixes
        medium = "CPU" if rng.random() < 0.2 else None
        if book.apply(t, batch(BlockStored(hashes, parent, tokens, 4, medium=medium))
                      ).unknown_parent == 0:
            held[t].extend(hashes)
        if rng.random() < 0.05:
            book.apply(t, batch(BlockStored([900_000 + step], None, [1] * 8, 8)))
    return book


def ledger_of(book: LedgerBook, target: int) -> dict:
    trees = {}
    for size in (4, 8):
        tree = book.tree(VLLM, MODEL, size)
        if tree is None:
            continue
        keys = tree.target_keys(target, ALL_MEDIA)
        trees[size] = (keys, tree.target_keys(target, GPU_ONLY), tree.target_entries(target))
    return trees


@pytest.mark.parametrize("seed", range(8))
def test_a_target_imported_into_another_book_is_the_same_ledger(seed):
    rng = random.Random(seed)
    source = random_book(rng)
    dest = random_book(random.Random(seed + 100), targets=2)  # other targets share the trees
    before = {t: ledger_of(dest, t) for t in (0, 1)}
    target = dest.register("newcomer", 0, VLLM, MODEL)
    added = dest.import_target(target, source.export_target(1))
    assert added == source.target_entries(1) == dest.target_entries(target)
    assert ledger_of(dest, target) == ledger_of(source, 1)
    assert {t: ledger_of(dest, t) for t in (0, 1)} == before  # R4: nobody else touched
    assert dest.export_target(target).keys() == source.export_target(1).keys()
    # Removals through the imported entries work (refcounts and media came along).
    for image in source.export_target(1).values():
        hashes = memoryview(image[2]).cast("Q").tolist()
        for h in hashes:
            dest.apply(target, batch(BlockRemoved([h]), BlockRemoved([h]), BlockRemoved([h])))
            dest.apply(target, batch(BlockRemoved([h], medium="CPU")))
    assert dest.target_entries(target) == 0
    assert {t: ledger_of(dest, t) for t in (0, 1)} == before
    # Every node the import created is gone again (R3): the trees hold what they held.
    assert dest.nodes == random_book(random.Random(seed + 100), targets=2).nodes


def test_match_sees_an_imported_target_like_the_original():
    rng = random.Random(7)
    source = random_book(rng)
    dest = LedgerBook()
    target = dest.register("x", 3, VLLM, MODEL)
    dest.import_target(target, source.export_target(0))
    tree_a, tree_b = source.tree(VLLM, MODEL, 4), dest.tree(VLLM, MODEL, 4)
    keys, parents = source.export_target(0)[4][:2]
    keys, parents = memoryview(keys).cast("Q").tolist(), memoryview(parents).cast("I").tolist()
    for i in range(len(keys)):  # the root-to-node path of every node listed
        path = []
        j = i + 1
        while j:
            path.append(keys[j - 1])
            j = parents[j - 1]
        path.reverse()
        assert tree_a.match(path, ALL_MEDIA).get(0) == tree_b.match(path, ALL_MEDIA).get(target)


def corrupt(image: tuple, which: int, data: bytes) -> tuple:
    return tuple(data if i == which else part for i, part in enumerate(image))


def test_an_inconsistent_image_is_refused_and_leaves_the_book_as_it_was():
    source = random_book(random.Random(3))
    image = source.export_target(2)[4]
    n_nodes = len(image[0]) // 8
    bad_parent = memoryview(bytearray(image[1])).cast("I")
    bad_parent[0] = 5  # the first node listed under a later one
    bad_node = memoryview(bytearray(image[3])).cast("I")
    bad_node[0] = n_nodes  # an entry naming no node
    dup = memoryview(bytearray(image[2])).cast("Q")
    dup[1] = dup[0]  # one engine hash twice
    for broken in (corrupt(image, 1, bytes(bad_parent)), corrupt(image, 3, bytes(bad_node)),
                   corrupt(image, 2, bytes(dup)), corrupt(image, 4, b"\0" * len(image[4])),
                   corrupt(image, 1, image[1][:-4])):
        dest = random_book(random.Random(4), targets=2)
        nodes, entries = dest.nodes, dest.entries
        target = dest.register("x", 0, VLLM, MODEL)
        with pytest.raises(ValueError):
            dest.import_target(target, {4: broken})
        assert (dest.nodes, dest.entries, dest.target_entries(target)) == (nodes, entries, 0)


def test_an_image_disagreeing_with_the_tree_is_refused():
    source = random_book(random.Random(5))
    dest = LedgerBook()
    a = dest.register("a", 0, VLLM, MODEL)
    dest.import_target(a, source.export_target(0))
    image = source.export_target(0)[4]
    parents = memoryview(bytearray(image[1])).cast("I")
    # Re-parent a node that is not a root onto the root level: its key exists under another.
    moved = next(i for i in range(len(parents)) if parents[i])
    parents[moved] = 0
    b = dest.register("b", 0, VLLM, MODEL)
    with pytest.raises(ValueError, match="another parent"):
        dest.import_target(b, {4: corrupt(image, 1, bytes(parents))})
    assert dest.target_entries(b) == 0
    with pytest.raises(ValueError, match="already holds"):
        dest.import_target(a, source.export_target(0))


def test_import_respects_the_entry_budget():
    source = random_book(random.Random(6))
    dest = LedgerBook(max_entries=10, low_water=0.5)
    target = dest.register("a", 0, VLLM, MODEL)
    assert source.target_entries(0) > 10
    dest.import_target(target, source.export_target(0))
    assert dest.entries <= 10 and dest.evicted_entries > 0


def stream(rank: int) -> StreamId:
    return StreamId("http://10.0.0.1:8000", rank, "vllm", MODEL, f"tcp://10.0.0.1:{5557 + rank}")


def test_snapshot_round_trip_and_skipped_targets():
    source = random_book(random.Random(8))
    snapshot = take_snapshot([
        ExportedTarget(stream(0), "w0", "ready", (41, b"d" * 16), source.export_target(0)),
        ExportedTarget(stream(1), "w1", "partial", None, None),
        ExportedTarget(stream(2), "w2", "ready", None, None),
    ])
    back = decode(encode(snapshot))
    assert back == snapshot
    assert [s.reason for s in back.skipped] == ["not ready",
                                                "no batch applied yet, or a replay pending"]
    image = back.by_stream()[stream(0)]
    assert (image.last_seq, image.last_digest) == (41, b"d" * 16)
    assert image.entries == sum(len(i[2]) // 8 for i in source.export_target(0).values())
    dest = LedgerBook()
    target = dest.register("elsewhere", 0, VLLM, MODEL)
    dest.import_target(target, image.images())
    assert ledger_of(dest, target) == ledger_of(source, 0)
    dest.set_state(target, TargetState.READY)


@pytest.mark.parametrize("data", [
    b"", b"\xc1", msgspec.msgpack.encode({"format": 2, "key_scheme": "xxh3-64-chained-v1"}),
    msgspec.msgpack.encode({"format": 1, "key_scheme": "other"}),
    msgspec.msgpack.encode({"format": 1, "key_scheme": "xxh3-64-chained-v1",
                            "targets": [{"stream": "x"}]}),
])
def test_malformed_snapshots_are_one_error(data):
    with pytest.raises(SnapshotError):
        decode(data)


def test_arrays_of_inconsistent_lengths_are_refused_at_decode():
    source = random_book(random.Random(9))
    keys, parents, hashes, nodes, refs = source.export_target(0)[4]
    snapshot = take_snapshot([ExportedTarget(stream(0), "w0", "ready", (1, b"d"),
                                             {4: (keys, parents, hashes, nodes[:-4], refs)})])
    with pytest.raises(SnapshotError, match="inconsistent"):
        decode(encode(snapshot))
