"""``cortex demo``: Cortex against round robin on real traffic, then the ledger under faults.

Section 1 — routing (``routing_section``): starts a simulated cluster (vLLM- and
SGLang-flavoured ``cortex sim`` engines in their own processes, real HTTP, real ZeroMQ KV
events) and the gateway, replays a time-compressed slice of the Mooncake conversation trace
through Cortex, then on a fresh cluster through round robin (the same gateway with its ledger
unused), then through Cortex in front of a prefill/decode cluster of the same engine count
(``cortex-pd``: per flavor two prefill engines and one decode engine, both legs of every
request orchestrated by Cortex), prints a side-by-side table (prefix-cache hit rate, TTFT mean/p50/p99, prefill
tokens computed, duplicated blocks, req/s, load spread, utilization, ledger accuracy) and writes
an SVG chart (TTFT distribution, requests per worker) and the JSON result to a folder it prints.
It is ``perf/replay.py`` with a fixed, small configuration (``DEMO``); the replay and its
figures are described there and in ``perf/RESULTS.md``.

Section 2 — the ledger (``ledger_section``): vLLM 0.33 / 0.23 and SGLang 0.5.23 / 0.5.19
simulated engines (two with 2 DP ranks) under chat-like traffic with dropped, duplicated and
reordered batches, restarts and cache clears; per (worker, rank) the ledger's trust state and how
it compares with the engine's true cache, and what ``match`` reports for a few prompts.

``run_demo`` returns True (exit 0) only if every replayed request succeeded, Cortex's predicted
cached tokens (``x-cortex-cache-hit-tokens``) equal what the engines reported for at least
``EXACT_MIN`` of the requests (on the PD cluster: the prefill engines' reports) (the rest are decisions made while the same worker was still
storing or evicting blocks for an earlier request), and every ledger equals its engine in
section 2.

This module needs the checkout's ``perf/`` and ``tests/`` folders (``make demo`` runs from it).
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import trio

from cortex._fast.blockkeys import block_keys, namespace_seed
from cortex.sim.cluster import EngineSpec, SimCluster, start_cluster

REPO = Path(__file__).resolve().parent.parent
EXACT_MIN = 0.99

BLOCK = 16
MODEL = "demo-model"
SPECS = [
    EngineSpec("vllm-a", "vllm-0.33", dp_size=2),
    EngineSpec("vllm-b", "vllm-0.23"),
    EngineSpec("sglang-a", "sglang-0.5.23", dp_size=2),
    EngineSpec("sglang-b", "sglang-0.5.19"),
]


def _prompt(rng: random.Random, systems: list[list[int]]) -> list[int]:
    system = rng.choice(systems)
    turns = rng.randint(1, 6)
    return system + [rng.randrange(32000) for _ in range(turns * rng.randint(20, 90))]


def _inject_fault(rng: random.Random, cluster: SimCluster, log: list[str]) -> None:
    worker, rank, _ = rng.choice(list(cluster.targets()))
    engine = cluster.engines[worker]
    kind = rng.choice(["drop", "drop", "duplicate", "reorder", "stall", "restart", "clear"])
    if kind == "drop":
        engine.faults(rank).drop_next(rng.randint(1, 4))
    elif kind == "duplicate":
        engine.faults(rank).duplicate_next(2)
    elif kind == "reorder":
        engine.faults(rank).reorder_next(1)
    elif kind == "stall":
        engine.publisher(rank).stall(0.05)
    elif kind == "restart":
        engine.restart(rank)
    else:
        engine.clear(rank)
    log.append(f"{kind}@{worker}/{rank}")


def _print_table(cluster: SimCluster) -> bool:
    header = (
        f"{'worker/rank':<14}{'wire':<15}{'state':<9}{'ledger':>8}{'engine':>8}"
        f"{'false+':>8}{'missed':>8}{'gaps':>6}{'fixed':>7}{'restarts':>10}{'dups':>6}"
    )
    print(header)
    print("-" * len(header))
    exact = True
    for worker, rank, _ in cluster.targets():
        cmp = cluster.compare(worker, rank)
        c = cluster.counters(worker, rank)
        state = cluster.state(worker, rank).value
        exact &= cmp.exact
        print(
            f"{worker + '/' + str(rank):<14}{cluster.engines[worker].profile.name:<15}"
            f"{state:<9}{cmp.ledger_blocks:>8}{cmp.engine_blocks:>8}{cmp.false_hits:>8}"
            f"{cmp.missed:>8}{c.gaps:>6}{c.gaps_repaired:>7}{c.restarts:>10}"
            f"{c.duplicates + c.replay_overlap:>6}"
        )
    return exact


def _print_matches(cluster: SimCluster, rng: random.Random, systems: list[list[int]]) -> None:
    print("\nmatch(prompt) — leading blocks per worker, ledger vs engine truth:")
    seed = namespace_seed(MODEL)
    truths = {(w, r): cluster.truth_keys(w, r) for w, r, _ in cluster.targets()}
    for i in range(3):
        prompt = _prompt(rng, systems)
        keys = block_keys(prompt, BLOCK, seed)
        for family in {e.profile.family for e in cluster.engines.values()}:
            ledger = cluster.book.match(family, MODEL, BLOCK, keys)
            parts = []
            for worker, rank, target in cluster.targets():
                if cluster.engines[worker].profile.family is not family:
                    continue
                truth = truths[(worker, rank)]
                held = next((n for n, k in enumerate(keys) if k not in truth), len(keys))
                parts.append(f"{worker}/{rank} {ledger.get(target, 0)}|{held}")
            print(f"  prompt {i} ({len(keys)} blocks, {family.value}): " + ", ".join(parts))


async def ledger_section(seconds: float = 8.0, seed: int = 7) -> bool:
    """Section 2: every ledger against its engine's true cache, with faults injected."""
    rng = random.Random(seed)
    systems = [[rng.randrange(32000) for _ in range(BLOCK * rng.randint(4, 24))] for _ in range(6)]
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(
            nursery, SPECS, model=MODEL, block_size=BLOCK, capacity_blocks=600, seed=seed
        )
        print(f"{len(SPECS)} simulated engines, {len(cluster.target)} KV-event "
              f"streams over ZeroMQ, block size {BLOCK}, 600 blocks per rank")
        faults: list[str] = []
        requests = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for worker, rank, _ in cluster.targets():
                cluster.engines[worker].submit(rank, _prompt(rng, systems))
                requests += 1
            if rng.random() < 0.08:
                _inject_fault(rng, cluster, faults)
            await trio.sleep(0.002)
        for _ in range(5):  # clean tail, so every dropped batch shows up as a gap
            for worker, rank, _ in cluster.targets():
                cluster.engines[worker].submit(rank, _prompt(rng, systems))
                requests += 1
        await cluster.quiet()
        total = cluster.handle.total()
        print(f"{requests} requests, {total.batches_applied} batches applied, "
              f"{total.stored_blocks} blocks stored, {total.removed_blocks} removed; "
              f"faults injected: {len(faults)} ({', '.join(faults[:12])}"
              f"{', ...' if len(faults) > 12 else ''})\n")
        exact = _print_table(cluster)
        _print_matches(cluster, rng, systems)
        print(f"\nledger {'equals' if exact else 'DIFFERS FROM'} every engine's cache; "
              f"{cluster.book.entries} entries, {cluster.book.memory_bytes / 1e6:.1f} MB")
        nursery.cancel_scope.cancel()
    return exact


def _replay():
    """``perf.replay``: the demo runs from a checkout, whose root it puts on ``sys.path``
    (``cortex demo`` may be started from anywhere)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from perf import replay

    return replay


def demo_params(seed: int = 0):
    replay = _replay()
    return replace(replay.Params(), trace="conversation", start=0, requests=600,
                   block_tokens=32, engine_block=16, engines=6, flavors="mixed",
                   capacity=0.1, capacity_basis="trace", prefill_tokens_per_s=3000.0, decode_ms_per_token=2.0,
                   max_running=1, max_output=16, utilization=0.7, max_blocks=48, seed=seed)


ROUTERS = ("cortex", "round_robin", "cortex-pd")
PREDICTING = ("cortex", "cortex-pd")  # the routers whose predictions must be exact


def routing_section(seed: int = 0, out_dir: str | None = None) -> bool:
    """Section 1 (blocking: runs its own processes and event loops)."""
    replay = _replay()
    from perf.replay_chart import chart_svg

    params = demo_params(seed)
    out_dir = out_dir or os.path.join(tempfile.gettempdir(), "cortex-demo")
    os.makedirs(out_dir, exist_ok=True)
    print(f"cortex demo 1/2 - routing: {params.engines} simulated engines "
          f"({params.engines // 2} vLLM-, {params.engines - params.engines // 2} "
          f"SGLang-flavoured), conversation trace requests {params.start}.."
          f"{params.start + params.requests}", flush=True)
    started = time.monotonic()
    result = replay.compare(params, list(ROUTERS), keep_results=True,
                            log=lambda m: print("  " + m, flush=True))
    facts = result["slice"]
    print(f"  cache {result['capacity_blocks_per_engine']} blocks of {params.engine_block} "
          f"tokens per engine (the cluster holds {params.capacity:.0%} of the trace's "
          f"{result['capacity_basis_blocks']:,} unique blocks, "
          f"{result['cluster_share_of_slice']:.0%} of the slice's {facts['unique_blocks']:,}); "
          f"arrivals {result['time_scale']}x real time; reusable blocks in the slice: "
          f"{facts['intrinsic_reuse']:.1%}")
    engines = result["params"]
    print(f"  engines: continuous batching on the {engines['step_profile']} step profile, each "
          f"token standing for {params.tokens_per_token():g} of the trace's, step budget "
          f"{params.step_budget()} tokens (prefill under load ~"
          f"{engines['prefill_tokens_per_s']:,.0f} tokens/s per engine; PD roles too)\n"
          if params.engine_model == "batching" else "")
    print(replay.table(result))
    chart = os.path.join(out_dir, "routing.svg")
    with open(chart, "w") as f:
        f.write(chart_svg(result, f"cortex demo: conversation trace, {params.requests} "
                                  f"requests, {params.engines} engines"))
    with open(os.path.join(out_dir, "routing.json"), "w") as f:
        json.dump(result, f, indent=1)
    failed = sum(run["failed"] for run in result["routers"].values())
    print(f"\nchart: {chart} (TTFT distribution, requests per worker); JSON beside it; "
          f"{time.monotonic() - started:.0f} s")
    exact_everywhere = True
    for name in PREDICTING:
        ledger = result["routers"][name]["ledger"]
        exact = ledger["exact_share"] or 0.0
        exact_everywhere &= exact >= EXACT_MIN
        print(f"{name}: predicted cached tokens equal the engines' for {exact:.1%} of requests "
              f"(total error {ledger['abs_error_tokens']:,} tokens)")
    print(f"failed requests: {failed}\n", flush=True)
    return failed == 0 and exact_everywhere


async def run_demo(seconds: float = 8.0, seed: int = 7) -> bool:
    """Both sections; True when the routing replay and the ledger check both passed."""
    routed = await trio.to_thread.run_sync(routing_section, 0)
    print("cortex demo 2/2 - the ledger against the engines, with faults injected", flush=True)
    exact = await ledger_section(seconds, seed)
    print(NEXT_STEPS, flush=True)
    return routed and exact


# Where a new user goes from here (the README's quick start needs ``cortex`` on the PATH).
NEXT_STEPS = """
next: Cortex in front of two simulated engines, by hand: README.md, "Quick start without a GPU".
  `cortex` is .venv/bin/cortex in this checkout: export PATH="$PWD/.venv/bin:$PATH"
"""
