"""ConnectionPool keep-alive over real loopback sockets: connections reused, closed when not
reusable, and the keep-alive race retried once, only when safe.
"""

from __future__ import annotations

import pytest
import trio

from cortex.upstream.connection import NOT_READY
from cortex.upstream.connection_pool import PoolStats
from cortex.upstream.errors import UpstreamBroken
from tests.integration.upstream_servers import (
    CHAT,
    JSON,
    ServerConn,
    get,
    keep_alive_ok,
    pool_serving,
)

# -- keep-alive and reuse --------------------------------------------------------------------

async def test_sequential_requests_reuse_one_connection():
    async with pool_serving(keep_alive_ok) as (pool, origin, server, _nursery):
        async with pool.request(origin, b"POST", CHAT, JSON, b"first") as response:
            assert (response.status, response.reused) == (200, False)
            assert await response.read() == b"first"
        async with pool.request(origin, b"POST", CHAT, JSON, b"second") as response:
            assert response.reused
            assert await response.read() == b"second"
        assert len(server.conns) == 1 and len(server.conns[0].requests) == 2
        assert pool.stats(origin) == PoolStats(open=1, idle=1, busy=0, created=1,
                                               reused=1, discarded=0)


async def test_head_sent_to_worker():
    async with pool_serving(keep_alive_ok) as (pool, origin, server, _nursery):
        headers = [(b"Host", b"gateway.example"), (b"Connection", b"keep-alive, x-hop"),
                   (b"x-hop", b"1"), (b"transfer-encoding", b"chunked"),
                   (b"content-length", b"1"), (b"authorization", b"Bearer k")]
        async with pool.request(origin, b"POST", b"/generate?x=1", headers,
                                b"{}") as response:
            await response.read()
        seen = server.conns[0].requests[0]
        assert (seen.method, seen.target, seen.body) == (b"POST", b"/generate?x=1", b"{}")
        assert seen.headers == [(b"host", origin.removeprefix("http://").encode()),
                                (b"authorization", b"Bearer k"),
                                (b"content-length", b"2")]


async def test_unread_body_already_received_still_reuses():
    async with pool_serving(keep_alive_ok) as (pool, origin, server, _nursery):
        for _ in range(3):
            async with pool.request(origin, b"GET", b"/health", []) as response:
                assert response.status == 200
                # the small body came in the head's segment; the caller never reads it
        assert len(server.conns) == 1
        assert pool.stats(origin) == PoolStats(1, 1, 0, created=1, reused=2, discarded=0)


async def test_connection_close_from_worker_is_not_reused():
    async def close_after_answer(conn: ServerConn) -> None:
        await conn.read_request()
        await conn.respond(200, b"bye", [(b"connection", b"close")])

    async with pool_serving(close_after_answer) as (pool, origin, server, _nursery):
        assert await get(pool, origin) == b"bye"
        assert await get(pool, origin) == b"bye"
        assert len(server.conns) == 2
        assert pool.stats(origin) == PoolStats(0, 0, 0, created=2, reused=0, discarded=2)


async def test_early_exit_closes_and_is_never_reused():
    async def stream_two_chunks(conn: ServerConn) -> None:
        while await conn.read_request() is not None:
            await conn.start_chunked()
            await conn.chunk(b"data: 1\n\n")
            if conn.index == 0:
                await conn.wait_eof()  # the client left after the head
                return
            await conn.chunk(b"data: 2\n\n")
            await conn.end()

    async with pool_serving(stream_two_chunks) as (pool, origin, server, _nursery):
        async with pool.request(origin, b"POST", CHAT, JSON, b"{}") as response:
            assert response.status == 200
            assert await anext(response.body_chunks()) == b"data: 1\n\n"
        await server.conns[0].saw_eof.wait()
        assert await get(pool, origin) == b"data: 1\n\ndata: 2\n\n"
        assert len(server.conns) == 2
        assert pool.stats(origin).discarded == 1


async def test_streamed_chunks_arrive_one_by_one():
    got: list[trio.Event] = [trio.Event() for _ in range(3)]

    async def lockstep(conn: ServerConn) -> None:
        await conn.read_request()
        await conn.start_chunked()
        for i in range(3):
            await conn.chunk(f"data: {i}\n\n".encode())
            await got[i].wait()  # chunk i+1 only once the client has chunk i
        await conn.chunk(b"data: [DONE]\n\n")
        await conn.end()

    async with pool_serving(lockstep) as (pool, origin, _, _nursery):
        received = []
        async with pool.request(origin, b"POST", CHAT, JSON, b"{}") as response:
            assert response.header(b"content-type") == b"text/event-stream"
            async for chunk in response.body_chunks():
                received.append(chunk)
                if len(received) <= 3:
                    got[len(received) - 1].set()
            assert response.complete
        assert received == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n",
                            b"data: [DONE]\n\n"]
        assert pool.stats(origin).idle == 1  # complete: back in the pool


async def test_chunk_now_takes_what_is_in_hand_and_never_waits():
    """``chunk_now``: a body already received comes without an await, the end as ``None``;
    a body still on its way is ``NOT_READY`` (``body_chunks`` then waits for it)."""
    release = trio.Event()

    async def held(conn: ServerConn) -> None:
        await conn.read_request()
        await conn.start_chunked()
        await release.wait()
        await conn.chunk(b"late")
        await conn.end()

    async with pool_serving(keep_alive_ok) as (pool, origin, _, _nursery):
        async with pool.request(origin, b"POST", CHAT, JSON, b"whole") as response:
            assert response.chunk_now() == b"whole"  # came with the head
            assert response.chunk_now() is None and response.complete
    async with pool_serving(held) as (pool, origin, _, _nursery):
        async with pool.request(origin, b"POST", CHAT, JSON, b"{}") as response:
            assert response.chunk_now() is NOT_READY
            release.set()
            assert [chunk async for chunk in response.body_chunks()] == [b"late"]
            assert response.chunk_now() is None


# -- the keep-alive race: one retry, only when safe --------------------------------------------

async def test_reused_connection_closed_before_any_byte_is_retried_once():
    async def drop_second_request(conn: ServerConn) -> None:
        first = True
        while await conn.read_request() is not None:
            if conn.index == 0 and not first:
                return  # read the request, then close without a byte (the keep-alive race)
            first = False
            await conn.respond(200, b"ok")

    async with pool_serving(drop_second_request) as (pool, origin, server, _nursery):
        assert await get(pool, origin) == b"ok"
        assert await get(pool, origin) == b"ok"
        assert len(server.conns) == 2
        stats = pool.stats(origin)
        assert (stats.created, stats.reused, stats.discarded) == (2, 1, 1)


async def test_connection_closed_while_idle_is_replaced():
    closed = trio.Event()

    async def answer_then_close(conn: ServerConn) -> None:
        await conn.read_request()
        await conn.respond(200, b"ok")  # keep-alive announced...
        await conn.close()  # ...then closed while idle in the client's pool
        closed.set()

    async with pool_serving(answer_then_close) as (pool, origin, server, _nursery):
        assert await get(pool, origin) == b"ok"
        await closed.wait()
        assert await get(pool, origin) == b"ok"  # detected while idle, or retried once
        assert len(server.conns) == 2


async def test_no_retry_once_a_response_byte_arrived():
    async def half_head_on_reuse(conn: ServerConn) -> None:
        await conn.read_request()
        await conn.respond(200, b"ok")
        await conn.read_request()
        await conn.raw(b"HTTP/1.1 200 OK\r\n")  # part of a head, then gone

    async with pool_serving(half_head_on_reuse) as (pool, origin, server, _nursery):
        await get(pool, origin)
        with pytest.raises(UpstreamBroken) as caught:
            await get(pool, origin)
        assert (caught.value.phase, caught.value.response_started) == ("head", True)
        assert caught.value.origin == origin
        assert len(server.conns) == 1


async def test_no_retry_on_a_fresh_connection():
    async def read_then_close(conn: ServerConn) -> None:
        await conn.read_request()

    async with pool_serving(read_then_close) as (pool, origin, server, _nursery):
        with pytest.raises(UpstreamBroken) as caught:
            await get(pool, origin)
        assert (caught.value.phase, caught.value.response_started) == ("head", False)
        assert caught.value.http_status == 502
        assert len(server.conns) == 1
        assert pool.stats(origin) == PoolStats(0, 0, 0, created=1, reused=0, discarded=1)
