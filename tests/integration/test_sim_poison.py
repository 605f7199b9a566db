"""The ``poison_marker`` fault through the gateway harness, over real sockets: every engine of a
cluster started with it answers 500 to a request containing the marker (the engine's own
internal-error body) and serves every other request; through Cortex the poisoned request fails
(whatever Cortex then makes of it) while the clean ones are still answered. And the malformed
bodies of issue 33 get the engines' 400 over real HTTP, never a 500."""

from __future__ import annotations

import json

from tests.front_http_client import RawClient, RawResponse
from tests.gateway_cluster import MODEL, gateway_cluster

POISON = "POISON-issue33"


async def post(port: int, path: str, body: object) -> RawResponse:
    client = await RawClient.connect(port)
    try:
        return await client.request(b"POST", path.encode(), json.dumps(body).encode(),
                                    [(b"content-type", b"application/json")])
    finally:
        await client.aclose()


def port_of(url: str | None) -> int:
    assert url is not None
    return int(url.rsplit(":", 1)[1])


async def test_a_poison_request_fails_on_every_engine_of_the_cluster():
    poison = [{"role": "user", "content": f"Please repeat {POISON} back."}]
    clean = [{"role": "user", "content": "Please repeat nothing back."}]
    async with gateway_cluster(("vllm-0.33", "sglang-0.5.23"),
                               engine_faults={"poison_marker": POISON}) as cluster:
        direct = [await post(port_of(engine.url), "/v1/chat/completions",
                             {"model": MODEL, "messages": poison, "max_tokens": 2})
                  for engine in cluster.engines]
        through = await cluster.chat(poison)
        served = [await cluster.chat(clean, max_tokens=2) for _ in range(4)]
        poisoned = [engine.handler.poisoned for engine in cluster.engines]
    assert [answer.status for answer in direct] == [500, 500]
    vllm_error, sglang_error = (json.loads(answer.body) for answer in direct)
    assert vllm_error["error"]["type"] == "InternalServerError"
    assert sglang_error["object"] == "error" and sglang_error["type"] == "InternalServerError"
    assert through.status >= 500
    assert [answer.status for answer in served] == [200] * 4
    assert all(count >= 1 for count in poisoned) and sum(poisoned) >= 3


async def test_issue_33_bodies_get_the_engines_400_over_http():
    bodies = [
        ("/v1/chat/completions", {"model": MODEL, "max_tokens": 2, "messages": [
            {"role": "user", "content": [{"type": [], "text": "x"}]}]}),
        ("/v1/responses", {"model": MODEL, "input": "x", "previous_response_id": ["x"]}),
        ("/v1/messages", {"model": MODEL, "max_tokens": 2, "system": [
            {"type": "text", "text": True}], "messages": [{"role": "user", "content": "x"}]}),
        ("/v1/messages", {"model": MODEL, "max_tokens": 2, "messages": [
            {"role": "user", "content": "x"}, {"role": "assistant", "content": [
                {"type": "thinking", "thinking": 1, "signature": "s"}]},
            {"role": "user", "content": "y"}]}),
        ("/v1/responses", {"model": MODEL, "input": "x", "tools": [{"type": []}]}),
        ("/v1/responses", {"model": MODEL, "input": [{"role": {}, "content": "x"}]}),
    ]
    async with gateway_cluster(("vllm-0.33", "sglang-0.5.23")) as cluster:
        answers = [(engine.family.value, await post(port_of(engine.url), path, body))
                   for engine in cluster.engines for path, body in bodies]
    for family, answer in answers:
        assert answer.status == 400, (family, answer.body)
        error = json.loads(answer.body)
        kind = error["error"]["type"] if "error" in error else error["type"]
        assert kind == "Bad Request", (family, error)  # the engines' validation answer
