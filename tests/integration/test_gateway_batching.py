"""Cortex in front of vLLM-flavoured simulated engines on the continuous-batching model, over
real sockets: after a small concurrent workload its ledger equals each engine's true cache —
blocks stored step by step (prompt chunks and full decode blocks alike) reach it exactly."""

from __future__ import annotations

import pytest
import trio

from cortex.sim.batching.factory import BatchingSettings
from tests.gateway_cluster import engine_keys, gateway_cluster, ledger_keys

SYSTEMS = [f"You are assistant number {n}, careful and brief. " * 12 for n in range(3)]


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
        await cluster.until(lambda: all(ledger_keys(cluster.running, e.name) == engine_keys(e)
                                        for e in cluster.engines))
        for engine in cluster.engines:
            assert engine.steppers and engine.steppers[0].steps > 0
        assert sum(len(engine_keys(e)) for e in cluster.engines) > 0
        assert sum(e.counters[0].cached_tokens for e in cluster.engines) > 0
