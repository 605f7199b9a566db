"""Added latency of Cortex's prefill/decode (PD) path against aggregated serving (issue 6).

Two clusters per engine flavor behind their own Cortex, at equal worker count and equal
simulated timing: *aggregated* (two ``both`` engines) and *PD* (one prefill, one decode
engine, ``cortex.sim.pd``). The same prompts go to both, interleaved request by request, so
machine noise hits both alike. Every prompt is new (no cache hit anywhere): what differs is
only the PD machinery — SGLang: two legs sent at once, decode fetching the room's KV from the
prefill's bootstrap port; vLLM: the prefill request (``max_tokens`` 1) answered first, then the
decode request with its ``kv_transfer_params``, decode fetching over the side channel.

Measured at the client, streamed chat requests, one at a time (c=1) and 8 at once (c=8):
time to the first SSE data chunk (TTFT) and to the end of the stream. Each engine is its own
``cortex sim`` process (its tokenization does not delay another engine's timers); the two
gateways and the client share this process, alike for both paths.

    .venv/bin/python -m perf.bench_pd            # ~1 minute
    .venv/bin/python -m perf.bench_pd --quick    # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import trio

from cortex.app import Running, run_gateway
from cortex.config.tree import (
    ControlConfig,
    CortexConfig,
    HealthConfig,
    ServerConfig,
)
from cortex.pd.plan import PdSettings
from cortex.scheduling.view import Role
from cortex.sim.serving import TimingConfig
from cortex.workers.spec import WorkerSpec
from perf.benchkit import percentile
from tests import deepseek_profile as ds
from tests.front_http_client import RawClient
from tests.gateway_cluster import (
    BLOCK,
    MODEL,
    all_ready,
    model_config,
    template_path,
    wait_for,
)

FLAVORS = {"sglang": "sglang-0.5.23", "vllm": "vllm-0.33"}
WORDS = ("alpha", "river", "stone", "maple", "cloud", "ember", "quartz", "violet", "harbor",
         "signal", "lantern", "meadow", "copper", "falcon", "orbit", "canyon")


def prompts(count: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"Request {i}: " + " ".join(rng.choice(WORDS) for _ in range(words))
            for i in range(count)]


async def one(port: int, text: str, max_tokens: int) -> tuple[float, float]:
    body = json.dumps({"model": MODEL, "max_tokens": max_tokens, "stream": True,
                       "messages": [{"role": "user", "content": text}]}).encode()
    client = await RawClient.connect(port)
    try:
        started = trio.current_time()
        await client.send(b"POST /v1/chat/completions HTTP/1.1\r\nhost: b\r\ncontent-type: "
                          b"application/json\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        status, headers, _ = await client.read_head()
        if status != 200:
            raise RuntimeError(f"status {status}")
        first = None
        async for part in client.body_parts(headers):  # chunked, or whole with its length
            if first is None and b"data: {" in part:
                first = trio.current_time()
        end = trio.current_time()
    finally:
        await client.aclose()
    assert first is not None
    return first - started, end - started


async def start_sim(nursery: trio.Nursery, flavor: str, name: str, role: str,
                    timing: TimingConfig) -> WorkerSpec:
    """One ``cortex sim`` process (its own event loop, as a real engine has); its worker spec."""
    argv = [sys.executable, "-m", "cortex", "sim", "--engine", FLAVORS[flavor], "--name", name,
            "--port", "0", "--model", MODEL, "--block-size", str(BLOCK),
            "--prefill-tokens-per-s", str(timing.prefill_tokens_per_s),
            "--decode-ms-per-token", str(timing.decode_s_per_token * 1000.0),
            "--max-running", str(timing.max_running), "--tokenizer", ds.TOKENIZER_JSON,
            # the fixed model on both paths (the figures in perf/RESULTS.md were measured
            # on it; PD roles run on the batching model too now), and the
            # comparison needs equal timing
            "--engine-model", "fixed",
            "--chat-template", template_path(), "--bos-token", ds.BOS, "--eos-token", ds.EOS]
    if role != "both":
        argv += ["--pd-role", role] + (["--bootstrap-port", "0"] if role == "prefill" else [])
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = await nursery.start(partial(trio.run_process, argv, stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, env=env, check=False))
    buffer = b""
    while b"\n" not in buffer:
        data = await process.stdout.receive_some(4096)
        if not data:
            raise RuntimeError(f"cortex sim {name} exited early")
        buffer += data
    parts = buffer.decode().split()
    fields = dict(part.split("=", 1) for part in parts[4:] if "=" in part)
    return WorkerSpec(parts[0], parts[2], engine=flavor, model=MODEL, role=Role(role),
                      events=fields["rank0"], replay=fields.get("replay0"),
                      bootstrap_port=int(fields["bootstrap"]) if "bootstrap" in fields
                      else None)


@asynccontextmanager
async def cluster(flavor: str, roles: tuple[str, ...],
                  timing: TimingConfig) -> AsyncIterator[Running]:
    """Engines (one process each) behind a gateway running in this process."""
    async with trio.open_nursery() as nursery:
        workers = []
        for i, role in enumerate(roles):
            workers.append(await start_sim(nursery, flavor, f"{role[0]}{i}_", role, timing))
        config = CortexConfig(
            server=ServerConfig(host="127.0.0.1", port=0),
            control=ControlConfig(host="127.0.0.1", port=0, admin_token="bench-token"),
            models=(model_config(),), workers=tuple(workers),
            health=HealthConfig(interval_s=1.0, timeout_s=5.0, load_interval_s=0.5),
            pd=PdSettings(bypass_max_uncached_tokens=0))
        running = await nursery.start(run_gateway, config)
        await wait_for(running, lambda: all_ready(running), 60.0)
        yield running
        nursery.cancel_scope.cancel()


async def run_flavor(flavor: str, texts: list[str], max_tokens: int, concurrency: int,
                     timing: TimingConfig) -> dict[str, dict[str, list[float]]]:
    samples: dict[str, dict[str, list[float]]] = {
        path: {"ttft": [], "e2e": []} for path in ("aggregated", "pd")}
    async with cluster(flavor, ("both", "both"), timing) as agg, \
            cluster(flavor, ("prefill", "decode"), timing) as pd:
        ports = {"aggregated": agg.data_port, "pd": pd.data_port}
        for start in range(0, len(texts), concurrency):
            batch = texts[start:start + concurrency]
            # interleaved: aggregated then PD for each batch, alternating which goes first
            order = ("aggregated", "pd") if (start // concurrency) % 2 == 0 else (
                "pd", "aggregated")
            for path in order:
                results: list[tuple[float, float]] = []

                async def send(text: str, path: str = path,
                               results: list[tuple[float, float]] = results) -> None:
                    results.append(await one(ports[path], text, max_tokens))

                async with trio.open_nursery() as nursery:
                    for text in batch:  # every prompt is new to both clusters
                        nursery.start_soon(send, text)
                samples[path]["ttft"] += [r[0] for r in results]
                samples[path]["e2e"] += [r[1] for r in results]
        served = pd.gateway.pd.counters.served
        if served != len(texts):
            raise RuntimeError(f"PD served {served} of {len(texts)} through the pair")
    return samples


def report(flavor: str, concurrency: int, samples: dict[str, dict[str, list[float]]]) -> None:
    agg, pd = samples["aggregated"], samples["pd"]
    for metric in ("ttft", "e2e"):
        a50, p50 = statistics.median(agg[metric]) * 1e3, statistics.median(pd[metric]) * 1e3
        a90, p90 = percentile(agg[metric], 0.9) * 1e3, percentile(pd[metric], 0.9) * 1e3
        print(f"| {flavor} | {concurrency} | {metric} | {a50:.2f} | {p50:.2f} | "
              f"{p50 - a50:+.2f} | {a90:.2f} | {p90:.2f} |", flush=True)


async def main(args: argparse.Namespace) -> None:
    timing = TimingConfig(prefill_tokens_per_s=args.prefill_tokens_per_s,
                          decode_s_per_token=args.decode_ms_per_token / 1000.0,
                          max_running=64)
    print(f"prompts: {args.requests} per cell, ~{args.words} words "
          f"(~{args.words * 1.1:.0f} tokens), {args.max_tokens} output tokens; sim prefill "
          f"{args.prefill_tokens_per_s:.0f} tok/s, decode {args.decode_ms_per_token} ms/token, "
          "KV transfer 2M tok/s")
    print("| flavor | c | metric | aggregated p50 ms | PD p50 ms | PD − agg p50 | "
          "aggregated p90 | PD p90 |")
    print("|---|---|---|---|---|---|---|---|")
    for flavor in args.flavors:
        for concurrency in args.concurrency:
            texts = prompts(args.requests, args.words, seed=concurrency)
            samples = await run_flavor(flavor, texts, args.max_tokens, concurrency, timing)
            report(flavor, concurrency, samples)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run (few requests)")
    parser.add_argument("--requests", type=int, default=80)
    parser.add_argument("--words", type=int, default=900, help="words per prompt")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--prefill-tokens-per-s", type=float, default=50_000.0)
    parser.add_argument("--decode-ms-per-token", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--flavors", nargs="+", default=sorted(FLAVORS), choices=sorted(FLAVORS))
    args = parser.parse_args()
    if args.quick:
        args.requests, args.words, args.concurrency = 8, 200, [1, 4]
    return args


if __name__ == "__main__":
    trio.run(main, parse())
