"""What Cortex answers itself for a client's bad input (issue 33): every 400 is counted by
reason in ``cortex_http_bad_requests_total``, and a 503 for want of a live worker says when to
come back (``Retry-After``, from the breakers)."""

from __future__ import annotations

import json

from cortex.config import HealthConfig
from cortex.errors import BAD_REQUEST_REASONS
from tests.front_http_client import RawClient
from tests.gateway_cluster import MODEL, gateway_cluster
from tests.integration.test_gateway_failing_answers import question, sample_value

CHAT = b"/v1/chat/completions"
BAD_BODIES = {
    "empty_body": b"",
    "invalid_json": b'{"model": "deepseek", "messages": [',
    "number_out_of_range": b'{"model": "deepseek", "max_tokens": 1e999}',
    "nesting_too_deep": b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    "not_an_object": b"[1, 2]",
    "invalid_model": b'{"model": 7, "messages": []}',
    "invalid_field": json.dumps({"model": MODEL, "messages": "hello"}).encode(),
}


async def test_every_400_cortex_answers_is_counted_by_reason():
    async with gateway_cluster(("vllm-0.33",)) as cluster:
        client = await RawClient.connect(cluster.port)
        try:
            for reason, body in BAD_BODIES.items():
                answer = await client.request(b"POST", CHAT, body,
                                              [(b"content-type", b"application/json")])
                assert answer.status == 400, (reason, answer.body)
                assert json.loads(answer.body)["error"]["code"] == 400
            lone_surrogate = b'{"model": "deepseek", "messages": "\\ud800"}'  # not valid JSON
            assert (await client.request(b"POST", CHAT, lone_surrogate)).status == 400
        finally:
            await client.aclose()
        broken = await RawClient.connect(cluster.port)  # malformed HTTP: answered, closed
        try:
            await broken.send(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                              b"content-length: twelve\r\n\r\n")
            assert (await broken.read_response()).status == 400
        finally:
            await broken.aclose()
        text = cluster.running.metrics.render().decode()
        counted = {reason: sample_value(text, "cortex_http_bad_requests_total", reason=reason)
                   for reason in BAD_REQUEST_REASONS}
        expected = dict.fromkeys(BAD_REQUEST_REASONS, None)
        expected.update(dict.fromkeys(BAD_BODIES, 1.0))
        expected["invalid_json"] = 2.0  # the truncated body and the lone surrogate
        expected["malformed_http"] = 1.0
        assert counted == expected
        assert sample_value(text, "cortex_http_responses_total", code="400") == 9.0


async def test_a_503_without_a_live_worker_says_when_one_may_be_back():
    """Every worker's breaker open: 503 with Retry-After from the breakers' trial time."""
    health = HealthConfig(interval_s=600.0, timeout_s=2.0, failures_to_open=1, open_s=30.0,
                          load_interval_s=600.0)
    async with gateway_cluster(("vllm-0.33", "sglang-0.5.23"),
                               config_changes={"health": health}) as cluster:
        for engine in cluster.engines:
            engine.faults.fail_status = 503  # unavailable: each worker's own failure
        assert (await cluster.chat(question(0))).status == 503  # relayed, both breakers open
        answer = await cluster.chat(question(1))
        assert answer.status == 503
        assert json.loads(answer.body)["error"]["type"] == "no_worker_available"
        retry_after = int(answer.header(b"retry-after") or b"0")
        assert 25 <= retry_after <= 32, retry_after  # open_s + a probe's timeout, whole seconds
