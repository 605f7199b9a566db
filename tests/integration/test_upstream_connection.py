"""UpstreamConnection over real loopback sockets: TCP options, connect failures, load."""

from __future__ import annotations

import socket

import pytest
import trio

from cortex.upstream.connection import open_connection
from cortex.upstream.connection_pool import ConnectionPool
from cortex.upstream.errors import UpstreamConnectError, UpstreamTimeout
from cortex.upstream.limits import PoolLimits
from tests.integration.upstream_servers import ServerConn, keep_alive_ok, start_server


async def test_every_upstream_socket_has_tcp_nodelay():
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, _ = await start_server(nursery, keep_alive_ok)
            port = int(origin.rsplit(":", 1)[1])
            conn = await open_connection(origin, "127.0.0.1", port, 5.0)
            try:
                assert conn.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                await conn.send_request(b"GET", b"/health", [(b"host", b"x")], b"")
                head = await conn.receive_head(5.0)
                assert head.status_code == 200
                assert await conn.receive_body(5.0) == b"ok"
                assert await conn.receive_body(5.0) is None
                assert conn.finish_exchange() and conn.exchanges == 1
                assert not conn.looks_closed()
            finally:
                conn.close()
            nursery.cancel_scope.cancel()


async def test_connect_timeout_when_the_listen_queue_is_full():
    # A listener that never accepts, with its accept queue filled: further SYNs are dropped,
    # so a connect attempt hangs until the connect timeout.
    listener = socket.socket()
    fillers: list[socket.socket] = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            fillers.append(filler)
            try:
                filler.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
        with trio.fail_after(10), pytest.raises(UpstreamConnectError) as caught:
            conn = await open_connection(f"http://127.0.0.1:{port}", "127.0.0.1", port, 0.3)
            conn.close()  # pragma: no cover - only if the kernel accepted anyway
        assert caught.value.phase == "connect" and "timeout" in str(caught.value)
    finally:
        for sock in [*fillers, listener]:
            sock.close()


async def test_many_concurrent_requests_share_a_capped_pool():
    async def echo(conn: ServerConn) -> None:
        while (request := await conn.read_request()) is not None:
            await conn.respond(200, request.body)

    pool = ConnectionPool(PoolLimits(max_connections_per_worker=8, max_idle_per_worker=4))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            origin, server = await start_server(nursery, echo)
            await nursery.start(pool.run)
            answers: dict[int, bytes] = {}

            async def call(i: int) -> None:
                for round_ in range(5):
                    body = f"{i}-{round_}".encode()
                    async with pool.request(origin, b"POST", b"/v1/completions", [],
                                            body) as response:
                        answers[i * 10 + round_] = await response.read()

            async with trio.open_nursery() as calls:
                for i in range(40):
                    calls.start_soon(call, i)
            assert answers == {i * 10 + r: f"{i}-{r}".encode()
                               for i in range(40) for r in range(5)}
            stats = pool.stats(origin)
            assert len(server.conns) == stats.created <= 8
            assert stats.created + stats.reused == 200
            assert stats.open == stats.idle <= 4 and stats.busy == 0
            nursery.cancel_scope.cancel()


async def test_timeouts_without_a_pool_running():
    # A connection used on its own (no deadline keeper): each wait has its own cancel scope.
    async def stall_in_head_then_in_body(conn: ServerConn) -> None:
        await conn.read_request()
        if conn.index == 1:
            await conn.start_chunked()
            await conn.chunk(b"data: 1\n\n")
        await conn.wait_eof()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, server = await start_server(nursery, stall_in_head_then_in_body)
            port = int(origin.rsplit(":", 1)[1])
            for index, phase in enumerate(("head", "body")):
                conn = await open_connection(origin, "127.0.0.1", port, 5.0)
                try:
                    await conn.send_request(b"POST", b"/", [(b"host", b"w"), (b"content-length", b"0")],
                                            b"")
                    with pytest.raises(UpstreamTimeout) as caught:
                        await conn.receive_head(0.2 if phase == "head" else 5.0)
                        assert await conn.receive_body(0.2) == b"data: 1\n\n"
                        await conn.receive_body(0.2)
                    assert caught.value.phase == phase
                    assert not conn.finish_exchange()
                finally:
                    conn.close()
                await server.conns[index].saw_eof.wait()
            nursery.cancel_scope.cancel()
