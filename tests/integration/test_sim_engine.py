"""A simulated engine over real sockets: HTTP on the lean server, KV events on ZeroMQ.

Engines start with ``nursery.start(engine.run)`` (the started value is the URL); a ZeroMQ
subscriber is known to be connected once the publisher saw its subscription. Waiting for the
engine to notice a client's disconnect polls its state under a generous deadline.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import h11
import openai
import pytest
import trio
import zmq

from cortex.events import zmq_trio
from cortex.events.decoder import decode_payload
from cortex.events.frames import parse_live_frames
from cortex.ledger.kv_events import BlockStored, EngineFamily
from cortex.sim.engine import SimEngine
from cortex.sim.serving import TimingConfig
from tests import deepseek_profile as ds
from tests.sim_engine_profile import SYSTEM, chat, deepseek

FAST = TimingConfig(prefill_tokens_per_s=1e6, decode_s_per_token=0.0)
SLOW_DECODE = TimingConfig(prefill_tokens_per_s=1e6, decode_s_per_token=0.05)


@asynccontextmanager
async def running(flavor: str = "vllm-0.33", **kwargs: Any) -> AsyncIterator[SimEngine]:
    kwargs.setdefault("timing", FAST)
    engine = SimEngine("e1", flavor, deepseek(), **kwargs)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(engine.run)
            assert url == engine.url
            yield engine
            nursery.cancel_scope.cancel()


class Client:
    """One HTTP/1.1 connection (h11) to an engine."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, url: str) -> Client:
        parts = urlsplit(url)
        assert parts.hostname and parts.port
        return cls(await trio.open_tcp_stream(parts.hostname, parts.port))

    async def send(self, method: str, path: str, body: object = None,
                   headers: list[tuple[str, str]] | None = None) -> h11.Response:
        await self.send_request(method, path, body, headers)
        event = await self._next()
        assert isinstance(event, h11.Response)
        return event

    async def send_request(self, method: str, path: str, body: object = None,
                           headers: list[tuple[str, str]] | None = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        head = [("host", "sim"), ("content-length", str(len(data))), *(headers or [])]
        if body is not None:
            head.append(("content-type", "application/json"))
        await self.stream.send_all(self.conn.send(h11.Request(method=method, target=path,
                                                              headers=head)))
        await self.stream.send_all(self.conn.send(h11.Data(data=data)) or b"")
        await self.stream.send_all(self.conn.send(h11.EndOfMessage()))

    async def _next(self) -> h11.Event:
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(await self.stream.receive_some(65536))
                continue
            return event

    async def next_chunk(self) -> bytes | None:
        """The next body chunk, or None at the end of the response."""
        event = await self._next()
        if isinstance(event, h11.EndOfMessage):
            return None
        assert isinstance(event, h11.Data)
        return bytes(event.data)

    async def body(self) -> bytes:
        chunks = []
        while (chunk := await self.next_chunk()) is not None:
            chunks.append(chunk)
        return b"".join(chunks)

    async def aclose(self) -> None:
        await self.stream.aclose()


async def call(url: str, method: str, path: str, body: object = None,
               headers: list[tuple[str, str]] | None = None) -> tuple[int, bytes]:
    client = await Client.open(url)
    try:
        response = await client.send(method, path, body, headers)
        return response.status_code, await client.body()
    finally:
        await client.aclose()


def sse_data(raw: bytes) -> list[Any]:
    events = [e for e in raw.split(b"\n\n") if e]
    assert all(e.startswith(b"data: ") for e in events)
    return ["[DONE]" if e == b"data: [DONE]" else json.loads(e[6:]) for e in events]


# ---------------------------------------------------------------- HTTP over sockets


async def test_routes_answer_over_real_sockets():
    async with running("sglang-0.5.23") as engine:
        assert engine.url is not None
        health = await call(engine.url, "GET", "/health")
        models = await call(engine.url, "GET", "/v1/models")
        info = await call(engine.url, "GET", "/server_info")
        missing = await call(engine.url, "GET", "/nope")
    assert health == (200, b"")
    assert json.loads(models[1])["data"][0]["id"] == "deepseek"
    assert json.loads(info[1])["kv_events"]["endpoint_port_base"] == engine.kv.base_port
    assert missing[0] == 404
    assert "error" in json.loads(missing[1])


async def test_repeated_chat_hits_the_cache_and_the_blocks_go_out_as_kv_events():
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.linger = 0
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    try:
        async with running() as engine:
            assert engine.url is not None
            sub.connect(engine.kv.endpoints(0).pub)
            await engine.kv.publisher(0).wait_subscribed()
            first = await call(engine.url, "POST", "/v1/chat/completions", chat(max_tokens=2))
            again = await call(engine.url, "POST", "/v1/chat/completions", chat(max_tokens=2))
            frames = await zmq_trio.recv_multipart(sub)
    finally:
        sub.close(linger=0)
    assert first[0] == again[0] == 200
    prompt = ds.tokenizer().encode(
        ds.BOS + SYSTEM + "<｜User｜>What is 2+2?<｜Assistant｜>", add_special_tokens=False).ids
    full = len(prompt) // 16 * 16
    assert json.loads(first[1])["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = json.loads(again[1])["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == (len(prompt) - 1) // 16 * 16 > 0
    batch = decode_payload(parse_live_frames(frames).payload, EngineFamily.VLLM)
    (stored,) = batch.events
    assert isinstance(stored, BlockStored)
    assert list(stored.token_ids) == prompt[:full]  # the engine's own full encode
    assert len(stored.block_hashes) == full // 16


async def test_streaming_over_sockets_ends_with_done():
    async with running() as engine:
        assert engine.url is not None
        status, raw = await call(engine.url, "POST", "/v1/completions", {
            "prompt": list(range(64)), "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}})
    events = sse_data(raw)
    assert status == 200
    assert [e["choices"][0]["text"] for e in events[:4]] == [" The", " quick", " brown", " fox"]
    assert events[4]["usage"]["completion_tokens"] == 4
    assert events[5] == "[DONE]"


async def test_vllm_rank_header_over_sockets():
    async with running(dp_size=2) as engine:
        assert engine.url is not None
        status, _ = await call(engine.url, "POST", "/v1/completions",
                               {"prompt": list(range(40)), "max_tokens": 1},
                               [("X-data-parallel-rank", "1")])
        assert status == 200
        assert engine.kv.truth(0) == set() and engine.kv.truth(1)


# ---------------------------------------------------------------- disconnects and faults


async def until(predicate: Any, timeout_s: float = 20.0) -> None:
    with trio.fail_after(timeout_s):
        while not predicate():
            await trio.sleep(0.005)


@pytest.mark.parametrize("stream", [False, True])
async def test_client_disconnect_aborts_the_request(stream):
    async with running(timing=SLOW_DECODE) as engine:
        assert engine.url is not None
        client = await Client.open(engine.url)
        body = {"prompt": list(range(40)), "max_tokens": 10_000, "stream": stream}
        if not stream:  # no answer until done: send and go away
            await client.send_request("POST", "/v1/completions", body)
        else:
            response = await client.send("POST", "/v1/completions", body)
            assert response.status_code == 200
            chunk = await client.next_chunk()
            assert chunk is not None and chunk.startswith(b"data: ")
        await until(lambda: engine.queues[0].running == 1)
        await client.aclose()
        await until(lambda: engine.queues[0].running == 0)
        assert engine.counters[0].aborted == 1
        assert engine.counters[0].generation_tokens < 10_000


async def test_die_after_chunks_breaks_the_connection_mid_stream():
    async with running() as engine:
        assert engine.url is not None
        engine.faults.die_after_chunks = 2
        client = await Client.open(engine.url)
        try:
            response = await client.send("POST", "/v1/completions", {
                "prompt": list(range(40)), "max_tokens": 8, "stream": True})
            assert response.status_code == 200
            received = []
            with pytest.raises(h11.RemoteProtocolError):  # closed before the final chunk
                while (chunk := await client.next_chunk()) is not None:
                    received.append(chunk)
        finally:
            await client.aclose()
        assert len(sse_data(b"".join(received))) == 2
        await until(lambda: engine.queues[0].running == 0)


async def test_fault_switches_over_http():
    async with running() as engine:
        assert engine.url is not None
        status, body = await call(engine.url, "POST", "/sim/faults", {"fail_status": 500})
        failed = await call(engine.url, "POST", "/v1/completions", {"prompt": [1, 2]})
        bad = await call(engine.url, "POST", "/sim/faults", {"hang": "yes"})
        await call(engine.url, "POST", "/sim/faults", {"fail_status": None, "unhealthy": True})
        health = await call(engine.url, "GET", "/health")
    assert status == 200 and json.loads(body)["fail_status"] == 500
    assert failed[0] == 500
    assert bad[0] == 400
    assert health[0] == 503


# ---------------------------------------------------------------- the official client


def _openai_calls(base_url: str) -> dict[str, Any]:
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="none", max_retries=0)
    messages = [{"role": "user", "content": "Say hello."}]
    out: dict[str, Any] = {}
    out["chat"] = client.chat.completions.create(model="deepseek", messages=messages,
                                                 max_tokens=3)
    out["chat_stream"] = list(client.chat.completions.create(
        model="deepseek", messages=messages, max_tokens=3, stream=True,
        stream_options={"include_usage": True}))
    out["completion"] = client.completions.create(model="deepseek", prompt="Hi", max_tokens=2)
    out["completion_stream"] = list(client.completions.create(
        model="deepseek", prompt="Hi", max_tokens=2, stream=True))
    client.close()
    return out


async def test_the_openai_client_works_against_the_engine():
    async with running() as engine:
        assert engine.url is not None
        out = await trio.to_thread.run_sync(_openai_calls, engine.url)
    assert out["chat"].choices[0].message.content == " The quick brown"
    assert out["chat"].usage.prompt_tokens_details.cached_tokens == 0
    chunks = out["chat_stream"]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        " The quick brown"
    assert chunks[-1].usage.completion_tokens == 3
    assert out["completion"].choices[0].text == " The quick"
    assert "".join(c.choices[0].text for c in out["completion_stream"]) == " The quick"
