"""The ledger equals the engines' truth: simulated vLLM and SGLang engines of every wire era,
real ZeroMQ, random shared-prefix workloads with evictions, cache salts and injected faults.

Once the streams are quiet, every READY target's ledger holds exactly the blocks its engine
holds (no false hits, no missed blocks); every injected gap was detected; restarts and clears
emptied the right entries; a gap the replay buffer could not close left the target PARTIAL with
a ledger that is a subset of the truth, until the engine's cache was cleared.
"""

from __future__ import annotations

import random

import pytest

from cortex.events.source import IngestSettings
from cortex.ledger.state import TargetState
from cortex.sim.cluster import EngineSpec, SimCluster, start_cluster

BLOCK = 4
VOCAB = 500
SHORT = "vllm-short"  # replay buffer of 2 batches: a longer gap cannot be repaired
SPECS = [
    EngineSpec("vllm-new", "vllm-0.33", dp_size=2),
    EngineSpec("vllm-old", "vllm-0.23"),
    EngineSpec("sglang-new", "sglang-0.5.23", dp_size=2),
    EngineSpec("sglang-old", "sglang-0.5.19"),
    EngineSpec(SHORT, "vllm-0.33", buffer_steps=2),
]


class Workload:
    """Prompts drawn from shared prefixes plus private tails; some carry a cache salt."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.prefixes = [
            [rng.randrange(VOCAB) for _ in range(BLOCK * rng.randint(1, 5))] for _ in range(10)
        ]

    def submit(self, cluster: SimCluster, worker: str, rank: int, count: int = 1) -> None:
        rng = self.rng
        for _ in range(count):
            tokens = list(rng.choice(self.prefixes))
            tokens += [rng.randrange(VOCAB) for _ in range(rng.randint(0, 3 * BLOCK + 2))]
            salt = rng.choice(["tenant-a", "tenant-b"]) if rng.random() < 0.15 else None
            cluster.engines[worker].submit(rank, tokens, cache_salt=salt)

    def everywhere(self, cluster: SimCluster, rounds: int) -> None:
        for _ in range(rounds):
            for worker, rank, _ in cluster.targets():
                self.submit(cluster, worker, rank)

    def fresh(self, cluster: SimCluster, worker: str, rank: int, count: int = 1) -> None:
        """Never-seen prompts: each one publishes exactly one batch."""
        for _ in range(count):
            tokens = [VOCAB + self.rng.randrange(10**6) for _ in range(2 * BLOCK)]
            cluster.engines[worker].submit(rank, tokens)

    def clean_tail(self, cluster: SimCluster) -> None:
        """A batch on every stream, so any batch dropped before it shows up as a gap."""
        for worker, rank, _ in cluster.targets():
            self.fresh(cluster, worker, rank)


def assert_equals_truth(cluster: SimCluster) -> None:
    for worker, rank, _ in cluster.targets():
        assert cluster.state(worker, rank) is TargetState.READY, (worker, rank)
        comparison = cluster.compare(worker, rank)
        assert comparison.exact, (worker, rank, comparison)


@pytest.mark.parametrize("seed", [1, 2])
async def test_ledger_equals_engine_truth_under_faults(nursery, seed):
    cluster = await start_cluster(
        nursery, SPECS, block_size=BLOCK, capacity_blocks=40, seed=seed,
        settings=IngestSettings(replay_timeout_s=2.0),
    )
    work = Workload(random.Random(seed))

    # 1. Plain traffic with evictions (capacity 40 blocks per rank).
    work.everywhere(cluster, rounds=30)
    await cluster.quiet()
    assert_equals_truth(cluster)
    for worker, rank, _ in cluster.targets():
        assert cluster.engines[worker].stats(rank).blocks_removed > 0, "the workload must evict"

    # 2. Faults on every rank: dropped, duplicated and reordered batches, a stalled stream.
    gaps_before = {}
    for worker, rank, _ in cluster.targets():
        if worker == SHORT:
            continue
        gaps_before[(worker, rank)] = cluster.counters(worker, rank).gaps
        faults = cluster.engines[worker].faults(rank)
        faults.drop_next(2)
        work.fresh(cluster, worker, rank, count=2)
        work.submit(cluster, worker, rank, count=4)
        faults.duplicate_next(2)
        faults.reorder_next(1)
        cluster.engines[worker].publisher(rank).stall(0.05)
        work.submit(cluster, worker, rank, count=6)
    work.everywhere(cluster, rounds=3)
    work.clean_tail(cluster)
    await cluster.quiet()
    assert_equals_truth(cluster)
    for (worker, rank), before in gaps_before.items():
        c = cluster.counters(worker, rank)
        assert c.gaps > before, (worker, rank)
        assert c.gaps_repaired >= 1 and c.gaps_unrepaired == 0, (worker, rank, c)
        assert c.duplicates + c.replay_overlap >= 1, (worker, rank, c)

    # 3. Restarts and clears empty exactly the right entries.
    restarted = [("vllm-new", 1), ("sglang-old", 0)]
    for worker, rank in restarted:
        cluster.engines[worker].restart(rank)
    cluster.engines["sglang-new"].clear(0)
    cluster.engines["vllm-old"].clear(0)
    work.everywhere(cluster, rounds=4)
    await cluster.quiet()
    assert_equals_truth(cluster)
    for worker, rank in restarted:
        assert cluster.counters(worker, rank).restarts >= 1

    # 4. A gap longer than the replay buffer: entries dropped, PARTIAL, never a false hit ...
    cluster.engines[SHORT].faults(0).drop_next(5)
    work.fresh(cluster, SHORT, 0, count=5)
    work.clean_tail(cluster)
    await cluster.quiet()
    assert cluster.state(SHORT, 0) is TargetState.PARTIAL
    assert cluster.counters(SHORT, 0).gaps_unrepaired >= 1
    partial_view = cluster.compare(SHORT, 0)
    assert partial_view.false_hits == 0, partial_view
    # ... until the engine's cache is known empty again.
    cluster.engines[SHORT].clear(0)
    work.everywhere(cluster, rounds=3)
    await cluster.quiet()
    assert_equals_truth(cluster)
