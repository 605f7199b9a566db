"""A simulated engine over real loopback ZeroMQ, read with plain pyzmq and Cortex's decoder.

No sleeping for readiness: engines start with ``nursery.start``; a subscriber is known to be
connected once it has received something (``_connect_sub`` publishes cache clears, which change
nothing in an empty cache, until one arrives). Absence of a message is checked with a short
bounded wait.
"""

from __future__ import annotations

import dataclasses
import errno
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import zmq

from cortex.events import zmq_trio
from cortex.events.decoder import decode_payload
from cortex.events.frames import encode_replay_request, parse_live_frames, parse_replay_reply
from cortex.ledger.kv_events import (
    AllBlocksCleared,
    BlockStored,
    EventBatch,
    LiveMessage,
    ReplayEnd,
    ReplayItem,
)
from cortex.sim import publisher as publisher_module
from cortex.sim.kv_engine import SimEndpointConfig, SimHashConfig, SimKVEngine
from cortex.sim.publisher import bind_rank_sockets, find_free_port_range
from cortex.sim.wire import PROFILES

CTX = zmq.Context.instance()
QUIET_S = 0.15  # how long "nothing arrives" is watched


@asynccontextmanager
async def running(profile: str = "vllm-0.33", **kwargs: Any) -> AsyncIterator[SimKVEngine]:
    kwargs.setdefault("block_size", 4)
    kwargs.setdefault("topic", "kv")
    kwargs.setdefault("rng", random.Random(1234))
    engine = SimKVEngine(profile, **kwargs)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            yield engine
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def socket(kind: int, endpoint: str) -> AsyncIterator[zmq.Socket]:
    sock = CTX.socket(kind)
    sock.linger = 0
    if kind == zmq.SUB:
        sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(endpoint)
    try:
        yield sock
    finally:
        sock.close()


async def _recv(sock: zmq.Socket, timeout: float = 3.0) -> LiveMessage:
    with trio.fail_after(timeout):
        return parse_live_frames(await zmq_trio.recv_multipart(sock))


async def _nothing_arrives(sock: zmq.Socket) -> bool:
    with trio.move_on_after(QUIET_S):
        await zmq_trio.recv_multipart(sock)
        return False
    return True


async def _connect_sub(engine: SimKVEngine, rank: int, sub: zmq.Socket) -> None:
    """Publish clears until the SUB sees one, then drain up to the last one published."""
    while True:
        engine.clear(rank)
        with trio.move_on_after(0.05):
            message = await zmq_trio.recv_multipart(sub)
            break
    last = engine.publisher(rank).next_seq - 1
    seq = parse_live_frames(message).seq
    while seq < last:
        seq = (await _recv(sub)).seq


async def _replay(endpoint: str, start_seq: int) -> list[ReplayItem]:
    items: list[ReplayItem] = []
    async with socket(zmq.DEALER, endpoint) as dealer:
        await zmq_trio.send_multipart(dealer, encode_replay_request(start_seq))
        with trio.fail_after(3):
            while True:
                reply = parse_replay_reply(await zmq_trio.recv_multipart(dealer))
                if isinstance(reply, ReplayEnd):
                    return items
                items.append(reply)



def _plain(events) -> list:
    """Decoded events with their token ids as lists (the decoder gives ``array('I')``), to
    compare with the events the simulated cache produced."""
    return [
        dataclasses.replace(e, token_ids=list(e.token_ids)) if isinstance(e, BlockStored) else e
        for e in events
    ]

def _decode(engine: SimKVEngine, payload: bytes) -> EventBatch:
    return decode_payload(payload, engine.profile.family)


@pytest.mark.parametrize("profile", sorted(PROFILES))
async def test_live_batches_carry_what_the_cache_did(profile: str) -> None:
    async with running(profile) as engine, socket(zmq.SUB, engine.endpoints(0).pub) as sub:
        await _connect_sub(engine, 0, sub)
        first_seq = engine.publisher(0).next_seq
        results = [
            engine.submit(0, [1, 2, 3, 4, 5, 6, 7, 8]),
            engine.submit(0, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], cache_salt=None),
            engine.submit(0, [1, 2, 3, 4, 5]),  # hits, stores nothing: no batch
            engine.submit(0, [7, 7, 7, 7, 7], cache_salt="tenant"),
        ]
        assert [bool(r.events) for r in results] == [True, True, False, True]
        for offset, result in enumerate(r for r in results if r.events):
            message = await _recv(sub)
            assert (message.topic, message.seq) == (b"kv", first_seq + offset)
            batch = _decode(engine, message.payload)
            assert batch.dp_rank == 0 and batch.unknown_fields == 0
            assert _plain(batch.events) == result.events
        assert engine.stats(0).blocks_stored == 4
        assert await _nothing_arrives(sub)


async def test_bytes_hashes_decode_to_the_int_values() -> None:
    hashing = SimHashConfig(int_block_hashes=False)
    async with running("vllm-0.23", hashing=hashing, capacity_blocks=2) as engine:
        engine.submit(0, [1, 2, 3, 4, 5, 6, 7, 8])
        evicting = engine.submit(0, [9, 9, 9, 9])
        (first, second) = await _replay(engine.endpoints(0).replay or "", 0)
        assert b"\xc4\x20" in first.payload  # msgpack bin8 of 32 bytes
        assert _plain(_decode(engine, second.payload).events) == evicting.events


@pytest.mark.parametrize(("profile", "topic"), [("sglang-0.5.23", b"kv"), ("sglang-0.5.19", None)])
async def test_replay_returns_buffered_batches_in_the_profiles_generation(
    profile: str, topic: bytes | None
) -> None:
    endpoints = SimEndpointConfig(buffer_steps=3)
    async with running(profile, endpoints=endpoints) as engine:
        replay = engine.endpoints(0).replay
        assert replay is not None
        for n in range(4):  # seq 0..3; the buffer keeps 1..3
            engine.submit(0, [n] * 4)
        buffered = engine.publisher(0).buffered()
        items = await _replay(replay, 2)
        assert [(i.seq, i.payload, i.topic) for i in items] == [
            (seq, payload, topic) for seq, payload in buffered if seq >= 2
        ]
        assert [i.seq for i in await _replay(replay, 0)] == [1, 2, 3]  # oldest buffered on
        assert await _replay(replay, 4) == []  # beyond everything: only the end marker
        assert engine.publisher(0).counters.replay_requests == 3


async def test_malformed_replay_requests_get_no_answer() -> None:
    async with running() as engine:
        engine.submit(0, [1, 2, 3, 4])
        async with socket(zmq.DEALER, engine.endpoints(0).replay or "") as dealer:
            await zmq_trio.send_multipart(dealer, [(0).to_bytes(8, "big")])  # no delimiter
            await zmq_trio.send_multipart(dealer, [b"", b"\x00"])  # short seq
            await zmq_trio.send_multipart(dealer, encode_replay_request(0))
            with trio.fail_after(3):
                first = parse_replay_reply(await zmq_trio.recv_multipart(dealer))
                end = parse_replay_reply(await zmq_trio.recv_multipart(dealer))
            assert isinstance(first, ReplayItem) and first.seq == 0 and isinstance(end, ReplayEnd)
            assert await _nothing_arrives(dealer)
        assert engine.publisher(0).counters.malformed_requests == 2


async def test_dp_ranks_listen_on_base_plus_rank() -> None:
    async with running("vllm-0.25", dp_size=3) as engine:
        base, replay_base = engine.base_port, engine.replay_base_port
        assert base is not None and replay_base is not None
        for rank in range(3):
            endpoints = engine.endpoints(rank)
            assert endpoints.pub == f"tcp://127.0.0.1:{base + rank}"
            assert endpoints.replay == f"tcp://127.0.0.1:{replay_base + rank}"
        result = engine.submit(2, [5, 6, 7, 8])
        (item,) = await _replay(engine.endpoints(2).replay or "", 0)
        batch = _decode(engine, item.payload)
        assert batch.dp_rank == 2 and _plain(batch.events) == result.events
        assert await _replay(engine.endpoints(1).replay or "", 0) == []
        assert engine.truth(2) == {(None, None, (5, 6, 7, 8))} and engine.truth(0) == set()
        async with socket(zmq.SUB, engine.endpoints(1).pub) as sub:
            await _connect_sub(engine, 1, sub)
            engine.submit(1, [1, 1, 1, 1])
            assert _decode(engine, (await _recv(sub)).payload).dp_rank == 1


async def test_drop_keeps_the_batch_for_replay() -> None:
    async with running() as engine, socket(zmq.SUB, engine.endpoints(0).pub) as sub:
        await _connect_sub(engine, 0, sub)
        start = engine.publisher(0).next_seq
        engine.faults(0).drop_next(1)
        for n in range(3):
            engine.submit(0, [n] * 4)
        assert [(await _recv(sub)).seq for _ in range(2)] == [start + 1, start + 2]
        replayed = await _replay(engine.endpoints(0).replay or "", start)
        assert replayed[0].seq == start
        (lost,) = _decode(engine, replayed[0].payload).events
        assert isinstance(lost, BlockStored) and list(lost.token_ids) == [0] * 4
        assert engine.faults(0).counters.dropped == 1


async def test_duplicate_and_reorder() -> None:
    async with running("sglang-0.5.21") as engine, socket(zmq.SUB, engine.endpoints(0).pub) as sub:
        await _connect_sub(engine, 0, sub)
        faults, start = engine.faults(0), engine.publisher(0).next_seq
        faults.duplicate_next(1)
        engine.submit(0, [1] * 4)
        faults.reorder_next(1)
        engine.submit(0, [2] * 4)
        engine.submit(0, [3] * 4)
        seqs = [(await _recv(sub)).seq for _ in range(4)]
        assert seqs == [start, start, start + 2, start + 1]
        engine.publisher(0).reorder_max_hold_s = 0.05
        faults.reorder_next(1)
        engine.submit(0, [4] * 4)  # nothing follows: released after the hold time
        assert (await _recv(sub)).seq == start + 3


async def test_random_faults() -> None:
    async with running() as engine, socket(zmq.SUB, engine.endpoints(0).pub) as sub:
        await _connect_sub(engine, 0, sub)
        start = engine.publisher(0).next_seq
        engine.faults(0).probabilities.duplicate = 1.0
        engine.submit(0, [1] * 4)
        assert [(await _recv(sub)).seq for _ in range(2)] == [start, start]
        engine.faults(0).probabilities.duplicate = 0.0
        engine.faults(0).probabilities.drop = 1.0
        engine.submit(0, [2] * 4)
        assert await _nothing_arrives(sub)
        assert engine.publisher(0).next_seq == start + 2
        engine.faults(0).probabilities.drop = 0.0
        engine.faults(0).probabilities.stall = 1.0
        engine.faults(0).probabilities.stall_s = 0.1
        began = trio.current_time()
        engine.submit(0, [3] * 4)
        assert (await _recv(sub)).seq == start + 2
        assert trio.current_time() - began >= 0.1
        assert engine.faults(0).counters.stalled == 1


async def test_stall_and_pause_delay_but_lose_nothing() -> None:
    async with running() as engine, socket(zmq.SUB, engine.endpoints(0).pub) as sub:
        await _connect_sub(engine, 0, sub)
        publisher, start = engine.publisher(0), engine.publisher(0).next_seq
        publisher.stall(0.2)
        began = trio.current_time()
        engine.submit(0, [1] * 4)
        assert (await _recv(sub)).seq == start
        assert trio.current_time() - began >= 0.2
        publisher.pause()
        engine.submit(0, [2] * 4)
        engine.submit(0, [3] * 4)
        assert await _nothing_arrives(sub)
        publisher.resume()
        assert [(await _recv(sub)).seq for _ in range(2)] == [start + 1, start + 2]


async def test_restart_resets_sequence_buffer_and_cache_silently() -> None:
    async with running() as engine, socket(zmq.SUB, engine.endpoints(0).pub) as sub:
        await _connect_sub(engine, 0, sub)
        engine.submit(0, [1, 2, 3, 4])
        await _recv(sub)
        engine.publisher(0).pause()
        engine.submit(0, [5, 6, 7, 8])  # queued, never sent: lost with the old process
        engine.restart(0)
        engine.publisher(0).resume()
        assert engine.truth(0) == set() and engine.stats(0).restarts == 1
        again = engine.submit(0, [1, 2, 3, 4])
        assert again.cached_tokens == 0
        message = await _recv(sub)
        assert message.seq == 0
        assert _plain(_decode(engine, message.payload).events) == again.events
        assert not any(isinstance(e, AllBlocksCleared) for e in again.events)
        assert [i.seq for i in await _replay(engine.endpoints(0).replay or "", 0)] == [0]
        engine.restart_probability = 1.0
        engine.submit(0, [9] * 4)
        assert (await _recv(sub)).seq == 0 and engine.stats(0).restarts == 2


async def test_old_vllm_without_seed_hashes_differently_after_restart() -> None:
    async with running("vllm-0.23") as engine:
        before = engine.submit(0, [1, 2, 3, 4]).events[0]
        engine.restart(0)
        after = engine.submit(0, [1, 2, 3, 4]).events[0]
        assert isinstance(before, BlockStored) and isinstance(after, BlockStored)
        assert before.block_hashes != after.block_hashes
        assert before.token_ids == after.token_ids


async def test_engine_must_run_before_it_publishes() -> None:
    engine = SimKVEngine("vllm-0.33", block_size=4)
    with pytest.raises(RuntimeError):
        engine.submit(0, [1, 2, 3, 4])
    with pytest.raises(IndexError):
        engine.truth(1)
    with pytest.raises(ValueError):
        SimKVEngine("sglang-0.5.23", hashing=SimHashConfig(int_block_hashes=False))


def test_free_port_range_is_bindable() -> None:
    base = find_free_port_range(4)
    socks = [CTX.socket(zmq.PUB) for _ in range(4)]
    try:
        for offset, sock in enumerate(socks):
            sock.linger = 0
            sock.bind(f"tcp://127.0.0.1:{base + offset}")
    finally:
        for sock in socks:
            sock.close()


def test_binding_retries_when_a_probed_range_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    squatter = CTX.socket(zmq.PUB)
    squatter.linger = 0
    squatter.bind("tcp://127.0.0.1:*")
    taken = int(zmq_trio.bound_endpoint(squatter).rsplit(":", 1)[1])
    real = publisher_module.find_free_port_range
    answers = iter([taken])
    monkeypatch.setattr(
        publisher_module,
        "find_free_port_range",
        lambda count, host="127.0.0.1": next(answers, None) or real(count, host),
    )
    try:
        sockets, base, replay_base = bind_rank_sockets(CTX, 2)
        assert base != taken and replay_base == base + 2
        for s in sockets:
            s.pub.close()
            assert s.router is not None
            s.router.close()
        with pytest.raises(zmq.ZMQError) as explicit:
            bind_rank_sockets(CTX, 1, base_port=taken, replay=False)
        assert explicit.value.errno == errno.EADDRINUSE
    finally:
        squatter.close()


def test_free_port_ranges_come_from_below_the_ephemeral_range() -> None:
    """Outgoing connections take their ports from the kernel's ephemeral range: a busy host
    holds many odd ports there, so a run of six free ones is sought below it (the DP test
    failed with 'no 6 contiguous free ports' under a loaded CI run before)."""
    low, _ = publisher_module.ephemeral_port_range()
    for _ in range(5):
        base = find_free_port_range(6)
        assert 20_000 <= base and base + 6 <= low
