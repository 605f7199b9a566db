"""The warm-start entry of the sync state machine: a peer's snapshot is kept only when the
engine's replay proves it continuous (cortex.events.sync, ``start_from_snapshot``)."""

from __future__ import annotations

import pytest

from cortex.events.sync import TargetSync
from cortex.ledger.state import TargetState
from tests.unit.test_sync import b, show

READY, PARTIAL, SYNCING = TargetState.READY, TargetState.PARTIAL, TargetState.SYNCING


def warm(seq: int = 5, life: int = 0) -> tuple[TargetSync, list[str]]:
    sync = TargetSync(has_replay=True)
    return sync, show(sync.start_from_snapshot(seq, b(seq, life=life).digest))


def test_start_from_snapshot_asks_for_the_snapshots_last_batch_again():
    sync, actions = warm(5)
    assert actions == ["syncing", "replay 5 max None"]
    assert sync.replay_pending is not None and sync.state is SYNCING
    assert sync.resume_point is None


def test_replay_continuing_the_snapshot_makes_it_ready_without_history():
    sync, _ = warm(5)
    out = show(sync.on_replay_result([b(5), b(6), b(7)], ended=True, refused=False))
    assert out == ["apply 6 r", "apply 7 r", "ready"]
    assert sync.next_seq == 8 and sync.counters.snapshot_continued == 1
    assert sync.resume_point == (7, b(7).digest)
    assert show(sync.on_live(b(8))) == ["apply 8"]


def test_an_up_to_date_snapshot_is_ready_at_once():
    sync, _ = warm(5)
    assert show(sync.on_replay_result([b(5)], ended=True, refused=False)) == ["ready"]
    assert sync.next_seq == 6
    assert sync.resume_point == (5, b(5).digest)


def test_live_batches_held_meanwhile_follow_the_replay():
    sync, _ = warm(5)
    assert show(sync.on_live(b(7))) == [] and sync.held == 1
    out = show(sync.on_replay_result([b(5), b(6), b(7)], ended=True, refused=False))
    assert out == ["apply 6 r", "apply 7 r", "ready"]  # the held 7: already replayed
    assert sync.counters.replay_overlap == 1 and sync.next_seq == 8


@pytest.mark.parametrize("items, ended, why", [
    ([b(6), b(7)], True, "no longer reaches back"),  # the buffer starts after the snapshot
    ([], True, "no longer reaches back"),  # the engine has fewer batches (restarted)
    ([b(5, life=1), b(6, life=1)], True, "engine restarted"),  # another batch at seq 5
    ([b(5), b(6)], False, "truncated"),  # no end marker
    ([b(5), b(7)], True, "truncated"),  # not contiguous
])
def test_a_snapshot_that_cannot_be_proved_continuous_is_discarded(items, ended, why):
    sync, _ = warm(5)
    sync.on_live(b(9))  # held
    out = show(sync.on_replay_result(items, ended=ended, refused=False))
    assert out == ["syncing", "drop", "replay 0 max None"]  # then the normal path
    assert why in sync.reason
    assert sync.counters.snapshot_discarded == 1 and sync.counters.snapshot_continued == 0
    assert sync.held == 1  # still held for after the history replay
    out = show(sync.on_replay_result([b(i) for i in range(10)], ended=True, refused=False))
    assert out == [*(f"apply {i} r" for i in range(10)), "ready"]


def test_a_refused_replay_discards_the_snapshot_and_goes_partial():
    sync, _ = warm(5)
    out = show(sync.on_replay_result([], ended=False, refused=True))
    assert out == ["partial", "drop"]
    assert sync.counters.snapshot_discarded == 1 and sync.counters.replay_refused == 1
    assert show(sync.on_live(b(40))) == ["apply 40"]  # no expectation, like a refused history


def test_an_undecodable_replayed_batch_after_the_snapshot_drops_to_partial():
    sync, _ = warm(5)
    out = show(sync.on_replay_result([b(5), b(6, bad=True), b(7)], ended=True, refused=False))
    assert out == ["drop", "apply 7 r", "partial"]


def test_a_snapshot_needs_a_replay_endpoint():
    with pytest.raises(RuntimeError):
        TargetSync(has_replay=False).start_from_snapshot(3, b(3).digest)


def test_resume_point_only_when_ready_and_following():
    sync = TargetSync(has_replay=True)
    sync.start()
    assert sync.resume_point is None  # history pending
    sync.on_replay_result([b(0), b(1)], ended=True, refused=False)
    assert sync.resume_point == (1, b(1).digest)
    sync.on_live(b(3))  # gap: STALE, replay pending
    assert sync.resume_point is None
    sync.on_replay_result([b(2), b(3)], ended=True, refused=False)
    assert sync.resume_point == (3, b(3).digest)
    empty = TargetSync(has_replay=True)
    empty.start()
    empty.on_replay_result([], ended=True, refused=False)  # READY, nothing published yet
    assert empty.state is READY and empty.resume_point is None
