"""Warm start from a peer replica (issue 7 §2) over real sockets: replica A serves its ledger
snapshot on ``/admin/ledger/snapshot``; replica B, started against the same busy simulated
engines, loads it and continues by replay from the snapshot's sequence numbers — READY with
the engines' truth and without replaying history from 0 — or, when the engines' replay buffer
no longer reaches back to the snapshot, discards it and takes the normal path (no false hit).
"""

from __future__ import annotations

import socket
from dataclasses import replace
from functools import partial

import trio

from cortex.app import Running, run_gateway
from cortex.config.tree import CortexConfig
from cortex.control.app import ControlApp
from cortex.control.auth import BearerAuth
from cortex.control.serve import serve_control
from cortex.ledger.snapshot import decode
from cortex.ledger.state import TargetState
from cortex.metrics.cortex_metrics import CortexMetrics
from cortex.sim.kv_engine import SimEndpointConfig
from tests.front_http_client import RawClient
from tests.gateway_cluster import (
    Cluster,
    all_ready,
    engine_keys,
    gateway_cluster,
    ledger_keys,
    wait_for,
)

TOKEN = "test-token"  # gateway_cluster's admin token


def chat(n: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": f"Conversation {n}. " * 20},
            {"role": "user", "content": f"Question {n}?"}]


async def traffic(cluster: Cluster, first: int, count: int) -> None:
    for n in range(first, first + count):
        response = await cluster.chat(chat(n))
        assert response.status == 200, response.body


def warm_config(cluster: Cluster, url: str) -> CortexConfig:
    config = cluster.config
    return replace(config, ledger=replace(config.ledger, warm_start_url=url,
                                          warm_start_token=TOKEN))


async def get_snapshot(port: int, token: str | None = TOKEN) -> tuple[int, bytes]:
    client = await RawClient.connect(port)
    try:
        headers = [] if token is None else [(b"authorization", f"Bearer {token}".encode())]
        response = await client.request(b"GET", b"/admin/ledger/snapshot", b"", headers)
        return response.status, response.body
    finally:
        await client.aclose()


async def test_replica_b_continues_replica_a_snapshot_without_replaying_history():
    async with gateway_cluster(("vllm-0.33", "sglang-0.5.23")) as cluster:
        await traffic(cluster, 0, 48)  # a history far longer than what follows the snapshot
        a = cluster.running
        await wait_for(a, lambda: all(ledger_keys(a, e.name) == engine_keys(e)
                                      for e in cluster.engines), 20)
        assert (await get_snapshot(a.control_port, token=None))[0] == 401
        status, body = await get_snapshot(a.control_port)
        assert status == 200
        snapshot = decode(body)
        assert {image.worker for image in snapshot.targets} == {e.name for e in cluster.engines}
        assert all(image.state == "ready" and image.last_seq > 0 for image in snapshot.targets)

        publishers = {e.name: e.kv.publisher(0) for e in cluster.engines}
        published = {name: p.next_seq for name, p in publishers.items()}
        replayed = {name: p.counters.replayed for name, p in publishers.items()}
        assert min(published.values()) >= 20
        url = f"http://127.0.0.1:{a.control_port}"
        async with trio.open_nursery() as nursery:
            # The engines stay busy while B starts.
            nursery.start_soon(traffic, cluster, 100, 8)
            b: Running = await nursery.start(run_gateway, warm_config(cluster, url))
            await wait_for(b, lambda: all_ready(b), 20)
            await traffic(cluster, 200, 4)  # B's ledger follows the live stream from there
            await wait_for(b, lambda: all(ledger_keys(b, e.name) == engine_keys(e)
                                          for e in cluster.engines), 20)
            for engine in cluster.engines:
                target = b.book.find(engine.name, 0)
                assert b.book.state(target) is TargetState.READY
                counters = b.ingest_counters[target]
                assert (counters.snapshot_continued, counters.snapshot_discarded) == (1, 0)
                assert counters.replay_unrecoverable == 0
                # Not replayed from 0: the engine re-sent only what followed the snapshot
                # (plus what the traffic added), fewer batches than it had published before.
                resent = publishers[engine.name].counters.replayed - replayed[engine.name]
                assert resent < published[engine.name]
                assert counters.batches_applied < published[engine.name]
            assert b.book.warm_start_failures == 0
            nursery.cancel_scope.cancel()


async def serve_recorded(body: bytes, *, task_status: trio.TaskStatus[int]) -> None:
    """A peer's control plane answering with a snapshot recorded earlier."""
    app = ControlApp(metrics=CortexMetrics(), readiness=lambda: None,  # type: ignore[arg-type]
                     auth=BearerAuth(TOKEN), snapshot=lambda: body)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(partial(serve_control, app, "127.0.0.1", 0))
        task_status.started(port)


async def test_a_snapshot_the_replay_buffer_no_longer_reaches_is_discarded():
    small = SimEndpointConfig(buffer_steps=4)
    async with gateway_cluster(("vllm-0.33", "sglang-0.5.23"), kv_endpoints=small) as cluster:
        a = cluster.running
        await traffic(cluster, 0, 8)
        await wait_for(a, lambda: all(ledger_keys(a, e.name) == engine_keys(e)
                                      for e in cluster.engines), 20)
        status, recorded = await get_snapshot(a.control_port)
        assert status == 200 and len(decode(recorded).targets) == 2
        before = {e.name: e.kv.publisher(0).next_seq for e in cluster.engines}
        await traffic(cluster, 100, 16)  # the engines move on, past their 4-batch buffers
        await wait_for(a, lambda: all(e.kv.publisher(0).next_seq > before[e.name] + 4
                                      for e in cluster.engines), 20)
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_recorded, recorded)
            b: Running = await nursery.start(
                run_gateway, warm_config(cluster, f"http://127.0.0.1:{port}"))

            def settled() -> bool:
                return all(b.book.state(b.book.find(e.name, 0)) in
                           (TargetState.PARTIAL, TargetState.READY) for e in cluster.engines)

            await wait_for(b, settled, 20)
            await traffic(cluster, 200, 4)
            for engine in cluster.engines:
                target = b.book.find(engine.name, 0)
                counters = b.ingest_counters[target]
                assert (counters.snapshot_continued, counters.snapshot_discarded) == (0, 1)
                # Normal path: history from 0, which a 4-batch buffer no longer holds.
                assert b.book.state(target) is TargetState.PARTIAL
            for engine in cluster.engines:  # a lower bound only: no false hit
                assert ledger_keys(b, engine.name) <= engine_keys(engine)
            nursery.cancel_scope.cancel()


async def test_an_unreachable_peer_is_counted_and_ignored():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    async with gateway_cluster(("sglang-0.5.23",)) as cluster:
        await traffic(cluster, 0, 4)
        async with trio.open_nursery() as nursery:
            b: Running = await nursery.start(
                run_gateway, warm_config(cluster, f"http://127.0.0.1:{dead}"))
            await wait_for(b, lambda: all_ready(b), 20)
            assert b.book.warm_start_failures == 1
            target = b.book.find(cluster.engines[0].name, 0)
            counters = b.ingest_counters[target]
            assert counters.snapshot_continued == counters.snapshot_discarded == 0
            await traffic(cluster, 100, 4)
            engine = cluster.engines[0]
            await wait_for(b, lambda: ledger_keys(b, engine.name) == engine_keys(engine), 20)
            # One subscriber per stream (a worker's ingestion used to start twice).
            assert counters.messages <= engine.kv.publisher(0).next_seq
            nursery.cancel_scope.cancel()
