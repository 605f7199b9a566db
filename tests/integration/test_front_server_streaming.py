"""The lean HTTP server's handler contract over real loopback sockets: streamed bodies flushed
chunk by chunk, client disconnects cancelling the handler, failures after the head, handler
errors, and graceful drain."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

import pytest
import trio
import trio.lowlevel
import trio.testing

from cortex.errors import ConfigError, NotFound, UpstreamError
from cortex.front.limits import ServerLimits
from cortex.front.messages import HttpRequest, HttpResponse, json_response
from cortex.front.server import HttpServer
from tests.front_http_client import RawClient, build_request
from tests.integration.test_front_server import TIMEOUT, serving


class Script:
    """Events and flags shared by a test and its handler."""

    def __init__(self) -> None:
        self.release = trio.Event()
        self.handler_started = trio.Event()
        self.handler_finally = trio.Event()
        self.body_closed = trio.Event()
        self.handler_cancelled = False
        self.body_cancelled = False

    async def run_until_cancelled(self) -> None:
        """A handler's body that runs until cancelled, recording start, cancel and end."""
        self.handler_started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            self.handler_cancelled = True
            raise
        finally:
            self.handler_finally.set()


async def answers_500_then_closes(handler) -> None:
    """A handler bug found while the head is held: one counted 500, then the server closes."""
    with trio.fail_after(TIMEOUT):
        async with serving(handler) as served:
            client = await served.connect()
            response = await client.request(b"GET", b"/")
            assert response.status == 500
            assert await client.read_until_eof() == b""
            assert served.counters.handler_errors == 1


async def chunked_stream(served) -> RawClient:
    """A client that sent ``GET /stream`` and read a 200 chunked head."""
    client = await served.connect()
    await client.send(build_request(b"GET", b"/stream"))
    status, headers, _ = await client.read_head()
    assert status == 200 and (b"transfer-encoding", b"chunked") in headers
    return client


async def test_streamed_body_is_flushed_chunk_by_chunk():
    script = Script()

    async def chunks() -> AsyncIterator[bytes]:
        try:
            yield b"data: one\n\n"
            await script.release.wait()
            yield b""  # empty chunks are skipped, never a premature terminator
            yield b"data: two\n\n"
        finally:
            script.body_closed.set()

    async def handler(request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, [(b"content-type", b"text/event-stream")], chunks())

    with trio.fail_after(TIMEOUT):
        async with serving(handler) as served:
            client = await chunked_stream(served)
            # chunk one arrives while the handler still holds chunk two
            assert await client.read_chunk() == b"data: one\n\n"
            assert not script.release.is_set()
            script.release.set()
            assert await client.read_chunk() == b"data: two\n\n"
            assert await client.read_chunk() == b""
            await script.body_closed.wait()
            # the connection is kept for the next request (released: it runs straight through)
            response = await client.request(b"GET", b"/stream")
            assert response.body == b"data: one\n\ndata: two\n\n"


class ReadyFirstBody:
    """A streamed body holding its first chunk (``chunk_ready``); asked through ``__anext__``
    instead, it would give that chunk only after ``gate`` opens."""

    def __init__(self, gate: trio.Event) -> None:
        self.gate = gate
        self.chunks = [b"data: one\n\n", b"data: two\n\n"]
        self.ready_taken = False

    def chunk_ready(self) -> bytes | None:
        if self.ready_taken:
            return None
        self.ready_taken = True
        return self.chunks.pop(0)

    def __aiter__(self) -> ReadyFirstBody:
        return self

    async def __anext__(self) -> bytes:
        await self.gate.wait()
        if not self.chunks:
            raise StopAsyncIteration
        return self.chunks.pop(0)


async def test_a_chunk_the_body_holds_goes_out_with_the_head_without_awaiting_the_body():
    gate = trio.Event()
    body = ReadyFirstBody(gate)

    async def handler(request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, [(b"content-type", b"text/event-stream")], body)

    with trio.fail_after(TIMEOUT):
        async with serving(handler) as served:
            client = await chunked_stream(served)
            assert await client.read_chunk() == b"data: one\n\n"  # while the gate is shut
            gate.set()
            assert await client.read_chunk() == b"data: two\n\n"
            assert await client.read_chunk() == b""


async def test_streamed_body_with_content_length_is_not_chunked():
    async def chunks() -> AsyncIterator[bytes]:
        yield b"abc"
        yield b"def"

    async def handler(request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, [(b"content-length", b"6")], chunks())

    with trio.fail_after(TIMEOUT):
        async with serving(handler) as served:
            client = await served.connect()
            response = await client.request(b"GET", b"/")
            assert response.header(b"transfer-encoding") is None
            assert response.header(b"content-length") == b"6" and response.body == b"abcdef"
            assert (await client.request(b"GET", b"/")).body == b"abcdef"


async def test_streamed_body_to_http_10_client_is_close_delimited():
    async def chunks() -> AsyncIterator[bytes]:
        yield b"abc"
        yield b"def"

    async def handler(request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, [], chunks())

    with trio.fail_after(TIMEOUT):
        async with serving(handler) as served:
            client = await served.connect()
            await client.send(b"GET / HTTP/1.0\r\n\r\n")
            response = await client.read_response()
            assert response.header(b"transfer-encoding") is None
            assert response.body == b"abcdef" and client.eof


async def test_client_leaving_while_the_handler_runs_cancels_it():
    script = Script()

    async def handler(request: HttpRequest) -> HttpResponse:
        await script.run_until_cancelled()

    with trio.fail_after(TIMEOUT):
        async with serving(handler) as served:
            client = await served.connect()
            await client.send(build_request(b"POST", b"/v1/chat/completions", b"{}"))
            await script.handler_started.wait()
            assert served.server.in_flight == 1
            await client.abort()  # a real disconnect (a reset)
            await script.handler_finally.wait()
            assert script.handler_cancelled
            await trio.testing.wait_all_tasks_blocked()
            assert served.counters.client_gone == 1
            assert served.server.in_flight == 0 and served.counters.connections_open == 0


@pytest.mark.parametrize("watch_after_s", [0.0, 0.3])
async def test_a_client_leaving_is_noticed_from_client_watch_after_s_into_the_response(
        watch_after_s: float):
    # Until then nothing reads the client's socket (a short answer costs no watcher); from
    # then the watcher reads, sees the end of stream and cancels the handler.
    script = Script()
    started_at: list[float] = []

    async def handler(request: HttpRequest) -> HttpResponse:
        started_at.append(trio.current_time())
        await script.run_until_cancelled()

    with trio.fail_after(TIMEOUT):
        async with serving(handler, client_watch_after_s=watch_after_s) as served:
            client = await served.connect()
            await client.send(build_request(b"POST", b"/v1/chat/completions", b"{}"))
            await script.handler_started.wait()
            await client.abort()  # a real disconnect (a reset)
            await script.handler_finally.wait()
            assert script.handler_cancelled
            assert trio.current_time() - started_at[0] >= watch_after_s
            await trio.testing.wait_all_tasks_blocked()
            assert served.counters.client_gone == 1 and served.server.in_flight == 0


async def test_client_leaving_a_later_request_on_a_kept_connection_still_cancels_it():
    # Between responses the main task reads the socket itself and the watcher's wait is
    # ended; it must watch again for each later response.
    script = Script()

    async def handler(request: HttpRequest) -> HttpResponse:
        if request.path == b"/fast":
            await trio.lowlevel.checkpoint()  # the watcher gets to wait on the socket
            return json_response(200, b"{}")
        await script.run_until_cancelled()

    with trio.fail_after(TIMEOUT):
        async with serving(handler) as served:
            client = await served.connect()
            for _ in range(3):
                assert (await client.request(b"POST", b"/fast", b"{}")).status == 200
            await client.send(build_request(b"POST", b"/slow", b"{}"))
            await script.handler_started.wait()
            await client.abort()  # a real disconnect (a reset)
            await script.handler_finally.wait()
            assert script.handler_cancelled
            await trio.testing.wait_all_tasks_blocked()
            assert served.counters.client_gone == 1 and served.counters.requests == 4


async def test_client_leaving_while_the_body_streams_cancels_and_closes_it():
    script = Script()

    async def chunks() -> AsyncIterator[bytes]:
        try:
            yield b"first"
            await trio.sleep_forever()
            yield b"never"
        except trio.Cancelled:
            script.body_cancelled = True
            raise
        finally:
            script.body_closed.set()

    async def handler(request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, [], chunks())

    with trio.fail_after(TIMEOUT):
        async with serving(handler) as served:
            client = await served.connect()
            await client.send(build_request(b"GET", b"/stream"))
            await client.read_head()
            assert await client.read_chunk() == b"first"
            await client.abort()  # a real disconnect (a reset)
            await script.body_closed.wait()
            assert script.body_cancelled
            await trio.testing.wait_all_tasks_blocked()
            assert served.counters.client_gone == 1


async def test_body_iterator_failing_after_the_head_closes_without_the_last_chunk():
    script = Script()

    async def chunks() -> AsyncIterator[bytes]:
        try:
            yield b"partial"
            raise UpstreamError("worker died mid-stream")
        finally:
            script.body_closed.set()

    async def handler(request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, [], chunks())

    with trio.fail_after(TIMEOUT):
        async with serving(handler) as served:
            client = await served.connect()
            await client.send(build_request(b"GET", b"/stream"))
            await client.read_head()
            assert await client.read_chunk() == b"partial"
            rest = await client.read_until_eof()
            assert rest == b""  # closed: no terminating 0-chunk
            assert script.body_closed.is_set()


async def test_body_iterator_bug_after_the_head_is_logged_and_counted(caplog):
    async def chunks() -> AsyncIterator[bytes]:
        yield b"partial"
        raise KeyError("bug")

    async def handler(request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, [], chunks())

    with trio.fail_after(TIMEOUT):
        async with serving(handler) as served:
            client = await served.connect()
            await client.send(build_request(b"GET", b"/stream"))
            await client.read_head()
            assert await client.read_chunk() == b"partial"
            assert await client.read_until_eof() == b""
            assert served.counters.handler_errors == 1
    assert any(r.name == "cortex.front" and r.exc_info for r in caplog.records)


async def test_cortex_errors_become_json_answers_and_keep_the_connection():
    async def handler(request: HttpRequest) -> HttpResponse:
        if request.path == b"/missing":
            raise NotFound("no route GET /missing")
        if request.path == b"/config":
            raise ConfigError(["a is wrong", "b is wrong"])
        return json_response(200, b"{}")

    with trio.fail_after(TIMEOUT):
        async with serving(handler) as served:
            client = await served.connect()
            response = await client.request(b"GET", b"/missing")
            assert response.status == 404
            assert response.header(b"content-type") == b"application/json"
            assert json.loads(response.body) == {"error": {
                "message": "no route GET /missing", "type": "not_found", "code": 404}}
            response = await client.request(b"GET", b"/config")
            error = json.loads(response.body)["error"]
            assert response.status == 500 and error["type"] == "config_error"
            assert error["problems"] == ["a is wrong", "b is wrong"]
            assert (await client.request(b"GET", b"/ok")).status == 200
            assert served.counters.handler_errors == 0
            assert served.counters.connections_opened == 1


async def test_cortex_error_raised_from_a_handler_nursery_is_unwrapped():
    async def failing() -> None:
        raise UpstreamError("upstream refused")

    async def handler(request: HttpRequest) -> HttpResponse:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(failing)
        return json_response(200, b"{}")

    with trio.fail_after(TIMEOUT):
        async with serving(handler) as served:
            client = await served.connect()
            response = await client.request(b"GET", b"/")
            assert response.status == 502
            assert json.loads(response.body)["error"]["type"] == "upstream_error"


async def test_handler_bug_is_a_logged_counted_500_and_closes(caplog):
    async def handler(request: HttpRequest) -> HttpResponse:
        raise ZeroDivisionError("bug")

    with trio.fail_after(TIMEOUT):
        async with serving(handler) as served:
            client = await served.connect()
            with caplog.at_level(logging.ERROR, logger="cortex.front"):
                response = await client.request(b"GET", b"/boom")
            assert response.status == 500
            assert json.loads(response.body) == {"error": {
                "message": "internal server error", "type": "internal_server_error",
                "code": 500}}
            assert response.header(b"connection") == b"close"
            assert await client.read_until_eof() == b""
            assert served.counters.handler_errors == 1
    (record,) = [r for r in caplog.records if r.name == "cortex.front"]
    assert record.exc_info[0] is ZeroDivisionError


async def test_drain_finishes_in_flight_refuses_new_and_closes_idle():
    script = Script()

    async def chunks() -> AsyncIterator[bytes]:
        yield b"one"
        await script.release.wait()
        yield b"two"

    async def handler(request: HttpRequest) -> HttpResponse:
        if request.path == b"/stream":
            return HttpResponse(200, [], chunks())
        return json_response(200, b'{"ok":true}')

    with trio.fail_after(TIMEOUT):
        async with serving(handler) as served:
            server = served.server
            idle = await served.connect()
            assert (await idle.request(b"GET", b"/")).status == 200
            busy = await served.connect()
            await busy.send(build_request(b"GET", b"/stream"))
            await busy.read_head()
            assert await busy.read_chunk() == b"one"
            # a pipelined request behind the stream, answered after it
            await busy.send(build_request(b"GET", b"/after"))

            server.drain()
            assert server.draining
            assert await idle.read_until_eof() == b""  # idle keep-alive closed at once
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(OSError):
                await trio.open_tcp_stream("127.0.0.1", served.port)

            script.release.set()
            assert await busy.read_chunk() == b"two"
            assert await busy.read_chunk() == b""
            after = await busy.read_response()
            assert after.status == 200 and after.header(b"connection") == b"close"
            assert await busy.read_until_eof() == b""
            assert server.in_flight == 0


async def test_serve_returns_after_drain_and_cancels_stragglers_at_the_deadline():
    script = Script()

    async def handler(request: HttpRequest) -> HttpResponse:
        script.handler_started.set()
        try:
            await trio.sleep_forever()
        finally:
            script.handler_finally.set()

    server = HttpServer(handler, ServerLimits(drain_timeout_s=0.2))
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            _, port = await nursery.start(server.serve, "127.0.0.1", 0)
            client = await RawClient.connect(port)
            await client.send(build_request(b"GET", b"/hang"))
            await script.handler_started.wait()
            server.drain()
        # serve() returned: the hanging handler was cancelled at the drain deadline
        assert script.handler_finally.is_set()
        assert await client.read_until_eof() == b""
        await client.aclose()


@pytest.mark.parametrize("bad", [
    HttpResponse(200, [(b"x-bad", b"line\r\nbreak")], b"{}"),
    HttpResponse(99, [], b"{}"),
    HttpResponse(200, [(b"x-bad", b"line\r\nbreak")], None),
])
async def test_unsendable_response_from_the_handler_is_a_500(bad, caplog):
    if bad.body is None:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"x"
        bad.body = chunks()

    async def handler(request: HttpRequest) -> HttpResponse:
        return bad

    await answers_500_then_closes(handler)


async def test_bytes_pipelined_while_the_handler_runs_wait_for_the_next_cycle():
    script = Script()

    async def handler(request: HttpRequest) -> HttpResponse:
        if request.path == b"/slow":
            script.handler_started.set()
            await script.release.wait()
        return json_response(200, b'{"path":"%s"}' % request.path)

    with trio.fail_after(TIMEOUT):
        async with serving(handler) as served:
            client = await served.connect()
            await client.send(build_request(b"POST", b"/slow", b"{}"))
            await script.handler_started.wait()
            await client.send(build_request(b"POST", b"/next", b"x" * 70_000))
            await trio.testing.wait_all_tasks_blocked()
            script.release.set()
            assert json.loads((await client.read_response()).body) == {"path": "/slow"}
            assert json.loads((await client.read_response()).body) == {"path": "/next"}
            assert served.counters.client_gone == 0 and served.counters.requests == 2


async def test_body_longer_than_its_content_length_is_a_500_while_the_head_is_held(caplog):
    async def chunks() -> AsyncIterator[bytes]:
        yield b"way too long"

    async def handler(request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, [(b"content-length", b"3")], chunks())

    await answers_500_then_closes(handler)


async def test_body_shorter_than_its_content_length_closes_after_the_head():
    async def chunks() -> AsyncIterator[bytes]:
        yield b"abc"

    async def handler(request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, [(b"content-length", b"10")], chunks())

    with trio.fail_after(TIMEOUT):
        async with serving(handler) as served:
            client = await served.connect()
            await client.send(build_request(b"GET", b"/"))
            status, headers, _ = await client.read_head()
            assert status == 200 and (b"content-length", b"10") in headers
            assert await client.read_until_eof() == b"abc"  # cut: the client sees 3 of 10
            assert served.counters.handler_errors == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_that_half_closes_after_sending_still_gets_its_whole_answer(stream):
    """Issue 22 §4: ``shutdown(SHUT_WR)`` after the request is legal HTTP/1.1; the answer (a
    slow whole one, or a long stream) still comes, then the connection closes. With
    ``eof_is_gone`` the old behaviour: the request is abandoned."""
    async def chunks() -> AsyncIterator[bytes]:
        for i in range(40):
            await trio.sleep(0.01)
            yield b"event %d\n" % i

    async def handler(request: HttpRequest) -> HttpResponse:
        if stream:
            return HttpResponse(200, [], chunks())
        await trio.sleep(0.4)  # longer than client_watch_after_s
        return json_response(200, b'{"done":true}')

    with trio.fail_after(TIMEOUT):
        async with serving(handler) as served:
            client = await served.connect()
            await client.send(build_request(b"POST", b"/v1/completions", b"{}"))
            await client.half_close()
            response = await client.read_response()
            assert response.status == 200
            assert response.body.count(b"event") == 40 if stream else b"done" in response.body
            assert await client.read_until_eof() == b""  # then the server closes
            assert served.counters.client_gone == 0
        async with serving(handler, eof_is_gone=True) as served:
            client = await served.connect()
            await client.send(build_request(b"POST", b"/v1/completions", b"{}"))
            await client.half_close()
            await client.read_until_eof()  # whatever was sent before, then the close
            await trio.testing.wait_all_tasks_blocked()
            assert served.counters.client_gone == 1
