"""A gateway over simulated engines that can be killed and brought back on the same ports.

``async with chaos_cluster(flavors, seed=...) as cluster`` starts one ``SimEngine`` per flavor
(real HTTP, real ZeroMQ events), then ``run_gateway`` with those engines as workers, and returns
once every worker is live and every ledger READY (listeners, not timers).

``cluster.kill(name)`` cancels the engine (HTTP server and publishers vanish, as a crashed
process would) and waits until its sockets are closed; ``cluster.revive(name)`` starts a FRESH
engine (empty cache, sequence 0, empty replay buffer) on the SAME HTTP, PUB and replay ports, so
the registry's worker of that name comes back. ``cluster.compare(name)`` is the worker's ledger
against its engine's cache, as sets of Cortex block keys (``cortex.sim.cluster.Comparison``).
"""

from __future__ import annotations

import errno
import random
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio
import zmq

from cortex._fast.blockkeys import block_keys, namespace_seed
from cortex.app import Running, run_gateway
from cortex.config.tree import (
    ControlConfig,
    CortexConfig,
    HealthConfig,
    ServerConfig,
    UpstreamConfig,
)
from cortex.front.limits import ServerLimits
from cortex.ledger.state import TargetState
from cortex.sim.cluster import Comparison
from cortex.sim.engine import SimEngine
from cortex.sim.kv_engine import SimEndpointConfig
from cortex.sim.serving import TimingConfig
from cortex.upstream.connection_pool import PoolStats
from cortex.upstream.limits import PoolLimits
from cortex.workers.spec import WorkerSpec
from tests.gateway_cluster import BLOCK, MODEL, all_ready, model_config, model_profile, wait_for

CHAOS_TIMING = TimingConfig(prefill_tokens_per_s=400_000, decode_s_per_token=0.002,
                            max_running=32)
# Short upstream deadlines, so a hung engine costs a request ~3 s before it moves on; not
# shorter: on a shared 2-vCPU machine the event loop of this one process (gateway, four
# engines and twenty clients) can lag by a few hundred ms, and a deadline that the lag alone
# can pass would turn a healthy worker into a failed attempt.
CHAOS_UPSTREAM = UpstreamConfig(
    limits=PoolLimits(connect_timeout_s=2.0, head_timeout_s=3.0, read_timeout_s=5.0),
    retries_before_first_byte=3)
CHAOS_HEALTH = HealthConfig(interval_s=0.2, timeout_s=2.0, failures_to_open=2, open_s=0.3,
                            load_interval_s=0.3)


@dataclass
class EngineSlot:
    """One worker: its current engine (None while killed) and its fixed ports."""

    name: str
    flavor: str
    http_port: int
    pub_port: int
    replay_port: int
    engine: SimEngine | None
    scope: trio.CancelScope
    stopped: trio.Event
    generation: int = 0  # engines started in this slot so far, minus one


@dataclass
class ChaosCluster:
    slots: dict[str, EngineSlot]
    running: Running
    config: CortexConfig
    nursery: trio.Nursery
    make_engine: Callable[[str, str, int, SimEndpointConfig, int], SimEngine]

    @property
    def port(self) -> int:
        return self.running.data_port

    def engine(self, name: str) -> SimEngine:
        engine = self.slots[name].engine
        assert engine is not None, f"{name} is down"
        return engine

    def up(self) -> list[str]:
        return [name for name, slot in self.slots.items() if slot.engine is not None]

    async def kill(self, name: str) -> None:
        slot = self.slots[name]
        if slot.engine is None:
            return
        slot.engine = None  # at once: a stopping engine's KV side is already gone
        slot.scope.cancel()
        await slot.stopped.wait()

    async def revive(self, name: str) -> SimEngine:
        """A fresh engine on the slot's ports (bind retried while the old sockets linger)."""
        slot = self.slots[name]
        assert slot.engine is None, f"{name} is running"
        slot.generation += 1
        endpoints = SimEndpointConfig(base_port=slot.pub_port, replay_base_port=slot.replay_port)
        for attempt in range(50):
            engine = self.make_engine(name, slot.flavor, slot.http_port, endpoints,
                                      slot.generation)
            try:
                slot.scope, slot.stopped = await self.nursery.start(_run_engine, engine)
            except (OSError, zmq.ZMQError, BaseExceptionGroup) as error:
                if not _address_in_use(error) or attempt == 49:
                    raise
                await trio.sleep(0.05)  # the old socket is still closing: retry the bind
                continue
            slot.engine = engine
            return engine
        raise AssertionError("unreachable")

    async def until(self, condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
        await wait_for(self.running, condition, timeout_s)

    def live(self, name: str) -> bool:
        return self.running.registry.status(name).live

    def target(self, name: str, rank: int = 0) -> int | None:
        return self.running.book.find(name, rank)

    def state(self, name: str, rank: int = 0) -> TargetState | None:
        target = self.target(name, rank)
        return None if target is None else self.running.book.state(target)

    def compare(self, name: str, rank: int = 0) -> Comparison:
        engine = self.engine(name)
        target = self.target(name, rank)
        assert target is not None
        truth = {block_keys(tokens, BLOCK, namespace_seed(MODEL, lora, salt))[-1]
                 for lora, salt, tokens in engine.kv.truth(rank)}
        keys = self.running.book.target_keys(target)
        assert set(keys) <= {BLOCK}, f"ledger holds blocks of sizes {set(keys)}"
        ledger = keys.get(BLOCK, set())
        return Comparison(len(ledger), len(truth), len(ledger - truth), len(truth - ledger))

    def upstream_stats(self, name: str) -> PoolStats:
        """The gateway's upstream pool figures for this worker (``Running`` does not expose the
        pool, so it is reached through the data plane's handler)."""
        gateway = self.running.server._shared.handler.__self__  # type: ignore[attr-defined]
        return gateway.upstream.stats(f"http://127.0.0.1:{self.slots[name].http_port}")

    def all_ready(self) -> bool:
        return all_ready(self.running)


def _address_in_use(error: BaseException) -> bool:
    """The bind failed because the old engine's socket is still closing (also when a nursery
    wrapped that error in a group)."""
    if isinstance(error, BaseExceptionGroup):
        return all(_address_in_use(inner) for inner in error.exceptions)
    return isinstance(error, (OSError, zmq.ZMQError)) and error.errno == errno.EADDRINUSE


async def _run_engine(engine: SimEngine, *,
                      task_status: trio.TaskStatus[tuple[trio.CancelScope, trio.Event]]) -> None:
    stopped = trio.Event()
    try:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                await nursery.start(engine.run)
                task_status.started((scope, stopped))
    finally:
        stopped.set()


@asynccontextmanager
async def chaos_cluster(
    flavors: Sequence[str] = ("vllm-0.33", "sglang-0.5.23", "vllm-0.33", "sglang-0.5.23"),
    *,
    seed: int = 0,
    timing: TimingConfig = CHAOS_TIMING,
    capacity_blocks: int = 256,  # small: the storm's traffic makes the engines evict
    segment_cache_bytes: int = 1 << 20,
    upstream: UpstreamConfig = CHAOS_UPSTREAM,
    health: HealthConfig = CHAOS_HEALTH,
    server_limits: ServerLimits = ServerLimits(),
) -> AsyncIterator[ChaosCluster]:
    def make_engine(name: str, flavor: str, http_port: int, endpoints: SimEndpointConfig,
                    generation: int) -> SimEngine:
        rng = random.Random(f"{seed}/{name}/{generation}")
        return SimEngine(name, flavor, model_profile(), block_size=BLOCK,
                         capacity_blocks=capacity_blocks, timing=timing, http_port=http_port,
                         kv_endpoints=endpoints, rng=rng)

    async with trio.open_nursery() as nursery:
        slots: dict[str, EngineSlot] = {}
        for i, flavor in enumerate(flavors):
            name = f"e{i}"
            engine = make_engine(name, flavor, 0, SimEndpointConfig(), 0)
            scope, stopped = await nursery.start(_run_engine, engine)
            assert engine.url is not None and engine.kv.base_port is not None
            assert engine.kv.replay_base_port is not None
            slots[name] = EngineSlot(name, flavor, int(engine.url.rsplit(":", 1)[1]),
                                     engine.kv.base_port, engine.kv.replay_base_port, engine,
                                     scope, stopped)
        workers = tuple(
            WorkerSpec(slot.name, f"http://127.0.0.1:{slot.http_port}",
                       engine="vllm" if "vllm" in slot.flavor else "sglang", model=MODEL,
                       events=f"tcp://127.0.0.1:{slot.pub_port}",
                       replay=f"tcp://127.0.0.1:{slot.replay_port}")
            for slot in slots.values())
        config = CortexConfig(
            server=ServerConfig(host="127.0.0.1", port=0, limits=server_limits),
            control=ControlConfig(host="127.0.0.1", port=0, admin_token="test-token"),
            models=(model_config(segment_cache_bytes=segment_cache_bytes,
                                 render_cache_bytes=segment_cache_bytes),), workers=workers,
            health=health, upstream=upstream)
        running = await nursery.start(run_gateway, config)
        cluster = ChaosCluster(slots, running, config, nursery, make_engine)
        await cluster.until(cluster.all_ready)
        yield cluster
        nursery.cancel_scope.cancel()

