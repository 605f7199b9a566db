"""Streaming and failure behaviour of the gateway over real sockets: SSE passes through
unchanged, a client that leaves aborts the engine's request, a worker dead before the first byte
is retried elsewhere, one dying mid-stream ends the client's stream with an error, not a hang."""

from __future__ import annotations

import json
import re

import trio

from tests.front_http_client import RawClient, chat_request, read_broken_stream
from tests.gateway_cluster import MODEL, SYSTEM_TEXT, gateway_cluster

_VOLATILE = re.compile(rb'"(id|created|cached_tokens)":\s*("[^"]*"|\d+)')


def chat_body(question: str, **extra: object) -> bytes:
    return json.dumps({"model": MODEL, "max_tokens": 6, "messages": [
        {"role": "system", "content": SYSTEM_TEXT},
        {"role": "user", "content": question}], **extra}).encode()


async def read_stream(client: RawClient) -> tuple[int, dict[bytes, bytes], bytes]:
    """Status, headers and body of an SSE answer: chunked as it streamed, or in one piece with
    ``content-length`` when Cortex already had the whole stream at its first read."""
    response = await client.read_response()
    return response.status, dict(response.headers), response.body


async def test_sse_through_cortex_is_the_engines_stream():
    async with gateway_cluster(("vllm-0.33",)) as cluster:
        engine = cluster.engines[0]
        body = chat_body("Stream this please.", stream=True,
                         stream_options={"include_usage": True})
        direct = await RawClient.connect(int(engine.url.rsplit(":", 1)[1]))
        via = await RawClient.connect(cluster.port)
        request = chat_request(body)
        await direct.send(request)
        _, direct_headers, direct_bytes = await read_stream(direct)
        await via.send(request)
        status, via_headers, via_bytes = await read_stream(via)
        assert status == 200
        assert via_headers[b"content-type"] == direct_headers[b"content-type"]
        assert via_headers[b"x-cortex-assigned-worker"] == engine.name.encode()
        assert via_bytes.endswith(b"data: [DONE]\n\n")
        assert direct_bytes.count(b"data: ") == via_bytes.count(b"data: ") >= 8
        # The same events, byte for byte, except the per-request id and timestamp (and the
        # cached tokens: the second of two identical prompts hits the cache).
        assert _VOLATILE.sub(b"", via_bytes) == _VOLATILE.sub(b"", direct_bytes)
        await direct.aclose()
        await via.aclose()


async def test_client_disconnect_aborts_the_engine_request():
    slow = {"prefill_tokens_per_s": 1e6, "decode_s_per_token": 0.05, "max_running": 8}
    async with gateway_cluster(("sglang-0.5.23",), timing_changes=slow) as cluster:
        engine = cluster.engines[0]
        pool = cluster.running.pools[MODEL]
        client = await RawClient.connect(cluster.port)
        body = chat_body("A long answer, please.", stream=True, max_tokens=10_000)
        await client.send(chat_request(body))
        status, _, _ = await client.read_head()
        assert status == 200
        assert await client.read_chunk()  # the first event arrived: the request runs
        assert pool.pending.in_flight(engine.name) == 1
        await client.aclose()  # the client leaves mid-stream
        with trio.fail_after(10):
            while engine.counters[0].aborted == 0 or pool.pending.in_flight(engine.name):
                await trio.sleep(0.01)
        assert engine.queues[0].running == 0


async def test_worker_dead_before_first_byte_is_retried_on_another():
    async with gateway_cluster(("vllm-0.33", "vllm-0.33")) as cluster:
        first = await cluster.chat(cluster_chat("Who holds this prefix?"))
        holder = first.header(b"x-cortex-assigned-worker").decode()
        await cluster.until(lambda: cluster.holders(cluster_chat("x")).get(holder, 0) > 0)
        engine = next(e for e in cluster.engines if e.name == holder)
        engine.faults.update({"fail_status": 503})  # the holder fails every generation
        response = await cluster.chat(cluster_chat("And now?"))
        assert response.status == 200, response.body
        assert response.header(b"x-cortex-assigned-worker").decode() != holder
        assert response.header(b"x-cortex-attempts") == b"2"

        cluster.stop_engine(holder)  # now the holder is gone altogether: connection refused
        response = await cluster.chat(cluster_chat("Still there?"))
        assert response.status == 200, response.body
        assert response.header(b"x-cortex-assigned-worker").decode() != holder


async def test_worker_dying_mid_stream_ends_the_client_stream_with_an_error():
    async with gateway_cluster(("vllm-0.33",)) as cluster:
        cluster.engines[0].faults.update({"die_after_chunks": 2})
        client = await RawClient.connect(cluster.port)
        body = chat_body("Die halfway.", stream=True, max_tokens=20)
        await client.send(chat_request(body))
        with trio.fail_after(10):
            status, _, _ = await client.read_head()
            assert status == 200
            chunks = await read_broken_stream(client)
        assert b"[DONE]" not in b"".join(chunks)
        await client.aclose()


def cluster_chat(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_TEXT}, {"role": "user", "content": question}]
