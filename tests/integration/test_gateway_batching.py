"""Cortex in front of vLLM-flavoured simulated engines on the continuous-batching model, over
real sockets: after a small concurrent workload its ledger equals each engine's true cache —
blocks stored step by step (prompt chunks and full decode blocks alike) reach it exactly."""

from __future__ import annotations

import pytest
import trio

from cortex._fast.blockkeys import block_keys, namespace_seed
from cortex.sim.batching.factory import BatchingSettings
from cortex.sim.engine import SimEngine
from tests.gateway_cluster import BLOCK, MODEL, Cluster, gateway_cluster

SYSTEMS = [f"You are assistant number {n}, careful and brief. " * 12 for n in range(3)]


def truth_keys(engine: SimEngine) -> set[int]:
    return {block_keys(tokens, BLOCK, namespace_seed(MODEL, lora, salt))[-1]
            for lora, salt, tokens in engine.kv.truth(0)}


def ledger_keys(cluster: Cluster, engine: SimEngine) -> set[int]:
    book = cluster.running.book
    target = book.find(engine.name, 0)
    assert target is not None
    return book.target_keys(target).get(BLOCK, set())


@pytest.mark.parametrize("flavors", [("vllm-0.33", "vllm-0.33"),
                                     ("sglang-0.5.23", "sglang-0.5.23"),
                                     ("vllm-0.33", "sglang-0.5.23")])
async def test_ledger_equals_the_batching_engines_truth_after_a_small_workload(flavors):
    settings = BatchingSettings(max_num_batched_tokens=256, max_num_seqs=8, speedup=5.0)
    async with gateway_cluster(flavors, engine_model="batching",
                               batching=settings) as cluster:
        statuses: list[int] = []

        async def user(n: int) -> None:
            for turn in range(2):
                response = await cluster.chat(
                    [{"role": "system", "content": SYSTEMS[n % len(SYSTEMS)]},
                     {"role": "user", "content": f"Question {n}.{turn}?"}], max_tokens=24)
                statuses.append(response.status)

        async with trio.open_nursery() as nursery:
            for n in range(6):
                nursery.start_soon(user, n)
        assert statuses == [200] * 12
        await cluster.until(lambda: all(ledger_keys(cluster, e) == truth_keys(e)
                                        for e in cluster.engines))
        for engine in cluster.engines:
            assert engine.steppers and engine.steppers[0].steps > 0
        assert sum(len(truth_keys(e)) for e in cluster.engines) > 0
        assert sum(e.counters[0].cached_tokens for e in cluster.engines) > 0
