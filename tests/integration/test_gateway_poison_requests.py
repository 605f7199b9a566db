"""Poison requests (issue 33 §1): a request whose content makes every engine answer 500 must
not take workers out of service. The failure follows the request from worker to worker, so it
is the request's own: answered once with the engine's error, never a retry storm, counted
(``cortex_poisoned_requests_total``), and no worker's breaker counts it — while a worker that
fails requests other workers serve still opens its breaker
(``test_gateway_failing_answers``). Engines: ``cortex sim`` with its ``poison_marker`` fault
(a body containing the marker is answered 500 in the engine's internal-error shape)."""

from __future__ import annotations

import json

import pytest

from cortex.config import HealthConfig
from cortex.workers.breaker import BreakerState
from tests.gateway_cluster import MODEL, gateway_cluster
from tests.integration.test_gateway_failing_answers import question, sample_value
from tests.integration.test_pd_gateway import NO_BYPASS, messages, pd_cluster

MARKER = "POISON-33"
# Breakers open on the 3rd consecutive failure, and stay open for the whole test once open.
QUIET = {"health": HealthConfig(interval_s=600.0, timeout_s=2.0, failures_to_open=3,
                                open_s=600.0, load_interval_s=600.0)}


def poison(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Bad input {i}: {MARKER}"}]


def poisoned_total(cluster, status: str = "500") -> float | None:
    return sample_value(cluster.running.metrics.render().decode(),
                        "cortex_poisoned_requests_total", model=MODEL, status=status)


def all_in_service(cluster) -> None:
    registry = cluster.running.registry
    for engine in cluster.engines:
        status = registry.status(engine.name)
        assert status.breaker is BreakerState.CLOSED and status.live, (engine.name, status)
    assert cluster.running.gateway.readiness().http_status == 200


@pytest.mark.parametrize("flavors", [("vllm-0.33", "sglang-0.5.23"),
                                     ("vllm-0.33", "vllm-0.33", "sglang-0.5.23")])
async def test_poison_requests_never_take_a_worker_out(flavors):
    async with gateway_cluster(flavors, config_changes=QUIET,
                               engine_faults={"poison_marker": MARKER}) as cluster:
        for i in range(12):  # 4x what would open every breaker if each 500 counted
            bad = await cluster.chat(poison(i))
            assert bad.status == 500, bad.body  # the engine's own answer, relayed
            assert bad.header(b"x-cortex-attempts") == b"2"  # one retry, never a storm
            assert "simulated internal error" in bad.body.decode()
            good = await cluster.chat(question(i))
            assert good.status == 200, good.body
        assert sum(engine.handler.poisoned for engine in cluster.engines) == 12 * 2
        assert poisoned_total(cluster) == 12.0
        all_in_service(cluster)
        text = cluster.running.metrics.render().decode()
        for engine in cluster.engines:  # counted per worker all the same
            assert sample_value(text, "cortex_worker_breaker_opens_total",
                                worker=engine.name) in (None, 0.0)


async def test_with_one_worker_the_engines_answer_is_relayed_at_once():
    async with gateway_cluster(("sglang-0.5.23",), config_changes=QUIET,
                               engine_faults={"poison_marker": MARKER}) as cluster:
        for i in range(6):
            bad = await cluster.chat(poison(i))
            assert bad.status == 500 and bad.header(b"x-cortex-attempts") is None
            assert json.loads(bad.body)  # the engine's error body, not Cortex's 502
        assert cluster.engines[0].handler.poisoned == 6
        assert poisoned_total(cluster) is None  # one worker: no verdict, nobody blamed
        assert (await cluster.chat(question(0))).status == 200
        all_in_service(cluster)


@pytest.mark.parametrize("bypass", [False, True])
async def test_a_pd_pair_stops_after_the_second_worker_fails_the_same_request(bypass):
    """(With vLLM's bypass on, a decode answering 5xx alone was a handler crash, 500 with a
    traceback, before: its RetryableStatus escaped the orchestrator.)"""
    changes = {"health": QUIET["health"], **({} if bypass else {"pd": NO_BYPASS})}
    async with pd_cluster("vllm", ("prefill", "prefill", "prefill", "decode"),
                          config_changes=changes,
                          engine_faults={"poison_marker": MARKER}) as cluster:
        for i in range(6):
            bad = await cluster.chat(messages(f"{MARKER} {i}"))
            message = json.loads(bad.body)["error"]["message"]
            if bypass and bad.status == 500:
                # a prefill leg failed, then the retry went to decode alone (it holds the
                # prefix by now): a whole answer, relayed as the engine gave it, as for a
                # single worker (cortex.dispatch.blame)
                assert message.startswith("simulated internal error"), bad.body
            else:  # a leg's failure is never the client's answer: a clear 502
                assert bad.status == 502, bad.body
                assert bypass or "on two workers" in message, bad.body
            assert (await cluster.chat(messages(f"fine {i}"))).status == 200
        tries = sum(engine.handler.poisoned for engine in cluster.engines)
        if bypass:  # decode held the prefix after the first: alone, and the only decode worker
            assert 6 <= tries <= 6 * 2
        else:
            assert tries == 6 * 2 and poisoned_total(cluster) == 6.0
        all_in_service(cluster)
