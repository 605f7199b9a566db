"""ConnectionPool against Cortex's own lean HTTP server (the simulated engines run on it)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import trio

from cortex.front.limits import ServerLimits
from cortex.front.messages import HttpRequest, HttpResponse, json_response
from cortex.front.server import HttpServer
from cortex.upstream.connection_pool import ConnectionPool, PoolStats
from cortex.upstream.sse import CachedTokensSniffer

USAGE = (b'data: {"choices":[],"usage":{"prompt_tokens":40,'
         b'"prompt_tokens_details":{"cached_tokens":32}}}\n\n')


class Engine:
    """A handler playing an engine: JSON, a lockstep SSE stream, and one that never ends."""

    def __init__(self) -> None:
        self.client_got = [trio.Event() for _ in range(3)]
        self.endless_started = trio.Event()
        self.endless_cancelled = trio.Event()

    async def handle(self, request: HttpRequest) -> HttpResponse:
        if request.path == b"/json":
            return json_response(200, b'{"echo": %d}' % len(request.body))
        if request.path == b"/stream":
            return HttpResponse(200, [(b"content-type", b"text/event-stream")], self._lockstep())
        return HttpResponse(200, [(b"content-type", b"text/event-stream")], self._endless())

    async def _lockstep(self) -> AsyncIterator[bytes]:
        for i in range(3):
            yield b'data: {"choices":[{"delta":{"content":"t%d"}}]}\n\n' % i
            await self.client_got[i].wait()
        yield USAGE
        yield b"data: [DONE]\n\n"

    async def _endless(self) -> AsyncIterator[bytes]:
        try:
            yield b"data: first\n\n"
            self.endless_started.set()
            await trio.sleep_forever()
        except trio.Cancelled:
            self.endless_cancelled.set()
            raise
        yield b"never"  # pragma: no cover


async def test_keep_alive_streaming_and_cancellation_against_the_lean_server():
    engine = Engine()
    server = HttpServer(engine.handle, ServerLimits(eof_is_gone=True))  # an engine's rule
    pool = ConnectionPool()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(server.serve, "127.0.0.1", 0)
            origin = f"http://{host}:{port}"
            await nursery.start(pool.run)

            for size in (0, 5, 70_000):
                async with pool.request(origin, b"POST", b"/json", [], b"x" * size) as response:
                    assert response.status == 200
                    assert await response.read() == b'{"echo": %d}' % size

            sniffer = CachedTokensSniffer()
            received = []
            async with pool.request(origin, b"POST", b"/stream", [], b"{}") as response:
                async for chunk in response.body_chunks():
                    received.append(chunk)
                    sniffer.feed(chunk)
                    if len(received) <= 3:
                        engine.client_got[len(received) - 1].set()
            assert len(received) >= 4  # three events in lockstep, then what was left
            # (the last two events may come in one read: chunk boundaries are not kept)
            assert b"".join(received[3:]) == USAGE + b"data: [DONE]\n\n"
            assert (sniffer.cached_tokens, sniffer.prompt_tokens) == (32, 40)
            assert pool.stats(origin) == PoolStats(1, 1, 0, created=1, reused=3, discarded=0)
            assert server.counters.connections_opened == 1

            with trio.CancelScope() as client_gone:
                async with pool.request(origin, b"POST", b"/endless", [], b"{}") as response:
                    async for _chunk in response.body_chunks():
                        await engine.endless_started.wait()
                        client_gone.cancel()
            await engine.endless_cancelled.wait()  # the engine's handler saw the client leave
            assert pool.stats(origin).open == 0
            server.drain()
            nursery.cancel_scope.cancel()
