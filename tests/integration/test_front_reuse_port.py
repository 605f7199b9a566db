"""Replicas of one host on one port (``server.reuse_port``): two lean HTTP servers bind the same
loopback port with ``SO_REUSEPORT`` and the kernel hands new connections to both; a server
without it cannot bind a port they hold (the default keeps a port to one process)."""

from __future__ import annotations

import errno

import pytest
import trio

from cortex.front.limits import ServerLimits
from cortex.front.messages import HttpRequest, HttpResponse, json_response
from cortex.front.server import HttpServer
from tests.front_http_client import RawClient

TIMEOUT = 30
CONNECTIONS = 64  # new connections (new source ports): P(all to one of two) = 2 * 2**-64


def answering(name: bytes):
    async def handler(request: HttpRequest) -> HttpResponse:
        return json_response(200, b'{"server": "' + name + b'"}')
    return handler


async def test_two_servers_share_one_port_and_both_get_connections():
    first, second = HttpServer(answering(b"a"), ServerLimits()), HttpServer(answering(b"b"),
                                                                          ServerLimits())
    seen: dict[bytes, int] = {}
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            _, port = await nursery.start(
                lambda task_status: first.serve("127.0.0.1", 0, reuse_port=True,
                                                task_status=task_status))
            await nursery.start(
                lambda task_status: second.serve("127.0.0.1", port, reuse_port=True,
                                                 task_status=task_status))
            with pytest.raises(OSError) as refused:  # not shared: the port is theirs
                await HttpServer(answering(b"c"), ServerLimits()).serve("127.0.0.1", port)
            assert refused.value.errno == errno.EADDRINUSE
            for _ in range(CONNECTIONS):
                client = await RawClient.connect(port)
                try:
                    response = await client.request(b"GET", b"/", b"")
                    assert response.status == 200
                    name = response.body.split(b'"server": "')[1][:1]
                    seen[name] = seen.get(name, 0) + 1
                finally:
                    await client.aclose()
            nursery.cancel_scope.cancel()
    assert set(seen) == {b"a", b"b"}, seen
