"""Ingestion end to end over real loopback ZeroMQ, fed with the captured fixture payloads.

The fixture story (every version): seq 0 stores A1,A2; 1 stores B3 under A2; 2 stores C2 under
A1; 3 removes B3; 4 removes C2 and A2; 5 stores A2 under A1 again; 6 clears everything. After
seq 5 the worker holds A1→A2 only; after seq 6 nothing.

No sleeping for readiness: ingestion is started with ``nursery.start``; the publisher waits for
the subscription on its XPUB; tests wait on ledger changes (``RecordingLedger.wait_until``), and
things that leave the ledger untouched (duplicates, garbage) are followed by a sentinel batch
whose arrival proves they were processed (ZeroMQ keeps order per connection).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio
import trio.lowlevel
import zmq

from cortex.events.counters import IngestCounters
from cortex.events.source import EventSource, IngestSettings
from cortex.events.subscriber import IngestionHandle, run_ingestion, run_source
from cortex.ledger.state import TargetState
from tests.kv_test_publisher import (
    FixtureVersion,
    KvTestPublisher,
    RecordingLedger,
    ReplayMode,
    running_publisher,
    with_ts,
)

READY, PARTIAL, STALE, SYNCING = (
    TargetState.READY,
    TargetState.PARTIAL,
    TargetState.STALE,
    TargetState.SYNCING,
)
TIMEOUT_S = 0.3
SETTINGS = IngestSettings(replay_timeout_s=TIMEOUT_S)


@pytest.fixture
def vllm(kv_fixtures_dir) -> FixtureVersion:
    return FixtureVersion.load(kv_fixtures_dir, "vllm-0.33.0")


class Ingesting:
    def __init__(self, ledger: RecordingLedger, handle: IngestionHandle, fx: FixtureVersion):
        self.ledger = ledger
        self.handle = handle
        self.fx = fx
        (self.target,) = handle.sources
        self.counters: IngestCounters = handle.counters[self.target]

    @property
    def state(self) -> TargetState:
        return self.ledger.state(self.target)

    @property
    def states(self) -> list[TargetState]:
        return [s for s, _ in self.ledger.targets[self.target].states]

    def held(self) -> dict[str, str | None]:
        """Held blocks as fixture labels: label -> parent label."""
        names = {h: label for label, h in self.fx.labels.items()}
        held = self.ledger.targets[self.target].held
        return {names[h]: (names[p] if p is not None else None) for h, p in held.items()}

    async def until(self, predicate) -> None:
        await self.ledger.wait_until(predicate)

    async def until_applied(self, n: int, state: TargetState | None = None) -> None:
        await self.until(
            lambda: self.counters.batches_applied >= n and (state is None or self.state is state)
        )


@asynccontextmanager
async def ingesting(
    ctx: zmq.Context,
    pub: KvTestPublisher,
    fx: FixtureVersion,
    *,
    replay: bool = True,
    settings: IngestSettings = SETTINGS,
    topic: bytes = b"kv",
    rank: int = 0,
) -> AsyncIterator[Ingesting]:
    ledger = RecordingLedger()
    source = EventSource(
        worker="w0",
        rank=rank,
        family=fx.family,
        model="m",
        endpoint=pub.endpoint,
        replay_endpoint=pub.replay_endpoint if replay else None,
        topic=topic,
    )
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(
            partial(run_ingestion, [source], ledger, ctx=ctx, settings=settings)
        )
        yield Ingesting(ledger, handle, fx)
        nursery.cancel_scope.cancel()


def publisher(ctx: zmq.Context, fx: FixtureVersion, **kwargs):
    return running_publisher(ctx, replay_topic_frame=fx.replay_topic_frame, **kwargs)


# --- history and gaps ----------------------------------------------------------------


async def test_history_replayed_from_zero_makes_the_target_ready(ctx, fx):
    async with publisher(ctx, fx) as pub:
        for payload in fx.payloads[:6]:
            pub.publish(payload, deliver=False)  # before anyone subscribed
        async with ingesting(ctx, pub, fx) as ing:
            await ing.until_applied(6, READY)
            assert ing.held() == {"A1": None, "A2": "A1"}
            assert pub.replay_requests == [0]
            assert ing.states == [SYNCING, READY]
            await pub.wait_subscribed(b"kv")
            pub.publish(fx.payloads[6])
            await ing.until_applied(7)
            assert ing.held() == {}
            assert ing.state is READY
            c = ing.counters
            assert (c.messages, c.gaps, c.duplicates, c.decode_errors) == (1, 0, 0, 0)
            assert (c.unknown_parent, c.unknown_removal, c.unknown_events) == (0, 0, 0)
            assert (c.stored_blocks, c.removed_blocks) == (5, 3)  # B3, C2, A2; the clear is no removal


async def test_dropped_batch_is_a_gap_that_replay_closes(ctx, fx):
    async with publisher(ctx, fx) as pub, ingesting(ctx, pub, fx) as ing:
        await ing.until(lambda: ing.state is READY)  # nothing published yet
        await pub.wait_subscribed()
        pub.publish(fx.payloads[0])
        pub.publish(fx.payloads[1])
        pub.publish(fx.payloads[2], deliver=False)
        for payload in fx.payloads[3:6]:
            pub.publish(payload)
        await ing.until_applied(6, READY)
        assert ing.held() == {"A1": None, "A2": "A1"}
        assert pub.replay_requests == [0, 2]
        assert ing.states == [SYNCING, READY, STALE, READY]
        c = ing.counters
        assert (c.gaps, c.gaps_repaired, c.gaps_unrepaired) == (1, 1, 0)
        assert (c.unknown_parent, c.unknown_removal) == (0, 0)


async def test_reordered_batch_is_repaired_and_its_late_copy_dropped(ctx, vllm):
    fx = vllm
    async with publisher(ctx, fx) as pub, ingesting(ctx, pub, fx) as ing:
        await ing.until(lambda: ing.state is READY)
        await pub.wait_subscribed()
        pub.publish(fx.payloads[0])
        pub.publish(fx.payloads[1], deliver=False)
        pub.publish(fx.payloads[2])
        pub.resend(1)  # arrives late
        pub.publish(fx.payloads[3])
        await ing.until_applied(4, READY)
        assert ing.held() == {"A1": None, "A2": "A1", "C2": "A1"}
        assert ing.counters.replay_overlap >= 1 and ing.counters.duplicates == 0


async def test_replay_buffer_too_short_drops_entries_and_goes_partial(ctx, fx):
    async with publisher(ctx, fx, buffer_steps=2) as pub, ingesting(ctx, pub, fx) as ing:
        await ing.until(lambda: ing.state is READY)
        await pub.wait_subscribed()
        pub.publish(fx.payloads[0])
        pub.publish(fx.payloads[1])
        for payload in fx.payloads[2:5]:
            pub.publish(payload, deliver=False)
        pub.publish(fx.payloads[5])  # the buffer now holds only 4 and 5
        await ing.until_applied(3, PARTIAL)
        c = ing.counters
        assert (c.gaps, c.gaps_unrepaired, c.replay_unrecoverable) == (1, 1, 1)
        assert ing.held() == {}  # A1 was dropped, so seq 5 (A2 under A1) could not be stored
        assert c.unknown_parent == 1
        assert ing.states == [SYNCING, READY, STALE, PARTIAL]
        pub.publish(fx.payloads[6])  # AllBlocksCleared: the engine's cache is known empty
        await ing.until_applied(4, READY)
        assert ing.held() == {}


# --- refused and truncated replays ---------------------------------------------------


async def test_history_replay_refused_is_partial_within_the_timeout(ctx, fx):
    async with publisher(ctx, fx, replay_mode=ReplayMode.SILENT) as pub:
        for payload in fx.payloads[:3]:
            pub.publish(payload, deliver=False)
        start = trio.current_time()
        async with ingesting(ctx, pub, fx) as ing:
            await ing.until(lambda: ing.state is PARTIAL)
            assert trio.current_time() - start < TIMEOUT_S + 1.0
            assert ing.counters.replay_refused == 1 and ing.held() == {}
            await pub.wait_subscribed()
            for payload in fx.payloads[3:6]:
                pub.publish(payload)  # joined mid-stream: accepted, not a gap
            await ing.until_applied(3)
            c = ing.counters
            assert c.gaps == 0 and c.unknown_removal == 3 and c.unknown_parent == 1
            assert ing.state is PARTIAL
            pub.publish(fx.payloads[6])
            await ing.until_applied(4, READY)


async def test_gap_replay_refused_drops_entries(ctx, vllm):
    fx = vllm
    async with publisher(ctx, fx) as pub, ingesting(ctx, pub, fx) as ing:
        await ing.until(lambda: ing.state is READY)
        await pub.wait_subscribed()
        pub.replay_mode = ReplayMode.SILENT
        pub.publish(fx.payloads[0])
        pub.publish(fx.payloads[1], deliver=False)
        pub.publish(fx.payloads[2])  # C2 under A1
        start = trio.current_time()
        await ing.until_applied(2, PARTIAL)
        assert trio.current_time() - start < TIMEOUT_S + 1.0
        c = ing.counters
        assert (c.replay_refused, c.gaps_unrepaired) == (1, 1)
        assert ing.held() == {}  # A1, A2 dropped; C2's parent unknown
        assert c.unknown_parent == 1


async def test_history_replay_without_end_marker_is_partial_with_its_batches(ctx, fx):
    async with publisher(ctx, fx, replay_mode=ReplayMode.NO_END_MARKER) as pub:
        for payload in fx.payloads[:3]:
            pub.publish(payload, deliver=False)
        start = trio.current_time()
        async with ingesting(ctx, pub, fx) as ing:
            await ing.until_applied(3, PARTIAL)
            assert TIMEOUT_S <= trio.current_time() - start < TIMEOUT_S + 1.0
            assert ing.held() == {"A1": None, "A2": "A1", "B3": "A2", "C2": "A1"}
            assert ing.counters.replay_truncated == 1


async def test_without_replay_endpoint_a_late_joiner_is_partial(ctx, vllm):
    fx = vllm
    async with publisher(ctx, fx) as pub, ingesting(ctx, pub, fx, replay=False) as ing:
        await pub.wait_subscribed()
        pub.publish(fx.payloads[0], deliver=False)
        pub.publish(fx.payloads[1])
        await ing.until_applied(1, PARTIAL)
        assert ing.held() == {} and ing.counters.unknown_parent == 1
        assert pub.replay_requests == []


# --- duplicates, restarts, garbage, topics, ranks ------------------------------------


async def test_duplicate_is_dropped(ctx, fx):
    async with publisher(ctx, fx) as pub, ingesting(ctx, pub, fx) as ing:
        await ing.until(lambda: ing.state is READY)
        await pub.wait_subscribed()
        pub.publish(fx.payloads[0])
        pub.resend(0)
        pub.publish(fx.payloads[1])
        await ing.until_applied(2)
        assert ing.counters.duplicates == 1
        assert ing.held() == {"A1": None, "A2": "A1", "B3": "A2"}
        assert ing.state is READY and ing.counters.unknown_parent == 0


async def test_restart_at_zero_drops_the_old_entries(ctx, fx):
    async with publisher(ctx, fx) as pub:
        for payload in fx.payloads[:3]:
            pub.publish(payload, deliver=False)
        async with ingesting(ctx, pub, fx) as ing:
            await ing.until_applied(3, READY)
            assert set(ing.held()) == {"A1", "A2", "B3", "C2"}
            await pub.wait_subscribed()
            drops = ing.ledger.targets[ing.target].drops
            pub.restart()
            pub.publish(with_ts(fx.payloads[0], 1.0))
            await ing.until_applied(4)
            assert ing.counters.restarts == 1
            assert ing.ledger.targets[ing.target].drops == drops + 1
            assert ing.held() == {"A1": None, "A2": "A1"}
            assert ing.state is READY


async def test_restart_first_seen_after_zero_fetches_the_new_history(ctx, vllm):
    fx = vllm
    async with publisher(ctx, fx) as pub:
        for payload in fx.payloads[:3]:
            pub.publish(payload, deliver=False)
        async with ingesting(ctx, pub, fx) as ing:
            await ing.until_applied(3, READY)
            await pub.wait_subscribed()
            pub.restart()
            pub.publish(with_ts(fx.payloads[0], 1.0), deliver=False)
            pub.publish(with_ts(fx.payloads[1], 2.0))
            await ing.until(lambda: ing.counters.restarts == 1 and ing.state is READY)
            assert ing.held() == {"A1": None, "A2": "A1", "B3": "A2"}
            assert pub.replay_requests == [0, 0]
            assert ing.states[-2:] == [SYNCING, READY]


async def test_garbage_frames_and_payloads_are_counted_and_survived(ctx, fx):
    async with publisher(ctx, fx) as pub, ingesting(ctx, pub, fx) as ing:
        await ing.until(lambda: ing.state is READY)
        await pub.wait_subscribed()
        pub.send_frames([b"kv", b"\x00\x01"])  # two frames
        pub.send_frames([b"kv", b"\x00\x00\x00", fx.payloads[0]])  # 3-byte seq
        pub.send_frames([b"kv", bytes(8), fx.payloads[0], b"extra"])  # four frames
        pub.publish(b"\xc1 not msgpack")  # seq 0: its events are lost
        pub.publish(fx.payloads[1])  # seq 1: B3 under A2, whose store was lost
        await ing.until_applied(1, PARTIAL)
        c = ing.counters
        assert (c.malformed_frames, c.decode_errors, c.messages) == (3, 1, 5)
        assert c.unknown_parent == 1 and ing.held() == {}
        pub.publish(fx.payloads[6])  # seq 2: AllBlocksCleared
        await ing.until_applied(2, READY)


async def test_topic_filter_keeps_other_topics_out(ctx, vllm):
    fx = vllm
    async with publisher(ctx, fx) as pub, ingesting(ctx, pub, fx, topic=b"kv") as ing:
        await ing.until(lambda: ing.state is READY)
        await pub.wait_subscribed()
        pub.send_frames([b"other", bytes(8), fx.payloads[0]])
        pub.send_frames([b"k", bytes(8), fx.payloads[0]])
        pub.publish(fx.payloads[0])
        await ing.until_applied(1)
        assert ing.counters.messages == 1  # the foreign topics never reached the task
        assert ing.held() == {"A1": None, "A2": "A1"}


async def test_replay_reply_with_a_foreign_topic_is_not_trusted(ctx, vllm):
    fx = vllm
    async with publisher(ctx, fx, replay_topic=b"zz") as pub:
        assert fx.replay_topic_frame
        for payload in fx.payloads[:2]:
            pub.publish(payload, deliver=False)
        async with ingesting(ctx, pub, fx) as ing:
            await ing.until(lambda: ing.state is PARTIAL)
            assert ing.counters.topic_mismatch == 2 and ing.held() == {}


async def test_batch_of_another_dp_rank_is_counted(ctx, fx):
    async with publisher(ctx, fx) as pub, ingesting(ctx, pub, fx) as ing:
        await ing.until(lambda: ing.state is READY)
        await pub.wait_subscribed()
        pub.publish(fx.rank3_payload)
        pub.publish(fx.payloads[1])
        await ing.until_applied(2)
        assert ing.counters.rank_mismatch == 1


# --- fairness --------------------------------------------------------------------------


async def test_busy_stream_does_not_starve_the_event_loop(ctx, vllm):
    """Thousands of queued batches are processed in turns of at most max_messages_per_turn;
    another task keeps running between turns."""
    fx = vllm
    n, per_turn = 3000, 32
    settings = IngestSettings(max_messages_per_turn=per_turn, replay_timeout_s=TIMEOUT_S)
    ledger = RecordingLedger()
    counters = IngestCounters()
    samples: list[int] = []

    async def ticker() -> None:
        while True:
            samples.append(counters.messages)
            await trio.lowlevel.checkpoint()

    async with publisher(ctx, fx) as pub:
        source = EventSource("w0", 0, fx.family, "m", pub.endpoint, None, b"kv")
        target = ledger.register("w0", 0, fx.family, "m")
        async with trio.open_nursery() as nursery:
            await nursery.start(
                partial(
                    run_source, source, target, ledger, ctx=ctx, settings=settings,
                    counters=counters,
                )
            )
            await pub.wait_subscribed()
            nursery.start_soon(ticker)
            for _ in range(n):  # all queued at once, no checkpoint in between
                pub.publish(fx.payloads[0])
            await ledger.wait_until(lambda: counters.batches_applied == n, timeout_s=20)
            nursery.cancel_scope.cancel()
    steps = [b - a for a, b in itertools.pairwise(samples)]
    assert counters.messages == n
    assert max(steps) <= 2 * per_turn
    assert len({s for s in samples if 0 < s < n}) >= n // (2 * per_turn)


async def test_a_refused_history_is_asked_again_until_it_comes(ctx, fx):
    """Issue 22 §11: a replay endpoint nobody answered at start left the ledger PARTIAL for
    good; it is asked again (with backoff) and the history, once it comes, makes it READY."""
    retry = dataclasses.replace(SETTINGS, history_retry_s=0.3)
    async with publisher(ctx, fx, replay_mode=ReplayMode.SILENT) as pub:
        for payload in fx.payloads[:6]:
            pub.publish(payload, deliver=False)
        async with ingesting(ctx, pub, fx, settings=retry) as ing:
            await ing.until(lambda: ing.state is PARTIAL)
            pub.replay_mode = ReplayMode.ANSWER  # the engine's replay answers now
            await ing.until_applied(6, READY)
            assert ing.counters.replay_refused >= 1
            assert ing.held() == {"A1": None, "A2": "A1"}


async def test_a_stream_from_zero_proves_itself_whole_when_the_replay_is_silent(ctx, fx):
    """Cortex started before the engine published anything, its replay silent: the first live
    batch is sequence 0, so nothing was missed: READY without any replay."""
    async with publisher(ctx, fx, replay_mode=ReplayMode.SILENT) as pub:
        async with ingesting(ctx, pub, fx) as ing:
            await ing.until(lambda: ing.state is PARTIAL)
            await pub.wait_subscribed()
            pub.publish(fx.payloads[0])
            await ing.until_applied(1, READY)
