"""LedgerBook: registry, states, event application and the trees behind them."""

from __future__ import annotations

import json

import pytest

from cortex._fast.blockkeys import block_keys, namespace_seed
from cortex.errors import CortexError
from cortex.events.decoder import decode_payload
from cortex.ledger import ALL_MEDIA, ApplyResult, LedgerBook, TargetInfo, TargetState
from cortex.ledger.kv_events import (
    U64_MASK,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineFamily,
    EventBatch,
)

VLLM, SGLANG = EngineFamily.VLLM, EngineFamily.SGLANG
MODEL = "m"
A = [1, 2, 3, 4, 5, 6, 7, 8]
KA1, KA2 = block_keys(A, 4, namespace_seed(MODEL))


def batch(*events) -> EventBatch:
    return EventBatch(ts=0.0, events=tuple(events), dp_rank=0)


def stored(hashes, tokens, parent=None, **kw) -> BlockStored:
    return BlockStored(block_hashes=list(hashes), parent_hash=parent, token_ids=list(tokens),
                       block_size=kw.pop("block_size", 4), **kw)


def removed(*hashes, **kw) -> BlockRemoved:
    return BlockRemoved(block_hashes=list(hashes), **kw)


def fixture_story(labels: dict[str, int], family: EngineFamily) -> list[EventBatch]:
    """The fixtures' seven batches (README of shared/fixtures/kv-events), as typed events."""
    h = {label: value & U64_MASK for label, value in labels.items()}
    seq4 = (
        [removed(h["C2"]), removed(h["A2"])] if family is VLLM else [removed(h["C2"], h["A2"])]
    )
    return [
        batch(stored([h["A1"], h["A2"]], A)),
        batch(stored([h["B3"]], [9, 10, 11, 12], h["A2"])),
        batch(stored([h["C2"]], [100, 101, 102, 103], h["A1"])),
        batch(removed(h["B3"])),
        batch(*seq4),
        batch(stored([h["A2"]], A[4:], h["A1"])),
        batch(AllBlocksCleared()),
    ]


@pytest.mark.parametrize(
    ("folder", "family"),
    [("vllm-0.33.0", VLLM), ("vllm-0.23.0", VLLM), ("sglang-0.5.23", SGLANG),
     ("sglang-0.5.19", SGLANG)],
)
def test_fixture_story(kv_fixtures_dir, folder, family):
    frames = json.loads((kv_fixtures_dir / folder / "frames.json").read_text())
    book = LedgerBook()
    target = book.register("w0", 0, family, MODEL)
    results = [book.apply(target, b) for b in fixture_story(frames["block_labels"], family)]
    assert [r.stored_blocks for r in results] == [2, 1, 1, 0, 0, 1, 0]
    assert [r.removed_blocks for r in results] == [0, 0, 0, 1, 2, 0, 0]
    assert sum(r.unknown_parent + r.unknown_removal + r.invalid_events for r in results) == 0
    assert results[-1].cleared == 1
    assert book.target_entries(target) == 0


@pytest.mark.parametrize(
    ("folder", "family"),
    [("vllm-0.33.0", VLLM), ("vllm-0.23.0", VLLM), ("sglang-0.5.23", SGLANG),
     ("sglang-0.5.19", SGLANG)],
)
def test_decoded_fixture_payloads_after_seq_5_hold_a1_a2_only(kv_fixtures_dir, folder, family):
    book = LedgerBook()
    target = book.register("w0", 0, family, MODEL)
    payloads = sorted((kv_fixtures_dir / folder / "payloads").glob("*.msgpack"))
    assert len(payloads) == 7
    for payload in payloads[:6]:
        book.apply(target, decode_payload(payload.read_bytes(), family))
    assert book.target_keys(target) == {4: {KA1, KA2}}
    assert book.match(family, MODEL, 4, block_keys(A + [9, 10, 11, 12], 4,
                                                   namespace_seed(MODEL))) == {target: 2}
    assert book.nodes == 2
    book.apply(target, decode_payload(payloads[6].read_bytes(), family))
    assert book.target_keys(target) == {}
    assert (book.nodes, book.entries) == (0, 0)


def test_apply_reports_unknown_parents_removals_duplicates_and_conflicts():
    book = LedgerBook()
    t = book.register("w", 0, VLLM, MODEL)
    result = book.apply(t, batch(
        stored([1, 2], A),
        stored([3], [9, 9, 9, 9], parent=77),  # parent never stored
        stored([1], A[:4]),  # duplicate
        stored([2], [0, 0, 0, 0], parent=1),  # hash 2 re-stored with another key
        removed(55, 1),
        removed(1),
    ))
    assert result == ApplyResult(stored_blocks=4, removed_blocks=2, unknown_parent=1,
                                 unknown_removal=1, duplicate_store=1, hash_conflict=1)
    other = block_keys([0, 0, 0, 0], 4, namespace_seed(MODEL), parent_key=KA1)[0]
    assert book.target_keys(t) == {4: {other}}


def test_all_blocks_cleared_and_drop_target_entries_empty_only_that_target():
    book = LedgerBook()
    t0 = book.register("w", 0, VLLM, MODEL)
    t1 = book.register("w", 1, VLLM, MODEL)
    for t in (t0, t1):
        book.apply(t, batch(stored([1, 2], A), stored([3], [1, 2], block_size=2)))
    assert book.target_entries(t0) == 3
    assert book.apply(t0, batch(AllBlocksCleared())).cleared == 1
    assert (book.target_entries(t0), book.target_entries(t1)) == (0, 3)
    assert book.drop_target_entries(t1) == 3
    assert book.entries == 0


def test_non_main_attention_groups_are_skipped():
    book = LedgerBook()
    t = book.register("w", 0, VLLM, MODEL)
    result = book.apply(t, batch(
        stored([1], A[:4], group_idx=1),
        stored([2], A[:4], kv_cache_spec_kind="sliding_window", group_idx=0),
        stored([3], A[:4], kv_cache_spec_kind="mla_attention", group_idx=2),
    ))
    assert (result.skipped_non_main, result.stored_blocks) == (2, 1)
    assert book.target_keys(t) == {4: {KA1}}


def test_vllm_and_sglang_never_share_a_tree():
    book = LedgerBook()
    v = book.register("v", 0, VLLM, MODEL)
    s = book.register("s", 0, SGLANG, MODEL)
    book.apply(v, batch(stored([1, 2], A)))
    book.apply(s, batch(stored([1], A[:4])))
    assert book.match(VLLM, MODEL, 4, [KA1, KA2]) == {v: 2}
    assert book.match(SGLANG, MODEL, 4, [KA1, KA2]) == {s: 1}
    assert book.tree(VLLM, MODEL, 4) is not book.tree(SGLANG, MODEL, 4)
    assert book.match(VLLM, "other-model", 4, [KA1]) == {}


def test_lora_and_salt_namespaces_give_different_keys():
    book = LedgerBook()
    t = book.register("w", 0, VLLM, MODEL)
    book.apply(t, batch(
        stored([1], A[:4], lora_name="lora"),
        stored([2], A[:4], cache_salt="tenant"),
        stored([3], A[:4], lora_name="lora", cache_salt="tenant"),
    ))
    keys = {block_keys(A[:4], 4, namespace_seed(MODEL, lora, salt))[0]
            for lora, salt in (("lora", None), (None, "tenant"), ("lora", "tenant"))}
    assert book.target_keys(t) == {4: keys}
    assert book.match(VLLM, MODEL, 4, [KA1]) == {}
    salted = block_keys(A[:4], 4, namespace_seed(MODEL, None, "tenant"))
    assert book.match(VLLM, MODEL, 4, salted) == {t: 1}


def test_a_store_with_a_parent_continues_the_parents_namespace():
    # vLLM names a request's salt only in its first block's extra keys: the decoded store of a
    # later block has a parent but no salt. It still lands in the salted namespace.
    book = LedgerBook()
    t = book.register("w", 0, VLLM, MODEL)
    book.apply(t, batch(stored([1], A[:4], cache_salt="tenant", lora_name="lora")))
    book.apply(t, batch(stored([2], A[4:], parent=1, lora_name="lora")))
    salted = block_keys(A, 4, namespace_seed(MODEL, "lora", "tenant"))
    assert book.match(VLLM, MODEL, 4, salted) == {t: 2}
    assert book.target_keys(t) == {4: set(salted)}


def test_media_from_the_wire():
    book = LedgerBook()
    t = book.register("w", 0, SGLANG, MODEL)
    book.apply(t, batch(stored([1, 2], A, medium="CPU_PINNED"), stored([1, 2], A, medium="GPU")))
    assert book.match(SGLANG, MODEL, 4, [KA1, KA2]) == {t: 2}
    assert book.apply(t, batch(removed(1, 2, medium=None))).removed_blocks == 2  # None = GPU
    assert book.match(SGLANG, MODEL, 4, [KA1, KA2]) == {}
    assert book.match(SGLANG, MODEL, 4, [KA1, KA2], ALL_MEDIA) == {t: 2}
    assert book.apply(t, batch(removed(1, medium="DISK"))).unknown_removal == 1


def test_removals_find_their_tree_when_a_target_has_several_block_sizes():
    book = LedgerBook()
    t = book.register("w", 0, VLLM, MODEL)
    book.apply(t, batch(stored([1, 2], A), stored([3, 4], A[:4], block_size=2)))
    result = book.apply(t, batch(removed(2, 3, 99)))
    assert (result.removed_blocks, result.unknown_removal) == (2, 1)
    assert book.target_keys(t) == {4: {KA1}, 2: {block_keys(A[:4], 2, namespace_seed(MODEL))[1]}}


def test_unusable_events_are_counted_not_raised():
    book = LedgerBook()
    t = book.register("w", 0, VLLM, MODEL)
    result = book.apply(t, batch(
        stored([1], A[:3]),  # too few tokens
        stored([1], [1, 2, 3, 2**32]),  # token id out of range
        stored([1], [], block_size=0),
        stored([1], [], block_size=10**9),
        removed(2**64),
        stored([5], A[:4]),  # still applied
        stored([5], A[:4]),  # a duplicate
        stored([5], A[:4], lora_name=7),  # not a name
        stored([6], A[:4], parent=2**64),
    ))
    assert (result.invalid_events, result.stored_blocks) == (7, 2)
    assert (result.duplicate_store, result.hash_conflict) == (1, 0)
    assert book.target_entries(t) == 1


def test_registry_ids_are_idempotent_reused_and_plentiful():
    book = LedgerBook()
    ids = [book.register(f"w{i}", i % 8, VLLM, MODEL) for i in range(1100)]
    assert ids == list(range(1100))
    assert book.register("w5", 5, VLLM, MODEL) == 5
    assert book.find("w5", 5) == 5 and book.find("w5", 6) is None
    assert book.info(5) == TargetInfo("w5", 5, VLLM, MODEL)
    with pytest.raises(ValueError):
        book.register("w5", 5, SGLANG, MODEL)
    book.apply(7, batch(stored([1, 2], A)))
    book.unregister(7)
    book.unregister(3)
    assert book.find("w7", 7) is None and book.entries == 0
    assert [book.register("x", 0, SGLANG, MODEL), book.register("y", 0, VLLM, MODEL)] == [3, 7]
    assert book.state(7) is TargetState.SYNCING and book.target_keys(7) == {}


def test_target_ids_run_out_at_65535():
    book = LedgerBook()
    book._next_id = 65535  # as if 65535 targets were registered
    with pytest.raises(CortexError):
        book.register("w", 0, VLLM, MODEL)


def test_states_are_stored_not_decided():
    book = LedgerBook()
    t = book.register("w", 0, VLLM, MODEL)
    assert book.state(t) is TargetState.SYNCING
    book.set_state(t, TargetState.STALE, "gap 4..6")
    assert (book.state(t), book.reason(t)) == (TargetState.STALE, "gap 4..6")
    book.set_state(t, TargetState.READY)
    assert book.states() == {t: TargetState.READY} and book.reason(t) == ""
    with pytest.raises(KeyError):
        book.set_state(t + 1, TargetState.READY)


def test_stats_sum_over_every_tree():
    book = LedgerBook()
    v = book.register("v", 0, VLLM, MODEL)
    s = book.register("s", 0, SGLANG, MODEL)
    book.apply(v, batch(stored([1, 2], A)))
    book.apply(s, batch(stored([1, 2], A[:4], block_size=2), stored([3], A[:4])))
    assert (book.nodes, book.entries) == (2 + 2 + 1, 2 + 3)
    assert book.memory_bytes > 0


def test_state_listeners_hear_changes_only():
    book = LedgerBook()
    target = book.register("w", 0, EngineFamily.VLLM, "m")
    heard = []
    book.on_state_change(lambda t, s: heard.append((t, s)))
    book.set_state(target, TargetState.READY, "synced")
    book.set_state(target, TargetState.READY, "again")
    book.set_state(target, TargetState.STALE, "gap")
    assert heard == [(target, TargetState.READY), (target, TargetState.STALE)]
