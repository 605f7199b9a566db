"""A simulated cluster behind a running Cortex gateway, over real sockets: the harness of the
gateway's integration tests and benchmarks.

``async with gateway_cluster(flavors) as cluster`` starts one ``SimEngine`` per flavor (real
HTTP, real ZeroMQ events), then ``run_gateway`` with those engines as workers, and returns once
every worker is live and every ledger READY (waiting on the registry's and the ledger's change
listeners, never on a timer).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

import trio

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
from cortex.sim.engine import SimEngine
from cortex.sim.http_faults import SimFaults
from cortex.sim.kv_engine import SimEndpointConfig
from cortex.sim.pd import PdSimSettings
from cortex.sim.serving import TimingConfig
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
class Cluster:
    engines: list[SimEngine]
    running: Running
    config: CortexConfig
    scopes: dict[str, trio.CancelScope]

    def stop_engine(self, name: str) -> None:
        """Kill an engine (HTTP and events) at once, as a crashed process would vanish."""
        self.scopes[name].cancel()

    @property
    def port(self) -> int:
        return self.running.data_port

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
                      task_status: trio.TaskStatus[trio.CancelScope]) -> None:
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            task_status.started(scope)


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
) -> AsyncIterator[Cluster]:
    """``roles`` (one per flavor: both, prefill, decode) makes a PD cluster: the engines take
    those roles (``cortex.sim.pd``) and the workers are registered with them.
    ``engine_model="batching"`` runs the engines on the continuous-batching model with
    ``batching`` (both flavors, PD roles included; ``timing`` is then unused); the default "fixed"
    is the simple timing model most tests assert against. ``engine_block_size``: the engines'
    page size (Cortex keys blocks of ``BLOCK`` all the same: 1 is SGLang's default, folded).
    ``engine_faults``: fault switches every engine starts with (``SimFaults.update`` changes,
    e.g. ``{"poison_marker": "POISON"}``: a request containing it fails on every worker); each
    engine's own switches stay in ``cluster.engines[i].faults``."""
    roles = tuple(roles or ("both",) * len(flavors))
    async with trio.open_nursery() as nursery:
        timing = replace(timing, **(timing_changes or {}))
        engines = [SimEngine(f"e{i}", flavor, model_profile(), block_size=engine_block_size,
                             capacity_blocks=capacity_blocks, timing=timing, dp_size=dp_size,
                             pd_role=None if role == "both" else role,
                             bootstrap_port=0 if role == "prefill" else None,
                             pd_settings=pd_settings, kv_endpoints=kv_endpoints,
                             faults=_faults(engine_faults), engine_model=engine_model,
                             batching=batching)
                   for i, (flavor, role) in enumerate(zip(flavors, roles, strict=True))]
        scopes: dict[str, trio.CancelScope] = {}
        for engine in engines:
            scopes[engine.name] = await nursery.start(_run_engine, engine)
        workers = tuple(
            WorkerSpec(engine.name, engine.url, engine="vllm" if "vllm" in flavor else "sglang",
                       model=MODEL, dp_size=dp_size, events=engine.kv.endpoints(0).pub,
                       replay=engine.kv.endpoints(0).replay, role=Role(role),
                       bootstrap_port=engine.pd.bootstrap_port
                       if engine.pd is not None and engine.pd.listens else None)
            for engine, flavor, role in zip(engines, flavors, roles, strict=True))
        config = CortexConfig(
            control=ControlConfig(host="127.0.0.1", port=0, admin_token=ADMIN_TOKEN),
            models=(model_config(),), workers=workers,
            **{"server": ServerConfig(host="127.0.0.1", port=0),
               "health": HealthConfig(interval_s=0.2, timeout_s=2.0, load_interval_s=0.2),
               **(config_changes or {})})
        running = await nursery.start(run_gateway, config)
        cluster = Cluster(engines, running, config, scopes)
        await cluster.until(lambda: all_ready(running))
        yield cluster
        nursery.cancel_scope.cancel()
