"""Every rule of cortex.events.sequencer."""

from __future__ import annotations

import sys

import pytest

from cortex.events.sequencer import (
    ACCEPT,
    DUPLICATE,
    RESTART,
    Sequencer,
    Verdict,
    VerdictKind,
    payload_digest,
)


def d(seq: int, incarnation: int = 0) -> bytes:
    return payload_digest(f"batch {seq} of incarnation {incarnation}".encode())


def test_fresh_sequencer_accepts_any_first_seq_slow_joiner():
    for first in (0, 1, 17, 2**63):
        s = Sequencer()
        assert s.next_seq is None
        assert s.observe(first, d(first)) == ACCEPT
        assert s.next_seq == first + 1


def test_in_order_batches_are_accepted():
    s = Sequencer()
    for seq in range(5):
        assert s.observe(seq, d(seq)) == ACCEPT
    assert s.next_seq == 5


def test_seq_above_next_is_a_gap_and_changes_nothing():
    s = Sequencer()
    s.observe(0, d(0))
    s.observe(1, d(1))
    v = s.observe(5, d(5))
    assert v == Verdict.gap(2, 5)
    assert (v.kind, v.lo, v.hi) == (VerdictKind.GAP, 2, 5)
    assert s.next_seq == 2
    # the same gap is reported again until the caller resolves it
    assert s.observe(5, d(5)) == Verdict.gap(2, 5)
    assert s.observe(2, d(2)) == ACCEPT


def test_repeat_with_same_digest_is_a_duplicate_and_changes_nothing():
    s = Sequencer()
    for seq in range(4):
        s.observe(seq, d(seq))
    assert s.observe(1, d(1)) == DUPLICATE
    assert s.observe(3, d(3)) == DUPLICATE
    assert s.next_seq == 4
    assert s.observe(4, d(4)) == ACCEPT


def test_lower_seq_with_other_digest_is_a_restart_and_changes_nothing():
    s = Sequencer()
    for seq in range(4):
        s.observe(seq, d(seq))
    assert s.observe(0, d(0, incarnation=1)) == RESTART
    assert s.observe(2, d(2, incarnation=1)) == RESTART
    assert s.next_seq == 4
    assert s.observe(1, d(1)) == DUPLICATE  # the old timeline is still known


def test_duplicate_older_than_the_window_counts_as_restart():
    s = Sequencer(window=3)
    for seq in range(10):
        s.observe(seq, d(seq))
    assert s.observe(7, d(7)) == DUPLICATE
    assert s.observe(9, d(9)) == DUPLICATE
    assert s.observe(6, d(6)) == RESTART


def test_accept_records_batches_applied_from_a_replay():
    s = Sequencer()
    s.observe(0, d(0))
    assert s.observe(4, d(4)) == Verdict.gap(1, 4)
    for seq in (1, 2, 3):
        s.accept(seq, d(seq))
    assert s.next_seq == 4
    assert s.observe(2, d(2)) == DUPLICATE  # live copy of a replayed batch
    assert s.observe(4, d(4)) == ACCEPT


def test_accept_backwards_starts_a_new_timeline():
    s = Sequencer()
    for seq in range(5):
        s.observe(seq, d(seq))
    s.accept(0, d(0, incarnation=1))
    assert s.next_seq == 1
    assert s.observe(3, d(3)) == Verdict.gap(1, 3)  # old pairs are gone
    assert s.observe(0, d(0, incarnation=1)) == DUPLICATE


def test_expect_sets_next_without_recording():
    s = Sequencer()
    s.observe(0, d(0))
    s.expect(10)
    assert s.next_seq == 10
    assert s.observe(0, d(0)) == DUPLICATE  # window kept when moving forward
    assert s.observe(12, d(12)) == Verdict.gap(10, 12)
    assert s.observe(10, d(10)) == ACCEPT


def test_expect_zero_makes_the_first_batch_count():
    s = Sequencer()
    s.expect(0)
    assert s.observe(3, d(3)) == Verdict.gap(0, 3)
    assert s.observe(0, d(0)) == ACCEPT


def test_expect_backwards_clears_the_window():
    s = Sequencer()
    for seq in range(5):
        s.observe(seq, d(seq))
    s.expect(2)
    assert s.observe(1, d(1)) == RESTART


def test_expect_none_and_reset_forget_the_publisher():
    s = Sequencer()
    for seq in range(3):
        s.observe(seq, d(seq))
    s.expect(None)
    assert s.observe(7, d(7)) == ACCEPT
    s.reset()
    assert s.next_seq is None
    assert s.observe(1, d(1)) == ACCEPT
    assert s.observe(0, d(0)) == RESTART  # window was cleared by reset: 0 is unknown


def test_window_must_be_positive():
    with pytest.raises(ValueError):
        Sequencer(window=0)


def test_payload_digest_tells_payloads_apart():
    a = payload_digest(b"\x93\xcb" + b"\x41" * 8 + b"\x90\x00")
    assert a == payload_digest(b"\x93\xcb" + b"\x41" * 8 + b"\x90\x00")
    assert a != payload_digest(b"\x93\xcb" + b"\x42" * 8 + b"\x90\x00")
    assert isinstance(a, bytes) and len(a) == 16


def test_a_seq_window_numbers_later_takes_its_slot():
    s = Sequencer(window=4)
    for seq in range(6):
        s.observe(seq, d(seq))
    assert s.observe(5, d(5)) == DUPLICATE
    assert s.observe(2, d(2)) == DUPLICATE
    assert s.observe(1, d(1)) == RESTART  # slot 1 now holds seq 5
    assert s.last_accepted == (5, d(5))


def test_digests_have_one_size():
    with pytest.raises(ValueError):
        Sequencer().accept(0, b"short")


def test_a_flood_of_batches_leaves_no_objects_behind():
    """Every accepted pair lives in the ring's flat buffers, not in objects of its own (issue
    22 §6: one int and one bytes per remembered batch pinned allocator pages after a flood)."""
    s = Sequencer()
    digests = [d(seq) for seq in range(20_000)]
    s.observe(0, digests[0])
    before = sys.getallocatedblocks()
    for seq in range(1, 20_000):
        s.observe(seq, digests[seq])
    assert sys.getallocatedblocks() - before < 100
    assert s.observe(19_000, digests[19_000]) == DUPLICATE
