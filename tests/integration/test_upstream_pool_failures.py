"""ConnectionPool against workers that break, stall or are cancelled on, over real loopback
sockets: typed failures with their phase, sockets closed, nothing broken pooled.
"""

from __future__ import annotations

import socket

import pytest
import trio
import trio.testing

from cortex.errors import BadRequest
from cortex.upstream.connection_pool import ConnectionPool, PoolStats
from cortex.upstream.errors import UpstreamBroken, UpstreamConnectError, UpstreamTimeout
from cortex.upstream.limits import PoolLimits
from tests.integration.upstream_servers import (
    CHAT,
    JSON,
    ServerConn,
    get,
    keep_alive_ok,
    pool_serving,
)

# -- broken workers ------------------------------------------------------------------------

async def test_garbage_instead_of_a_head():
    async def garbage(conn: ServerConn) -> None:
        await conn.read_request()
        await conn.raw(b"SMTP ready\r\n\r\n")
        await conn.wait_eof()

    async with pool_serving(garbage) as (pool, origin, server, _nursery):
        with pytest.raises(UpstreamBroken) as caught:
            await get(pool, origin)
        assert (caught.value.phase, caught.value.response_started) == ("head", True)
        await server.conns[0].saw_eof.wait()


async def test_close_after_head_and_mid_chunked_body():
    async def die_in_body(conn: ServerConn) -> None:
        await conn.read_request()
        if conn.index == 0:
            await conn.raw(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n12345")
        else:
            await conn.start_chunked()
            await conn.chunk(b"data: 1\n\n")

    async with pool_serving(die_in_body) as (pool, origin, _, _nursery):
        for expected_chunks in ([b"12345"], [b"data: 1\n\n"]):
            chunks = []
            with pytest.raises(UpstreamBroken) as caught:
                async with pool.request(origin, b"POST", CHAT, JSON, b"{}") as response:
                    async for chunk in response.body_chunks():
                        chunks.append(chunk)
            assert chunks == expected_chunks
            assert (caught.value.phase, caught.value.response_started) == ("body", True)
        assert pool.stats(origin).open == 0


async def test_body_over_read_limit():
    async with pool_serving(keep_alive_ok) as (pool, origin, _, _nursery):
        with pytest.raises(UpstreamBroken) as caught:
            async with pool.request(origin, b"POST", CHAT, JSON, b"x" * 100) as response:
                await response.read(limit=10)
        assert caught.value.phase == "body"
        # the whole response had arrived, so the connection itself is clean and kept
        assert pool.stats(origin) == PoolStats(1, 1, 0, created=1, reused=0, discarded=0)


async def test_connect_refused():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    pool = ConnectionPool()
    with trio.fail_after(10), pytest.raises(UpstreamConnectError) as caught:
        await get(pool, f"http://127.0.0.1:{port}")
    assert (caught.value.phase, caught.value.response_started) == ("connect", False)
    assert pool.stats(f"http://127.0.0.1:{port}").open == 0


async def test_a_head_h11_refuses_is_a_bad_request_and_nothing_is_sent():
    async with pool_serving(keep_alive_ok) as (pool, origin, server, _nursery):
        with pytest.raises(BadRequest):
            async with pool.request(origin, b"POST", CHAT, [(b"x-evil", b"a\r\nb: c")]):
                pass
        await server.conns[0].saw_eof.wait()
        assert server.conns[0].requests == []
        assert pool.stats(origin).open == 0


# -- cancellation and timeouts -------------------------------------------------------------

async def test_cancelled_while_waiting_for_head_closes_the_socket():
    got_request = trio.Event()

    async def never_answer(conn: ServerConn) -> None:
        await conn.read_request()
        got_request.set()
        await conn.wait_eof()

    async with pool_serving(never_answer) as (pool, origin, server, nursery):
        with trio.CancelScope() as client_gone:
            nursery.start_soon(_cancel_when, got_request, client_gone)
            await get(pool, origin)
        assert client_gone.cancelled_caught
        await server.conns[0].saw_eof.wait()  # the engine learns its client left
        assert pool.stats(origin) == PoolStats(0, 0, 0, created=1, reused=0, discarded=1)


async def test_cancelled_mid_stream_closes_the_socket():
    async def stream_forever(conn: ServerConn) -> None:
        await conn.read_request()
        await conn.start_chunked()
        await conn.chunk(b"data: 1\n\n")
        await conn.wait_eof()

    async with pool_serving(stream_forever) as (pool, origin, server, _nursery):
        with trio.CancelScope() as client_gone:
            async with pool.request(origin, b"POST", CHAT, JSON, b"{}") as response:
                async for _chunk in response.body_chunks():
                    client_gone.cancel()
        await server.conns[0].saw_eof.wait()
        assert pool.stats(origin).discarded == 1


async def _cancel_when(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def test_head_and_body_timeouts():
    async def stall(conn: ServerConn) -> None:
        await conn.read_request()
        if conn.index == 1:
            await conn.start_chunked()
            await conn.chunk(b"data: 1\n\n")
        await conn.wait_eof()

    slow_reads = ConnectionPool(PoolLimits(read_timeout_s=0.2))
    async with pool_serving(stall, slow_reads) as (pool, origin, server, _nursery):
        with pytest.raises(UpstreamTimeout) as caught:
            async with pool.request(origin, b"POST", CHAT, JSON, b"{}",
                                    head_timeout_s=0.2):
                pass
        assert (caught.value.phase, caught.value.http_status) == ("head", 504)
        with pytest.raises(UpstreamTimeout) as caught:
            async with pool.request(origin, b"POST", CHAT, JSON, b"{}") as response:
                assert await anext(response.body_chunks()) == b"data: 1\n\n"
                await response.read()
        assert (caught.value.phase, caught.value.response_started) == ("body", True)
        await server.conns[0].saw_eof.wait()
        await server.conns[1].saw_eof.wait()


async def test_an_earlier_deadline_wakes_the_deadline_keeper():
    # A waits for its head with the default 600 s; B, sent later with 0.2 s, must still time
    # out at its own deadline, while A keeps waiting until it is cancelled.
    heads_requested = trio.Event()
    requests = 0

    async def never_answer(conn: ServerConn) -> None:
        nonlocal requests
        await conn.read_request()
        requests += 1
        if requests == 2:
            heads_requested.set()
        await conn.wait_eof()

    async with pool_serving(never_answer) as (pool, origin, server, nursery):
        a_gone = trio.CancelScope()

        async def request_a() -> None:
            with a_gone:
                await get(pool, origin, b"a")

        nursery.start_soon(request_a)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(UpstreamTimeout) as caught:
            async with pool.request(origin, b"POST", CHAT, JSON, b"b", head_timeout_s=0.2):
                pass
        assert caught.value.phase == "head"
        assert heads_requested.is_set() and pool.stats(origin).busy == 1  # A still waits
        a_gone.cancel()
        for conn in server.conns:
            await conn.saw_eof.wait()
        assert pool.stats(origin).open == 0
