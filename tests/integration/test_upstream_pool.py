"""UpstreamPool over real loopback sockets, against servers that misbehave precisely."""

from __future__ import annotations

import socket

import pytest
import trio
import trio.testing

from cortex.errors import BadRequest
from cortex.upstream.errors import UpstreamBroken, UpstreamConnectError, UpstreamTimeout
from cortex.upstream.limits import PoolLimits
from cortex.upstream.pool import PoolStats, UpstreamPool
from tests.integration.upstream_servers import ServerConn, keep_alive_ok, start_server

CHAT = b"/v1/chat/completions"
JSON = [(b"content-type", b"application/json")]


async def get(pool: UpstreamPool, origin: str, body: bytes = b"") -> bytes:
    async with pool.request(origin, b"POST", CHAT, JSON, body) as response:
        return await response.read()


# -- keep-alive and reuse --------------------------------------------------------------------

async def test_sequential_requests_reuse_one_connection():
    pool = UpstreamPool()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, server = await start_server(nursery, keep_alive_ok)
            await nursery.start(pool.run)
            async with pool.request(origin, b"POST", CHAT, JSON, b"first") as response:
                assert (response.status, response.reused) == (200, False)
                assert await response.read() == b"first"
            async with pool.request(origin, b"POST", CHAT, JSON, b"second") as response:
                assert response.reused
                assert await response.read() == b"second"
            assert len(server.conns) == 1 and len(server.conns[0].requests) == 2
            assert pool.stats(origin) == PoolStats(open=1, idle=1, busy=0, created=1,
                                                   reused=1, discarded=0)
            nursery.cancel_scope.cancel()


async def test_head_sent_to_worker():
    pool = UpstreamPool()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, server = await start_server(nursery, keep_alive_ok)
            await nursery.start(pool.run)
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
            nursery.cancel_scope.cancel()


async def test_unread_body_already_received_still_reuses():
    pool = UpstreamPool()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, server = await start_server(nursery, keep_alive_ok)
            await nursery.start(pool.run)
            for _ in range(3):
                async with pool.request(origin, b"GET", b"/health", []) as response:
                    assert response.status == 200
                    # the small body came in the head's segment; the caller never reads it
            assert len(server.conns) == 1
            assert pool.stats(origin) == PoolStats(1, 1, 0, created=1, reused=2, discarded=0)
            nursery.cancel_scope.cancel()


async def test_connection_close_from_worker_is_not_reused():
    async def close_after_answer(conn: ServerConn) -> None:
        await conn.read_request()
        await conn.respond(200, b"bye", [(b"connection", b"close")])

    pool = UpstreamPool()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, server = await start_server(nursery, close_after_answer)
            await nursery.start(pool.run)
            assert await get(pool, origin) == b"bye"
            assert await get(pool, origin) == b"bye"
            assert len(server.conns) == 2
            assert pool.stats(origin) == PoolStats(0, 0, 0, created=2, reused=0, discarded=2)
            nursery.cancel_scope.cancel()


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

    pool = UpstreamPool()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, server = await start_server(nursery, stream_two_chunks)
            await nursery.start(pool.run)
            async with pool.request(origin, b"POST", CHAT, JSON, b"{}") as response:
                assert response.status == 200
                assert await anext(response.body_chunks()) == b"data: 1\n\n"
            await server.conns[0].saw_eof.wait()
            assert await get(pool, origin) == b"data: 1\n\ndata: 2\n\n"
            assert len(server.conns) == 2
            assert pool.stats(origin).discarded == 1
            nursery.cancel_scope.cancel()


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

    pool = UpstreamPool()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, _ = await start_server(nursery, lockstep)
            await nursery.start(pool.run)
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
            nursery.cancel_scope.cancel()


# -- the keep-alive race: one retry, only when safe --------------------------------------------

async def test_reused_connection_closed_before_any_byte_is_retried_once():
    async def drop_second_request(conn: ServerConn) -> None:
        first = True
        while await conn.read_request() is not None:
            if conn.index == 0 and not first:
                return  # read the request, then close without a byte (the keep-alive race)
            first = False
            await conn.respond(200, b"ok")

    pool = UpstreamPool()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, server = await start_server(nursery, drop_second_request)
            await nursery.start(pool.run)
            assert await get(pool, origin) == b"ok"
            assert await get(pool, origin) == b"ok"
            assert len(server.conns) == 2
            stats = pool.stats(origin)
            assert (stats.created, stats.reused, stats.discarded) == (2, 1, 1)
            nursery.cancel_scope.cancel()


async def test_connection_closed_while_idle_is_replaced():
    closed = trio.Event()

    async def answer_then_close(conn: ServerConn) -> None:
        await conn.read_request()
        await conn.respond(200, b"ok")  # keep-alive announced...
        await conn.close()  # ...then closed while idle in the client's pool
        closed.set()

    pool = UpstreamPool()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, server = await start_server(nursery, answer_then_close)
            await nursery.start(pool.run)
            assert await get(pool, origin) == b"ok"
            await closed.wait()
            assert await get(pool, origin) == b"ok"  # detected while idle, or retried once
            assert len(server.conns) == 2
            nursery.cancel_scope.cancel()


async def test_no_retry_once_a_response_byte_arrived():
    async def half_head_on_reuse(conn: ServerConn) -> None:
        await conn.read_request()
        await conn.respond(200, b"ok")
        await conn.read_request()
        await conn.raw(b"HTTP/1.1 200 OK\r\n")  # part of a head, then gone

    pool = UpstreamPool()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, server = await start_server(nursery, half_head_on_reuse)
            await nursery.start(pool.run)
            await get(pool, origin)
            with pytest.raises(UpstreamBroken) as caught:
                await get(pool, origin)
            assert (caught.value.phase, caught.value.response_started) == ("head", True)
            assert caught.value.origin == origin
            assert len(server.conns) == 1
            nursery.cancel_scope.cancel()


async def test_no_retry_on_a_fresh_connection():
    async def read_then_close(conn: ServerConn) -> None:
        await conn.read_request()

    pool = UpstreamPool()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, server = await start_server(nursery, read_then_close)
            await nursery.start(pool.run)
            with pytest.raises(UpstreamBroken) as caught:
                await get(pool, origin)
            assert (caught.value.phase, caught.value.response_started) == ("head", False)
            assert caught.value.http_status == 502
            assert len(server.conns) == 1
            assert pool.stats(origin) == PoolStats(0, 0, 0, created=1, reused=0, discarded=1)
            nursery.cancel_scope.cancel()


# -- broken workers ------------------------------------------------------------------------

async def test_garbage_instead_of_a_head():
    async def garbage(conn: ServerConn) -> None:
        await conn.read_request()
        await conn.raw(b"SMTP ready\r\n\r\n")
        await conn.wait_eof()

    pool = UpstreamPool()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, server = await start_server(nursery, garbage)
            await nursery.start(pool.run)
            with pytest.raises(UpstreamBroken) as caught:
                await get(pool, origin)
            assert (caught.value.phase, caught.value.response_started) == ("head", True)
            await server.conns[0].saw_eof.wait()
            nursery.cancel_scope.cancel()


async def test_close_after_head_and_mid_chunked_body():
    async def die_in_body(conn: ServerConn) -> None:
        await conn.read_request()
        if conn.index == 0:
            await conn.raw(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n12345")
        else:
            await conn.start_chunked()
            await conn.chunk(b"data: 1\n\n")

    pool = UpstreamPool()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, _ = await start_server(nursery, die_in_body)
            await nursery.start(pool.run)
            for expected_chunks in ([b"12345"], [b"data: 1\n\n"]):
                chunks = []
                with pytest.raises(UpstreamBroken) as caught:
                    async with pool.request(origin, b"POST", CHAT, JSON, b"{}") as response:
                        async for chunk in response.body_chunks():
                            chunks.append(chunk)
                assert chunks == expected_chunks
                assert (caught.value.phase, caught.value.response_started) == ("body", True)
            assert pool.stats(origin).open == 0
            nursery.cancel_scope.cancel()


async def test_body_over_read_limit():
    pool = UpstreamPool()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, _ = await start_server(nursery, keep_alive_ok)
            await nursery.start(pool.run)
            with pytest.raises(UpstreamBroken) as caught:
                async with pool.request(origin, b"POST", CHAT, JSON, b"x" * 100) as response:
                    await response.read(limit=10)
            assert caught.value.phase == "body"
            # the whole response had arrived, so the connection itself is clean and kept
            assert pool.stats(origin) == PoolStats(1, 1, 0, created=1, reused=0, discarded=0)
            nursery.cancel_scope.cancel()


async def test_connect_refused():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    pool = UpstreamPool()
    with trio.fail_after(10), pytest.raises(UpstreamConnectError) as caught:
        await get(pool, f"http://127.0.0.1:{port}")
    assert (caught.value.phase, caught.value.response_started) == ("connect", False)
    assert pool.stats(f"http://127.0.0.1:{port}").open == 0


# -- cancellation and timeouts -------------------------------------------------------------

async def test_cancelled_while_waiting_for_head_closes_the_socket():
    got_request = trio.Event()

    async def never_answer(conn: ServerConn) -> None:
        await conn.read_request()
        got_request.set()
        await conn.wait_eof()

    pool = UpstreamPool()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, server = await start_server(nursery, never_answer)
            await nursery.start(pool.run)
            with trio.CancelScope() as client_gone:
                nursery.start_soon(_cancel_when, got_request, client_gone)
                await get(pool, origin)
            assert client_gone.cancelled_caught
            await server.conns[0].saw_eof.wait()  # the engine learns its client left
            assert pool.stats(origin) == PoolStats(0, 0, 0, created=1, reused=0, discarded=1)
            nursery.cancel_scope.cancel()


async def test_cancelled_mid_stream_closes_the_socket():
    async def stream_forever(conn: ServerConn) -> None:
        await conn.read_request()
        await conn.start_chunked()
        await conn.chunk(b"data: 1\n\n")
        await conn.wait_eof()

    pool = UpstreamPool()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, server = await start_server(nursery, stream_forever)
            await nursery.start(pool.run)
            with trio.CancelScope() as client_gone:
                async with pool.request(origin, b"POST", CHAT, JSON, b"{}") as response:
                    async for _chunk in response.body_chunks():
                        client_gone.cancel()
            await server.conns[0].saw_eof.wait()
            assert pool.stats(origin).discarded == 1
            nursery.cancel_scope.cancel()


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

    pool = UpstreamPool(PoolLimits(read_timeout_s=0.2))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, server = await start_server(nursery, stall)
            await nursery.start(pool.run)
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
            nursery.cancel_scope.cancel()


# -- limits --------------------------------------------------------------------------------

async def test_connection_cap_waiters_get_the_released_connection_or_time_out():
    release = trio.Event()
    in_flight = trio.Event()

    async def first_waits(conn: ServerConn) -> None:
        while (request := await conn.read_request()) is not None:
            if request.body == b"hold":
                in_flight.set()
                await release.wait()
            await conn.respond(200, request.body)

    pool = UpstreamPool(PoolLimits(max_connections_per_worker=1, max_idle_per_worker=1,
                                   acquire_timeout_s=0.2))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, server = await start_server(nursery, first_waits)
            await nursery.start(pool.run)
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
            nursery.cancel_scope.cancel()


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

    pool = UpstreamPool(PoolLimits(max_connections_per_worker=4, max_idle_per_worker=1))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, _ = await start_server(nursery, answer_when_both_arrived)
            await nursery.start(pool.run)
            async with trio.open_nursery() as calls:
                calls.start_soon(get, pool, origin, b"a")
                calls.start_soon(get, pool, origin, b"b")
            assert pool.stats(origin) == PoolStats(1, 1, 0, created=2, reused=0, discarded=1)
            nursery.cancel_scope.cancel()


async def test_run_reaps_idle_connections_and_closes_the_pool_on_cancel():
    pool = UpstreamPool(PoolLimits(idle_timeout_s=0.05))
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
    pool = UpstreamPool(PoolLimits(idle_timeout_s=30), clock=lambda: now[0])
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, server = await start_server(nursery, _answer_then_wait_eof)
            await nursery.start(pool.run)
            await get(pool, origin)
            assert pool.reap_idle(129.0) == 130.0
            assert pool.stats(origin).idle == 1
            assert pool.reap_idle(130.0) is None
            await server.conns[0].saw_eof.wait()
            nursery.cancel_scope.cancel()


async def test_close_origin_closes_idle_and_retires_busy_connections():
    release = trio.Event()
    holding = trio.Event()

    async def maybe_hold(conn: ServerConn) -> None:
        while (request := await conn.read_request()) is not None:
            if request.body == b"hold":
                holding.set()
                await release.wait()
            await conn.respond(200, request.body)

    pool = UpstreamPool()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, server = await start_server(nursery, maybe_hold)
            await nursery.start(pool.run)
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
            nursery.cancel_scope.cancel()


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

    pool = UpstreamPool(PoolLimits(max_connections_per_worker=1, max_idle_per_worker=1))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, server = await start_server(nursery, hold_then_close)
            await nursery.start(pool.run)
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
            nursery.cancel_scope.cancel()


async def keep_alive_ok_after(conn: ServerConn, first) -> None:
    await conn.respond(200, first.body)
    await keep_alive_ok(conn)


async def test_a_head_h11_refuses_is_a_bad_request_and_nothing_is_sent():
    pool = UpstreamPool()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, server = await start_server(nursery, keep_alive_ok)
            await nursery.start(pool.run)
            with pytest.raises(BadRequest):
                async with pool.request(origin, b"POST", CHAT, [(b"x-evil", b"a\r\nb: c")]):
                    pass
            await server.conns[0].saw_eof.wait()
            assert server.conns[0].requests == []
            assert pool.stats(origin).open == 0
            nursery.cancel_scope.cancel()


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

    pool = UpstreamPool()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, server = await start_server(nursery, never_answer)
            await nursery.start(pool.run)
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
            nursery.cancel_scope.cancel()
