"""Cortex in front of real vLLM or SGLang servers, configured as an operator would: the model
directory the engines load as ``tokenizer`` (no ``bos_token``, no ``chat_template``: Cortex reads
them from it, as the engines do), ``block_size`` 32 (vLLM's page; SGLang's one-token pages are
folded into the ``block_size`` given), each server's KV-event and replay endpoints.

``async with cortex_front(servers, model) as front`` starts ``run_gateway`` and returns once
every worker is live and every ledger READY. ``front.send`` posts through Cortex and returns
what both sides said: Cortex's prediction and pick (headers) and the engine's
``cached_tokens`` (its usage, streamed or not; SGLang ``/generate``'s ``meta_info``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import trio

from cortex.app import Running, run_gateway
from cortex.config.tree import ControlConfig, CortexConfig, HealthConfig, ModelConfig, ServerConfig
from cortex.dispatch.endpoints import ENDPOINTS, request_prompt
from cortex.profile.request_keys import prompt_token_ids
from cortex.workers.spec import WorkerSpec
from tests.front_http_client import RawClient
from tests.gateway_cluster import all_ready, wait_for
from tests.real_engine.engine_server import EngineProcess

BLOCK = 32


@dataclass(frozen=True)
class Sent:
    """One request through Cortex: what Cortex decided and what the engine reported."""

    status: int
    worker: str | None
    mode: str | None
    predicted: int | None
    reported: int | None
    prompt_tokens: int | None
    body: bytes

    @property
    def exact(self) -> bool:
        return self.predicted is not None and self.predicted == self.reported


@dataclass
class Front:
    running: Running
    model: str
    servers: Sequence[EngineProcess]

    @property
    def port(self) -> int:
        return self.running.data_port

    @property
    def pool(self):
        return self.running.pools[self.model]

    async def send(self, path: str, body: dict[str, Any], *, stream: bool = False) -> Sent:
        body = {"model": self.model, **body}
        if stream:
            body["stream"] = True
            if path != "/generate":  # SGLang's native API reports usage in every chunk
                body["stream_options"] = {"include_usage": True}
        client = await RawClient.connect(self.port)
        try:
            response = await client.request(b"POST", path.encode(), json.dumps(body).encode(),
                                            [(b"content-type", b"application/json")])
        finally:
            await client.aclose()
        usage = _usage(response.body, stream) if response.status == 200 else None
        if path == "/generate" and response.status == 200:  # SGLang's native API
            usage = _generate_usage(response.body, stream)

        def header(name: bytes) -> str | None:
            value = response.header(name)
            return None if value is None else value.decode()

        predicted = header(b"x-cortex-cache-hit-tokens")
        details = (usage or {}).get("prompt_tokens_details") or {}
        # SGLang leaves prompt_tokens_details null when nothing was cached
        reported = details.get("cached_tokens", 0 if usage is not None else None)
        return Sent(response.status, header(b"x-cortex-assigned-worker"),
                    header(b"x-cortex-match-mode"),
                    None if predicted is None else int(predicted), reported,
                    (usage or {}).get("prompt_tokens"), response.body)

    async def open_stream(self, path: str, body: dict[str, Any]) -> tuple[RawClient, str]:
        """Send a streamed request through Cortex and read its head and first chunk: the open
        client (to read on or to drop) and the worker Cortex picked."""
        raw = json.dumps(body).encode()
        client = await RawClient.connect(self.port)
        await client.send(b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                          b"content-length: %d\r\n\r\n%s" % (path.encode(), len(raw), raw))
        status, headers, _ = await client.read_head()
        assert status == 200
        await client.read_chunk()
        return client, dict(headers)[b"x-cortex-assigned-worker"].decode()

    def prompt_ids(self, path: str, body: dict[str, Any]) -> list[int]:
        """The prompt's token ids as Cortex computes them (template, segment cache)."""
        pool = self.pool
        prompt = request_prompt(ENDPOINTS[path.encode()], {"model": self.model, **body},
                                pool.profile.chat_templates, pool.chat_engine)
        assert prompt is not None
        return prompt_token_ids(prompt, pool.tokenizer).tolist()

    def held(self, path: str, body: dict[str, Any]) -> dict[str, int]:
        """Worker -> blocks of this request's prompt the ledger credits it with."""
        pool = self.pool
        prompt = request_prompt(ENDPOINTS[path.encode()], {"model": self.model, **body},
                                pool.profile.chat_templates, pool.chat_engine)
        assert prompt is not None
        return pool.holders(prompt_token_ids(prompt, pool.tokenizer), prompt)

    async def until(self, condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
        await wait_for(self.running, condition, timeout_s)

    async def settled(self, path: str, body: dict[str, Any], worker: str,
                      timeout_s: float = 10.0) -> bool:
        """Wait until the engine's events for this prompt reached the ledger: ``worker`` is
        credited with every block it could serve next time. ``False`` after ``timeout_s``
        (a block evicted at once never shows)."""
        want = (len(self.prompt_ids(path, body)) - 1) // self.pool.profile.block_size
        with trio.move_on_after(timeout_s):
            await self.until(lambda: self.held(path, body).get(worker, 0) >= want, timeout_s)
            return True
        return False


def _generate_usage(raw: bytes, stream: bool) -> dict[str, Any] | None:
    """SGLang ``/generate``'s ``meta_info`` (the last chunk's when streamed) as a usage."""
    meta = None
    if not stream:
        meta = json.loads(raw).get("meta_info")
    else:
        for line in raw.split(b"\n"):
            if line.startswith(b"data: {"):
                meta = json.loads(line[6:]).get("meta_info") or meta
    if meta is None:
        return None
    return {"prompt_tokens": meta.get("prompt_tokens"),
            "prompt_tokens_details": {"cached_tokens": meta.get("cached_tokens")}}


def _usage(raw: bytes, stream: bool) -> dict[str, Any] | None:
    if not stream:
        return json.loads(raw).get("usage")
    usage = None
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {"):
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
    return usage


def worker_spec(server: EngineProcess, model: str) -> WorkerSpec:
    return WorkerSpec(server.name, server.url, engine=server.engine, model=model,
                      events=server.events, replay=server.replay)


def front_config(servers: Sequence[EngineProcess], model: str, model_dir: str,
                 block_size: int = BLOCK, **changes: Any) -> CortexConfig:
    config = CortexConfig(
        server=ServerConfig(host="127.0.0.1", port=0),
        control=ControlConfig(host="127.0.0.1", port=0, admin_token="test-token"),
        models=(ModelConfig(name=model, tokenizer=model_dir, block_size=block_size),),
        workers=tuple(worker_spec(server, model) for server in servers),
        health=HealthConfig(interval_s=0.5, timeout_s=5.0, load_interval_s=0.5))
    return replace(config, **changes)


@asynccontextmanager
async def cortex_front(servers: Sequence[EngineProcess], model: str, model_dir: str,
                       ready: bool = True, block_size: int = BLOCK,
                       **changes: Any) -> AsyncIterator[Front]:
    async with trio.open_nursery() as nursery:
        running = await nursery.start(
            run_gateway, front_config(servers, model, model_dir, block_size, **changes))
        front = Front(running, model, servers)
        if ready:
            await front.until(lambda: all_ready(running), 60.0)
        yield front
        nursery.cancel_scope.cancel()
