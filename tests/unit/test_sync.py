"""Every transition of the per-target sync state machine (cortex.events.sync)."""

from __future__ import annotations

import pytest

from cortex.events.sequencer import payload_digest
from cortex.events.sync import TargetSync
from cortex.events.sync_actions import (
    Action,
    ApplyBatch,
    DropEntries,
    RequestReplay,
    SequencedBatch,
    SetState,
    contiguous_run,
)
from cortex.ledger.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from cortex.ledger.state import TargetState

SYNCING, READY, STALE, PARTIAL = (
    TargetState.SYNCING,
    TargetState.READY,
    TargetState.STALE,
    TargetState.PARTIAL,
)


def b(seq: int, *, clear: bool = False, bad: bool = False, life: int = 0) -> SequencedBatch:
    """A batch of incarnation ``life``; ``clear``: holds AllBlocksCleared; ``bad``: undecodable."""
    digest = payload_digest(f"{life}:{seq}:{clear}:{bad}".encode())
    if bad:
        return SequencedBatch(seq, digest, None)
    events: tuple = (
        (BlockStored([seq], None, [seq], 1), AllBlocksCleared())
        if clear
        else (BlockRemoved([seq]),)
    )
    return SequencedBatch(seq, digest, EventBatch(ts=float(seq), events=events, dp_rank=0))


def show(actions: list[Action]) -> list[str]:
    out = []
    for a in actions:
        if isinstance(a, SetState):
            out.append(a.state.value)
        elif isinstance(a, DropEntries):
            out.append("drop")
        elif isinstance(a, ApplyBatch):
            out.append(f"apply {a.seq}{' r' if a.replayed else ''}")
        elif isinstance(a, RequestReplay):
            out.append(f"replay {a.start_seq} max {a.max_items}")
        else:  # pragma: no cover
            raise AssertionError(a)  # noqa: TRY004 (a test's failure)
    return out


def live(sync: TargetSync, *seqs: int) -> list[str]:
    out: list[str] = []
    for seq in seqs:
        out += show(sync.on_live(b(seq)))
    return out


def replay(sync: TargetSync, seqs, *, ended=True, refused=False, **kw) -> list[str]:
    return show(sync.on_replay_result([b(s, **kw) for s in seqs], ended=ended, refused=refused))


def ready_with_replay(upto: int) -> TargetSync:
    """A replay target that applied batches 0..upto and is READY."""
    sync = TargetSync(has_replay=True)
    sync.start()
    replay(sync, range(upto + 1))
    assert sync.state is READY and sync.next_seq == upto + 1
    return sync


def partial_with_replay(first: int, upto: int) -> TargetSync:
    sync = TargetSync(has_replay=True)
    sync.start()
    replay(sync, range(first, upto + 1))
    assert sync.state is PARTIAL and sync.next_seq == upto + 1
    return sync


# --- start ---------------------------------------------------------------------------


def test_start_with_replay_drops_entries_and_requests_history_from_zero():
    sync = TargetSync(has_replay=True)
    assert show(sync.start()) == ["syncing", "drop", "replay 0 max None"]
    assert sync.state is SYNCING
    assert sync.replay_pending == RequestReplay(0, None)


def test_start_without_replay_waits_for_the_first_batch():
    sync = TargetSync(has_replay=False)
    assert show(sync.start()) == ["syncing", "drop"]
    assert sync.replay_pending is None


def test_without_replay_first_batch_zero_is_ready():
    sync = TargetSync(has_replay=False)
    sync.start()
    assert live(sync, 0, 1) == ["ready", "apply 0", "apply 1"]
    assert sync.state is READY


def test_without_replay_first_batch_after_zero_is_partial_not_a_gap():
    sync = TargetSync(has_replay=False)
    sync.start()
    assert live(sync, 7, 8) == ["partial", "apply 7", "apply 8"]
    assert sync.state is PARTIAL
    assert sync.counters.gaps == 0


def test_start_again_resets_pending_replay_and_held_batches():
    sync = TargetSync(has_replay=True)
    sync.start()
    live(sync, 4)
    assert sync.held == 1
    assert show(sync.start()) == ["syncing", "drop", "replay 0 max None"]
    assert sync.held == 0
    assert replay(sync, [0]) == ["apply 0 r", "ready"]


# --- history replay ------------------------------------------------------------------


def test_live_batches_are_held_while_history_replay_is_pending():
    sync = TargetSync(has_replay=True)
    sync.start()
    assert live(sync, 5, 6) == []
    assert sync.held == 2 and sync.state is SYNCING


def test_complete_history_from_zero_is_ready_after_its_batches():
    sync = TargetSync(has_replay=True)
    sync.start()
    assert replay(sync, [0, 1, 2]) == ["apply 0 r", "apply 1 r", "apply 2 r", "ready"]
    assert sync.state is READY and sync.next_seq == 3
    assert sync.counters.replays == 1


def test_history_with_only_the_end_marker_is_ready_and_expects_zero():
    sync = TargetSync(has_replay=True)
    sync.start()
    assert replay(sync, []) == ["ready"]
    assert sync.next_seq == 0
    # a first live batch after 0 is then a real gap (published while we were connecting)
    assert live(sync, 2) == ["stale", "replay 0 max 3"]


def test_history_starting_after_zero_is_partial_with_its_batches_applied():
    sync = TargetSync(has_replay=True)
    sync.start()
    assert replay(sync, [3, 4, 5]) == ["apply 3 r", "apply 4 r", "apply 5 r", "partial"]
    assert sync.next_seq == 6
    assert sync.counters.replay_unrecoverable == 1


def test_history_refused_is_partial_and_the_next_live_batch_is_accepted():
    sync = TargetSync(has_replay=True)
    sync.start()
    live(sync, 9)
    assert show(sync.on_replay_result([], ended=False, refused=True)) == ["partial", "apply 9"]
    assert sync.counters.replay_refused == 1
    assert sync.counters.gaps == 0
    assert live(sync, 10) == ["apply 10"]


def test_history_without_end_marker_is_partial_but_keeps_its_run():
    sync = TargetSync(has_replay=True)
    sync.start()
    assert replay(sync, [0, 1, 2], ended=False) == ["apply 0 r", "apply 1 r", "apply 2 r", "partial"]
    assert sync.counters.replay_truncated == 1
    assert sync.next_seq == 3


def test_history_with_a_hole_applies_only_the_contiguous_run():
    sync = TargetSync(has_replay=True)
    sync.start()
    assert replay(sync, [0, 1, 3, 4]) == ["apply 0 r", "apply 1 r", "partial"]
    assert sync.counters.replay_truncated == 1
    assert sync.next_seq == 2


def test_history_of_only_malformed_replies_is_partial():
    sync = TargetSync(has_replay=True)
    sync.start()
    assert replay(sync, [], ended=False) == ["partial"]
    assert sync.next_seq is None
    assert sync.counters.replay_truncated == 1


def test_held_batches_covered_by_the_history_are_dropped_as_overlap():
    sync = TargetSync(has_replay=True)
    sync.start()
    live(sync, 2, 3, 4)
    assert replay(sync, [0, 1, 2, 3]) == [
        "apply 0 r", "apply 1 r", "apply 2 r", "apply 3 r", "ready", "apply 4",
    ]
    assert sync.counters.replay_overlap == 2
    assert sync.counters.duplicates == 0


def test_live_copies_of_replayed_batches_after_the_replay_are_overlap():
    sync = ready_with_replay(3)
    assert live(sync, 2, 3, 4) == ["apply 4"]
    assert sync.counters.replay_overlap == 2
    assert live(sync, 4) == []
    assert sync.counters.duplicates == 1


def test_a_gap_among_held_batches_is_repaired_like_any_gap():
    sync = TargetSync(has_replay=True)
    sync.start()
    live(sync, 4, 5)
    assert replay(sync, [0, 1]) == ["apply 0 r", "apply 1 r", "ready", "stale", "replay 2 max 3"]
    assert sync.held == 2
    assert replay(sync, [2, 3, 4]) == ["apply 2 r", "apply 3 r", "apply 4 r", "ready", "apply 5"]
    assert sync.counters.gaps == 1 and sync.counters.gaps_repaired == 1
    assert sync.counters.replay_overlap == 1


def test_history_after_zero_with_a_clear_is_ready():
    sync = TargetSync(has_replay=True)
    sync.start()
    out = show(
        sync.on_replay_result([b(3), b(4, clear=True), b(5)], ended=True, refused=False)
    )
    assert out == ["apply 3 r", "apply 4 r", "apply 5 r", "ready"]
    assert "AllBlocksCleared" in sync.reason


def test_history_with_an_undecodable_batch_is_partial_and_drops_at_that_point():
    sync = TargetSync(has_replay=True)
    sync.start()
    out = show(sync.on_replay_result([b(0), b(1, bad=True), b(2)], ended=True, refused=False))
    assert out == ["apply 0 r", "drop", "apply 2 r", "partial"]
    assert sync.next_seq == 3


# --- gaps ----------------------------------------------------------------------------


def test_gap_with_replay_goes_stale_holds_and_requests_the_missing_range():
    sync = ready_with_replay(1)
    assert live(sync, 5) == ["stale", "replay 2 max 4"]
    assert sync.state is STALE and sync.held == 1
    assert live(sync, 6) == []
    assert sync.held == 2
    assert sync.counters.gaps == 1


def test_gap_closed_by_replay_reaching_hi_returns_to_ready():
    sync = ready_with_replay(1)
    live(sync, 5, 6)
    out = replay(sync, [2, 3, 4, 5], ended=False)
    assert out == ["apply 2 r", "apply 3 r", "apply 4 r", "apply 5 r", "ready", "apply 6"]
    assert sync.counters.gaps_repaired == 1 and sync.counters.gaps_unrepaired == 0
    assert sync.counters.replay_overlap == 1
    assert sync.next_seq == 7


def test_gap_closed_by_replay_up_to_hi_minus_one_with_end_marker():
    sync = ready_with_replay(1)
    live(sync, 5)
    assert replay(sync, [2, 3, 4], ended=True) == [
        "apply 2 r", "apply 3 r", "apply 4 r", "ready", "apply 5",
    ]


def test_gap_replay_items_before_lo_are_ignored():
    sync = ready_with_replay(1)
    live(sync, 4)
    assert replay(sync, [1, 2, 3]) == ["apply 2 r", "apply 3 r", "ready", "apply 4"]


def test_gap_replay_up_to_hi_minus_one_without_end_marker_is_not_enough():
    sync = ready_with_replay(1)
    live(sync, 5)
    assert replay(sync, [2, 3, 4], ended=False) == ["partial", "drop", "apply 5"]
    assert sync.counters.replay_truncated == 1 and sync.counters.gaps_unrepaired == 1
    assert sync.next_seq == 6


def test_gap_replay_starting_after_lo_drops_entries_and_continues_from_held():
    sync = ready_with_replay(1)
    live(sync, 5, 6)
    assert replay(sync, [3, 4, 5, 6]) == ["partial", "drop", "apply 5", "apply 6"]
    assert sync.counters.replay_unrecoverable == 1
    assert sync.counters.gaps_unrepaired == 1


def test_gap_replay_with_only_the_end_marker_is_unrecoverable():
    sync = ready_with_replay(1)
    live(sync, 5)
    assert replay(sync, []) == ["partial", "drop", "apply 5"]
    assert sync.counters.replay_unrecoverable == 1


def test_gap_replay_with_a_hole_is_truncated():
    sync = ready_with_replay(1)
    live(sync, 5)
    assert replay(sync, [2, 4, 5]) == ["partial", "drop", "apply 5"]
    assert sync.counters.replay_truncated == 1


def test_gap_replay_refused_drops_entries():
    sync = ready_with_replay(1)
    live(sync, 5)
    assert show(sync.on_replay_result([], ended=False, refused=True)) == [
        "partial", "drop", "apply 5",
    ]
    assert sync.counters.replay_refused == 1 and sync.counters.gaps_unrepaired == 1


def test_gap_while_partial_repaired_returns_to_partial():
    sync = partial_with_replay(3, 4)
    assert live(sync, 7) == ["stale", "replay 5 max 3"]
    assert replay(sync, [5, 6, 7]) == ["apply 5 r", "apply 6 r", "apply 7 r", "partial"]
    assert sync.state is PARTIAL


def test_gap_while_partial_repaired_with_a_clear_in_between_is_ready():
    sync = partial_with_replay(3, 4)
    live(sync, 7)
    out = show(sync.on_replay_result([b(5), b(6, clear=True), b(7)], ended=True, refused=False))
    assert out == ["apply 5 r", "apply 6 r", "apply 7 r", "ready"]


def test_gap_repair_with_an_undecodable_replayed_batch_ends_partial():
    sync = ready_with_replay(1)
    live(sync, 4)
    out = show(sync.on_replay_result([b(2, bad=True), b(3)], ended=True, refused=False))
    assert out == ["drop", "apply 3 r", "partial", "apply 4"]


def test_gap_without_replay_drops_entries_and_continues_partial():
    sync = TargetSync(has_replay=False)
    sync.start()
    live(sync, 0, 1)
    assert live(sync, 4) == ["partial", "drop", "apply 4"]
    assert sync.counters.gaps == 1 and sync.counters.gaps_unrepaired == 1
    assert live(sync, 5) == ["apply 5"]
    assert live(sync, 7) == ["drop", "apply 7"]  # already PARTIAL: no state change


# --- restarts ------------------------------------------------------------------------


def test_restart_at_zero_drops_entries_and_stays_ready():
    sync = ready_with_replay(5)
    out = show(sync.on_live(b(0, life=1)))
    assert out == ["drop", "apply 0"]
    assert sync.state is READY and sync.counters.restarts == 1
    assert show(sync.on_live(b(1, life=1))) == ["apply 1"]


def test_restart_at_zero_makes_a_partial_target_ready():
    sync = partial_with_replay(3, 5)
    assert show(sync.on_live(b(0, life=1))) == ["drop", "ready", "apply 0"]


def test_restart_after_zero_with_replay_fetches_the_new_history():
    sync = ready_with_replay(5)
    assert show(sync.on_live(b(2, life=1))) == ["syncing", "drop", "replay 0 max None"]
    assert sync.held == 1
    out = show(sync.on_replay_result([b(0, life=1), b(1, life=1), b(2, life=1)],
                                     ended=True, refused=False))
    assert out == ["apply 0 r", "apply 1 r", "apply 2 r", "ready"]
    assert sync.counters.replay_overlap == 1
    assert sync.counters.restarts == 1


def test_restart_after_zero_without_replay_is_partial():
    sync = TargetSync(has_replay=False)
    sync.start()
    live(sync, 0, 1, 2, 3)
    assert show(sync.on_live(b(1, life=1))) == ["partial", "drop", "apply 1"]
    assert sync.counters.restarts == 1
    assert show(sync.on_live(b(2, life=1))) == ["apply 2"]


# --- duplicates, decode errors, clears -----------------------------------------------


def test_duplicate_is_dropped_and_counted():
    sync = TargetSync(has_replay=False)
    sync.start()
    live(sync, 0, 1)
    assert live(sync, 1, 0) == []
    assert sync.counters.duplicates == 2
    assert sync.state is READY


def test_undecodable_live_batch_drops_entries_and_goes_partial():
    sync = ready_with_replay(1)
    assert show(sync.on_live(b(2, bad=True))) == ["partial", "drop"]
    assert sync.next_seq == 3  # its number was consumed: no gap after it
    assert live(sync, 3) == ["apply 3"]


def test_undecodable_first_batch_without_replay():
    sync = TargetSync(has_replay=False)
    sync.start()
    assert show(sync.on_live(b(0, bad=True))) == ["ready", "partial", "drop"]


def test_clear_while_partial_makes_ready_after_it_is_applied():
    sync = partial_with_replay(3, 4)
    assert show(sync.on_live(b(5, clear=True))) == ["apply 5", "ready"]
    assert "AllBlocksCleared" in sync.reason


def test_clear_while_ready_changes_nothing():
    sync = ready_with_replay(1)
    assert show(sync.on_live(b(2, clear=True))) == ["apply 2"]


def test_replay_result_without_pending_replay_is_a_programming_error():
    sync = TargetSync(has_replay=False)
    sync.start()
    with pytest.raises(RuntimeError):
        sync.on_replay_result([], ended=True, refused=False)


def test_contiguous_run():
    items = [b(3), b(4), b(6)]
    assert [m.seq for m in contiguous_run(items, 3)] == [3, 4]
    assert contiguous_run(items, 2) == []
    assert contiguous_run([], 0) == []


def test_every_list_ends_at_its_replay_request():
    sync = TargetSync(has_replay=True)
    sync.start()
    live(sync, 3, 4, 9, 10)
    actions = sync.on_replay_result([b(0), b(1), b(2)], ended=True, refused=False)
    requests = [i for i, a in enumerate(actions) if isinstance(a, RequestReplay)]
    assert requests == [len(actions) - 1]
    assert sync.held == 2  # 9 and 10 wait for the repair of [5, 9)


# --- suspected restarts: the engine was unreachable (issue 22: no false hit after a restart) ---

def test_a_suspected_restart_is_not_routable_until_the_replay_proves_continuity():
    sync = ready_with_replay(4)
    assert show(sync.suspect("probe failed")) == ["stale"]
    assert "may have restarted" in sync.reason
    assert live(sync, 5, 6) == []  # held while unproven
    assert show(sync.verify()) == ["stale", "replay 4 max None"]
    # the same engine: batch 4 again with its digest, then what followed
    assert replay(sync, [4, 5, 6]) == ["apply 5 r", "apply 6 r", "ready"]
    assert sync.state is READY and sync.next_seq == 7 and sync.counters.restarts == 0
    assert sync.counters.replay_overlap == 2  # the held 5 and 6, already replayed


def test_a_restarted_engine_is_found_out_and_its_ledger_dropped():
    sync = ready_with_replay(4)
    sync.suspect("connect refused")
    assert show(sync.verify()) == ["stale", "replay 4 max None"]
    # the new process published two batches: the replay does not reach sequence 4
    assert replay(sync, [0, 1], life=1) == [
        "syncing", "drop", "replay 0 max None"]
    assert sync.counters.restarts == 1
    assert replay(sync, [0, 1], life=1) == ["apply 0 r", "apply 1 r", "ready"]
    # ... or it published more: another batch at sequence 4
    sync = ready_with_replay(4)
    sync.suspect("probe failed")
    sync.verify()
    assert replay(sync, [4, 5], life=1)[:2] == ["syncing", "drop"]
    assert "engine restarted" in sync.reason


def test_suspicion_without_replay_starts_over_and_partial_resumes_partial():
    sync = TargetSync(has_replay=False)
    sync.start()
    live(sync, 0, 1)
    assert show(sync.suspect("probe failed")) == ["stale"]
    assert live(sync, 2) == []
    assert show(sync.verify()) == ["syncing", "drop", "partial", "apply 2"]
    sync = partial_with_replay(3, 6)
    sync.suspect("probe failed")
    sync.verify()
    assert replay(sync, [6, 7]) == ["apply 7 r", "partial"]


def test_nothing_to_suspect_and_suspicions_during_a_replay_wait_for_it():
    sync = TargetSync(has_replay=True)
    sync.start()  # history replay pending
    assert sync.suspect("probe failed") == []
    assert replay(sync, [0, 1]) == ["apply 0 r", "apply 1 r", "ready", "stale"]
    assert show(sync.verify())[-1] == "replay 1 max None"
    empty = TargetSync(has_replay=True)
    empty.start()
    replay(empty, [])  # nothing ever published: nothing the ledger could claim
    assert empty.suspect("probe failed") == [] and empty.verify() == []
    assert empty.state is READY


def test_a_refused_proof_is_partial_and_too_much_held_starts_over(monkeypatch):
    sync = ready_with_replay(2)
    sync.suspect("probe failed")
    sync.verify()
    assert show(sync.on_replay_result([], ended=False, refused=True)) == ["partial", "drop"]
    monkeypatch.setattr("cortex.events.sync.SUSPECT_HOLD_MAX", 2)
    sync = ready_with_replay(2)
    sync.suspect("probe failed")
    assert live(sync, 3, 4) == []
    assert live(sync, 5) == ["syncing", "drop", "replay 0 max None"]


# --- a refused history replay (issue 22 §11: PARTIAL for good) --------------------------------

def test_a_refused_history_is_retried_and_a_stream_from_zero_is_whole():
    sync = TargetSync(has_replay=True)
    sync.start()
    assert show(sync.on_replay_result([], ended=False, refused=True)) == ["partial"]
    assert sync.history_refused
    assert live(sync, 0, 1) == ["ready", "apply 0", "apply 1"]  # the stream starts at 0
    assert not sync.history_refused and sync.retry_history() == []
    later = TargetSync(has_replay=True)
    later.start()
    later.on_replay_result([], ended=False, refused=True)
    assert live(later, 5) == ["apply 5"]  # joined late: still PARTIAL, still to fetch
    assert later.history_refused and later.state is PARTIAL
    assert show(later.retry_history()) == ["syncing", "drop", "replay 0 max None"]
    assert live(later, 6) == []  # held during the replay
    assert replay(later, range(7)) == [f"apply {i} r" for i in range(7)] + ["ready"]
    assert not later.history_refused and later.next_seq == 7
