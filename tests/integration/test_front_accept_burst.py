"""A burst of new connections against a busy lean HTTP server, over real loopback sockets: they
are accepted in bursts, not one per scheduler pass (``cortex.front.server``'s accept rules), so
the last of them waits tens of milliseconds for its first answer, not hundreds; and a burst
stays within ``max_connections``."""

from __future__ import annotations

import time

import trio

from cortex.front.limits import ServerLimits
from cortex.front.messages import HttpRequest, HttpResponse, json_response
from cortex.front.server import HttpServer
from tests.front_http_client import RawClient, build_request

TIMEOUT = 30
BUSY = 64  # keep-alive connections sending requests back to back
BURST = 64  # connections opened at once while they run
# Measured here (2 vCPUs, one of them kept busy by another process or not): the slowest first
# answer of the burst took 34-38 ms with accepts in bursts (every busy connection got 5 answers
# meanwhile: ~5 scheduler passes), 267-301 ms with one accept per pass (ddd4c3a). The bound
# leaves the first 4x for a slower or busier machine and fails the second by ~1.8x.
BOUND_S = 0.15

REQUEST = build_request(b"POST", b"/v1/chat/completions", b'{"messages": []}',
                        [(b"content-type", b"application/json")])


async def instant(request: HttpRequest) -> HttpResponse:
    return json_response(200, b'{"ok": true}')


async def test_a_burst_of_new_connections_beside_busy_ones_is_answered_within_the_bound():
    server = HttpServer(instant, ServerLimits())
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            _, port = await nursery.start(server.serve, "127.0.0.1", 0)
            busy = [await RawClient.connect(port) for _ in range(BUSY)]
            running = trio.Event()
            answered = [0]
            stop = [False]

            async def keep_busy(client: RawClient) -> None:
                while not stop[0]:
                    assert (await client.request(b"POST", b"/v1/chat/completions",
                                                 b'{"messages": []}')).status == 200
                    answered[0] += 1
                    if answered[0] == BUSY:  # every busy connection is being served
                        running.set()

            waits: list[float] = []

            async def first_answer(start: float) -> None:
                client = await RawClient.connect(port)
                try:
                    await client.send(REQUEST)
                    assert (await client.read_response()).status == 200
                    waits.append(time.perf_counter() - start)
                finally:
                    await client.aclose()

            async with trio.open_nursery() as traffic:
                for client in busy:
                    traffic.start_soon(keep_busy, client)
                await running.wait()
                before = answered[0]
                async with trio.open_nursery() as burst:
                    start = time.perf_counter()
                    for _ in range(BURST):
                        burst.start_soon(first_answer, start)
                during = answered[0] - before
                stop[0] = True
            for client in busy:
                await client.aclose()
            nursery.cancel_scope.cancel()
    waits.sort()
    print(f"burst of {BURST} beside {BUSY} busy: first answers p50 {waits[BURST // 2] * 1e3:.1f}"
          f" ms, max {waits[-1] * 1e3:.1f} ms; {during} busy requests answered meanwhile")
    assert len(waits) == BURST
    assert server.counters.connections_opened == BUSY + BURST
    assert during > 0  # the burst did not stop the requests already running
    assert waits[-1] < BOUND_S, f"slowest first answer {waits[-1] * 1e3:.0f} ms"


async def test_a_burst_takes_no_more_connections_than_max_connections():
    server = HttpServer(instant, ServerLimits(max_connections=2))
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            _, port = await nursery.start(server.serve, "127.0.0.1", 0)
            first = await RawClient.connect(port)
            assert (await first.request(b"GET", b"/")).status == 200  # one token left
            # three at once: the loop wakes for one, the others may already wait beside it
            others = [await RawClient.connect(port) for _ in range(3)]
            for client in others:
                await client.send(REQUEST)
            answered: list[RawClient] = []
            answers = [trio.Event() for _ in others]

            async def read(client: RawClient) -> None:
                assert (await client.read_response()).status == 200
                answered.append(client)
                answers[len(answered) - 1].set()

            async with trio.open_nursery() as readers:
                for client in others:
                    readers.start_soon(read, client)
                await answers[0].wait()
                with trio.move_on_after(0.3):
                    await answers[1].wait()
                    raise AssertionError("a connection was served past max_connections")
                assert server.counters.connections_opened == 2
                await first.aclose()  # its token lets one more in
                await answers[1].wait()
                await answered[0].aclose()  # and this one's the last
            assert server.counters.connections_opened == 4
            for client in others:
                await client.aclose()
            nursery.cancel_scope.cancel()
