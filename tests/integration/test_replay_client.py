"""cortex.events.replay.fetch_replay against a real loopback ROUTER, both reply generations."""

from __future__ import annotations

import pytest
import trio
import zmq

from cortex.events import zmq_trio
from cortex.events.replay import ReplayOutcome, fetch_replay
from cortex.ledger.kv_events import ReplayItem
from tests.kv_test_publisher import ReplayMode, running_publisher

TIMEOUT_S = 0.3


async def test_replay_from_three_returns_the_buffered_payloads_and_the_end(ctx, fx):
    async with running_publisher(ctx, replay_topic_frame=fx.replay_topic_frame) as pub:
        for payload in fx.payloads:
            pub.publish(payload, deliver=False)
        outcome = await fetch_replay(ctx, pub.replay_endpoint, 3, timeout_s=5.0)
    assert outcome.ended and not outcome.refused and not outcome.truncated
    assert [i.seq for i in outcome.items] == [3, 4, 5, 6]
    assert [i.payload for i in outcome.items] == list(fx.payloads[3:])
    expected_topic = b"kv" if fx.replay_topic_frame else None
    assert {i.topic for i in outcome.items} == {expected_topic}
    assert outcome.contiguous_from() == outcome.items
    assert pub.replay_requests == [3]


async def test_max_items_stops_reading_before_the_end_marker(ctx, fx):
    async with running_publisher(ctx, replay_topic_frame=fx.replay_topic_frame) as pub:
        for payload in fx.payloads:
            pub.publish(payload, deliver=False)
        outcome = await fetch_replay(ctx, pub.replay_endpoint, 1, timeout_s=5.0, max_items=2)
    assert [i.seq for i in outcome.items] == [1, 2]
    assert outcome.truncated


async def test_start_beyond_the_buffer_gets_only_the_end_marker(ctx):
    async with running_publisher(ctx) as pub:
        pub.publish(b"\x93\xcb" + bytes(8) + b"\x90\x00", deliver=False)
        outcome = await fetch_replay(ctx, pub.replay_endpoint, 5, timeout_s=5.0)
    assert outcome.items == () and outcome.ended and outcome.first_seq is None


async def test_buffer_that_no_longer_reaches_back_starts_later(ctx, fx):
    async with running_publisher(
        ctx, replay_topic_frame=fx.replay_topic_frame, buffer_steps=2
    ) as pub:
        for payload in fx.payloads:
            pub.publish(payload, deliver=False)
        outcome = await fetch_replay(ctx, pub.replay_endpoint, 0, timeout_s=5.0)
    assert outcome.first_seq == 5 and outcome.ended
    assert outcome.contiguous_from() == ()
    assert [i.seq for i in outcome.contiguous_from(5)] == [5, 6]


async def test_silent_router_is_refused_at_the_deadline(ctx):
    async with running_publisher(ctx, replay_mode=ReplayMode.SILENT) as pub:
        pub.publish(b"x", deliver=False)
        start = trio.current_time()
        outcome = await fetch_replay(ctx, pub.replay_endpoint, 0, timeout_s=TIMEOUT_S)
        elapsed = trio.current_time() - start
    assert outcome.refused and not outcome.ended and outcome.items == ()
    assert TIMEOUT_S <= elapsed < TIMEOUT_S + 1.0
    assert pub.replay_requests == [0]


async def test_nobody_listening_is_refused(ctx):
    probe = ctx.socket(zmq.ROUTER)
    probe.bind("tcp://127.0.0.1:*")
    endpoint = zmq_trio.bound_endpoint(probe)
    probe.close(linger=0)
    outcome = await fetch_replay(ctx, endpoint, 0, timeout_s=TIMEOUT_S)
    assert outcome.refused


async def test_missing_end_marker_is_truncated_not_refused(ctx, fx):
    async with running_publisher(
        ctx, replay_topic_frame=fx.replay_topic_frame, replay_mode=ReplayMode.NO_END_MARKER
    ) as pub:
        for payload in fx.payloads[:3]:
            pub.publish(payload, deliver=False)
        outcome = await fetch_replay(ctx, pub.replay_endpoint, 0, timeout_s=TIMEOUT_S)
    assert [i.seq for i in outcome.items] == [0, 1, 2]
    assert outcome.truncated and not outcome.refused


async def test_malformed_replies_are_counted_and_skipped(ctx):
    async with running_publisher(ctx) as pub:
        pub.replay_garbage = [[b"", b"\x00\x01", b"p"], [b"junk"], [b"x", b"kv", bytes(8), b"p"]]
        pub.publish(b"payload", deliver=False)
        outcome = await fetch_replay(ctx, pub.replay_endpoint, 0, timeout_s=5.0)
    assert outcome.malformed_frames == 3
    assert [i.payload for i in outcome.items] == [b"payload"] and outcome.ended


async def test_only_malformed_replies_are_not_a_refusal(ctx):
    async with running_publisher(ctx, replay_mode=ReplayMode.SILENT) as pub:
        pub.replay_mode = ReplayMode.NO_END_MARKER
        pub.replay_garbage = [[b"junk"]]
        outcome = await fetch_replay(ctx, pub.replay_endpoint, 0, timeout_s=TIMEOUT_S)
    assert not outcome.refused and outcome.truncated and outcome.malformed_frames == 1


async def test_max_items_must_be_positive(ctx):
    with pytest.raises(ValueError):
        await fetch_replay(ctx, "tcp://127.0.0.1:1", 0, max_items=0)


def test_contiguous_from_stops_at_the_first_hole():
    items = tuple(ReplayItem(seq=s, payload=b"", topic=None) for s in (2, 3, 5))
    outcome = ReplayOutcome(start_seq=2, items=items, ended=True, refused=False)
    assert [i.seq for i in outcome.contiguous_from()] == [2, 3]
    assert outcome.contiguous_from(3) == ()
