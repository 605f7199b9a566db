"""A simulated cluster behind a running Cortex gateway, over real sockets, in one process: the
harness of the gateway's integration, chaos and fuzz tests.

``async with gateway_cluster(flavors) as cluster`` starts one ``SimEngine`` per flavor (real
HTTP, real ZeroMQ events), each in a slot that keeps its ports, then ``run_gateway`` with those
engines as workers, and returns once every worker is live and every ledger READY (waiting on the
registry's and the ledger's change listeners, never on a timer).

``cluster.stop_engine(name)`` / ``await cluster.kill(name)`` make an engine vanish as a crashed
process would (HTTP server and publishers gone; ``kill`` waits until its sockets are closed);
``cluster.revive(name)`` starts a FRESH engine (empty cache, sequence 0, empty replay buffer) on
the SAME HTTP, PUB and replay ports, so the registry's worker of that name comes back.
``cluster.compare(name)`` is the worker's ledger against its engine's cache
(``cortex.sim.cluster.Comparison``). ``tests.chaos.cluster`` is this harness with the chaos
tests' settings. (The process-based twin, engines and gateways as processes, is
``perf/replay_cluster.py``.)
"""

from __future__ import annotations

import atexit
import errno
import json
import os
import random
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

import trio
import zmq

from cortex.app import Running, run_gateway
from cortex.config.tree import (
    ControlConfig,
    CortexConfig,
    HealthConfig,
    ModelConfig,
    ServerConfig,
)
from cortex.ledger.state import TargetState
from cortex.profile.model_profile import ModelProfile, ProfileSpec, load_profile
from cortex.scheduling.view import Role
from cortex.sim.batching.factory import BatchingSettings
from cortex.sim.cluster import Comparison, cached_keys, compare_keys
from cortex.sim.engine import SimEngine
from cortex.sim.http_faults import SimFaults
from cortex.sim.kv_engine import SimEndpointConfig
from cortex.sim.pd import PdSimSettings
from cortex.sim.serving import TimingConfig
from cortex.upstream.connection_pool import PoolStats
from cortex.workers.spec import WorkerSpec
from tests import deepseek_profile as ds
from tests.front_http_client import RawClient, RawResponse

MODEL = "deepseek"
BLOCK = 16
FAST = TimingConfig(prefill_tokens_per_s=1e6, decode_s_per_token=0.0, max_running=64)
SYSTEM_TEXT = "You are Cortex's test assistant. " * 30  # ~210 tokens: 13 full blocks


@cache
def template_path() -> str:
    """The test chat template as a file, written once per process and removed when the
    process exits (processes given its path must not outlive this one)."""
    folder = tempfile.mkdtemp(prefix="cortex-test-template-")
    atexit.register(_remove_folder, folder, os.getpid())
    path = os.path.join(folder, "chat.jinja")
    with open(path, "w") as f:
        f.write(ds.TEMPLATE)
    return path


def _remove_folder(folder: str, owner_pid: int) -> None:
    if os.getpid() == owner_pid:  # not in a forked child that inherited the exit handler
        shutil.rmtree(folder, ignore_errors=True)


@cache
def model_profile() -> ModelProfile:
    return load_profile(ProfileSpec(MODEL, ds.TOKENIZER_JSON, BLOCK, template_path(),
                                    bos_token=ds.BOS, eos_token=ds.EOS))


def model_config(**changes: Any) -> ModelConfig:
    return replace(ModelConfig(name=MODEL, tokenizer=ds.TOKENIZER_JSON, block_size=BLOCK,
                               chat_template=template_path(), bos_token=ds.BOS,
                               eos_token=ds.EOS), **changes)


ADMIN_TOKEN = "test-token"  # the clusters' control plane token

@dataclass
class EngineSlot:
    """One worker: its current engine (None while down) and its fixed ports."""

    name: str
    flavor: str
    role: str
    http_port: int
    pub_port: int
    replay_port: int
    engine: SimEngine | None
    scope: trio.CancelScope
    stopped: trio.Event
    generation: int = 0  # engines started in this slot so far, minus one


# (name, flavor, role, HTTP port, KV endpoints, generation) -> a new engine for a slot
EngineMaker = Callable[[str, str, str, int, SimEndpointConfig, int], SimEngine]


@dataclass
class Cluster:
    engines: list[SimEngine]  # as first started; ``engine(name)`` is the one running now
    slots: dict[str, EngineSlot]
    running: Running
    config: CortexConfig
    nursery: trio.Nursery
    make_engine: EngineMaker

    @property
    def port(self) -> int:
        return self.running.data_port

    def engine(self, name: str) -> SimEngine:
        engine = self.slots[name].engine
        assert engine is not None, f"{name} is down"
        return engine

    def up(self) -> list[str]:
        return [name for name, slot in self.slots.items() if slot.engine is not None]

    def stop_engine(self, name: str) -> None:
        """Kill an engine (HTTP and events) at once, as a crashed process would vanish."""
        slot = self.slots[name]
        slot.engine = None  # at once: a stopping engine's KV side is already gone
        slot.scope.cancel()

    async def kill(self, name: str) -> None:
        """``stop_engine``, then wait until its sockets are closed."""
        slot = self.slots[name]
        if slot.engine is None:
            return
        self.stop_engine(name)
        await slot.stopped.wait()

    async def revive(self, name: str) -> SimEngine:
        """A fresh engine on the slot's ports (bind retried while the old sockets linger)."""
        slot = self.slots[name]
        assert slot.engine is None, f"{name} is running"
        slot.generation += 1
        endpoints = SimEndpointConfig(base_port=slot.pub_port, replay_base_port=slot.replay_port)
        for attempt in range(50):
            engine = self.make_engine(name, slot.flavor, slot.role, slot.http_port, endpoints,
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

    def live(self, name: str) -> bool:
        return self.running.registry.status(name).live

    def target(self, name: str, rank: int = 0) -> int | None:
        return self.running.book.find(name, rank)

    def state(self, name: str, rank: int = 0) -> TargetState | None:
        target = self.target(name, rank)
        return None if target is None else self.running.book.state(target)

    def compare(self, name: str, rank: int = 0) -> Comparison:
        """The worker's ledger against its engine's cache, as sets of Cortex block keys."""
        target = self.target(name, rank)
        assert target is not None
        return compare_keys(self.running.book.target_keys(target),
                            self.engine(name).kv.truth(rank), BLOCK, MODEL)

    def upstream_stats(self, name: str) -> PoolStats:
        """The gateway's upstream connection figures for this worker."""
        return self.running.gateway.upstream.stats(
            f"http://127.0.0.1:{self.slots[name].http_port}")

    def all_ready(self) -> bool:
        return all_ready(self.running)

    async def chat(self, messages: list[dict[str, Any]], **extra: Any) -> RawResponse:
        return await self.request("/v1/chat/completions",
                                  {"model": MODEL, "messages": messages, "max_tokens": 4, **extra})

    async def request(self, path: str, body: dict[str, Any]) -> RawResponse:
        client = await RawClient.connect(self.port)
        try:
            return await client.request(b"POST", path.encode(), json.dumps(body).encode(),
                                        [(b"content-type", b"application/json")])
        finally:
            await client.aclose()

    async def admin(self, method: bytes, path: bytes, body: bytes = b"") -> RawResponse:
        """One authorized request to the control plane (the admin API, /metrics)."""
        client = await RawClient.connect(self.running.control_port)
        try:
            return await client.request(method, path, body, [
                (b"authorization", b"Bearer " + ADMIN_TOKEN.encode()),
                (b"content-type", b"application/json")])
        finally:
            await client.aclose()

    def holders(self, messages: list[dict[str, Any]]) -> dict[str, int]:
        """Worker -> leading blocks the ledger credits it with for this chat's prompt."""
        text = model_profile().chat_template.render(messages, add_generation_prompt=True)
        return self.held(model_profile().tokenizer.encode(text, add_special_tokens=False).ids)

    def held(self, token_ids: Sequence[int]) -> dict[str, int]:
        """Worker -> leading blocks of these prompt ids the ledger credits it with (the blocks
        an engine could serve from its cache: never the one holding the last token)."""
        return self.running.pools[MODEL].holders(token_ids, _plain_prompt())

    async def until(self, condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
        """Wait until ``condition()`` holds, re-checking on every ledger or registry change and
        every ingested event batch (woken by listeners, not by a timer)."""
        await wait_for(self.running, condition, timeout_s)


def _address_in_use(error: BaseException) -> bool:
    """The bind failed because the old engine's socket is still closing (also when a nursery
    wrapped that error in a group)."""
    if isinstance(error, BaseExceptionGroup):
        return all(_address_in_use(inner) for inner in error.exceptions)
    return isinstance(error, (OSError, zmq.ZMQError)) and error.errno == errno.EADDRINUSE


def _plain_prompt() -> Any:
    from cortex.prompt.request_text import RequestPrompt

    return RequestPrompt("", None, False, None, None)


async def wait_for(running: Running, condition: Callable[[], bool], timeout_s: float) -> None:
    changed = trio.Event()

    def wake(*_: object) -> None:
        changed.set()

    running.registry.on_change(wake)
    running.book.on_state_change(wake)
    with trio.fail_after(timeout_s):
        while not condition():
            changed = trio.Event()
            # Ledger contents change without a state change (events applied): re-check after
            # each batch of scheduler turns too.
            with trio.move_on_after(0.02):
                await changed.wait()


def engine_keys(engine: SimEngine, rank: int = 0) -> set[int]:
    """The engine's cached blocks as Cortex keys."""
    return cached_keys(engine.kv.truth(rank), BLOCK, MODEL)


def ledger_keys(running: Running, worker: str, rank: int = 0) -> set[int]:
    """The blocks the gateway's ledger credits the worker's rank with."""
    target = running.book.find(worker, rank)
    assert target is not None
    return running.book.target_keys(target).get(BLOCK, set())


def all_ready(running: Running) -> bool:
    for pool in running.pools.values():
        views = pool.views()
        if not views or not all(v.healthy for v in views):
            return False
        if any(v.ledger_state is not None and v.ledger_state is not TargetState.READY
               for v in views):
            return False
    return True


def _faults(changes: Mapping[str, object] | None) -> SimFaults:
    faults = SimFaults()
    faults.update(changes or {})
    return faults


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
async def gateway_cluster(
    flavors: Sequence[str] = ("vllm-0.33", "sglang-0.5.23"),
    *,
    timing: TimingConfig = FAST,
    timing_changes: dict[str, Any] | None = None,
    capacity_blocks: int = 4096,
    config_changes: dict[str, Any] | None = None,
    dp_size: int = 1,
    roles: Sequence[str] | None = None,
    pd_settings: PdSimSettings = PdSimSettings(),
    kv_endpoints: SimEndpointConfig = SimEndpointConfig(),
    engine_faults: Mapping[str, object] | None = None,
    engine_model: str = "fixed",
    batching: BatchingSettings = BatchingSettings(),
    engine_block_size: int = BLOCK,
    seed: int | None = None,
) -> AsyncIterator[Cluster]:
    """``roles`` (one per flavor: both, prefill, decode) makes a PD cluster: the engines take
    those roles (``cortex.sim.pd``) and the workers are registered with them.
    ``engine_model="batching"`` runs the engines on the continuous-batching model with
    ``batching`` (both flavors, PD roles included; ``timing`` is then unused); the default "fixed"
    is the simple timing model most tests assert against. ``engine_block_size``: the engines'
    page size (Cortex keys blocks of ``BLOCK`` all the same: 1 is SGLang's default, folded).
    ``engine_faults``: fault switches every engine starts with (``SimFaults.update`` changes,
    e.g. ``{"poison_marker": "POISON"}``: a request containing it fails on every worker); each
    engine's own switches stay in ``cluster.engines[i].faults``. ``seed``: each engine's
    random choices come from ``seed``, its name and its generation (revivals), else from the
    engine's own seed. ``config_changes`` replace whole sections of the gateway's
    configuration (``server``, ``health``, ``upstream``, ``models``, ...)."""
    roles = tuple(roles or ("both",) * len(flavors))
    timing = replace(timing, **(timing_changes or {}))

    def make_engine(name: str, flavor: str, role: str, http_port: int,
                    endpoints: SimEndpointConfig, generation: int) -> SimEngine:
        rng = None if seed is None else random.Random(f"{seed}/{name}/{generation}")
        return SimEngine(name, flavor, model_profile(), block_size=engine_block_size,
                         capacity_blocks=capacity_blocks, timing=timing, dp_size=dp_size,
                         http_port=http_port, pd_role=None if role == "both" else role,
                         bootstrap_port=0 if role == "prefill" else None,
                         pd_settings=pd_settings, kv_endpoints=endpoints,
                         faults=_faults(engine_faults), engine_model=engine_model,
                         batching=batching, rng=rng)

    async with trio.open_nursery() as nursery:
        engines: list[SimEngine] = []
        slots: dict[str, EngineSlot] = {}
        for i, (flavor, role) in enumerate(zip(flavors, roles, strict=True)):
            engine = make_engine(f"e{i}", flavor, role, 0, kv_endpoints, 0)
            scope, stopped = await nursery.start(_run_engine, engine)
            assert engine.url is not None and engine.kv.base_port is not None
            assert engine.kv.replay_base_port is not None
            engines.append(engine)
            slots[engine.name] = EngineSlot(engine.name, flavor, role,
                                            int(engine.url.rsplit(":", 1)[1]),
                                            engine.kv.base_port, engine.kv.replay_base_port,
                                            engine, scope, stopped)
        workers = tuple(
            WorkerSpec(engine.name, engine.url, engine="vllm" if "vllm" in flavor else "sglang",
                       model=MODEL, dp_size=dp_size, events=engine.kv.endpoints(0).pub,
                       replay=engine.kv.endpoints(0).replay, role=Role(role),
                       bootstrap_port=engine.pd.bootstrap_port
                       if engine.pd is not None and engine.pd.listens else None)
            for engine, flavor, role in zip(engines, flavors, roles, strict=True))
        config = CortexConfig(
            control=ControlConfig(host="127.0.0.1", port=0, admin_token=ADMIN_TOKEN),
            workers=workers,
            **{"server": ServerConfig(host="127.0.0.1", port=0),
               "health": HealthConfig(interval_s=0.2, timeout_s=2.0, load_interval_s=0.2),
               "models": (model_config(),),
               **(config_changes or {})})
        running = await nursery.start(run_gateway, config)
        cluster = Cluster(engines, slots, running, config, nursery, make_engine)
        await cluster.until(lambda: all_ready(running))
        yield cluster
        nursery.cancel_scope.cancel()
