"""The I/O shell of replica sync: this replica's requests out over ZeroMQ PUB, the peers' in
over one SUB, into each model's ``PeerInflight`` (rules in ``scheduling.peer_inflight``).

* One PUB bound at ``replicas.listen``; one SUB connected to every ``replicas.peers``
  endpoint (ZeroMQ reconnects by itself: a peer that restarts or starts late is heard once it
  listens). A replica named in its own peer list hears itself: its own id is ignored.
* Out: every request this replica routes (``PendingWork.announce``) as ``Routed``,
  ``PrefillDone``, ``Finished``; each heartbeat (``heartbeat_s``) lists, per model, the numbers
  of its requests in flight. Events go out in batches, one ZeroMQ message each: an announced
  event wakes the flusher, which runs once the event loop's current tick is done and sends
  everything announced by then (no timer: under load a tick holds many requests' events, idle
  it holds one) — less what peers need never hear (``wire.coalesced``: a request that came and
  went within the batch; counted ``coalesced``). A heartbeat goes after what was announced
  before it, in the same batch. Sends never wait: past ``sndhwm`` queued batches for a peer a
  batch is dropped and its events counted (``dropped``) — the heartbeats repair what a lost
  event leaves, and the TTL bounds the rest.
* In: every message is decoded (``wire``); a malformed one is counted (``invalid``) and
  skipped, a model this replica does not serve is skipped (``foreign``). A peer heard for the
  first time, or again after it left the view, is logged once; one silent for
  ``peer_timeout_s`` leaves the view (its requests no longer counted), logged once with how
  many requests it took along.
* Identity: a random id drawn at start (``peer_id``), so a restarted replica is a new peer.
* Pools: every model's at the start; a pool a worker of a new model brings later (the admin
  API, discovery) is taken in at the next heartbeat, or at once when a peer speaks of it.

Everything runs on the trio thread that owns the pools (single owner, no locks).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import trio
import zmq

from cortex.events import zmq_trio
from cortex.replicas import wire
from cortex.replicas.settings import ReplicaSettings
from cortex.scheduling.inflight import Hold, PendingWork
from cortex.scheduling.peer_inflight import PeerInflight

log = logging.getLogger("cortex.replicas")

RCVHWM = 1_000_000  # what a peer's burst may queue here before ZeroMQ drops (counted nowhere)


class Pool(Protocol):
    """What sync needs of a model's pool: its pending work and its workers' ledger targets."""

    pending: PendingWork
    targets: dict[str, tuple[int, ...]]


@dataclass(slots=True)
class SyncCounters:  # events (requests routed, prefills done, ends, heartbeats), not batches
    sent: int = 0
    dropped: int = 0  # not sent: the peer's queue was full
    coalesced: int = 0  # not sent: the request came and went within one batch
    received: int = 0
    invalid: int = 0  # ZeroMQ messages undecodable, or not two frames
    foreign: int = 0  # for a model this replica does not serve


@dataclass(frozen=True, slots=True)
class SyncFigures:
    peers: int
    peer_requests: int
    sent: int
    dropped: int
    coalesced: int
    received: int
    invalid: int
    foreign: int


def _target_of(pool: Pool, worker: str, rank: int | None) -> int | None:
    targets = pool.targets.get(worker, ())
    if rank is None:
        return targets[0] if len(targets) == 1 else None
    return targets[rank] if 0 <= rank < len(targets) else None


def _rank_of(pool: Pool, worker: str, target: int) -> int:
    targets = pool.targets.get(worker, ())
    return targets.index(target) if target in targets and len(targets) > 1 else wire.NO_RANK


class ReplicaSync:
    def __init__(self, settings: ReplicaSettings, pools: Mapping[str, Pool],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.peer_id = secrets.token_hex(6)
        self.counters = SyncCounters()
        self._pools = pools
        self._clock = clock
        self._views: dict[str, PeerInflight] = {}
        self._active: dict[str, set[int]] = {}
        self._heard: dict[str, float] = {}  # peer -> last heard (the peers in the view)
        self._pub: zmq.Socket | None = None
        self._outbox: list[wire.Message] = []
        self._wake = trio.Event()
        self.endpoint = ""  # where the PUB listens (resolved), once running

    # -- the view, for /metrics ---------------------------------------------------------------

    def figures(self) -> SyncFigures:
        """The view's size and the counters, for ``/metrics`` (``replica_writer``)."""
        c = self.counters
        return SyncFigures(len(self._heard),
                           sum(view.in_flight() for view in self._views.values()),
                           c.sent, c.dropped, c.coalesced, c.received, c.invalid, c.foreign)

    # -- running --------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        ctx = zmq.Context.instance()
        pub = ctx.socket(zmq.PUB)
        sub = ctx.socket(zmq.SUB)
        try:
            pub.setsockopt(zmq.LINGER, 0)
            pub.setsockopt(zmq.SNDHWM, self.settings.sndhwm)
            if self.settings.listen:  # else it hears the peers and tells nothing
                pub.bind(self.settings.listen)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RCVHWM, RCVHWM)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            for endpoint in self.settings.peer_endpoints():
                sub.connect(endpoint)
            if self.settings.listen:
                self._pub = pub
                self.endpoint = zmq_trio.bound_endpoint(pub)
            self._adopt()
            log.info("replica sync: %s publishes on %s, listens to %d peer(s): %s",
                     self.peer_id, self.endpoint or "nothing (listen unset)",
                     len(self.settings.peer_endpoints()), self.settings.peers or "none")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._receive, sub)
                nursery.start_soon(self._flusher)
                nursery.start_soon(self._beat)
                task_status.started(self.endpoint)
        finally:
            for pool in self._pools.values():
                pool.pending.announce = None
            for view in self._views.values():
                view.clear()
            self._pub = None
            pub.close()
            sub.close()

    def _adopt(self) -> None:
        """Take in every pool not yet synced: those of the start, and one a worker of a new
        model brought later (adopted at the next heartbeat, or when a peer speaks of it)."""
        for model, pool in self._pools.items():
            if model in self._views:
                continue
            self._views[model] = PeerInflight(pool.pending, partial(_target_of, pool),
                                              entry_ttl_s=self.settings.entry_ttl_s,
                                              peer_timeout_s=self.settings.peer_timeout_s)
            self._active[model] = set()
            if self._pub is not None:
                pool.pending.announce = partial(self._announce, model)

    def _send(self, message: wire.Message) -> None:
        """Queue ``message`` for the next batch (nothing when this replica tells nobody)."""
        if self._pub is None:
            return
        if not self._outbox:
            self._wake.set()
        self._outbox.append(message)

    async def _flusher(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            self._flush()

    def _flush(self) -> None:
        pub, announced = self._pub, self._outbox
        self._outbox = []
        if pub is None or not announced:
            return
        batch = wire.coalesced(announced)
        self.counters.coalesced += len(announced) - len(batch)
        if not batch:
            return
        try:
            pub.send_multipart([self.peer_id.encode(), wire.encode(batch)], zmq.NOBLOCK)
            self.counters.sent += len(batch)
        except zmq.Again:
            self.counters.dropped += len(batch)

    def _announce(self, model: str, event: str, hold: Hold) -> None:
        active = self._active[model]
        if event == "routed":
            active.add(hold.number)
            prefix = hold.prefix
            pool = self._pools[model]
            rank, keys = wire.NO_RANK, b""
            if prefix is not None:
                target, block_keys, start = prefix
                rank = _rank_of(pool, hold.worker, target)
                keys = wire.keys_bytes(block_keys, start)
            self._send(wire.Routed(model, hold.number, hold.worker, rank, hold.prefill_tokens,
                                   keys))
        elif event == "prefill_done":
            self._send(wire.PrefillDone(model, hold.number))
        else:
            active.discard(hold.number)
            self._send(wire.Finished(model, hold.number))

    async def _beat(self) -> None:
        while True:
            self._adopt()
            self._send(wire.Heartbeat({model: sorted(active)
                                       for model, active in self._active.items()}))
            self._flush()  # after what was announced before it, in order
            now = self._clock()
            for peer, heard in list(self._heard.items()):
                if now - heard > self.settings.peer_timeout_s:
                    del self._heard[peer]
                    taken = sum(state.in_flight for view in self._views.values()
                                for state in view.states(now) if state.peer == peer)
                    log.warning("replica sync: peer %s left the view (silent %.1f s): its %d "
                                "requests in flight are no longer counted", peer, now - heard,
                                taken)
            for view in self._views.values():
                view.expire(now)
            await trio.sleep(self.settings.heartbeat_s)

    async def _receive(self, sub: zmq.Socket) -> None:
        while True:
            frames = await zmq_trio.recv_multipart(sub)
            self._take(frames)
            for _ in range(255):  # whatever else is queued, then let the loop run
                more = zmq_trio.try_recv_multipart(sub)
                if more is None:
                    break
                self._take(more)
            await trio.lowlevel.checkpoint()

    def _take(self, frames: list[bytes]) -> None:
        if len(frames) != 2:
            self.counters.invalid += 1
            return
        try:
            peer = frames[0].decode()
            messages = wire.decode(frames[1])
        except (UnicodeDecodeError, wire.WireError):
            self.counters.invalid += 1
            return
        if peer == self.peer_id:
            return
        self.counters.received += len(messages)
        now = self._clock()
        if peer not in self._heard:
            log.info("replica sync: peer %s joined the view", peer)
        self._heard[peer] = now
        for message in messages:
            self._apply(peer, message, now)

    def _apply(self, peer: str, message: wire.Message, now: float) -> None:
        if isinstance(message, wire.Heartbeat):
            for model, view in self._views.items():
                view.heartbeat(peer, frozenset(message.in_flight.get(model, ())), now)
            return
        view = self._views.get(message.model)
        if view is None and message.model in self._pools:  # a pool newer than the heartbeat
            self._adopt()
            view = self._views.get(message.model)
        if view is None:
            self.counters.foreign += 1
            return
        if isinstance(message, wire.Routed):
            view.routed(peer, message.request, message.worker,
                        None if message.rank == wire.NO_RANK else message.rank,
                        message.prefill_tokens, wire.keys_of(message.keys), now)
        elif isinstance(message, wire.PrefillDone):
            view.prefill_done(peer, message.request, now)
        else:
            view.finished(peer, message.request, now)
