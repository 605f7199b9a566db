"""Decision-time pending work: a hold adds on entry and removes exactly that on exit, whatever
ends the block; a hold never entered adds nothing."""

from __future__ import annotations

import pytest

from cortex.scheduling import PendingWork, WorkerView


class Cancelled(BaseException):
    """Stands for trio.Cancelled: a BaseException that must pass through untouched."""


def counts(pending: PendingWork, worker: str = "w0") -> tuple[int, int]:
    return pending.in_flight(worker), pending.queued_prefill_tokens(worker)


def test_hold_adds_at_entry_and_removes_at_exit():
    pending = PendingWork()
    with pending.hold("w0", 300) as hold:
        assert counts(pending) == (1, 300)
        assert hold.worker == "w0"
        with pending.hold("w0", 50):
            assert counts(pending) == (2, 350)
            assert pending.total_in_flight() == 2
    assert counts(pending) == (0, 0)
    assert pending.total_in_flight() == 0


def test_exception_and_cancellation_release():
    pending = PendingWork()
    with pytest.raises(ValueError), pending.hold("w0", 10):
        raise ValueError("upstream failed")
    with pytest.raises(Cancelled), pending.hold("w0", 10):
        raise Cancelled
    assert counts(pending) == (0, 0)


def test_generator_closed_midway_releases():
    pending = PendingWork()

    def stream():
        with pending.hold("w0", 100):
            yield 1
            yield 2

    chunks = stream()
    next(chunks)
    assert counts(pending) == (1, 100)
    chunks.close()  # the client went away: GeneratorExit inside the with block
    assert counts(pending) == (0, 0)


def test_hold_never_entered_adds_nothing():
    pending = PendingWork()
    pending.hold("w0", 100)
    assert counts(pending) == (0, 0)


def test_prefill_done_drops_tokens_once_and_keeps_the_request_in_flight():
    pending = PendingWork()
    with pending.hold("w0", 200) as hold, pending.hold("w0", 70):
        hold.prefill_done()
        hold.prefill_done()
        assert counts(pending) == (2, 70)
    assert counts(pending) == (0, 0)
    hold.prefill_done()  # after exit: nothing
    assert counts(pending) == (0, 0)


def test_a_hold_cannot_be_entered_twice_or_leak_when_exited_twice():
    pending = PendingWork()
    hold = pending.hold("w0", 5)
    with hold, pytest.raises(RuntimeError):
        hold.__enter__()
    hold.__exit__(None, None, None)
    with pytest.raises(RuntimeError):
        hold.__enter__()
    assert counts(pending) == (0, 0)


def test_view_carries_the_pending_counts_and_keeps_other_fields():
    pending = PendingWork()
    base = WorkerView("w0", targets=(3,), engine_queue=2, in_flight=99)
    with pending.hold("w0", 40):
        seen = pending.view(base)
    assert (seen.in_flight, seen.queued_prefill_tokens, seen.engine_queue, seen.targets) == (
        1, 40, 2, (3,))
    assert pending.view(base).in_flight == 0


def test_negative_tokens_refused():
    with pytest.raises(ValueError):
        PendingWork().hold("w0", -1)


def test_workers_are_independent():
    pending = PendingWork()
    with pending.hold("w0", 1), pending.hold("w1", 2):
        assert counts(pending, "w1") == (1, 2)
    assert counts(pending, "w1") == (0, 0)


def test_tracked_views_follow_every_count_change_and_keep_the_base():
    pending = PendingWork()
    pending.track(WorkerView("w0", targets=(0,), engine_queue=1))
    pending.track(WorkerView("w1", targets=(1,), in_flight=50))  # base counts are ignored
    assert [(v.worker, v.in_flight) for v in pending.views()] == [("w0", 0), ("w1", 0)]
    before = pending.views()
    assert pending.views() is before  # nothing changed: the same tuple
    with pending.hold("w1", 30) as hold:
        w1 = pending.views()[1]
        assert (w1.in_flight, w1.queued_prefill_tokens, w1.targets) == (1, 30, (1,))
        hold.prefill_done()
        assert pending.views()[1].queued_prefill_tokens == 0
        pending.track(WorkerView("w1", targets=(1,), healthy=False))
        assert pending.views()[1] == WorkerView("w1", targets=(1,), healthy=False, in_flight=1)
    assert pending.views()[1].in_flight == 0
    assert pending.views()[0] == WorkerView("w0", targets=(0,), engine_queue=1)
    pending.untrack("w0")
    assert [v.worker for v in pending.views()] == ["w1"]


def test_holds_on_untracked_workers_count_without_views():
    pending = PendingWork()
    with pending.hold("w9", 5):
        assert pending.views() == ()
        pending.track(WorkerView("w9"))
        assert pending.views()[0].in_flight == 1
    assert pending.views()[0].in_flight == 0


def test_release_listeners_hear_when_work_leaves_a_worker():
    from cortex.scheduling import PendingWork

    pending = PendingWork()
    heard = []
    pending.on_release(heard.append)
    with pending.hold("w", 10) as hold:
        assert heard == []
        hold.prefill_done()
        assert heard == ["w"]
    assert heard == ["w", "w"]
