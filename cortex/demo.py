"""``cortex demo``: a simulated cluster feeding Cortex's ledger over real ZeroMQ, with faults.

Starts vLLM- and SGLang-flavoured simulated engines (several wire eras, DP ranks), ingests all
their KV-event streams into one ledger book, drives a shared-prefix chat workload through them
while injecting dropped, duplicated and reordered batches, restarts and cache clears, and then
prints, per (worker, rank), the ledger's trust state and how it compares with the engine's true
cache, plus what ``match`` reports for a few prompts against what the engines really hold.
"""

from __future__ import annotations

import random
import time

import trio

from cortex._fast.blockkeys import block_keys, namespace_seed
from cortex.sim.cluster import EngineSpec, SimCluster, start_cluster

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


async def run_demo(seconds: float = 8.0, seed: int = 7) -> bool:
    rng = random.Random(seed)
    systems = [[rng.randrange(32000) for _ in range(BLOCK * rng.randint(4, 24))] for _ in range(6)]
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(
            nursery, SPECS, model=MODEL, block_size=BLOCK, capacity_blocks=600, seed=seed
        )
        print(f"cortex demo: {len(SPECS)} simulated engines, {len(cluster.target)} KV-event "
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
