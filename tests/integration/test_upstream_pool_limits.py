"""ConnectionPool's limits over real loopback sockets: connection and idle caps, waiters, idle
reaping, closing an origin.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from cortex.upstream.connection_pool import ConnectionPool, PoolStats
from cortex.upstream.errors import UpstreamTimeout
from cortex.upstream.limits import PoolLimits
from tests.integration.upstream_servers import (
    ServerConn,
    get,
    keep_alive_ok,
    pool_serving,
    start_server,
)


async def test_connection_cap_waiters_get_the_released_connection_or_time_out():
    release = trio.Event()
    in_flight = trio.Event()

    async def first_waits(conn: ServerConn) -> None:
        while (request := await conn.read_request()) is not None:
            if request.body == b"hold":
                in_flight.set()
                await release.wait()
            await conn.respond(200, request.body)

    limits = PoolLimits(max_connections_per_worker=1, max_idle_per_worker=1, acquire_timeout_s=0.2)
    async with pool_serving(first_waits, ConnectionPool(limits)) as (pool, origin, server, nursery):
        results: list[bytes] = []

        async def call(body: bytes) -> None:
            results.append(await get(pool, origin, body))

        nursery.start_soon(call, b"hold")
        await in_flight.wait()
        with pytest.raises(UpstreamTimeout) as caught:
            await get(pool, origin, b"late")
        assert caught.value.phase == "acquire"
        assert pool.stats(origin).busy == 1

        # a waiter is handed the connection as soon as the holder completes
        pool.limits = PoolLimits(max_connections_per_worker=1, max_idle_per_worker=1,
                                 acquire_timeout_s=10)
        async with trio.open_nursery() as waiters:
            waiters.start_soon(call, b"next")
            await trio.testing.wait_all_tasks_blocked()
            release.set()
        assert results == [b"hold", b"next"]
        assert len(server.conns) == 1
        assert pool.stats(origin) == PoolStats(1, 1, 0, created=1, reused=1, discarded=0)


async def test_idle_cap_keeps_the_newest():
    both_in = trio.Event()
    arrived = 0

    async def answer_when_both_arrived(conn: ServerConn) -> None:
        nonlocal arrived
        while (request := await conn.read_request()) is not None:
            arrived += 1
            if arrived == 2:
                both_in.set()
            await both_in.wait()
            await conn.respond(200, request.body)

    limits = PoolLimits(max_connections_per_worker=4, max_idle_per_worker=1)
    async with pool_serving(answer_when_both_arrived, ConnectionPool(limits)) as (
            pool, origin, _, _nursery):
        async with trio.open_nursery() as calls:
            calls.start_soon(get, pool, origin, b"a")
            calls.start_soon(get, pool, origin, b"b")
        assert pool.stats(origin) == PoolStats(1, 1, 0, created=2, reused=0, discarded=1)


async def test_run_reaps_idle_connections_and_closes_the_pool_on_cancel():
    pool = ConnectionPool(PoolLimits(idle_timeout_s=0.05))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, server = await start_server(nursery, _answer_then_wait_eof)
            reaper = trio.CancelScope()

            async def run_pool(task_status: trio.TaskStatus[None]) -> None:
                with reaper:
                    await pool.run(task_status=task_status)

            await nursery.start(run_pool)
            await get(pool, origin)
            await server.conns[0].saw_eof.wait()  # reaped after idle_timeout_s
            assert pool.stats(origin).open == 0

            pool.limits = PoolLimits(idle_timeout_s=600)
            await get(pool, origin)
            assert pool.stats(origin).idle == 1
            reaper.cancel()
            await server.conns[1].saw_eof.wait()  # closed with the pool
            assert pool.stats(origin).open == 0
            await get(pool, origin)  # still usable, but nothing is pooled any more
            assert pool.stats(origin).open == 0
            nursery.cancel_scope.cancel()


async def _answer_then_wait_eof(conn: ServerConn) -> None:
    await conn.read_request()
    await conn.respond(200, b"ok")
    await conn.wait_eof()


async def test_reap_idle_follows_the_injected_clock():
    now = [100.0]
    pool = ConnectionPool(PoolLimits(idle_timeout_s=30), clock=lambda: now[0])
    async with pool_serving(_answer_then_wait_eof, pool) as (pool, origin, server, _nursery):
        await get(pool, origin)
        assert pool.reap_idle(129.0) == 130.0
        assert pool.stats(origin).idle == 1
        assert pool.reap_idle(130.0) is None
        await server.conns[0].saw_eof.wait()


async def test_close_origin_closes_idle_and_retires_busy_connections():
    release = trio.Event()
    holding = trio.Event()

    async def maybe_hold(conn: ServerConn) -> None:
        while (request := await conn.read_request()) is not None:
            if request.body == b"hold":
                holding.set()
                await release.wait()
            await conn.respond(200, request.body)

    async with pool_serving(maybe_hold) as (pool, origin, server, _nursery):
        await get(pool, origin, b"idle")
        async with trio.open_nursery() as calls:
            calls.start_soon(get, pool, origin, b"hold")  # reuses the idle one
            await holding.wait()
            await get(pool, origin, b"second")  # a second connection, then idle
            assert pool.stats(origin).open == 2
            await pool.close_origin(origin)
            assert pool.stats(origin).idle == 0
            await server.conns[1].saw_eof.wait()
            release.set()
        assert pool.stats(origin).open == 0  # the busy one was closed, not pooled
        await server.conns[0].saw_eof.wait()
        assert await get(pool, origin, b"again") == b"again"  # the origin still works


async def test_waiters_cancelled_or_handed_a_slot_leave_the_books_straight():
    release = trio.Event()
    holding = trio.Event()

    async def hold_then_close(conn: ServerConn) -> None:
        request = await conn.read_request()
        assert request is not None
        if request.body == b"hold":
            holding.set()
            await release.wait()
            await conn.respond(200, b"held", [(b"connection", b"close")])
            return
        await keep_alive_ok_after(conn, request)

    limits = PoolLimits(max_connections_per_worker=1, max_idle_per_worker=1)
    async with pool_serving(hold_then_close, ConnectionPool(limits)) as (
            pool, origin, server, _nursery):
        results: list[bytes] = []

        async def call(body: bytes) -> None:
            results.append(await get(pool, origin, body))

        async with trio.open_nursery() as calls:
            calls.start_soon(call, b"hold")
            await holding.wait()
            gone = trio.CancelScope()

            async def impatient() -> None:
                with gone:
                    await get(pool, origin, b"never")

            calls.start_soon(impatient)
            calls.start_soon(call, b"patient")
            await trio.testing.wait_all_tasks_blocked()
            gone.cancel()  # leaves the queue before anything was handed over
            await trio.testing.wait_all_tasks_blocked()
            release.set()  # the holder's connection closes: its slot goes to "patient"
        assert results == [b"held", b"patient"]
        assert len(server.conns) == 2
        assert [r.body for c in server.conns for r in c.requests] == [b"hold", b"patient"]
        assert pool.stats(origin) == PoolStats(1, 1, 0, created=2, reused=0, discarded=1)


async def keep_alive_ok_after(conn: ServerConn, first) -> None:
    await conn.respond(200, first.body)
    await keep_alive_ok(conn)
