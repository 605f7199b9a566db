"""Small loopback HTTP servers for the upstream client tests, misbehaving on purpose.

``start_server(nursery, behaviour)`` serves ``behaviour(conn)`` for every accepted connection
and returns ``(origin, server)``. ``ServerConn`` reads requests with h11 (so well-behaved
answers are real HTTP) and can also write raw bytes, stall or close at any point. Everything
is synchronised with trio Events — nothing sleeps. ``get(pool, origin, body)`` is the client
side the pool tests share: a chat POST through the pool, its whole answer read.
``pool_serving(behaviour, pool)`` is their set-up: such a server and the pool running in front
of it inside ``fail_after(10)``, yielding ``(pool, origin, server, nursery)``; all cancelled on
exit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial

import h11
import trio

from cortex.upstream.connection_pool import ConnectionPool


@dataclass
class Received:
    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)


class ServerConn:
    def __init__(self, index: int, stream: trio.SocketStream) -> None:
        self.index = index  # 0 for the first accepted connection, 1 for the next...
        self.stream = stream
        self.h11 = h11.Connection(h11.SERVER)
        self.requests: list[Received] = []
        self.saw_eof = trio.Event()

    async def read_request(self) -> Received | None:
        """The next request, or None when the client closed the connection."""
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
        head = None
        body = b""
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                data = await self._receive()
                self.h11.receive_data(data)
                continue
            if isinstance(event, h11.ConnectionClosed):
                return None
            if isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                received = Received(head.method, head.target, list(head.headers), body)
                self.requests.append(received)
                return received

    async def respond(self, status: int = 200, body: bytes = b"ok",
                      headers: list[tuple[bytes, bytes]] | None = None) -> None:
        hdrs = [(b"content-length", str(len(body)).encode()), *(headers or [])]
        data = self.h11.send(h11.Response(status_code=status, headers=hdrs))
        data += self.h11.send(h11.Data(data=body)) if body else b""
        data += self.h11.send(h11.EndOfMessage())
        await self.stream.send_all(data)

    async def start_chunked(self, status: int = 200) -> None:
        await self.stream.send_all(self.h11.send(h11.Response(
            status_code=status, headers=[(b"transfer-encoding", b"chunked"),
                                         (b"content-type", b"text/event-stream")])))

    async def chunk(self, data: bytes) -> None:
        await self.stream.send_all(self.h11.send(h11.Data(data=data)))

    async def end(self) -> None:
        await self.stream.send_all(self.h11.send(h11.EndOfMessage()))

    async def raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def wait_eof(self) -> None:
        """Read (and ignore) until the client closes; then ``saw_eof`` is set."""
        while await self._receive():
            pass

    async def _receive(self) -> bytes:
        try:
            data = await self.stream.receive_some(65536)
        except trio.BrokenResourceError:
            data = b""
        if not data:
            self.saw_eof.set()
        return data

    async def close(self) -> None:
        await self.stream.aclose()


Behaviour = Callable[[ServerConn], Awaitable[None]]


@dataclass
class Server:
    behaviour: Behaviour
    conns: list[ServerConn] = field(default_factory=list)
    accepted: trio.Event = field(default_factory=trio.Event)

    async def handle(self, stream: trio.SocketStream) -> None:
        conn = ServerConn(len(self.conns), stream)
        self.conns.append(conn)
        self.accepted.set()
        try:
            await self.behaviour(conn)
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            conn.saw_eof.set()
        finally:
            await stream.aclose()


async def start_server(nursery: trio.Nursery, behaviour: Behaviour) -> tuple[str, Server]:
    server = Server(behaviour)
    listeners = await nursery.start(partial(trio.serve_tcp, server.handle, 0,
                                            host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    return f"http://127.0.0.1:{port}", server


@asynccontextmanager
async def pool_serving(behaviour: Behaviour, pool: ConnectionPool | None = None
                       ) -> AsyncIterator[tuple[ConnectionPool, str, Server, trio.Nursery]]:
    pool = pool if pool is not None else ConnectionPool()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            origin, server = await start_server(nursery, behaviour)
            await nursery.start(pool.run)
            yield pool, origin, server, nursery
            nursery.cancel_scope.cancel()


async def keep_alive_ok(conn: ServerConn) -> None:
    """Well-behaved: answer every request with 200 ``ok`` (echoing the body if any)."""
    while (request := await conn.read_request()) is not None:
        await conn.respond(200, request.body or b"ok")


CHAT = b"/v1/chat/completions"
JSON = [(b"content-type", b"application/json")]


async def get(pool: ConnectionPool, origin: str, body: bytes = b"") -> bytes:
    async with pool.request(origin, b"POST", CHAT, JSON, body) as response:
        return await response.read()
