"""Soak: sustained load through Cortex over simulated engines, watching Cortex's memory.

Cortex runs as its own process (``python -m cortex serve``) in front of four simulated engines
(two vLLM 0.33, two SGLang 0.5.23, real HTTP and real ZeroMQ KV events with replay) that run
in this process together with the load generator: ``--clients`` connections sending chat
requests back to back (half streamed, six tenants' system prompts with a new user message
each, from ``tests/chaos/load.py``). Every ``--sample-s`` seconds Cortex's resident set size
(``/proc/<pid>/status`` VmRSS) and CPU time are sampled.

Figures (JSON on stdout):

* ``requests``: sent / succeeded / failed with a clear error / hung / no answer, and req/s;
* ``rss_slope_bytes_per_min``: least-squares slope of RSS over time, over all samples and over
  the samples after the first fifth of the run (the warm-up: caches filling, allocator arenas
  growing), plus RSS at start, end and max;
* ``cpu_s``: Cortex's user+system CPU seconds over the run.

Every request carries a new user message, so Cortex's token-segment cache (bounded, 64 MiB by
default) fills for the whole run and its RSS grows with it until the budget is reached;
``--segment-cache-bytes`` shrinks the budget to tell that bounded growth from a leak.

Usage: ``python -m perf.soak [--minutes 10] [--clients 16] [--segment-cache-bytes N]
[--quick]`` (``--quick``: 20 s, sampled every second; CI smoke-runs it). Exit 1 if Cortex
does not start or a request hung.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from cortex.sim.engine import SimEngine
from cortex.sim.serving import TimingConfig
from perf.benchkit import machine_info
from tests import deepseek_profile as ds
from tests.chaos.load import Tally, client_loop
from tests.gateway_cluster import BLOCK, MODEL, model_profile, template_path

HERE = Path(__file__).resolve().parent
HOST = "127.0.0.1"
FLAVORS = ("vllm-0.33", "sglang-0.5.23", "vllm-0.33", "sglang-0.5.23")
TIMING = TimingConfig(prefill_tokens_per_s=400_000, decode_s_per_token=0.002, max_running=64)
READY_TIMEOUT_S = 90.0


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def slope_per_min(samples: list[tuple[float, int]]) -> float | None:
    """Least-squares slope of (seconds, bytes) samples, in bytes per minute."""
    if len(samples) < 3:
        return None
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_v = sum(v for _, v in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    if var == 0:
        return None
    cov = sum((t - mean_t) * (v - mean_v) for t, v in samples)
    return cov / var * 60.0


def start_cortex(engines: list[SimEngine], tmpdir: str, segment_cache_bytes: int | None,
                 extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen[bytes], int, int]:
    """``extra``: more ``cortex serve`` arguments."""
    port, control = _free_port(), _free_port()
    cache = "" if segment_cache_bytes is None else f",segment_cache_bytes={segment_cache_bytes}"
    argv = [sys.executable, "-m", "cortex", "serve", "--server-host", HOST,
            "--server-port", str(port), "--control-host", HOST, "--control-port", str(control),
            "--log-level", "warning",
            "--model", f"{MODEL},tokenizer={ds.TOKENIZER_JSON},block_size={BLOCK},"
                       f"chat_template={template_path()},bos_token={ds.BOS},"
                       f"eos_token={ds.EOS}{cache}"]
    for engine in engines:
        endpoints = engine.kv.endpoints(0)
        kind = "vllm" if "vllm" in engine.wire.name else "sglang"
        argv += ["--worker", f"{engine.url},name={engine.name},engine={kind},model={MODEL},"
                             f"events={endpoints.pub},replay={endpoints.replay}"]
    argv += extra
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORTEX_")}
    log = open(os.path.join(tmpdir, "cortex.log"), "wb")  # noqa: SIM115 (the child owns it)
    try:
        process = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                   cwd=HERE.parent, env=env, start_new_session=True)
    finally:
        log.close()
    return process, port, control


def stop_cortex(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to Cortex's process group, SIGKILL if it is not gone within 15 s."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=15)


async def wait_ready(process: subprocess.Popen[bytes], control: int, tmpdir: str) -> None:
    """Poll the control plane's readiness (another process: no task_status to wait on)."""
    from tests.front_http_client import RawClient

    deadline = trio.current_time() + READY_TIMEOUT_S
    while trio.current_time() < deadline:
        if process.poll() is not None:
            break
        try:
            client = await RawClient.connect(control)
            try:
                response = await client.request(b"GET", b"/health/ready")
            finally:
                await client.aclose()
            if response.status == 200:
                return
        except OSError:
            pass
        await trio.sleep(0.2)
    log = Path(tmpdir, "cortex.log").read_text(errors="replace")[-3000:]
    raise RuntimeError(f"Cortex did not become ready (exit {process.poll()}):\n{log}")


async def soak(duration_s: float, clients: int, sample_s: float,
               segment_cache_bytes: int | None = None) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="cortex-soak-") as tmpdir:  # Cortex's log
        return await _soak(tmpdir, duration_s, clients, sample_s, segment_cache_bytes)


async def _soak(tmpdir: str, duration_s: float, clients: int, sample_s: float,
                segment_cache_bytes: int | None) -> dict[str, object]:
    async with trio.open_nursery() as nursery:
        engines = []
        for i, flavor in enumerate(FLAVORS):
            engine = SimEngine(f"e{i}", flavor, model_profile(), block_size=BLOCK,
                               capacity_blocks=2048, timing=TIMING,
                               rng=random.Random(f"soak/{i}"))
            await nursery.start(engine.run)
            engines.append(engine)
        process, port, control = start_cortex(engines, tmpdir, segment_cache_bytes)
        try:
            await wait_ready(process, control, tmpdir)
            tally = Tally()
            stop = trio.Event()
            samples: list[tuple[float, int]] = []
            began = trio.current_time()
            cpu_before = cpu_seconds(process.pid)
            async with trio.open_nursery() as load:
                serials = [0]
                for i in range(clients):
                    load.start_soon(_client, port, i, tally, stop, serials)
                while (elapsed := trio.current_time() - began) < duration_s:
                    samples.append((elapsed, rss_bytes(process.pid)))
                    await trio.sleep(min(sample_s, duration_s - elapsed))
                samples.append((trio.current_time() - began, rss_bytes(process.pid)))
                stop.set()
            run_s = trio.current_time() - began
            cpu = cpu_seconds(process.pid) - cpu_before
        finally:
            stop_cortex(process)
        nursery.cancel_scope.cancel()
    warm = [s for s in samples if s[0] >= duration_s / 5]
    figures = tally.figures()
    return {
        "machine": {**machine_info(), "loadavg": os.getloadavg()},
        "duration_s": round(run_s, 1),
        "clients": clients,
        "requests": {**{k: figures[k] for k in ("sent", "succeeded",
                                                 "failed_with_clear_error", "hung",
                                                 "no_answer", "bad")},
                     "req_per_s": round(tally.sent / run_s, 1)},
        "rss_mib": {"start": round(samples[0][1] / 2**20, 1),
                    "end": round(samples[-1][1] / 2**20, 1),
                    "max": round(max(v for _, v in samples) / 2**20, 1)},
        "rss_slope_bytes_per_min": {
            "all": _round(slope_per_min(samples)),
            "after_first_fifth": _round(slope_per_min(warm)),
        },
        "rss_samples": [(round(t, 1), v) for t, v in samples],
        "cpu_s": round(cpu, 1),
        "segment_cache_bytes": segment_cache_bytes or "default",
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value)


async def _client(port: int, i: int, tally: Tally, stop: trio.Event, serials: list[int]) -> None:
    await client_loop(port, random.Random(f"soak-client/{i}"), tally, stop, None,
                      deadline_s=60.0, stream_share=0.5, serials=serials)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--segment-cache-bytes", type=int, default=None,
                        help="Cortex's token-segment cache budget (default: Cortex's own)")
    parser.add_argument("--quick", action="store_true", help="20 s, sampled every second")
    args = parser.parse_args()
    duration = 20.0 if args.quick else args.minutes * 60
    sample = 1.0 if args.quick else args.sample_s
    started = time.time()
    try:
        result = trio.run(soak, duration, args.clients, sample, args.segment_cache_bytes)
    except RuntimeError as error:
        print(f"soak: {error}", file=sys.stderr)
        return 1
    result["started_unix"] = round(started)
    result["command"] = " ".join(["python", "-m", "perf.soak", *sys.argv[1:]])
    print(json.dumps(result, indent=1))
    return 1 if result["requests"]["hung"] else 0  # type: ignore[index]


if __name__ == "__main__":
    sys.exit(main())
