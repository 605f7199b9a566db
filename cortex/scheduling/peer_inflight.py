"""Requests in flight that other replicas routed, as they said: counted in this replica's
pending work, so that its cost sees every replica's decisions, not only its own.

Every replica subscribes to every engine's events and builds the same exact ledger; what each
kept to itself is what it has routed and not yet seen finish (``inflight.PendingWork``). A
herd of one new prompt arriving at every replica at once, or the turns of many conversations
spread over replicas, would otherwise meet on one worker until the engines' polled load
catches up. Peers tell each other their requests; this module keeps what they told.

Rules:

* A peer (a replica, named by the id it drew at its start) tells, per request (numbered by
  it): ``routed`` — the worker, its DP rank when the peer chose one, the prefill tokens it
  will compute there, and the block keys it will leave there beyond what its ledger credited
  (``inflight_prefixes``: keys name their whole prefix, so they mean the same on every
  replica); ``prefill_done``; ``finished``. And a heartbeat, with the numbers of its requests
  still in flight.
* ``routed`` enters a ``Hold`` on the pending work — the same counts a local request adds —
  whose blocks are credited on this replica's own target of that worker and rank
  (``target_of``; none when the worker has several ranks and none was chosen, as locally);
  ``prefill_done`` drops its queued prefill tokens; ``finished`` exits it. A request told twice
  counts once; ``prefill_done``/``finished`` of an unknown request do nothing (a message lost
  or a peer's request already expired here).
* Loss-tolerant, never a consensus: a heartbeat drops the peer's entries it does not list (a
  lost ``finished``: messages of one peer arrive in order, so a request routed before the
  heartbeat was sent is listed in it); an entry older than ``entry_ttl_s`` is dropped whatever
  the peer says (what a lost heartbeat can cost is bounded); a peer silent for
  ``peer_timeout_s`` is dropped whole, with its entries (``expire`` returns it, so the shell
  logs it once), and counted again when heard again. A replica restarted draws a new id: its
  old entries leave with the old id's timeout. Alone, a replica counts only its own requests —
  today's behaviour.

Pure: the time is passed in; no I/O. Single owner (the trio thread).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from cortex.scheduling.inflight import Hold, PendingWork

# (worker, DP rank or None) -> this replica's ledger target for it, or None
TargetOf = Callable[[str, int | None], int | None]


@dataclass(slots=True)
class _Entry:
    hold: Hold
    since: float


@dataclass(slots=True)
class _Peer:
    heard: float
    entries: dict[int, _Entry] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PeerState:
    """What one peer has told: its requests counted here, and when it was last heard."""

    peer: str
    in_flight: int
    heard_s_ago: float


class PeerInflight:
    def __init__(self, pending: PendingWork, target_of: TargetOf, *, entry_ttl_s: float,
                 peer_timeout_s: float) -> None:
        if entry_ttl_s <= 0 or peer_timeout_s <= 0:
            raise ValueError("entry_ttl_s and peer_timeout_s must be > 0")
        self._pending = pending
        self._target_of = target_of
        self._ttl = entry_ttl_s
        self._timeout = peer_timeout_s
        self._peers: dict[str, _Peer] = {}

    def knows(self, peer: str) -> bool:
        """Whether the peer is in the view (heard, not dropped since)."""
        return peer in self._peers

    def _heard(self, peer: str, now: float) -> _Peer:
        known = self._peers.get(peer)
        if known is None:
            known = self._peers[peer] = _Peer(now)
        known.heard = now
        return known

    def routed(self, peer: str, request: int, worker: str, rank: int | None,
               prefill_tokens: int, new_keys: Sequence[int], now: float) -> None:
        known = self._heard(peer, now)
        if request in known.entries:
            return
        target = self._target_of(worker, rank) if len(new_keys) else None
        prefix = None if target is None else (target, new_keys, 0)
        hold = self._pending.hold(worker, max(prefill_tokens, 0), prefix, announce=False)
        hold.open()
        known.entries[request] = _Entry(hold, now)

    def prefill_done(self, peer: str, request: int, now: float) -> None:
        entry = self._heard(peer, now).entries.get(request)
        if entry is not None:
            entry.hold.prefill_done()

    def finished(self, peer: str, request: int, now: float) -> None:
        entry = self._heard(peer, now).entries.pop(request, None)
        if entry is not None:
            entry.hold.close()

    def heartbeat(self, peer: str, in_flight: Collection[int], now: float) -> None:
        """The peer's requests still in flight: any other entry of it ends here."""
        known = self._heard(peer, now)
        gone = [request for request in known.entries if request not in in_flight]
        for request in gone:
            known.entries.pop(request).hold.close()

    def expire(self, now: float) -> list[str]:
        """Drop entries older than the TTL and peers silent past the timeout; returns the
        peers dropped."""
        dropped = []
        for peer, known in list(self._peers.items()):
            if now - known.heard > self._timeout:
                self._forget(peer)
                dropped.append(peer)
                continue
            old = [request for request, entry in known.entries.items()
                   if now - entry.since > self._ttl]
            for request in old:
                known.entries.pop(request).hold.close()
        return dropped

    def _forget(self, peer: str) -> None:
        known = self._peers.pop(peer, None)
        if known is not None:
            for entry in known.entries.values():
                entry.hold.close()

    def clear(self) -> None:
        """Forget every peer (shutdown)."""
        for peer in list(self._peers):
            self._forget(peer)

    def states(self, now: float) -> list[PeerState]:
        return [PeerState(peer, len(known.entries), round(now - known.heard, 3))
                for peer, known in sorted(self._peers.items())]

    def in_flight(self) -> int:
        """Requests of peers counted now."""
        return sum(len(known.entries) for known in self._peers.values())
