"""Prefill/decode roles of a simulated engine, as the real engines behave on the wire
(protocols/pd-disaggregation.md). KV moves through ``cortex.sim.pd_transfer`` (TCP, so the
prefill and the decode engine may be separate processes).

SGLang flavor (``pd_role`` prefill or decode):

* Every generation request must carry ``bootstrap_host`` (str), ``bootstrap_port`` (int or
  null = the receiving engine's own ``bootstrap_port``) and ``bootstrap_room`` (int in
  [0, 2**63-1], or a list with one room per item; a single room ``r`` for a batch means
  ``r + i`` for item ``i``); otherwise 400. Batches (``/generate`` with several prompts) run
  each item as its own PD request (``batch_item_body``).
* prefill: runs the bootstrap listener; queues and prefills the prompt as usual (cache
  admission, KV events), offers the room's KV, then waits for the decode engine to fetch it
  (``bootstrap_timeout_s``, SGLang's default 300 s; on timeout 500) before answering with one
  token. Its batch slot is free while it waits; its cache blocks stay in use.
* decode: fetches the room from ``bootstrap_host:bootstrap_port``, waiting for it to appear up to
  ``waiting_timeout_s`` (SGLang 300 s): an unreachable or dead prefill, or a room that never
  appears, fails the request with 500 before any byte of the answer. The prompt it receives must
  be its own prompt's tokens (else 500). It then queues and streams its answer; no radix cache on
  decode (SGLang's default), so it publishes no KV events and reports ``cached_tokens`` 0.

vLLM flavor (NixlConnector, both instances ``kv_both``):

* ``kv_transfer_params.do_remote_decode: true`` (prefill leg): prefill as usual, answer one
  token with a top-level ``kv_transfer_params`` (``do_remote_prefill`` true, ``remote_engine_id``,
  ``remote_block_ids``, ``remote_request_id``, ``remote_host``/``remote_port`` = this engine's side
  channel, ...). The blocks stay pinned until decode reads them or ``kv_lease_s`` passes (vLLM's
  ``kv_lease_duration``, 30 s).
* ``kv_transfer_params.do_remote_prefill: true`` (decode leg): every key above must be there
  (400 otherwise); the blocks are read from the side channel (unknown, expired or already read:
  500); the prompt enters this engine's prefix cache (KV events, as vLLM's decode publishes the
  blocks it received) and ``cached_tokens`` counts what this engine held before.
* no ``kv_transfer_params``: an ordinary request (the engine computes the prefill itself).

Received KV costs ``uncached / transfer_tokens_per_s`` before the first token, instead of the
prefill time.

Both timing models run the roles, through ``generation`` (``SimEngine``'s docstring has the
details). The prefill leg is an ordinary request for one token asked with ``hold_kv``: this
module takes its KV hold (``gen.lease``) and gives it back (``release_kv``) once the decode
has read the KV or the lease / bootstrap wait ran out. On the fixed model (``cortex.sim.serving``)
the hold is the prompt's cache lease; on the batching model (``cortex.sim.batching``) the
finished request keeps its blocks in the model (``SimRequest.hold_kv``), counting against the
pool. The decode leg asks with ``kv_received``: on the batching model it waits the transfer,
then joins the model with its prompt's KV in place, so it never runs a prefill in a step it
shares with other requests' decodes (an aggregated engine's long prompt stretches every
running decode's inter-token gap; a decode engine's never does).

The engine is seen as a ``SimEngineView`` (``cortex.sim.engine_view``, where ``PdLeg``, what a
PD request hands the HTTP side, is defined too): the engine builds its role, so this module does
not import ``cortex.sim.engine``.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio

from cortex.errors import BadRequest, ConfigError
from cortex.ledger.kv_events import EngineFamily
from cortex.sim.engine_view import PdLeg, SimEngineView
from cortex.sim.generation import Generation, TokenStream
from cortex.sim.pd_transfer import KvTransferFailed, Offer, OfferTable, fetch, serve_offers
from cortex.sim.serving import TokenPlan

ROLES = ("prefill", "decode")
SGLANG_BOOTSTRAP_PORT = 8998
VLLM_SIDE_CHANNEL_PORT = 5600
MAX_ROOM = (1 << 63) - 1
VLLM_DECODE_KEYS = ("remote_engine_id", "remote_block_ids", "remote_request_id",
                    "remote_host", "remote_port")


@dataclass(frozen=True, slots=True)
class PdSimSettings:
    waiting_timeout_s: float = 300.0  # SGLang decode: wait for the room's KV
    bootstrap_timeout_s: float = 300.0  # SGLang prefill: wait for decode to fetch
    kv_lease_s: float = 30.0  # vLLM prefill: blocks pinned for decode this long
    transfer_tokens_per_s: float = 2_000_000.0  # received KV per second

    def __post_init__(self) -> None:
        problems = [f"{name} must be > 0" for name in (
            "waiting_timeout_s", "bootstrap_timeout_s", "kv_lease_s", "transfer_tokens_per_s")
            if not getattr(self, name) > 0]
        if problems:
            raise ConfigError(problems)


@dataclass(frozen=True, slots=True)
class SglangFields:
    host: str
    port: int | None
    room: int


def sglang_fields(body: dict[str, Any]) -> SglangFields:
    """The bootstrap fields of one single-item SGLang PD request (``BadRequest`` if unusable)."""
    host, port, room = (body.get(k) for k in ("bootstrap_host", "bootstrap_port",
                                              "bootstrap_room"))
    if isinstance(room, list):
        if len(room) != 1:
            raise BadRequest(f"bootstrap_room has {len(room)} rooms for 1 item")
        room = room[0]
    if isinstance(host, list):
        host = host[0] if len(host) == 1 else None
    if isinstance(port, list):
        port = port[0] if len(port) == 1 else "bad"
    problems = []
    if not isinstance(host, str) or not host:
        problems.append("bootstrap_host is required in disaggregation mode")
    if port is not None and (type(port) is not int or not 0 < port < 65536):
        problems.append("bootstrap_port must be a port number or null")
    if type(room) is not int or not 0 <= room <= MAX_ROOM:
        problems.append("bootstrap_room must be an integer in [0, 2**63-1]")
    if problems:
        raise BadRequest("; ".join(problems))
    return SglangFields(host, port, room)  # type: ignore[arg-type]


def batch_item_body(body: dict[str, Any], index: int, items: int) -> dict[str, Any]:
    """The body of item ``index`` of a batch of ``items``: its own bootstrap fields (a list
    gives one value per item; a single room ``r`` means ``r + index``, as SGLang expands it)."""
    item = dict(body)
    for name in ("bootstrap_host", "bootstrap_port", "bootstrap_room"):
        value = body.get(name)
        if isinstance(value, list):
            if len(value) != items:
                raise BadRequest(f"{name} has {len(value)} values for {items} items")
            item[name] = value[index]
        elif name == "bootstrap_room" and type(value) is int:
            item[name] = value + index
    return item


def vllm_params(body: dict[str, Any]) -> dict[str, Any] | None:
    """``kv_transfer_params`` of a vLLM request (None when absent or null)."""
    params = body.get("kv_transfer_params")
    if params is None:
        return None
    if not isinstance(params, dict):
        raise BadRequest("kv_transfer_params must be an object")
    return params


def vllm_decode_params(params: dict[str, Any]) -> dict[str, Any]:
    missing = [key for key in VLLM_DECODE_KEYS if params.get(key) is None]
    if missing:
        raise BadRequest(f"kv_transfer_params lacks {', '.join(missing)}")
    port = params["remote_port"]
    if type(port) is not int or not 0 < port < 65536:
        raise BadRequest("kv_transfer_params.remote_port must be a port number")
    return params


class SimPd:
    """The PD role of one ``SimEngine``: its transfer listener (prefill) and request flows."""

    def __init__(self, engine: SimEngineView, role: str, bootstrap_port: int | None,
                 settings: PdSimSettings) -> None:
        if role not in ROLES:
            raise ConfigError([f"pd_role must be one of {ROLES}, not {role!r}"])
        self.engine = engine
        self.role = role
        self.sglang = engine.family is EngineFamily.SGLANG
        default = SGLANG_BOOTSTRAP_PORT if self.sglang else VLLM_SIDE_CHANNEL_PORT
        self.bootstrap_port: int = default if bootstrap_port is None else bootstrap_port
        self.settings = settings
        self.offers = OfferTable(self._changed)
        self.engine_id = f"{engine.name}-engine"
        self.pinned = 0  # vLLM: prefill requests whose blocks wait for decode
        self.waiting = 0  # decode requests waiting for their KV
        self._ids = itertools.count(1)
        self._blocks = itertools.count(0)
        self._nursery: trio.Nursery | None = None
        self._change = trio.Event()

    @property
    def listens(self) -> bool:
        return self.role == "prefill"

    def idle(self) -> bool:
        """Nothing of a PD exchange is left on this engine."""
        return not self.offers.keys() and not self.pinned and not self.waiting

    async def wait_changed(self) -> None:
        await self._change.wait()

    def _changed(self) -> None:
        self._change.set()
        self._change = trio.Event()

    async def run(self, host: str, *, task_status: trio.TaskStatus[int | None]) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self.listens:
                self.bootstrap_port = await nursery.start(serve_offers, self.offers, host,
                                                          self.bootstrap_port)
                task_status.started(self.bootstrap_port)
            else:
                task_status.started(None)
            await trio.sleep_forever()

    # ------------------------------------------------------------------ request flows

    async def prepare(self, body: dict[str, Any], rank: int, token_ids: Sequence[int],
                      output_tokens: int, lora: str | None, salt: str | None) -> PdLeg | None:
        """Before the response head: check the PD fields, and do whatever must precede it
        (prefill: the whole prefill and hand-over; decode: getting the KV). None: not a PD
        request (vLLM without ``kv_transfer_params``)."""
        run = _Run(self.engine, rank, list(token_ids), lora, salt)
        if self.sglang:
            fields = sglang_fields(body)
            if self.role == "prefill":
                return await self._sglang_prefill(run, fields)
            return await self._sglang_decode(run, fields, output_tokens)
        params = vllm_params(body)
        if params is None:
            return None
        if params.get("do_remote_prefill"):
            return await self._vllm_decode(run, vllm_decode_params(params), output_tokens)
        if params.get("do_remote_decode"):
            if not self.listens:
                raise BadRequest("do_remote_decode on an engine without a KV side channel")
            return await self._vllm_prefill(run)
        return None

    async def _sglang_prefill(self, run: _Run, fields: SglangFields) -> PdLeg:
        key = str(fields.room)
        offer = self.offers.open(key)
        try:
            gen, lease = await run.prefill()
            try:
                self.offers.ready(key, run.token_ids, self.engine_id)
                with trio.move_on_after(self.settings.bootstrap_timeout_s):
                    await offer.fetched.wait()
                if not offer.fetched.is_set():
                    raise KvTransferFailed(f"room {fields.room}: no decode engine fetched the "
                                           f"KV within {self.settings.bootstrap_timeout_s} s")
            finally:
                run.release(lease)
        finally:
            self.offers.close(key)
        return PdLeg(_answered(gen))

    async def _sglang_decode(self, run: _Run, fields: SglangFields, output_tokens: int) -> PdLeg:
        port = fields.port if fields.port is not None else self.bootstrap_port
        received = await self._receive(fields.host, port, str(fields.room), wait=True,
                                       timeout_s=self.settings.waiting_timeout_s)
        run.check_prompt(received, f"room {fields.room}")
        return PdLeg(run.decode(output_tokens, cache_prompt=False))

    async def _vllm_prefill(self, run: _Run) -> PdLeg:
        key = f"{self.engine.name}-req-{next(self._ids)}"
        gen, lease = await run.prefill()
        blocks = -(-len(run.token_ids) // self.engine.block_size)
        first = next(self._blocks)
        for _ in range(blocks - 1):
            next(self._blocks)
        block_ids = [list(range(first, first + blocks))]
        self.pinned += 1
        try:
            offer = self.offers.open(key)
            self.offers.ready(key, run.token_ids, self.engine_id, block_ids)
            assert self._nursery is not None
            self._nursery.start_soon(self._pin, key, offer, run, lease)
        except BaseException:
            self.pinned -= 1
            self.offers.close(key)
            run.release(lease)
            raise
        params = {
            "do_remote_prefill": True, "do_remote_decode": False,
            "remote_block_ids": block_ids, "remote_engine_id": self.engine_id,
            "remote_request_id": key, "remote_host": self.engine.http_host,
            "remote_port": self.bootstrap_port, "tp_size": 1,
            "remote_num_tokens": len(run.token_ids),
        }
        return PdLeg(_answered(gen), {"kv_transfer_params": params})

    async def _pin(self, key: str, offer: Offer, run: _Run, lease: int | None) -> None:
        """Keep the blocks pinned until decode read them or the lease ran out."""
        try:
            with trio.move_on_after(self.settings.kv_lease_s):
                await offer.fetched.wait()
        finally:
            self.offers.close(key)
            run.release(lease)
            self.pinned -= 1
            self._changed()

    async def _vllm_decode(self, run: _Run, params: dict[str, Any], output_tokens: int) -> PdLeg:
        received = await self._receive(
            str(params["remote_host"]), params["remote_port"], str(params["remote_request_id"]),
            wait=False, timeout_s=self.settings.waiting_timeout_s,
            engine_id=str(params["remote_engine_id"]), block_ids=params["remote_block_ids"])
        run.check_prompt(received, f"request {params['remote_request_id']}")
        return PdLeg(run.decode(output_tokens, cache_prompt=True))

    async def _receive(self, host: str, port: int, key: str, *, wait: bool, timeout_s: float,
                       engine_id: str | None = None, block_ids: Any = None) -> list[int]:
        self.waiting += 1
        self._changed()
        try:
            with trio.move_on_after(timeout_s):
                return await fetch(host, port, key, wait=wait, engine_id=engine_id,
                                   block_ids=block_ids)
            raise KvTransferFailed(f"transfer {key}: no KV from {host}:{port} within "
                                   f"{timeout_s} s")
        finally:
            self.waiting -= 1
            self._changed()


@dataclass(slots=True)
class _Run:
    """One request on the engine: its rank, prompt and cache options."""

    engine: SimEngineView
    rank: int
    token_ids: list[int]
    lora: str | None
    salt: str | None

    async def prefill(self) -> tuple[TokenStream, int | None]:
        """Queue, admit and prefill; the first token is made; the KV hold is kept (the KV
        must stay until it is handed over) and the batch slot is freed."""
        async with self.engine.generation(self.rank, self.token_ids, 1, lora_name=self.lora,
                                          cache_salt=self.salt, hold_kv=True) as gen:
            async for _ in gen:
                pass
            lease, gen.lease = gen.lease, None
        return gen, lease

    def release(self, lease: int | None) -> None:
        if lease is not None:
            self.engine.release_kv(self.rank, lease)

    def check_prompt(self, received: list[int], what: str) -> None:
        if received != self.token_ids:
            raise KvTransferFailed(f"{what}: the KV received is for another prompt "
                                   f"({len(received)} tokens, this request has "
                                   f"{len(self.token_ids)})")

    def decode(self, output_tokens: int, *, cache_prompt: bool) -> (
            AbstractAsyncContextManager[TokenStream]):
        return self.engine.generation(self.rank, self.token_ids, output_tokens,
                                      lora_name=self.lora, cache_salt=self.salt,
                                      kv_received=True, cache_prompt=cache_prompt)


def _answered(gen: TokenStream) -> AbstractAsyncContextManager[Generation]:
    """The prefill's one token, already made: served at once."""

    @asynccontextmanager
    async def done() -> AsyncIterator[Generation]:
        yield Generation(gen.request_id, gen.rank, gen.prompt_tokens, gen.cached_tokens,
                          TokenPlan(trio.current_time(), 0.0, 0.0, 1))

    return done()

