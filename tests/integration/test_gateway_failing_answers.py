"""A worker that answers 500 or 429, one that answers a status that is not HTTP, and one whose
streams die midway (issue 22 §3): before the first byte the request goes to another worker
within the retry budget, every failure is counted by worker, phase and status, and repeated
failures open the worker's breaker (a 429 is load, not a failure: it does not)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cortex.config import HealthConfig
from cortex.workers.breaker import BreakerState
from tests.gateway_cluster import gateway_cluster

QUIET = {"health": HealthConfig(interval_s=600.0, timeout_s=2.0, failures_to_open=3,
                                open_s=600.0, load_interval_s=600.0)}


def sample_value(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


def question(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Failing answers, question {i}?"}]


async def preferred(cluster):
    """The engine Cortex sends these idle, cache-less questions to, and the other's name."""
    first = (await cluster.chat(question(-1))).header(b"x-cortex-assigned-worker").decode()
    engine = next(e for e in cluster.engines if e.name == first)
    return engine, next(e.name for e in cluster.engines if e.name != first)


@pytest.mark.parametrize("status", [500, 503, 429])
async def test_a_failing_status_is_retried_counted_and_opens_the_breaker(status):
    async with gateway_cluster(("vllm-0.33", "sglang-0.5.23"), config_changes=QUIET) as cluster:
        failing, healthy = await preferred(cluster)
        failing.faults.fail_status = status
        answers = [await cluster.chat(question(i)) for i in range(8)]
        assert [a.status for a in answers] == [200] * 8
        assert {a.header(b"x-cortex-assigned-worker") for a in answers} == {healthy.encode()}
        text = cluster.running.metrics.render().decode()
        errors = sample_value(text, "cortex_upstream_errors_total", worker=failing.name,
                              phase="head", status=str(status))
        assert errors is not None and errors >= 3
        breaker = cluster.running.registry.status(failing.name).breaker
        assert breaker is (BreakerState.CLOSED if status == 429 else BreakerState.OPEN)


async def test_a_status_that_is_not_http_becomes_a_502_never_relayed():
    async with gateway_cluster(("vllm-0.33",), config_changes=QUIET) as cluster:
        cluster.engines[0].faults.fail_status = 999
        answer = await cluster.chat(question(0))
        assert answer.status == 502
        assert b"999" in answer.body  # the reason names what the worker said


async def test_streams_dying_midway_open_the_breaker():
    async with gateway_cluster(("vllm-0.33", "sglang-0.5.23"), config_changes=QUIET) as cluster:
        dying, _ = await preferred(cluster)
        dying.faults.die_after_chunks = 2
        cut = 0
        for i in range(12):
            try:
                await cluster.chat(question(i), stream=True, max_tokens=8)
            except EOFError:  # the stream broke after its head: the client sees it cut
                cut += 1
        assert cut >= 3
        text = cluster.running.metrics.render().decode()
        assert sample_value(text, "cortex_upstream_errors_total", worker=dying.name,
                            phase="body", status="none") >= 3
        assert cluster.running.registry.status(dying.name).breaker is BreakerState.OPEN


async def test_generate_goes_only_to_sglang_workers_and_is_refused_without_one():
    """SGLang's native /generate in a mixed pool never reaches a vLLM worker (it would 404
    there); a pool without any SGLang worker refuses it with the reason (issue 22 §2)."""
    async with gateway_cluster(("vllm-0.33", "sglang-0.5.23"), config_changes=QUIET) as cluster:
        body = {"model": "deepseek", "text": "Hello there", "sampling_params":
                {"max_new_tokens": 2}}
        answers = [await cluster.request("/generate", {**body, "text": f"q{i}"})
                   for i in range(6)]
        assert [a.status for a in answers] == [200] * 6
        assert {a.header(b"x-cortex-assigned-worker") for a in answers} == {b"e1"}
    async with gateway_cluster(("vllm-0.33",), config_changes=QUIET) as cluster:
        refused = await cluster.request("/generate", body)
        assert refused.status == 404 and b"sglang engines only" in refused.body
