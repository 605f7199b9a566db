"""The I/O shell of KV-event ingestion: one SUB socket per (worker, DP rank), feeding the ledger.

Per source, one trio task (``run_source``):

* connects a SUB (the engine binds), subscribes to the source's topic prefix, generous RCVHWM,
  linger 0; reports started once connected and subscribed;
* starts the target's ``TargetSync`` (which asks for a history replay when the source has a
  replay endpoint) and executes its actions against the ledger sink — or, given a peer's
  snapshot of the stream (warm start), loads it into the empty target and starts the sync
  machine from the snapshot's sequence number (``start_from_snapshot``), which keeps it only
  if the replay proves it continuous;
* loops: drains up to ``max_messages_per_turn`` queued messages without waiting, processes each
  (frames → sequence number → payload decode → sync → ledger), then checkpoints, so a busy
  stream never starves the event loop; when nothing is queued it awaits the socket;
* fetches replays inline (live messages wait in the SUB queue meanwhile) and checkpoints every
  ``max_messages_per_turn`` replayed batches while decoding and applying them;
* takes the worker's health signals through its ``SourceHandle`` (``suspect`` when the engine
  was unreachable, ``verify`` when it answers again: ``TargetSync``'s rules), executed in the
  task between messages, waking it when it waits on the socket;
* asks again for a history replay that got no reply (``TargetSync.history_refused``) after
  ``settings.history_retry_s``, doubling the wait up to ``RETRY_MAX_S`` while it stays
  refused.

Malformed frames, undecodable payloads, foreign topics and foreign DP ranks are counted in the
target's ``IngestCounters`` and never end the task. The ledger itself is the single-owner
``LedgerSink``; it is only touched from these tasks, on the trio thread.

``run_ingestion`` registers every source's target with the book and starts one task per source.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol, cast

import trio
import trio.lowlevel
import zmq

from cortex.errors import ConfigError, DecodeError
from cortex.events import zmq_trio
from cortex.events.counters import IngestCounters
from cortex.events.decoder import decode_payload
from cortex.events.frames import parse_live_frames
from cortex.events.replay import fetch_replay
from cortex.events.sequencer import payload_digest
from cortex.events.source import EventSource, IngestSettings
from cortex.events.sync import TargetSync
from cortex.events.sync_actions import (
    Action,
    ApplyBatch,
    DropEntries,
    RequestReplay,
    SequencedBatch,
    SetState,
)
from cortex.ledger.kv_events import EngineFamily, EventBatch
from cortex.ledger.state import TargetState

log = logging.getLogger("cortex.events")

RETRY_MAX_S = 60.0  # the longest wait between two asks for a refused history replay


class AppliedBatch(Protocol):
    """What the ledger reports about one applied batch."""

    @property
    def stored_blocks(self) -> int: ...
    @property
    def removed_blocks(self) -> int: ...
    @property
    def unknown_parent(self) -> int: ...
    @property
    def unknown_removal(self) -> int: ...
    @property
    def cleared(self) -> int: ...
    @property
    def duplicate_store(self) -> int: ...
    @property
    def skipped_non_main(self) -> int: ...
    @property
    def hash_conflict(self) -> int: ...
    @property
    def invalid_events(self) -> int: ...


class LedgerSink(Protocol):
    """The ledger as ingestion uses it (``cortex.ledger.book.LedgerBook`` fits structurally).

    ``apply`` must accept every batch the decoder produces without raising."""

    def apply(self, target: int, batch: EventBatch) -> AppliedBatch: ...
    def drop_target_entries(self, target: int) -> object: ...
    def set_state(self, target: int, state: TargetState, reason: str) -> object: ...


class WarmSink(LedgerSink, Protocol):
    """A ledger that can load a peer's snapshot of a target (``LedgerBook`` fits)."""

    def import_target(self, target: int, images: dict[int, tuple[bytes, bytes, bytes, bytes, bytes]]
                      ) -> int: ...


class WarmImage(Protocol):
    """One target's part of a peer's snapshot (``cortex.ledger.snapshot.TargetImage``)."""

    @property
    def last_seq(self) -> int: ...
    @property
    def last_digest(self) -> bytes: ...
    def images(self) -> dict[int, tuple[bytes, bytes, bytes, bytes, bytes]]: ...


class LedgerRegistry(LedgerSink, Protocol):
    def register(self, worker: str, rank: int, family: EngineFamily, model: str) -> int: ...


class SourceHandle:
    """What ``run_source`` reports once subscribed: the target's sync machine (read-only:
    callers read its state, ``next_seq``, ``resume_point``; they must not drive it) and the
    worker's health signals, which the source's task feeds to it in order."""

    __slots__ = ("_ingest", "sync")

    def __init__(self, ingest: _SourceIngest) -> None:
        self.sync = ingest.sync
        self._ingest = ingest

    def suspect(self, why: str) -> None:
        """The engine was unreachable: it may have restarted (``TargetSync.suspect``)."""
        self._ingest.signal(partial(self.sync.suspect, why))

    def verify(self) -> None:
        """The engine answers again: prove its stream continued (``TargetSync.verify``)."""
        self._ingest.signal(self.sync.verify)


@dataclass(frozen=True, slots=True)
class IngestionHandle:
    """What ``run_ingestion`` reports once every source is subscribed."""

    sources: dict[int, EventSource]  # target id -> source
    counters: dict[int, IngestCounters]  # target id -> its live counters
    syncs: dict[int, TargetSync]  # target id -> its sync machine (read-only view: state, next_seq)

    def total(self) -> IngestCounters:
        return IngestCounters.total(self.counters.values())


class _SourceIngest:
    """The per-source state of ``run_source``: sync machine, counters, action executor."""

    def __init__(
        self,
        source: EventSource,
        target: int,
        sink: LedgerSink,
        ctx: zmq.Context,
        settings: IngestSettings,
        counters: IngestCounters,
    ) -> None:
        self.source = source
        self.target = target
        self.sink = sink
        self.ctx = ctx
        self.settings = settings
        self.counters = counters
        self.sync = TargetSync(
            has_replay=source.replay_endpoint is not None,
            counters=counters,
            window=settings.dedupe_window,
        )
        self._signals: deque[Callable[[], list[Action]]] = deque()
        self._waiting: trio.CancelScope | None = None  # set while the pump awaits the socket
        self._retry_delay = settings.history_retry_s
        self._retry_at: float | None = None  # when to ask again for a refused history

    def signal(self, step: Callable[[], list[Action]]) -> None:
        """Run ``step`` (a ``TargetSync`` input) in the task, before its next message."""
        self._signals.append(step)
        if self._waiting is not None:
            self._waiting.cancel()

    def start(self, warm: WarmImage | None) -> list[Action]:
        """The sync machine's first actions: from a peer's snapshot when one is given for
        this target (and it has a replay endpoint to prove it continuous), else from scratch.
        A snapshot the ledger refuses is logged and ignored."""
        if warm is None or self.source.replay_endpoint is None:
            return self.sync.start()
        sink = cast(WarmSink, self.sink)
        sink.set_state(self.target, TargetState.SYNCING, "warm start: loading a peer's snapshot")
        sink.drop_target_entries(self.target)
        try:
            loaded = sink.import_target(self.target, warm.images())
        except ValueError as error:
            self.counters.snapshot_discarded += 1
            log.warning("%s rank %d: peer snapshot not loaded: %s", self.source.worker,
                        self.source.rank, error)
            return self.sync.start()
        log.info("%s rank %d: %d entries loaded from a peer's snapshot up to sequence %d",
                 self.source.worker, self.source.rank, loaded, warm.last_seq)
        return self.sync.start_from_snapshot(warm.last_seq, warm.last_digest)

    async def pump(self, sub: zmq.Socket) -> None:
        budget = self.settings.max_messages_per_turn
        while True:
            while self._signals:
                await self.execute(self._signals.popleft()())
            if await self._retry_due():
                continue
            processed = 0
            while processed < budget:
                frames = zmq_trio.try_recv_multipart(sub)
                if frames is None:
                    break
                processed += 1
                await self.on_frames(frames)
            if processed:
                await trio.lowlevel.checkpoint()
            elif not self._signals:
                deadline = math.inf if self._retry_at is None else self._retry_at
                with trio.CancelScope(deadline=deadline) as self._waiting:
                    await zmq_trio.wait_for(sub, zmq.POLLIN)
                self._waiting = None

    async def _retry_due(self) -> bool:
        """Ask again for a refused history replay when its wait is over (True: asked)."""
        if not self.sync.history_refused:
            self._retry_at, self._retry_delay = None, self.settings.history_retry_s
            return False
        now = trio.current_time()
        if self._retry_at is None:
            self._retry_at = now + self._retry_delay
            return False
        if now < self._retry_at:
            return False
        log.info("%s rank %d: asking again for the history replay that got no reply",
                 self.source.worker, self.source.rank)
        self._retry_at = None
        self._retry_delay = min(self._retry_delay * 2, RETRY_MAX_S)
        await self.execute(self.sync.retry_history())
        return True

    async def on_frames(self, frames: list[bytes]) -> None:
        c = self.counters
        c.messages += 1
        try:
            live = parse_live_frames(frames)
        except DecodeError:
            c.malformed_frames += 1
            return
        if not live.topic.startswith(self.source.topic):
            c.topic_mismatch += 1
            return
        await self.execute(self.sync.on_live(self._sequenced(live.seq, live.payload)))

    def _sequenced(self, seq: int, payload: bytes) -> SequencedBatch:
        try:
            batch: EventBatch | None = decode_payload(payload, self.source.family)
        except DecodeError:
            self.counters.decode_errors += 1
            batch = None
        return SequencedBatch(seq, payload_digest(payload), batch)

    async def execute(self, actions: list[Action]) -> None:
        queue = deque(actions)
        budget = self.settings.max_messages_per_turn
        replayed = 0
        while queue:
            action = queue.popleft()
            if isinstance(action, ApplyBatch):
                self._apply(action.batch)
                if action.replayed:
                    replayed += 1
                    if replayed % budget == 0:
                        await trio.lowlevel.checkpoint()
            elif isinstance(action, DropEntries):
                self.sink.drop_target_entries(self.target)
            elif isinstance(action, SetState):
                self.sink.set_state(self.target, action.state, action.reason)
            else:
                assert isinstance(action, RequestReplay) and not queue
                queue.extend(await self._replay(action))

    def _apply(self, batch: EventBatch) -> None:
        c = self.counters
        result = self.sink.apply(self.target, batch)
        c.batches_applied += 1
        c.stored_blocks += result.stored_blocks
        c.removed_blocks += result.removed_blocks
        c.unknown_parent += result.unknown_parent
        c.unknown_removal += result.unknown_removal
        c.duplicate_store += result.duplicate_store
        c.skipped_non_main += result.skipped_non_main
        c.hash_conflict += result.hash_conflict
        c.invalid_events += result.invalid_events
        c.unknown_events += batch.unknown_events
        c.unknown_fields += batch.unknown_fields
        if batch.dp_rank is not None and batch.dp_rank != self.source.rank:
            c.rank_mismatch += 1

    async def _replay(self, request: RequestReplay) -> list[Action]:
        endpoint = self.source.replay_endpoint
        assert endpoint is not None
        cap = self.settings.replay_max_items
        outcome = await fetch_replay(
            self.ctx,
            endpoint,
            request.start_seq,
            timeout_s=self.settings.replay_timeout_s,
            max_items=cap if request.max_items is None else min(cap, request.max_items),
        )
        c = self.counters
        c.malformed_frames += outcome.malformed_frames
        items: list[SequencedBatch] = []
        complete = outcome.ended
        budget = self.settings.max_messages_per_turn
        for n, item in enumerate(outcome.items, 1):
            if item.topic is not None and not item.topic.startswith(self.source.topic):
                # Not this publisher's batch: leave it out, and the reply can no longer
                # vouch for being complete.
                c.topic_mismatch += 1
                complete = False
                continue
            items.append(self._sequenced(item.seq, item.payload))
            if n % budget == 0:
                await trio.lowlevel.checkpoint()
        return self.sync.on_replay_result(items, ended=complete, refused=outcome.refused)


async def run_source(
    source: EventSource,
    target: int,
    sink: LedgerSink,
    *,
    ctx: zmq.Context | None = None,
    settings: IngestSettings | None = None,
    counters: IngestCounters | None = None,
    warm: WarmImage | None = None,
    task_status: trio.TaskStatus[SourceHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Ingest one source into ``sink`` under ``target`` until cancelled.

    ``warm``: a peer's snapshot of this stream to start from (``_SourceIngest.start``); the
    sink must then be a ``WarmSink``. Reports the source's ``SourceHandle`` once subscribed."""
    ctx = ctx if ctx is not None else zmq.Context.instance()
    settings = settings if settings is not None else IngestSettings()
    counters = counters if counters is not None else IngestCounters()
    ingest = _SourceIngest(source, target, sink, ctx, settings, counters)
    sub = ctx.socket(zmq.SUB)
    try:
        sub.linger = 0
        sub.ipv6 = True  # tcp://[v6 literal]:port endpoints (IPv4 ones still work)
        sub.rcvhwm = settings.rcvhwm
        sub.setsockopt(zmq.SUBSCRIBE, source.topic)
        sub.connect(source.endpoint)
        task_status.started(SourceHandle(ingest))
        await ingest.execute(ingest.start(warm))
        await ingest.pump(sub)
    finally:
        sub.close(linger=0)


async def run_ingestion(
    sources: Sequence[EventSource],
    book: LedgerRegistry,
    *,
    ctx: zmq.Context | None = None,
    settings: IngestSettings | None = None,
    task_status: trio.TaskStatus[IngestionHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Register every source's target with ``book`` and ingest them all until cancelled.

    Reports an ``IngestionHandle`` once every source is connected and subscribed."""
    seen: set[tuple[str, int]] = set()
    problems = []
    for source in sources:
        key = (source.worker, source.rank)
        if key in seen:
            problems.append(f"{source.worker}: DP rank {source.rank} listed twice")
        seen.add(key)
    if problems:
        raise ConfigError(problems)
    settings = settings if settings is not None else IngestSettings()
    handle = IngestionHandle(sources={}, counters={}, syncs={})
    for source in sources:
        target = book.register(source.worker, source.rank, source.family, source.model)
        handle.sources[target] = source
        handle.counters[target] = IngestCounters()
    async with trio.open_nursery() as nursery:
        for target, source in handle.sources.items():
            source_handle: SourceHandle = await nursery.start(
                partial(
                    run_source,
                    source,
                    target,
                    book,
                    ctx=ctx,
                    settings=settings,
                    counters=handle.counters[target],
                )
            )
            handle.syncs[target] = source_handle.sync
        task_status.started(handle)
