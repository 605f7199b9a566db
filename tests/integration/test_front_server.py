"""The lean HTTP server's protocol behaviour over real loopback sockets, raw bytes on the wire:
keep-alive, pipelining, HTTP/1.0, 100-continue, limits, read timeouts, malformed input,
max_connections and TCP_NODELAY."""

from __future__ import annotations

import json
import socket
from contextlib import asynccontextmanager

import trio
import trio.testing

from cortex.front.limits import ServerLimits
from cortex.front.messages import HttpRequest, HttpResponse, json_response
from cortex.front.server import HttpServer
from tests.front_http_client import RawClient, build_request

TIMEOUT = 20


async def echo(request: HttpRequest) -> HttpResponse:
    payload = {"method": request.method.decode(), "target": request.target.decode(),
               "body": request.body.decode(), "version": request.http_version.decode(),
               "headers": len(request.headers)}
    return json_response(200, json.dumps(payload).encode(), [
        (b"x-echo", b"1"), (b"Connection", b"keep-alive"), (b"keep-alive", b"timeout=5"),
        (b"transfer-encoding", b"identity"), (b"proxy-authenticate", b"x"), (b"date", b"old"),
    ])


class Served:
    """A running server and the raw clients a test opened (all closed at the end)."""

    def __init__(self, server: HttpServer, port: int) -> None:
        self.server = server
        self.counters = server.counters
        self.port = port
        self.clients: list[RawClient] = []

    async def connect(self) -> RawClient:
        client = await RawClient.connect(self.port)
        self.clients.append(client)
        return client


@asynccontextmanager
async def serving(handler=echo, **limits):
    server = HttpServer(handler, ServerLimits(**limits))
    async with trio.open_nursery() as nursery:
        _, port = await nursery.start(server.serve, "127.0.0.1", 0)
        served = Served(server, port)
        try:
            yield served
        finally:
            for client in served.clients:
                await client.aclose()
            nursery.cancel_scope.cancel()


def answer(response) -> dict:
    return json.loads(response.body)


async def test_keep_alive_serves_requests_on_one_connection_with_date_and_server():
    with trio.fail_after(TIMEOUT):
        async with serving() as served:
            client = await served.connect()
            for i in range(3):
                response = await client.request(b"POST", b"/v1/x?i=%d" % i, b"body %d" % i)
                assert response.status == 200
                assert answer(response)["target"] == f"/v1/x?i={i}"
                assert answer(response)["body"] == f"body {i}"
                assert response.header(b"server") == b"cortex"
                assert response.header(b"date").endswith(b" GMT")
                assert response.header_values(b"date") != [b"old"]
                assert response.header(b"x-echo") == b"1"
                # hop-by-hop headers of the handler are dropped
                for name in (b"connection", b"keep-alive", b"transfer-encoding",
                             b"proxy-authenticate"):
                    assert response.header(name) is None, name
            assert served.counters.connections_opened == 1
            assert served.counters.requests == 3
            assert served.counters.responses_by_status == {200: 3}


async def test_pipelined_requests_are_answered_in_order():
    with trio.fail_after(TIMEOUT):
        async with serving() as served:
            client = await served.connect()
            await client.send(b"".join(
                build_request(b"POST", b"/p%d" % i, b"x" * i) for i in range(1, 6)))
            for i in range(1, 6):
                response = await client.read_response()
                assert answer(response)["target"] == f"/p{i}"
                assert answer(response)["body"] == "x" * i
            assert served.counters.requests == 5


async def test_http_10_client_gets_its_answer_then_the_connection_closes():
    with trio.fail_after(TIMEOUT):
        async with serving() as served:
            client = await served.connect()
            await client.send(b"GET /old HTTP/1.0\r\n\r\n")
            response = await client.read_response()
            assert response.raw_head.startswith(b"HTTP/1.1 200")
            assert answer(response)["version"] == "1.0"
            assert await client.read_until_eof() == b""
            assert client.eof


async def test_expect_100_continue_is_answered_before_the_body():
    with trio.fail_after(TIMEOUT):
        async with serving() as served:
            client = await served.connect()
            await client.send(b"POST /up HTTP/1.1\r\nhost: t\r\ncontent-length: 5\r\n"
                              b"expect: 100-continue\r\n\r\n")
            status, _, _ = await client.read_head()
            assert status == 100
            await client.send(b"hello")
            response = await client.read_response()
            assert response.status == 200 and answer(response)["body"] == "hello"


async def test_expect_100_continue_with_too_large_body_gets_413_without_continue():
    with trio.fail_after(TIMEOUT):
        async with serving(max_body_bytes=100) as served:
            client = await served.connect()
            await client.send(b"POST /up HTTP/1.1\r\nhost: t\r\ncontent-length: 101\r\n"
                              b"expect: 100-continue\r\n\r\n")
            status, headers, _ = await client.read_head()
            assert status == 413
            assert (b"connection", b"close") in headers


async def test_body_over_the_limit_is_refused_up_front_with_413_and_close():
    with trio.fail_after(TIMEOUT):
        async with serving(max_body_bytes=1000) as served:
            client = await served.connect()
            await client.send(b"POST /big HTTP/1.1\r\nhost: t\r\ncontent-length: 1001\r\n\r\n"
                              + b"x" * 1001)
            response = await client.read_response()
            assert response.status == 413
            error = answer(response)["error"]
            assert error["code"] == 413 and error["type"] == "payload_too_large"
            assert await client.read_until_eof() == b""
            assert served.counters.too_large == 1 and served.counters.requests == 0


async def test_chunked_body_is_counted_while_read_and_refused_past_the_limit():
    with trio.fail_after(TIMEOUT):
        async with serving(max_body_bytes=1000) as served:
            client = await served.connect()
            await client.send(b"POST /chunks HTTP/1.1\r\nhost: t\r\n"
                              b"transfer-encoding: chunked\r\n\r\n")
            for _ in range(3):
                await client.send(b"190\r\n" + b"y" * 400 + b"\r\n")
            response = await client.read_response()
            assert response.status == 413
            assert served.counters.too_large == 1 and served.counters.requests == 0

            # within the limit, a chunked body arrives whole
            client = await served.connect()
            await client.send(b"POST /chunks HTTP/1.1\r\nhost: t\r\n"
                              b"transfer-encoding: chunked\r\n\r\n"
                              b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
            assert answer(await client.read_response())["body"] == "abcde"


async def test_large_body_arrives_whole():
    body = bytes(range(256)) * 8192  # 2 MiB, many reads
    with trio.fail_after(TIMEOUT):
        async with serving(_length) as served:
            client = await served.connect()
            for _ in range(2):
                response = await client.request(b"POST", b"/big", body)
                assert response.body == b"%d %d" % (len(body), hash(body))


async def _length(request: HttpRequest) -> HttpResponse:
    return HttpResponse(200, [], b"%d %d" % (len(request.body), hash(request.body)))


async def test_too_many_or_too_large_headers_get_431_and_close():
    with trio.fail_after(TIMEOUT):
        async with serving(max_header_count=10, max_header_bytes=2048) as served:
            client = await served.connect()
            await client.send(build_request(
                b"GET", b"/", headers=[(b"x-h%d" % i, b"v") for i in range(11)]))
            response = await client.read_response()
            assert response.status == 431
            assert await client.read_until_eof() == b""

            # a complete head over the byte limit, in one write
            client = await served.connect()
            await client.send(build_request(b"GET", b"/", headers=[(b"x-big", b"v" * 3000)]))
            assert (await client.read_response()).status == 431

            # a head that never ends, over the byte limit
            client = await served.connect()
            await client.send(b"GET / HTTP/1.1\r\nhost: t\r\nx-long: " + b"z" * 5000)
            assert (await client.read_response()).status == 431
            assert served.counters.too_large == 3
            assert served.counters.requests == 0


async def test_malformed_requests_get_400_and_close_never_500():
    bad = [
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost: t\r\nno colon here\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost: t\r\nx: bad\x00value\r\n\r\n",
        b"POST / HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nabc\r\n",
        b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: ten\r\n\r\n",
        b"GET / HTTP/1.1\r\n\r\n",  # no host
    ]
    with trio.fail_after(TIMEOUT):
        async with serving() as served:
            for raw in bad:
                client = await served.connect()
                await client.send(raw)
                response = await client.read_response()
                assert response.status == 400, raw
                assert answer(response)["error"]["type"] == "bad_request"
                assert await client.read_until_eof() == b""
            assert served.counters.bad_requests == len(bad)
            assert served.counters.handler_errors == 0 and served.counters.requests == 0
            assert set(served.counters.responses_by_status) == {400}


async def test_slowloris_head_is_cut_at_the_deadline_with_408():
    with trio.fail_after(TIMEOUT):
        async with serving(header_timeout_s=0.5) as served:
            client = await served.connect()
            started = trio.current_time()

            async def dribble() -> None:  # one byte every 50 ms, for 5 s
                try:
                    for byte in b"GET / HTTP/1.1\r\nhost: t\r\nx-slow: " + b"s" * 100:
                        await client.send(bytes([byte]))
                        await trio.sleep(0.05)
                except trio.BrokenResourceError:
                    pass

            async with trio.open_nursery() as nursery:
                nursery.start_soon(dribble)
                response = await client.read_response()
                nursery.cancel_scope.cancel()
            assert response.status == 408
            assert trio.current_time() - started < 4
            assert served.counters.header_timeouts == 1


async def test_slow_body_is_cut_at_the_deadline_with_408():
    with trio.fail_after(TIMEOUT):
        async with serving(body_timeout_s=0.5) as served:
            client = await served.connect()
            await client.send(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 100\r\n\r\nab")
            response = await client.read_response()
            assert response.status == 408
            assert await client.read_until_eof() == b""
            assert served.counters.body_timeouts == 1 and served.counters.requests == 0


async def test_idle_keep_alive_connection_is_closed_quietly():
    with trio.fail_after(TIMEOUT):
        async with serving(keepalive_idle_s=0.3) as served:
            client = await served.connect()
            assert (await client.request(b"GET", b"/")).status == 200
            assert await client.read_until_eof() == b""  # closed, no 408
            assert served.counters.header_timeouts == 0


async def test_a_client_that_never_sends_gets_408_at_the_first_head_deadline():
    # (idle deadlines are kept by the server's WaitDeadlines task: it must end this wait)
    with trio.fail_after(TIMEOUT):
        async with serving(header_timeout_s=0.3) as served:
            client = await served.connect()
            response = await client.read_response()
            assert response.status == 408
            assert await client.read_until_eof() == b""
            assert served.counters.header_timeouts == 1 and served.counters.requests == 0


async def test_max_connections_makes_the_accept_loop_wait():
    with trio.fail_after(TIMEOUT):
        async with serving(max_connections=1) as served:
            first = await served.connect()
            assert (await first.request(b"GET", b"/1")).status == 200
            second = await served.connect()  # completes in the listen backlog
            await second.send(build_request(b"GET", b"/2"))
            with trio.move_on_after(0.3):
                await second.read_response()
                raise AssertionError("second connection was served while the first is open")
            assert served.counters.connections_opened == 1
            assert (await first.request(b"GET", b"/1b")).status == 200
            await first.aclose()
            assert answer(await second.read_response())["target"] == "/2"
            assert served.counters.connections_opened == 2


async def test_every_accepted_socket_has_tcp_nodelay():
    with trio.fail_after(TIMEOUT):
        async with serving() as served:
            clients = [await served.connect() for _ in range(3)]
            for client in clients:
                assert (await client.request(b"GET", b"/")).status == 200
            assert len(served.server.connections) == 3
            for connection in served.server.connections:
                sock = connection.stream.socket
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


async def test_head_request_gets_headers_without_body():
    with trio.fail_after(TIMEOUT):
        async with serving() as served:
            client = await served.connect()
            response = await client.request(b"HEAD", b"/")
            assert response.status == 200 and int(response.header(b"content-length")) > 0
            # the connection is still in sync: the next answer is the next request's
            assert answer(await client.request(b"GET", b"/after"))["target"] == "/after"


async def test_client_closing_between_requests_or_mid_head_is_not_an_error():
    with trio.fail_after(TIMEOUT):
        async with serving() as served:
            client = await served.connect()
            assert (await client.request(b"GET", b"/")).status == 200
            await client.stream.send_eof()
            assert await client.read_until_eof() == b""
            client = await served.connect()
            await client.send(b"GET / HTTP/1.1\r\nhost")  # half a head, then gone
            await client.stream.send_eof()
            assert await client.read_until_eof() == b""  # closed without an answer
            await trio.testing.wait_all_tasks_blocked()
            counters = served.counters
            assert counters.connections_open == 0 and counters.connections_opened == 2
            assert counters.bad_requests == 0 and counters.client_gone == 0
            assert counters.responses_by_status == {200: 1}


async def test_requests_pipelined_before_a_smuggling_attempt_are_answered_then_400():
    smuggle = (b"POST /s HTTP/1.1\r\nhost: t\r\ncontent-length: 5\r\n"
               b"transfer-encoding: chunked\r\n\r\n0\r\n\r\nGET /hidden HTTP/1.1\r\nhost: t\r\n\r\n")
    with trio.fail_after(TIMEOUT):
        async with serving() as served:
            client = await served.connect()
            await client.send(build_request(b"GET", b"/1") + build_request(b"GET", b"/2")
                              + smuggle)
            assert answer(await client.read_response())["target"] == "/1"
            assert answer(await client.read_response())["target"] == "/2"
            refused = await client.read_response()
            assert refused.status == 400 and refused.header(b"connection") == b"close"
            assert await client.read_until_eof() == b""  # /hidden is never served
            assert served.counters.requests == 2 and served.counters.bad_requests == 1


async def test_client_asking_to_close_gets_connection_close_and_the_close():
    with trio.fail_after(TIMEOUT):
        async with serving() as served:
            client = await served.connect()
            await client.send(build_request(b"GET", b"/last", headers=[(b"Connection", b"close")])
                              + build_request(b"GET", b"/never"))
            response = await client.read_response()
            assert answer(response)["target"] == "/last"
            assert response.header(b"connection") == b"close"
            assert await client.read_until_eof() == b""
            assert served.counters.requests == 1 and served.counters.bad_requests == 0


async def test_h2c_upgrade_request_is_served_as_http_11_with_its_body():
    with trio.fail_after(TIMEOUT):
        async with serving() as served:
            client = await served.connect()
            await client.send(build_request(b"POST", b"/up", b"hello", headers=[
                (b"connection", b"Upgrade, HTTP2-Settings"), (b"upgrade", b"h2c"),
                (b"http2-settings", b"AAMAAABkAAQCAAAAAAIAAAAA")]))
            response = await client.read_response()
            assert response.status == 200 and answer(response)["body"] == "hello"
            assert answer(await client.request(b"GET", b"/after"))["target"] == "/after"
