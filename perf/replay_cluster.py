"""The processes of one trace-replay run: simulated engines, the gateway, sglang-router.

* ``start_engines(...)``: ``python -m cortex sim`` once per engine (or once per flavor and
  role with ``--count N``); each prints one line per engine once it listens
  (``cortex.sim.cli``), which gives its URL, its KV-event and replay endpoints and, for a PD
  engine (``roles``: ``--pd-role prefill|decode``, prefills with ``--bootstrap-port 0``), its
  role and bootstrap port. A simulated engine tokenizes on its
  event loop (one full encode, as real engines do), so engines sharing a process delay each
  other's timers by that much: one process per engine keeps that out of the measurements.
* ``start_gateway(...)``: ``perf/replay_gateway.py`` with a spec file; ready when it prints
  ``ready <port>`` (every worker live, every ledger READY). ``ledger_report()`` asks it for
  the ledger's view of the caches (duplicated blocks). With ``replicas`` N > 1, N such
  processes bind one port with ``SO_REUSEPORT`` (``server.reuse_port``): the kernel spreads the
  client's connections among them, by a hash of each connection's addresses, as operators
  spread replicas of one host; each replica subscribes to every engine and builds its own
  ledger (the report is the first replica's); with ``sync`` they tell each other their
  requests in flight (``cortex.replicas``), else each counts only its own.
* ``start_sglang_router(...)``: ``perf/peers.py``'s launcher (``--policy cache_aware``).

Every engine starts with an empty cache: each router gets a fresh cluster. ``Procs.stop()``
ends exactly the process groups started here, then removes the run's folder (the processes'
logs, the chat template, the gateway's spec): a start failure quotes the log's tail first.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from perf import peers
from tests import deepseek_profile as ds
from tests.real_engine.vllm_server import metric_sum

REPO = Path(__file__).resolve().parent.parent  # children run from here: ``-m perf.x`` finds it

START_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class EngineSettings:
    model: str
    block_size: int
    capacity_blocks: int
    prefill_tokens_per_s: float
    decode_ms_per_token: float
    max_running: int
    engine_model: str = "fixed"  # batching: on step_profile (PD roles included)
    step_profile: str = ""
    token_scale: float = 1.0
    max_num_batched_tokens: int = 0
    max_num_seqs: int = 0


@dataclass(frozen=True, slots=True)
class Engine:
    name: str
    flavor: str  # "vllm" | "sglang"
    url: str
    events: str
    replay: str | None
    role: str = "both"  # both | prefill | decode
    bootstrap_port: int | None = None  # a prefill's KV bootstrap / side-channel port


def vllm_preemptions(engines: list[Engine]) -> int | None:
    """Preemptions so far, summed over the vLLM-flavoured engines (``vllm:num_preemptions_total``
    on their ``/metrics``; SGLang's retractions are not exposed); None without a vLLM engine."""
    vllm = [engine for engine in engines if engine.flavor == "vllm"]
    if not vllm:
        return None
    total = 0
    for engine in vllm:
        with urllib.request.urlopen(f"{engine.url}/metrics", timeout=10) as response:
            total += int(metric_sum(response.read().decode(), "vllm:num_preemptions_total"))
    return total


def pd_roles(flavors: list[str]) -> list[str]:
    """Roles for a PD cluster of these engines: per flavor (a pair must be of one flavor), the
    first half (rounded up) prefill, the rest decode. Each flavor needs two engines or more."""
    roles = []
    seen: dict[str, int] = {}
    for flavor in flavors:
        count = flavors.count(flavor)
        if count < 2:
            raise ValueError(f"a PD cluster needs 2+ {flavor} engines (a prefill and a decode)")
        index = seen[flavor] = seen.get(flavor, -1) + 1
        roles.append("prefill" if index < (count + 1) // 2 else "decode")
    return roles


@dataclass
class Procs:
    """Every process of one run, stopped together; ``tmpdir`` lives until ``stop()``."""

    running: list[peers.Running] = field(default_factory=list)
    tmpdir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="cortex-replay-"))

    def stop(self) -> None:
        for proc in self.running:  # EOF on stdin ends the gateway process
            if proc.process.stdin is not None:
                try:
                    proc.process.stdin.close()
                except OSError:
                    pass
        for proc in reversed(self.running):
            proc.stop()
        self.running.clear()
        shutil.rmtree(self.tmpdir, ignore_errors=True)

    def template(self) -> str:
        path = os.path.join(self.tmpdir, "chat.jinja")
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write(ds.TEMPLATE)
        return path


def spawn(procs: Procs, name: str, argv: list[str], stdin: int | None = None,
          cpus: str = "") -> peers.Running:
    """One process of the run (``peers.spawn``), its stdout a pipe (its ready line)."""
    process, log_path = peers.spawn(name, argv, procs.tmpdir, stdout=subprocess.PIPE,
                                    stdin=stdin, cpus=cpus)
    running = peers.Running(name, 0, process, None, log_path)
    procs.running.append(running)
    return running


def _line(running: peers.Running) -> str:
    assert running.process.stdout is not None
    line = running.process.stdout.readline().decode()
    if not line:
        raise peers.StartError(f"{running.name} exited before it was ready:\n"
                               f"{running.log_tail()}")
    return line.strip()


def start_engines(procs: Procs, settings: EngineSettings, flavors: list[str],
                  per_engine: bool = True, roles: list[str] | None = None,
                  cpus: str = "") -> list[Engine]:
    """``cortex sim`` processes: one per engine (``per_engine``: one engine's tokenization
    never delays another's timers) or one per flavor and role. Engines are named by flavor,
    role (``p``/``d``, none for ``both``) and index: ``v0_0``, ``sp1_0`` per engine; ``v0``,
    ``sd0`` per flavor."""
    roles = roles or ["both"] * len(flavors)
    tag = {"both": "", "prefill": "p", "decode": "d"}
    groups: list[tuple[str, str, str, int]] = []  # (flavor, role, name prefix, count)
    if per_engine:
        groups = [(flavor, role, f"{flavor[0]}{tag[role]}{i}_", 1)
                  for i, (flavor, role) in enumerate(zip(flavors, roles, strict=True))]
    else:
        pairs = list(zip(flavors, roles, strict=True))
        groups = [(flavor, role, flavor[0] + tag[role], pairs.count((flavor, role)))
                  for flavor in ("vllm", "sglang") for role in ("both", "prefill", "decode")
                  if (flavor, role) in pairs]
    started = []
    for flavor, role, prefix, count in groups:
        argv = [sys.executable, "-m", "cortex", "sim", "--engine", flavor, "--count", str(count),
                "--name", prefix, "--model", settings.model, "--port", "0",
                "--block-size", str(settings.block_size),
                "--capacity-blocks", str(settings.capacity_blocks),
                "--prefill-tokens-per-s", str(settings.prefill_tokens_per_s),
                "--decode-ms-per-token", str(settings.decode_ms_per_token),
                "--max-running", str(settings.max_running),
                "--tokenizer", ds.TOKENIZER_JSON, "--chat-template", procs.template(),
                "--bos-token", ds.BOS, "--eos-token", ds.EOS]
        if settings.engine_model == "batching":  # every role, PD ones included
            argv += ["--engine-model", "batching", "--step-profile", settings.step_profile,
                     "--token-scale", str(settings.token_scale),
                     "--max-num-batched-tokens", str(settings.max_num_batched_tokens),
                     "--max-num-seqs", str(settings.max_num_seqs)]
        else:
            argv += ["--engine-model", "fixed"]
        if role != "both":
            argv += ["--pd-role", role]
        if role == "prefill":
            argv += ["--bootstrap-port", "0"]
        started.append((flavor, role, count, spawn(procs, f"sim-{prefix}", argv, cpus=cpus)))
    engines = []
    for flavor, role, count, running in started:
        for _ in range(count):
            parts = _line(running).split()
            fields = dict(part.split("=", 1) for part in parts[4:] if "=" in part)
            bootstrap = fields.get("bootstrap")
            engines.append(Engine(parts[0], flavor, parts[2], fields["rank0"],
                                  fields.get("replay0"), fields.get("pd", "both"),
                                  int(bootstrap) if bootstrap else None))
    return engines


@dataclass
class Gateway:
    running: peers.Running  # the first replica (its ledger answers ``ledger_report``)
    port: int
    replicas: list[peers.Running] = field(default_factory=list)  # every replica, the first too

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ledger_report(self) -> dict:
        process = self.running.process
        assert process.stdin is not None
        process.stdin.write(b"report\n")
        process.stdin.flush()
        return json.loads(_line(self.running))


def start_gateway(procs: Procs, engines: list[Engine], policy: str, model: str,
                  block_size: int, cost: dict, replicas: int = 1,
                  sync: bool = False, cpus: str = "", spread: bool = True) -> Gateway:
    """``cost``: ``scheduler.cost`` settings (``CostConfig`` fields) the gateway is given;
    ``replicas``: gateway processes on one port (module docstring); ``sync``: the replicas tell
    each other their requests in flight (``replicas.listen``/``peers``, ZeroMQ over IPC);
    ``spread`` false: the replicas after the first listen on ports of their own, so the
    client's connections (to ``Gateway.port``) all reach the first."""
    # IPC endpoints: nothing to pick ahead (a TCP port picked free was once taken meanwhile)
    endpoints = [f"ipc://{procs.tmpdir}/sync-{i}" for i in range(replicas)] if sync else []
    spec = {"model": model, "cost": cost, "tokenizer": ds.TOKENIZER_JSON, "block_size": block_size,
            "template": procs.template(), "bos": ds.BOS, "eos": ds.EOS, "policy": policy,
            "reuse_port": replicas > 1, "port": 0,
            "workers": [{"name": e.name, "url": e.url, "engine": e.flavor, "events": e.events,
                         "replay": e.replay, "role": e.role,
                         "bootstrap_port": e.bootstrap_port} for e in engines]}
    started: list[peers.Running] = []
    port = 0
    for index in range(replicas):  # the first picks the port, the others bind it too
        spec["port"] = port if spread else 0
        if endpoints:
            spec["sync_listen"] = endpoints[index]
            spec["sync_peers"] = [e for e in endpoints if e != endpoints[index]]
        name = f"gateway-{policy}" + (f"-{index}" if replicas > 1 else "")
        path = os.path.join(procs.tmpdir, f"{name}.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        running = spawn(procs, name, [sys.executable, "-m", "perf.replay_gateway", path],
                         stdin=subprocess.PIPE, cpus=cpus)
        line = _line(running)
        if not line.startswith("ready "):
            raise peers.StartError(f"{name} said {line!r}:\n{running.log_tail()}")
        port = port or int(line.split()[1])
        started.append(running)
    return Gateway(started[0], port, started)


def start_sglang_router(procs: Procs, engines: list[Engine], model: str) -> str:
    router = peers.start_sglang_router([e.url for e in engines], model)
    procs.running.append(router)
    return router.url
