"""Overload over real sockets: with every worker at its watermark a request waits in the
model's admission queue and is served once capacity frees; one more than the queue holds gets
429 with Retry-After; a request that waits out its deadline gets 503 with Retry-After."""

from __future__ import annotations

import json

import trio

from cortex.config.tree import SchedulerConfig
from cortex.dispatch.settings import AdmissionSettings
from cortex.scheduling import Watermarks
from tests.front_http_client import RawClient, chat_request
from tests.gateway_cluster import MODEL, gateway_cluster


def body(question: str, **extra: object) -> bytes:
    return json.dumps({"model": MODEL, "max_tokens": 3, "messages": [
        {"role": "user", "content": question}], **extra}).encode()


async def hold_one(port: int) -> RawClient:
    """A streamed request that keeps the only slot until its client closes."""
    client = await RawClient.connect(port)
    payload = body("hold the slot", stream=True, max_tokens=100_000)
    await client.send(chat_request(payload))
    status, _, _ = await client.read_head()
    assert status == 200
    assert await client.read_chunk()
    return client


async def post(port: int, payload: bytes, into: dict, key: str) -> None:
    client = await RawClient.connect(port)
    try:
        into[key] = await client.request(b"POST", b"/v1/chat/completions", payload)
    finally:
        await client.aclose()


async def test_admission_queue_waits_then_refuses_with_retry_after():
    config = {"scheduler": SchedulerConfig(watermarks=Watermarks(max_in_flight=1)),
              "admission": AdmissionSettings(max_waiting=1, max_wait_s=1.0, retry_after_s=2)}
    slow = {"decode_s_per_token": 0.02}
    async with gateway_cluster(("vllm-0.33",), config_changes=config,
                               timing_changes=slow) as cluster:
        admission_of = cluster.running.gateway.admissions
        port = cluster.port
        holder = await hold_one(port)
        answers: dict = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, port, body("wait for me"), answers, "waiting")
            await cluster.until(lambda: MODEL in admission_of and admission_of[MODEL].waiting)
            await post(port, body("no room"), answers, "refused")
            assert answers["refused"].status == 429
            assert answers["refused"].header(b"retry-after") == b"2"
            await holder.aclose()  # the slot frees: the waiting request goes through
        assert answers["waiting"].status == 200
        assert answers["waiting"].header(b"x-cortex-assigned-worker") == b"e0"

        holder = await hold_one(port)
        await post(port, body("too long a wait"), answers, "timed_out")
        assert answers["timed_out"].status == 503
        assert answers["timed_out"].header(b"retry-after") == b"2"
        assert json.loads(answers["timed_out"].body)["error"]["type"] == "no_worker_available"
        await holder.aclose()
        counters = admission_of[MODEL].counters
        assert (counters.admitted_after_wait, counters.rejected_queue_full,
                counters.timed_out) == (1, 1, 1)
