"""Workers at runtime through the real control plane and data plane: a worker added through the
admin API gets traffic once live and synced; drained, it gets none and leaves; a data-parallel
worker is routed to the rank holding the prefix; a dead worker leaves the live pool and then
loses its ledger credit; /metrics shows the decisions."""

from __future__ import annotations

import json

import trio

from cortex.ledger.state import TargetState
from cortex.sim.engine import SimEngine
from tests.front_http_client import RawClient
from tests.gateway_cluster import (
    BLOCK,
    FAST,
    MODEL,
    SYSTEM_TEXT,
    all_ready,
    gateway_cluster,
    model_profile,
)

TOKEN = b"test-token"


def messages(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_TEXT}, {"role": "user", "content": question}]


async def control(port: int, method: bytes, path: bytes, body: object = None,
                  token: bytes | None = TOKEN) -> tuple[int, dict]:
    client = await RawClient.connect(port)
    headers = [(b"authorization", b"Bearer " + token)] if token else []
    raw = b"" if body is None else json.dumps(body).encode()
    try:
        response = await client.request(method, path, raw, headers)
    finally:
        await client.aclose()
    text = response.body.decode()
    return response.status, json.loads(text) if text.startswith("{") else {"text": text}


async def test_admin_add_drain_remove_at_runtime():
    async with gateway_cluster(("sglang-0.5.23",)) as cluster, trio.open_nursery() as nursery:
        running = cluster.running
        extra = SimEngine("late", "vllm-0.33", model_profile(), block_size=BLOCK, timing=FAST)
        await nursery.start(extra.run)
        spec = {"name": "late", "url": extra.url, "engine": "vllm", "model": MODEL,
                "events": extra.kv.endpoints(0).pub, "replay": extra.kv.endpoints(0).replay}
        status, _ = await control(running.control_port, b"POST", b"/admin/workers", spec,
                                  token=b"wrong")
        assert status == 401
        status, answer = await control(running.control_port, b"POST", b"/admin/workers",
                                       {**spec, "dp_size": 0, "engine": "tgi"})
        assert status == 400 and len(answer["error"]["problems"]) >= 2
        status, answer = await control(running.control_port, b"POST", b"/admin/workers",
                                       {**spec, "name": "meta",
                                        "url": "http://169.254.169.254:80"})
        assert status == 400 and "allowed worker hosts" in json.dumps(answer)  # no SSRF
        status, _ = await control(running.control_port, b"POST", b"/admin/workers", spec)
        assert status == 201
        await cluster.until(lambda: all_ready(running) and len(running.pools[MODEL].views()) == 2)
        seen = []

        async def one(n: int) -> None:
            response = await cluster.chat([{"role": "user", "content": f"fresh {n} " * 20}])
            assert response.status == 200
            seen.append(response.header(b"x-cortex-assigned-worker"))

        async with trio.open_nursery() as burst:  # concurrent: pending work spreads the burst
            for n in range(8):
                burst.start_soon(one, n)
        assert b"late" in seen and b"e0" in seen
        status, listing = await control(running.control_port, b"GET", b"/admin/workers")
        assert status == 200 and {w["name"] for w in listing["workers"]} == {"e0", "late"}

        status, _ = await control(running.control_port, b"POST", b"/admin/workers/late/drain")
        assert status == 202
        await cluster.until(lambda: "late" not in running.registry)
        for n in range(4):
            response = await cluster.chat([{"role": "user", "content": f"after {n} " * 20}])
            assert response.header(b"x-cortex-assigned-worker") == b"e0"
        assert running.book.find("late", 0) is None  # its ledger targets are gone too
        status, _ = await control(running.control_port, b"DELETE", b"/admin/workers/late")
        assert status == 404
        nursery.cancel_scope.cancel()


async def test_data_parallel_worker_is_routed_to_the_rank_holding_the_prefix():
    async with gateway_cluster(("sglang-0.5.23",), dp_size=2) as cluster:
        first = await cluster.chat(messages("Which rank?"))
        assert first.header(b"x-cortex-dp-rank") is None  # no hit yet: the engine chooses
        engine = cluster.engines[0]
        holding = [r for r in range(2) if engine.counters[r].requests]
        assert len(holding) == 1
        await cluster.until(lambda: cluster.holders(messages("x")).get("e0", 0) > 0)
        for n in range(4):
            response = await cluster.chat(messages(f"Again {n}?"))
            assert response.header(b"x-cortex-dp-rank") == str(holding[0]).encode()
            usage = json.loads(response.body)["usage"]
            assert usage["prompt_tokens_details"]["cached_tokens"] == int(
                response.header(b"x-cortex-cache-hit-tokens")) > 0
        assert engine.counters[1 - holding[0]].requests == 0


async def test_dead_worker_leaves_the_pool_then_loses_its_ledger_credit():
    async with gateway_cluster(("vllm-0.33", "sglang-0.5.23")) as cluster:
        running = cluster.running
        first = await cluster.chat(messages("Hold this."))
        holder = first.header(b"x-cortex-assigned-worker").decode()
        await cluster.until(lambda: cluster.holders(messages("x")).get(holder, 0) > 0)
        cluster.stop_engine(holder)
        target = running.book.find(holder, 0)
        await cluster.until(lambda: running.book.state(target) is not TargetState.READY
                            and running.book.target_entries(target) == 0, timeout_s=30)
        view = next(v for v in running.pools[MODEL].views() if v.worker == holder)
        assert not view.healthy
        response = await cluster.chat(messages("Who now?"))
        assert response.status == 200
        assert response.header(b"x-cortex-assigned-worker").decode() != holder
        status, answer = await control(running.data_port, b"GET", b"/health/ready", token=None)
        assert status == 200 and answer["degraded"] is True


async def test_metrics_count_decisions_and_ledger_accuracy():
    async with gateway_cluster(("vllm-0.33",)) as cluster:
        for n in range(3):
            await cluster.chat(messages(f"Count me {n}"))
        status, answer = await control(cluster.running.control_port, b"GET", b"/metrics",
                                       token=None)
        text = answer["text"]
        assert status == 200
        assert 'cortex_decisions_total{model="deepseek",mode="load_aware"' in text
        assert "cortex_cached_tokens_reported_total" in text
        assert "cortex_route_seconds_bucket" in text
        # tokenize and hash timings ride on the decision (observed after each answer)
        assert "cortex_tokenize_seconds_count 3" in text and "cortex_hash_seconds_count 3" in text
        assert 'cortex_ledger_state{' in text
        assert 'cortex_model_exact_routing{model="deepseek"} 1' in text
        assert "cortex_worker_probes_total" in text and "cortex_pd_served_total 0" in text
        assert "cortex_admission_waited_total" in text or not text.count("admission")
