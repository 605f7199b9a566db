"""Other replicas' requests counted in this replica's pending work (``peer_inflight``): what a
peer tells enters and leaves exactly like a local request, duplicates count once, and every
kind of loss — a lost ``finished``, a lost heartbeat, a silent peer — is bounded."""

from __future__ import annotations

import pytest

from cortex.scheduling.inflight import PendingWork
from cortex.scheduling.peer_inflight import PeerInflight, PeerState

TARGETS = {("w1", None): 11, ("w1", 0): 11, ("w2", 1): 22}


def core(ttl: float = 60.0, timeout: float = 5.0) -> tuple[PendingWork, PeerInflight]:
    pending = PendingWork()
    return pending, PeerInflight(pending, lambda worker, rank: TARGETS.get((worker, rank)),
                                 entry_ttl_s=ttl, peer_timeout_s=timeout)


def counts(pending: PendingWork, worker: str) -> tuple[int, int]:
    return pending.in_flight(worker), pending.queued_prefill_tokens(worker)


def test_a_peer_request_counts_like_a_local_one_until_it_finishes():
    pending, peers = core()
    peers.routed("a", 1, "w1", None, 300, [7, 8], now=0.0)
    assert counts(pending, "w1") == (1, 300)
    assert len(pending.prefixes) == 1  # its new blocks, credited on w1's target
    matched = {11: 0}
    assert pending.prefixes.extend([7, 8, 9], matched) == {11: 0} and matched == {11: 2}
    peers.prefill_done("a", 1, now=0.1)
    assert counts(pending, "w1") == (1, 0)
    peers.finished("a", 1, now=0.2)
    assert counts(pending, "w1") == (0, 0) and len(pending.prefixes) == 0
    assert peers.in_flight() == 0 and peers.knows("a")


def test_told_twice_counts_once_and_unknown_requests_do_nothing():
    pending, peers = core()
    peers.routed("a", 1, "w1", None, 100, [], now=0.0)
    peers.routed("a", 1, "w1", None, 100, [], now=0.0)  # a duplicate
    peers.routed("b", 1, "w1", None, 50, [], now=0.0)  # another peer's request 1
    assert counts(pending, "w1") == (2, 150)
    peers.finished("a", 9, now=0.1)
    peers.prefill_done("c", 3, now=0.1)
    assert counts(pending, "w1") == (2, 150)
    peers.finished("a", 1, now=0.2)
    peers.finished("a", 1, now=0.3)  # twice
    assert counts(pending, "w1") == (1, 50)


def test_no_target_for_a_rank_the_peer_did_not_choose_on_a_multi_rank_worker():
    pending, peers = core()
    peers.routed("a", 1, "w2", None, 10, [5], now=0.0)  # w2 has ranks; none chosen
    assert counts(pending, "w2") == (1, 10) and len(pending.prefixes) == 0
    peers.routed("a", 2, "w2", 1, 10, [5], now=0.0)
    assert len(pending.prefixes) == 1


def test_a_heartbeat_ends_what_it_does_not_list():
    pending, peers = core()
    for request in (1, 2, 3):
        peers.routed("a", request, "w1", None, 10, [], now=0.0)
    peers.heartbeat("a", {2}, now=1.0)  # the finished of 1 and 3 were lost
    assert counts(pending, "w1") == (1, 10)
    assert peers.states(now=1.5) == [PeerState("a", 1, 0.5)]


def test_entries_expire_after_the_ttl_and_silent_peers_are_dropped_whole():
    pending, peers = core(ttl=10.0, timeout=5.0)
    peers.routed("a", 1, "w1", None, 10, [7], now=0.0)
    peers.routed("b", 1, "w1", None, 20, [], now=0.0)
    peers.heartbeat("a", {1, 2}, now=4.0)
    assert peers.expire(now=6.0) == ["b"]  # b silent 6 s
    assert counts(pending, "w1") == (1, 10) and not peers.knows("b")
    peers.heartbeat("a", {1}, now=8.0)
    assert peers.expire(now=11.0) == []  # a heard, but its entry is 11 s old
    assert counts(pending, "w1") == (0, 0) and len(pending.prefixes) == 0
    peers.routed("b", 5, "w1", None, 1, [], now=12.0)  # heard again: counted again
    assert peers.knows("b") and counts(pending, "w1") == (1, 1)
    peers.clear()
    assert counts(pending, "w1") == (0, 0) and peers.in_flight() == 0


def test_bounds_are_positive():
    with pytest.raises(ValueError, match="must be > 0"):
        PeerInflight(PendingWork(), lambda w, r: None, entry_ttl_s=0, peer_timeout_s=1)
