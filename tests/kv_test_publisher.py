"""Test helpers for KV-event ingestion: a loopback publisher and a recording ledger.

``KvTestPublisher`` speaks the engines' wire protocol (kv-events.md §2, §6) on real ZeroMQ
sockets bound to ``tcp://127.0.0.1:*``: live messages ``[topic, seq, payload]`` and a replay
ROUTER answering in either generation (4 frames with topic, or 3 without). Its event socket
is an XPUB (a PUB that also reports subscriptions), so tests can wait until a subscriber is
attached instead of sleeping. Faults: drop (buffer without sending), duplicate / reorder
(``resend``), restart (sequence back to 0, buffer emptied), raw garbage frames, a replay
ROUTER that stays silent or never sends the end marker, a short replay buffer.

``RecordingLedger`` is a plain stand-in for the ledger book: per target, a map from engine
hash to parent hash, the state history and the number of drops.
"""

from __future__ import annotations

import enum
import json
import struct
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trio
import zmq

from cortex.events import zmq_trio
from cortex.ledger.kv_events import (
    REPLAY_END_SEQ,
    U64_MASK,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineFamily,
    EventBatch,
)
from cortex.ledger.state import TargetState


def seq_frame(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def with_ts(payload: bytes, ts: float) -> bytes:
    """The same batch with another timestamp (a restarted engine never repeats a payload)."""
    if payload[:2] != b"\x93\xcb":
        raise ValueError("payload does not start with a 3-array and a float64 timestamp")
    return payload[:2] + struct.pack(">d", ts) + payload[10:]


@dataclass(frozen=True)
class FixtureVersion:
    name: str  # e.g. "vllm-0.33.0"
    family: EngineFamily
    payloads: tuple[bytes, ...]  # payload of seq 0..6
    replay_topic_frame: bool  # new replay generation (4 frames)
    labels: dict[str, int]  # block label -> engine hash, normalised to u64
    rank3_payload: bytes  # variants/dp-rank-3.msgpack

    @classmethod
    def load(cls, kv_fixtures_dir: Path, name: str) -> FixtureVersion:
        root = kv_fixtures_dir / name
        frames = json.loads((root / "frames.json").read_text())
        replay = json.loads((root / "replay.json").read_text())
        payloads = tuple(
            (root / m["payload_file"]).read_bytes()
            for m in sorted(frames["messages"], key=lambda m: m["seq"])
        )
        return cls(
            name=name,
            family=EngineFamily(frames["engine"]),
            payloads=payloads,
            replay_topic_frame=replay["reply_frame_counts"][0] == 4,
            labels={k: v & U64_MASK for k, v in frames["block_labels"].items()},
            rank3_payload=(root / "variants" / "dp-rank-3.msgpack").read_bytes(),
        )


class ReplayMode(enum.Enum):
    ANSWER = "answer"  # items from the requested seq, then the end marker
    SILENT = "silent"  # never answers (like an engine given a malformed request)
    NO_END_MARKER = "no-end-marker"  # items, but the end marker never comes


class KvTestPublisher:
    def __init__(
        self,
        ctx: zmq.Context,
        *,
        topic: bytes = b"kv",
        replay_topic_frame: bool = True,
        buffer_steps: int = 10_000,
        replay_mode: ReplayMode = ReplayMode.ANSWER,
        replay_topic: bytes | None = None,
    ) -> None:
        self.topic = topic
        self.replay_topic_frame = replay_topic_frame
        self.replay_topic = topic if replay_topic is None else replay_topic
        self.replay_mode = replay_mode
        self.replay_garbage: list[list[bytes]] = []  # raw replies sent before the items
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.next_seq = 0
        self.replay_requests: list[int] = []
        self.xpub = ctx.socket(zmq.XPUB)
        self.router = ctx.socket(zmq.ROUTER)
        for sock in (self.xpub, self.router):
            sock.linger = 0
        self.xpub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.xpub.sndhwm = 0  # never drop on our side: the tests decide what is dropped
        self.xpub.bind("tcp://127.0.0.1:*")
        self.router.bind("tcp://127.0.0.1:*")
        self.endpoint = zmq_trio.bound_endpoint(self.xpub)
        self.replay_endpoint = zmq_trio.bound_endpoint(self.router)

    # --- live stream ------------------------------------------------------------------

    def publish(self, payload: bytes, *, deliver: bool = True) -> int:
        """Number, buffer and (unless ``deliver`` is false: a dropped batch) send a payload."""
        seq = self.next_seq
        self.next_seq += 1
        self.buffer.append((seq, payload))
        if deliver:
            self.send_frames([self.topic, seq_frame(seq), payload])
        return seq

    def resend(self, seq: int) -> None:
        """Send a buffered batch (again): a duplicate, or late delivery of a dropped one."""
        payload = dict(self.buffer)[seq]
        self.send_frames([self.topic, seq_frame(seq), payload])

    def send_frames(self, frames: list[bytes]) -> None:
        self.xpub.send_multipart(frames, zmq.NOBLOCK)

    def restart(self) -> None:
        """The engine process restarted: its counter starts at 0 again, its buffer is empty."""
        self.next_seq = 0
        self.buffer.clear()

    async def wait_subscribed(self, topic: bytes | None = None) -> None:
        """Return once a subscriber subscribed (to ``topic`` if given) — no sleeping."""
        while True:
            frames = await zmq_trio.recv_multipart(self.xpub)
            message = frames[0]
            if message[:1] == b"\x01" and (topic is None or message[1:] == topic):
                return

    # --- replay ROUTER ----------------------------------------------------------------

    async def serve_replay(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED):
        task_status.started()
        while True:
            frames = await zmq_trio.recv_multipart(self.router)
            if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
                continue  # engines log "Invalid replay request" and do not answer
            ident, start = frames[0], int.from_bytes(frames[2], "big")
            self.replay_requests.append(start)
            if self.replay_mode is ReplayMode.SILENT:
                continue
            for garbage in self.replay_garbage:
                await zmq_trio.send_multipart(self.router, [ident, *garbage])
            for seq, payload in list(self.buffer):
                if seq >= start:
                    await zmq_trio.send_multipart(
                        self.router, [ident, *self._reply(seq_frame(seq), payload)]
                    )
            if self.replay_mode is ReplayMode.ANSWER:
                await zmq_trio.send_multipart(self.router, [ident, *self._reply(REPLAY_END_SEQ, b"")])

    def _reply(self, seq: bytes, payload: bytes) -> list[bytes]:
        if not self.replay_topic_frame:
            return [b"", seq, payload]
        topic = b"" if seq == REPLAY_END_SEQ else self.replay_topic
        return [b"", topic, seq, payload]

    def close(self) -> None:
        self.xpub.close(linger=0)
        self.router.close(linger=0)


@asynccontextmanager
async def running_publisher(ctx: zmq.Context, **kwargs) -> AsyncIterator[KvTestPublisher]:
    """A publisher whose replay ROUTER is being served for the duration of the block."""
    pub = KvTestPublisher(ctx, **kwargs)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(pub.serve_replay)
            yield pub
            nursery.cancel_scope.cancel()
    finally:
        pub.close()


# --- a recording stand-in for the ledger book ---------------------------------------------


@dataclass(frozen=True)
class Applied:
    stored_blocks: int = 0
    removed_blocks: int = 0
    unknown_parent: int = 0
    unknown_removal: int = 0
    cleared: int = 0
    duplicate_store: int = 0
    skipped_non_main: int = 0
    hash_conflict: int = 0
    invalid_events: int = 0


@dataclass
class RecordedTarget:
    worker: str
    rank: int
    family: EngineFamily
    model: str
    held: dict[int, int | None] = field(default_factory=dict)  # engine hash -> parent hash
    states: list[tuple[TargetState, str]] = field(default_factory=list)
    drops: int = 0
    applied: list[EventBatch] = field(default_factory=list)

    @property
    def state(self) -> TargetState:
        return self.states[-1][0] if self.states else TargetState.SYNCING


class RecordingLedger:
    """Engine-hash bookkeeping per target; wakes ``wait_until`` on every change."""

    def __init__(self) -> None:
        self.targets: dict[int, RecordedTarget] = {}
        self._changed = trio.Event()

    def register(self, worker: str, rank: int, family: EngineFamily, model: str) -> int:
        target = len(self.targets)
        self.targets[target] = RecordedTarget(worker, rank, family, model)
        return target

    def apply(self, target: int, batch: EventBatch) -> Applied:
        t = self.targets[target]
        t.applied.append(batch)
        stored = removed = unknown_parent = unknown_removal = 0
        cleared = False
        for event in batch.events:
            if isinstance(event, BlockStored):
                parent = event.parent_hash
                if parent is not None and parent not in t.held:
                    unknown_parent += 1
                    continue
                for h in event.block_hashes:
                    t.held[h] = parent
                    parent = h
                stored += len(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                for h in event.block_hashes:
                    if t.held.pop(h, "missing") == "missing":
                        unknown_removal += 1
                    else:
                        removed += 1
            elif isinstance(event, AllBlocksCleared):
                t.held.clear()
                cleared = True
        self._wake()
        return Applied(stored, removed, unknown_parent, unknown_removal, cleared)

    def drop_target_entries(self, target: int) -> int:
        t = self.targets[target]
        dropped = len(t.held)
        t.held.clear()
        t.drops += 1
        self._wake()
        return dropped

    def set_state(self, target: int, state: TargetState, reason: str) -> None:
        self.targets[target].states.append((state, reason))
        self._wake()

    def state(self, target: int) -> TargetState:
        return self.targets[target].state

    async def wait_until(self, predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
        with trio.fail_after(timeout_s):
            while not predicate():
                await self._changed.wait()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
