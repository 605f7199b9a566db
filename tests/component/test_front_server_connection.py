"""One server connection over trio memory streams on a virtual clock: the read deadlines are
exact and absolute (a dribbling client cannot extend them), idle keep-alive ends quietly, and
no byte sequence makes the connection crash or answer anything but 2xx/4xx."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from cortex.errors import UpstreamError
from cortex.front.connection import HttpConnection
from cortex.front.limits import ServerLimits
from cortex.front.messages import HttpRequest, HttpResponse, json_response
from cortex.front.shared import ServerCounters, ServerShared
from tests.front_http_client import RawClient, build_request

LIMITS = ServerLimits(header_timeout_s=10, body_timeout_s=30, keepalive_idle_s=75)


async def ok(request: HttpRequest) -> HttpResponse:
    return json_response(200, b"{}")


async def serve_one(nursery: trio.Nursery, limits: ServerLimits = LIMITS
                    ) -> tuple[RawClient, ServerShared, trio.Event]:
    client_stream, server_stream = trio.testing.memory_stream_pair()
    shared = ServerShared(ok, limits, ServerCounters(), b"cortex")
    closed = trio.Event()

    async def run() -> None:
        await HttpConnection(server_stream, shared).run()
        closed.set()

    nursery.start_soon(run)
    return RawClient(client_stream), shared, closed


@pytest.fixture
def clock(autojump_clock):
    return autojump_clock


async def test_first_head_is_due_header_timeout_after_the_accept(clock):
    async with trio.open_nursery() as nursery:
        client, shared, closed = await serve_one(nursery)
        response = await client.read_response()
        assert response.status == 408
        assert trio.current_time() == pytest.approx(10)
        assert shared.counters.header_timeouts == 1
        await client.stream.aclose()
        await closed.wait()


async def test_dribbling_client_does_not_extend_the_head_deadline(clock):
    async with trio.open_nursery() as nursery:
        client, _shared, _closed = await serve_one(nursery)

        async def dribble() -> None:
            for byte in b"GET / HTTP/1.1\r\nhost: t\r\nx-slow: " + b"s" * 100:
                await client.send(bytes([byte]))
                await trio.sleep(0.5)

        nursery.start_soon(dribble)
        response = await client.read_response()
        assert response.status == 408
        assert trio.current_time() == pytest.approx(10, abs=0.5)
        nursery.cancel_scope.cancel()


async def test_body_is_due_body_timeout_after_the_head(clock):
    async with trio.open_nursery() as nursery:
        client, shared, _closed = await serve_one(nursery)
        await trio.sleep(4)
        await client.send(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 10\r\n\r\n")
        for _ in range(40):  # a byte a second would take 10 s, but stops after 9
            if trio.current_time() > 12:
                break
            await client.send(b"x")
            await trio.sleep(1)
        response = await client.read_response()
        assert response.status == 408
        assert trio.current_time() == pytest.approx(34, abs=1)
        assert shared.counters.body_timeouts == 1
        nursery.cancel_scope.cancel()


async def test_idle_keep_alive_closes_quietly_after_keepalive_idle(clock):
    async with trio.open_nursery() as nursery:
        client, shared, closed = await serve_one(nursery)
        assert (await client.request(b"GET", b"/")).status == 200
        answered = trio.current_time()
        assert await client.read_until_eof() == b""  # no 408 for an idle connection
        await closed.wait()
        assert trio.current_time() - answered == pytest.approx(75)
        assert shared.counters.header_timeouts == 0


async def test_later_head_is_due_header_timeout_after_its_first_byte(clock):
    async with trio.open_nursery() as nursery:
        client, _shared, _closed = await serve_one(nursery)
        assert (await client.request(b"GET", b"/")).status == 200
        await trio.sleep(50)  # idle, within keepalive_idle_s
        started = trio.current_time()
        await client.send(b"GET /second HTTP/1.1\r\n")
        response = await client.read_response()
        assert response.status == 408
        assert trio.current_time() - started == pytest.approx(10)
        nursery.cancel_scope.cancel()


async def test_pipelined_request_after_a_slow_one_gets_its_own_deadline(clock):
    async with trio.open_nursery() as nursery:
        client, _shared, _closed = await serve_one(nursery)
        await client.send(build_request(b"GET", b"/1") + build_request(b"GET", b"/2"))
        assert (await client.read_response()).status == 200
        assert (await client.read_response()).status == 200
        assert trio.current_time() == 0
        nursery.cancel_scope.cancel()


ANSWERS = {200, 400, 408, 413, 431}
PREFIXES = [b"", b"GET / HTTP/1.1\r\nhost: t\r\n", b"POST / HTTP/1.1\r\nhost: t\r\n"
            b"transfer-encoding: chunked\r\n\r\n", b"POST / HTTP/1.1\r\nhost: t\r\n"
            b"content-length: 5\r\n\r\n"]


@settings(max_examples=300, deadline=None)
@given(prefix=st.sampled_from(PREFIXES), noise=st.binary(max_size=300),
       split=st.integers(min_value=0, max_value=400), close=st.booleans())
def test_any_bytes_get_a_client_error_or_an_answer_never_a_crash(prefix, noise, split, close):
    """Whatever a client sends, the connection ends with 2xx/4xx answers (or none) and
    ``run`` returns without raising or logging a failure."""
    data = prefix + noise
    limits = ServerLimits(header_timeout_s=5, body_timeout_s=5, keepalive_idle_s=5,
                          max_header_bytes=256, max_body_bytes=128)

    async def main() -> bytes:
        client_stream, server_stream = trio.testing.memory_stream_pair()
        shared = ServerShared(ok, limits, ServerCounters(), b"cortex")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(HttpConnection(server_stream, shared).run)
            await client_stream.send_all(data[:split])
            await client_stream.send_all(data[split:])
            if close:
                await client_stream.send_eof()
            received = b""
            while chunk := await client_stream.receive_some(65536):
                received += chunk
        assert shared.counters.handler_errors == 0
        assert set(shared.counters.responses_by_status) <= ANSWERS
        return received

    records: list[logging.LogRecord] = []
    catcher = logging.Handler()
    catcher.emit = records.append
    logger = logging.getLogger("cortex.front")
    logger.addHandler(catcher)
    try:
        received = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    finally:
        logger.removeHandler(catcher)
    assert not records
    for line in received.split(b"\r\n"):
        if line.startswith(b"HTTP/1.1 "):
            assert int(line.split()[1]) in ANSWERS | {100}


async def test_iterator_body_with_content_length_goes_out_with_its_head_in_one_write():
    async def chunks():
        yield b'{"ok":'
        yield b"true}"

    async def handler(request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, [(b"content-length", b"11")], chunks())

    writes: list[bytes] = []
    to_client = trio.testing.MemorySendStream()
    from_client = trio.testing.MemoryReceiveStream()

    async def record() -> None:
        writes.append(to_client.get_data_nowait())

    to_client.send_all_hook = record
    from_client.put_data(build_request(b"GET", b"/"))
    shared = ServerShared(handler, LIMITS, ServerCounters(), b"cortex")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(HttpConnection(trio.StapledStream(to_client, from_client), shared).run)
        await trio.testing.wait_all_tasks_blocked()  # answered, idle for the next request
        nursery.cancel_scope.cancel()
    assert len(writes) == 2  # head + first chunk, then the second chunk
    assert writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and writes[0].endswith(b'{"ok":')
    assert writes[1] == b"true}"


async def test_body_failing_before_its_held_head_becomes_an_error_answer():
    async def chunks():
        raise UpstreamError("worker closed before its body")
        yield b""  # pragma: no cover

    async def handler(request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, [(b"content-length", b"11")], chunks())

    client_stream, server_stream = trio.testing.memory_stream_pair()
    shared = ServerShared(handler, LIMITS, ServerCounters(), b"cortex")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(HttpConnection(server_stream, shared).run)
        client = RawClient(client_stream)
        response = await client.request(b"GET", b"/")
        assert response.status == 502
        assert response.header(b"connection") == b"close"
        assert await client.read_until_eof() == b""
    assert shared.counters.responses_by_status == {502: 1}


async def test_after_sent_runs_when_the_client_is_gone_before_the_write():
    """A whole answer's ``after_sent`` releases its upstream exchange (the gateway relies on
    it): it runs also when the write fails because the client went away."""
    seen: list[str] = []

    async def handler(request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, [], b"{}", lambda: seen.append("released"))

    to_client = trio.testing.MemorySendStream()
    from_client = trio.testing.MemoryReceiveStream()

    async def gone() -> None:
        raise trio.BrokenResourceError("the client reset the connection")

    to_client.send_all_hook = gone
    from_client.put_data(build_request(b"GET", b"/whole"))
    shared = ServerShared(handler, LIMITS, ServerCounters(), b"cortex")
    with trio.fail_after(5):
        await HttpConnection(trio.StapledStream(to_client, from_client), shared).run()
    assert seen == ["released"]
    assert shared.counters.client_gone == 1


async def test_after_sent_runs_once_the_answer_is_written_and_a_failing_one_is_counted(caplog):
    """``after_sent`` runs after the write (the client already has its answer), once per
    response, whole or streamed; one that raises is logged and counted, and the connection
    goes on serving."""
    written: list[bytes] = []
    seen: list[tuple[str, int]] = []

    async def chunks():
        yield b"streamed"

    def after(kind: str) -> None:
        seen.append((kind, len(written)))
        if kind == "fails":
            raise RuntimeError("a measurement bug")

    async def handler(request: HttpRequest) -> HttpResponse:
        kind = request.path.decode()[1:]
        body = chunks() if kind == "stream" else b"{}"
        return HttpResponse(200, [], body, lambda: after(kind))

    to_client = trio.testing.MemorySendStream()
    from_client = trio.testing.MemoryReceiveStream()

    async def record() -> None:
        written.append(to_client.get_data_nowait())

    to_client.send_all_hook = record
    for path in (b"/whole", b"/stream", b"/fails", b"/whole"):
        from_client.put_data(build_request(b"GET", path))
    shared = ServerShared(handler, LIMITS, ServerCounters(), b"cortex")
    with caplog.at_level(logging.ERROR, logger="cortex.front"):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(HttpConnection(trio.StapledStream(to_client, from_client),
                                              shared).run)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    # whole: after its one write; streamed: after its head, its chunk and its last chunk
    assert seen == [("whole", 1), ("stream", 4), ("fails", 5), ("whole", 6)]
    assert shared.counters.responses_by_status == {200: 4}
    assert shared.counters.handler_errors == 1
    assert "after_sent of GET /fails failed" in caplog.text
