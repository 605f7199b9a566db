"""A small answer that arrives whole with its head is handed over as bytes: the upstream
exchange is closed (connection idle in the pool, accounting released) by its ``after_sent``,
right after the client's write and off the client's wait; a stream that is still arriving
stays a stream (real sim engines, real sockets)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from cortex.app import Running
from cortex.config import HealthConfig
from cortex.front.messages import HttpRequest, HttpResponse
from cortex.sim.engine import SimEngine
from tests.gateway_cluster import MODEL, gateway_cluster

# Health probes and load polls share the upstream pool; after the first round (which the
# cluster waits for) none runs during a test, so the pool's counts are the request's alone.
QUIET = {"health": HealthConfig(interval_s=600.0, timeout_s=2.0, load_interval_s=600.0)}


def chat(question: str, **extra: object) -> HttpRequest:
    body = {"model": MODEL, "max_tokens": 6, "messages": [{"role": "user", "content": question}],
            **extra}
    return HttpRequest(b"POST", b"/v1/chat/completions",
                       [(b"content-type", b"application/json")], json.dumps(body).encode())


async def test_a_whole_answer_is_bytes_and_its_exchange_closed_once_written():
    async with gateway_cluster(("vllm-0.33",), config_changes=QUIET) as cluster:
        running = cluster.running
        engine = cluster.engines[0]
        response = await running.gateway.handle(chat("Answer in one piece."))
        assert isinstance(response.body, bytes)
        assert json.loads(response.body)["choices"][0]["message"]["content"]
        names = [name for name, _ in response.headers]
        assert b"content-length" not in names and b"transfer-encoding" not in names
        assert dict(response.headers)[b"x-cortex-assigned-worker"] == engine.name.encode()
        # held until the answer is written (the server then runs after_sent, also when the
        # write failed); nothing of it waits for I/O any more
        assert running.gateway.upstream.stats(engine.url).busy == 1
        assert running.pools[MODEL].pending.in_flight(engine.name) == 1
        assert response.after_sent is not None
        response.after_sent()
        # the worker's connection is idle again and the request no longer pending work
        stats = running.gateway.upstream.stats(engine.url)
        assert stats.busy == 0 and stats.idle >= 1
        assert running.pools[MODEL].pending.in_flight(engine.name) == 0


@asynccontextmanager
async def streaming_answer(question: str) -> AsyncIterator[tuple[Running, SimEngine,
                                                                  HttpResponse]]:
    """A one-engine cluster, probes quiet and none in flight, and the handler's response to a
    streamed request still arriving (six tokens, 20 ms apart: not whole at first read)."""
    async with gateway_cluster(("vllm-0.33",), timing_changes={"decode_s_per_token": 0.02},
                               config_changes=QUIET) as cluster:
        running = cluster.running
        engine = cluster.engines[0]
        await cluster.until(lambda: running.gateway.upstream.stats(engine.url).busy == 0)
        response = await running.gateway.handle(chat(question, stream=True))
        assert not isinstance(response.body, bytes)
        yield running, engine, response


async def test_an_answer_still_arriving_stays_a_stream_until_read():
    async with streaming_answer("Stream it.") as (running, engine, response):
        try:
            assert running.pools[MODEL].pending.in_flight(engine.name) == 1
            assert running.gateway.upstream.stats(engine.url).busy == 1  # still its exchange's
            with trio.fail_after(10):
                body = b"".join([chunk async for chunk in response.body])
        finally:
            await response.body.aclose()  # as the server always does, even on a failed assert
        assert body.endswith(b"data: [DONE]\n\n")
        assert running.pools[MODEL].pending.in_flight(engine.name) == 0


async def test_a_stream_closed_before_its_first_chunk_releases_everything():
    """The server closes a body without asking for a chunk when the client left while the
    head was written: the exchange and the accounting are released all the same."""
    async with streaming_answer("Leave at once.") as (running, engine, response):
        assert running.gateway.upstream.stats(engine.url).busy == 1
        await response.body.aclose()
        stats = running.gateway.upstream.stats(engine.url)
        assert stats.busy == 0 and stats.discarded >= 1  # incomplete: closed, not pooled
        assert running.pools[MODEL].pending.in_flight(engine.name) == 0
        async for _ in response.body:  # a closed body yields nothing more
            raise AssertionError("a closed body yielded a chunk")
