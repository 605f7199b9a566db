"""The monitor as the gateway runs it: a fetch on the real upstream pool, simulated vLLM and
SGLang engines (``cortex sim``'s HTTP side on the lean server) over loopback sockets."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import trio

from cortex.sim.engine import SimEngine
from cortex.sim.serving import TimingConfig
from cortex.upstream.connection_pool import ConnectionPool
from cortex.workers.breaker import BreakerState
from cortex.workers.health import HealthSettings
from cortex.workers.load import RankLoad
from cortex.workers.monitor import run_monitor
from cortex.workers.registry import WorkerRegistry
from cortex.workers.spec import WorkerSpec

SETTINGS = HealthSettings(interval_s=0.05, timeout_s=1.0, failures_to_open=2, open_s=0.3,
                          load_interval_s=0.05)
WAIT_S = 30.0
# One request runs per rank, the next ones wait; each runs for ~100 s unless cancelled.
BUSY = TimingConfig(prefill_tokens_per_s=1e6, decode_s_per_token=1.0, max_running=1)


def pool_fetch(upstream: ConnectionPool):
    """The fetch the app builds on the upstream pool."""

    async def fetch(origin: str, path: str, timeout_s: float) -> tuple[int, bytes]:
        with trio.fail_after(timeout_s):
            async with upstream.request(origin, b"GET", path.encode(), []) as response:
                return response.status, await response.read(16 << 20)

    return fetch


async def until(registry: WorkerRegistry, condition: Callable[[], bool]) -> None:
    with trio.fail_after(WAIT_S):
        while not condition():
            changed = trio.Event()
            unsubscribe = registry.on_change(lambda kind, name: changed.set())
            try:
                await changed.wait()
            finally:
                unsubscribe()


async def start_engine(nursery: trio.Nursery, flavor: str, **kwargs) -> tuple[SimEngine,
                                                                             trio.CancelScope]:
    engine = SimEngine(flavor, flavor, None, **kwargs)
    scope = trio.CancelScope()

    async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            await engine.run(task_status=task_status)

    await nursery.start(run)
    return engine, scope


async def generate(upstream: ConnectionPool, engine: SimEngine, rank: int) -> None:
    """A long completion on one DP rank (the vLLM header or the SGLang body field)."""
    body: dict[str, object] = {"model": engine.served_model_name, "prompt": [1, 2, 3, 4],
                               "max_tokens": 100}
    headers: list[tuple[bytes, bytes]] = [(b"content-type", b"application/json")]
    if engine.family.value == "vllm":
        headers.append((b"x-data-parallel-rank", str(rank).encode()))
    else:
        body["routed_dp_rank"] = rank
    async with upstream.request(engine.url, b"POST", b"/v1/completions", headers,
                                json.dumps(body).encode()) as response:
        assert response.status == 200, await response.read()
        await response.read()


@pytest.mark.parametrize("flavor", ["vllm-0.33", "vllm-0.23", "sglang-0.5.23"])
async def test_engine_queue_and_kv_usage_reach_the_views(nursery, flavor) -> None:
    upstream = ConnectionPool()
    await nursery.start(upstream.run)
    engine, _ = await start_engine(nursery, flavor, dp_size=2, timing=BUSY)
    registry = WorkerRegistry(SETTINGS, trio.current_time)
    registry.add(WorkerSpec("w", engine.url, engine=engine.family.value, dp_size=2))
    await nursery.start(run_monitor, registry, pool_fetch(upstream), SETTINGS)
    await until(registry, lambda: registry.status("w").loads != {})
    assert {rank: (load.running, load.waiting)
            for rank, load in registry.status("w").loads.items()} == {0: (0, 0), 1: (0, 0)}
    # Rank 1: one running, two waiting; rank 0: one running.
    async with trio.open_nursery() as clients:
        for rank in (1, 1, 1, 0):
            clients.start_soon(generate, upstream, engine, rank)
        await until(registry, lambda: {r: (x.running, x.waiting) for r, x in
                                       registry.status("w").loads.items()}
                    == {0: (1, 0), 1: (1, 2)})
        [view] = registry.views(lambda name: None, lambda name: (0, 1))
        assert view.healthy and view.engine_queue == 2
        assert view.kv_usage is not None and 0 < view.kv_usage <= 1
        clients.cancel_scope.cancel()


async def test_unhealthy_fault_then_recovery_and_a_stopped_engine(nursery) -> None:
    upstream = ConnectionPool()
    await nursery.start(upstream.run)
    vllm, vllm_scope = await start_engine(nursery, "vllm-0.33")
    sglang, _ = await start_engine(nursery, "sglang-0.5.23")
    registry = WorkerRegistry(SETTINGS, trio.current_time)
    registry.add(WorkerSpec("v", vllm.url, engine="vllm"))
    registry.add(WorkerSpec("s", sglang.url, engine="sglang"))
    await nursery.start(run_monitor, registry, pool_fetch(upstream), SETTINGS)
    await until(registry, lambda: registry.is_live("v") and registry.is_live("s")
                and registry.status("s").loads != {})
    assert registry.status("s").loads == {0: RankLoad(0, 0, 0.0, 0)}

    sglang.faults.unhealthy = True  # /health answers 503
    await until(registry, lambda: registry.status("s").breaker is BreakerState.OPEN)
    assert registry.status("s").last_error == "/health answered 503"
    assert registry.is_live("v")
    sglang.faults.unhealthy = False
    await until(registry, lambda: registry.is_live("s"))  # the half-open trial passed

    vllm_scope.cancel()  # the engine is gone: its port refuses
    await until(registry, lambda: registry.status("v").breaker is BreakerState.OPEN)
    status = registry.status("v")
    assert not status.live and status.loads == {}
    assert registry.counters("v").probe_failures >= 2
    assert [spec.name for spec in registry.live()] == ["s"]
