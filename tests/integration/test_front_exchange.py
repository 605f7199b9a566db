"""What each request came to, as the lean server tells its exchange hook (the access log's
source), over real loopback sockets: one record per request, at its end — the last byte, the
client gone (before or after the head), the answer cut, a refusal — with status, bytes and
times."""

from __future__ import annotations

import math
from contextlib import asynccontextmanager

import trio

from cortex.errors import NotFound, UpstreamError
from cortex.front.exchange import Exchange
from cortex.front.limits import ServerLimits
from cortex.front.messages import HttpRequest, HttpResponse
from cortex.front.server import HttpServer
from tests.front_http_client import RawClient, build_request

TIMEOUT = 20
SLOW_S = 0.05  # a slow answer's pause between chunks (a worker producing tokens)


async def chunks(*parts: bytes, pause_s: float = 0.0, then: BaseException | None = None):
    for part in parts:
        yield part
        await trio.sleep(pause_s)
    if then is not None:
        raise then


async def handler(request: HttpRequest) -> HttpResponse:
    path = request.path
    if path == b"/slow":
        return HttpResponse(200, [(b"x-cortex-assigned-worker", b"w1")],
                            chunks(b"one", b"two", b"three", pause_s=SLOW_S))
    if path == b"/never":
        await trio.sleep_forever()
    if path == b"/first-then-wait":
        return HttpResponse(200, [], chunks(b"first", pause_s=math.inf))
    if path == b"/breaks":
        return HttpResponse(200, [], chunks(b"part", then=UpstreamError("worker broke")))
    if path == b"/missing":
        raise NotFound("no route")
    if path == b"/bug":
        raise ValueError("a bug")
    if path == b"/late":
        await trio.sleep(0.2)
        return HttpResponse(200, [], b"late answer")
    return HttpResponse(200, [], b"ok")


@asynccontextmanager
async def told():
    """A server with an exchange hook; yields (port, receive channel of Exchanges)."""
    send, receive = trio.open_memory_channel[Exchange](math.inf)
    server = HttpServer(handler, ServerLimits(client_watch_after_s=0.01),
                        on_exchange=send.send_nowait)
    async with trio.open_nursery() as nursery:
        _, port = await nursery.start(server.serve, "127.0.0.1", 0)
        yield port, receive
        nursery.cancel_scope.cancel()


async def test_a_slow_stream_is_told_at_its_last_byte_with_its_bytes():
    with trio.fail_after(TIMEOUT):
        async with told() as (port, exchanges):
            client = await RawClient.connect(port)
            response = await client.request(b"GET", b"/slow")
            assert response.body == b"onetwothree"
            done = await exchanges.receive()
            assert (done.outcome, done.status, done.body_bytes) == ("complete", 200, 11)
            assert done.request is not None and done.request.path == b"/slow"
            assert dict(done.headers)[b"x-cortex-assigned-worker"] == b"w1"
            assert done.started <= done.head_at <= done.ended
            assert done.ended - done.head_at >= 2 * SLOW_S  # not at the head
            quick = await client.request(b"GET", b"/quick")
            assert quick.status == 200
            assert (await exchanges.receive()).outcome == "complete"
            await client.aclose()


async def test_a_client_leaving_before_the_head_gets_its_record():
    with trio.fail_after(TIMEOUT):
        async with told() as (port, exchanges):
            client = await RawClient.connect(port)
            await client.send(build_request(b"GET", b"/never"))
            await client.abort()
            done = await exchanges.receive()
            assert (done.outcome, done.status, done.body_bytes, done.head_at) == (
                "client_gone", None, 0, None)


async def test_a_client_leaving_a_stream_and_an_answer_that_breaks():
    with trio.fail_after(TIMEOUT):
        async with told() as (port, exchanges):
            client = await RawClient.connect(port)
            await client.send(build_request(b"GET", b"/first-then-wait"))
            status, _, _ = await client.read_head()
            assert status == 200 and await client.read_chunk() == b"first"
            await client.abort()
            gone = await exchanges.receive()
            assert (gone.outcome, gone.status, gone.body_bytes) == ("client_gone", 200, 5)

            client = await RawClient.connect(port)
            await client.send(build_request(b"GET", b"/breaks"))
            await client.read_until_eof()
            broke = await exchanges.receive()
            assert (broke.outcome, broke.status, broke.body_bytes) == ("upstream_broke", 200, 4)
            await client.aclose()


async def test_refusals_and_bugs_are_told_with_their_status():
    with trio.fail_after(TIMEOUT):
        async with told() as (port, exchanges):
            client = await RawClient.connect(port)
            assert (await client.request(b"GET", b"/missing")).status == 404
            missing = await exchanges.receive()
            assert (missing.outcome, missing.status) == ("refused", 404)
            assert missing.body_bytes > 0
            assert (await client.request(b"GET", b"/bug")).status == 500
            bug = await exchanges.receive()
            assert (bug.outcome, bug.status) == ("error", 500)
            await client.aclose()

            client = await RawClient.connect(port)
            await client.send(b"GARBAGE\r\n\r\n")
            assert (await client.read_response()).status == 400
            unreadable = await exchanges.receive()
            assert (unreadable.request, unreadable.outcome, unreadable.status) == (
                None, "refused", 400)
            assert unreadable.client is not None
            await client.aclose()


async def test_a_half_closed_client_is_answered_and_told_complete():
    with trio.fail_after(TIMEOUT):
        async with told() as (port, exchanges):
            client = await RawClient.connect(port)
            await client.send(build_request(b"GET", b"/late"))
            await client.half_close()
            assert (await client.read_response()).body == b"late answer"
            done = await exchanges.receive()
            assert (done.outcome, done.status, done.body_bytes) == ("complete", 200, 11)
            await client.aclose()
