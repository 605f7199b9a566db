"""Two Cortex replicas in front of the same simulated engines tell each other what they route,
over real ZeroMQ (``cortex.replicas.sync``): a request in flight through one is counted by the
other on the same worker, and its new prompt blocks are credited there, so the other sends the
same prompt to the worker computing it; when it ends the count goes; a replica that stops is
dropped from the other's view after ``peer_timeout_s`` (its requests no longer counted), and
``/metrics`` shows the view."""

from __future__ import annotations

import json
import socket
from dataclasses import replace

import trio

from cortex.app import run_gateway
from cortex.replicas.settings import ReplicaSettings
from cortex.replicas.sync import ReplicaSync
from cortex.scheduling.inflight import PendingWork
from cortex.sim.serving import TimingConfig
from tests.front_http_client import RawClient
from tests.gateway_cluster import MODEL, all_ready, gateway_cluster, wait_for

SLOW = TimingConfig(prefill_tokens_per_s=1e6, decode_s_per_token=0.25, max_running=64)
SYNC = {"heartbeat_s": 0.1, "peer_timeout_s": 2.0}
CHAT = [{"role": "system", "content": "A herd's new prefix. " * 60},
        {"role": "user", "content": "Which worker computes it?"}]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def chat(port: int, messages: list[dict[str, str]]) -> tuple[int, str]:
    client = await RawClient.connect(port)
    try:
        response = await client.request(
            b"POST", b"/v1/chat/completions",
            json.dumps({"model": MODEL, "messages": messages, "max_tokens": 4}).encode(),
            [(b"content-type", b"application/json")])
        return response.status, response.header(b"x-cortex-assigned-worker").decode()
    finally:
        await client.aclose()


async def test_replicas_count_each_others_requests_and_drop_a_silent_one():
    b_endpoint = f"tcp://127.0.0.1:{free_port()}"
    a_sync = ReplicaSettings(listen="tcp://127.0.0.1:*", peers=b_endpoint, **SYNC)
    async with gateway_cluster(("vllm-0.33", "sglang-0.5.23"), timing=SLOW,
                               config_changes={"replicas": a_sync}) as cluster:
        a = cluster.running
        assert a.replica_sync is not None
        b_sync = ReplicaSettings(listen=b_endpoint, peers=a.replica_sync.endpoint, **SYNC)
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                b_scope = trio.CancelScope()

                async def run_b(task_status=trio.TASK_STATUS_IGNORED):
                    with b_scope:
                        await run_gateway(replace(cluster.config, replicas=b_sync),
                                          task_status=task_status)

                b = await nursery.start(run_b)
                await wait_for(b, lambda: all_ready(b), 20)
                await wait_for(a, lambda: a.replica_sync.figures().peers == 1
                               and b.replica_sync.figures().peers == 1, 20)
                b_pool = b.pools[MODEL]
                answers: list[tuple[int, str]] = []

                async def through(port: int, messages: list[dict[str, str]]) -> None:
                    answers.append(await chat(port, messages))

                def b_in_flight() -> int:
                    return sum(v.in_flight for v in b_pool.views())

                # A no longer routes to e0 (drained there only), so its request goes to e1,
                # in flight ~1 s (4 slow tokens); B, told nothing, would pick e0, the first of
                # a tie (checked without sync: e0 every time)
                assert (await cluster.admin(b"POST", b"/admin/workers/e0/drain")).status == 202
                nursery.start_soon(through, a.data_port, CHAT)
                await wait_for(b, lambda: b_in_flight() == 1, 10)
                assert b.replica_sync.figures().peer_requests == 1
                assert len(b_pool.pending.prefixes) == 1  # A's new prompt blocks, credited
                await through(b.data_port, CHAT)  # the same prompt through B
                await wait_for(b, lambda: len(answers) == 2 and b.replica_sync.figures()
                               .peer_requests == 0, 10)
                assert answers == [(200, "e1"), (200, "e1")]  # B: where A's was computing
                assert b_in_flight() == 0

                text = (await cluster.admin(b"GET", b"/metrics")).body.decode()
                assert "cortex_replica_peers 1" in text
                assert "cortex_replica_messages_invalid_total 0" in text

                b_scope.cancel()  # B stops: A hears nothing more from it
                await wait_for(a, lambda: a.replica_sync.figures().peers == 0, 10)
                nursery.cancel_scope.cancel()


class _Pool:  # what sync reads of a pool: its pending work and its workers' ledger targets
    def __init__(self) -> None:
        self.pending = PendingWork()
        self.targets = {"w0": (1,)}


async def until(condition) -> None:  # type: ignore[no-untyped-def]
    """Poll ``condition`` (state another task changes on a message; nothing to wake us)."""
    while not condition():
        await trio.sleep(0.005)


async def test_a_pool_a_new_model_brings_later_is_synced_too():
    """A worker of a model no pool served at the start (the admin API, discovery) brings a
    pool: its requests are told and heard like the others'."""
    settings = {"heartbeat_s": 0.05, "peer_timeout_s": 2.0}
    a_pools, b_pools = {"m": _Pool()}, {"m": _Pool()}
    a = ReplicaSync(ReplicaSettings(listen="tcp://127.0.0.1:*", **settings), a_pools)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            b = ReplicaSync(ReplicaSettings(listen="tcp://127.0.0.1:*",
                                            peers=await nursery.start(a.run), **settings),
                            b_pools)
            await nursery.start(b.run)
            a_pools["new"], b_pools["new"] = _Pool(), _Pool()
            await until(lambda: b.figures().peers == 1
                        and a_pools["new"].pending.announce is not None)
            with a_pools["new"].pending.hold("w0", 100):
                await until(lambda: b_pools["new"].pending.in_flight("w0") == 1)
            await until(lambda: b_pools["new"].pending.in_flight("w0") == 0)
            assert b.counters.foreign == 0
            nursery.cancel_scope.cancel()
