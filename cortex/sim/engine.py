"""``SimEngine``: one simulated vLLM or SGLang engine, KV-event side and HTTP side as one unit.

Lifecycle: construct, then ``url = await nursery.start(engine.run)``: the KV side
(``SimKVEngine``: prefix cache or batching model, and ZeroMQ publishers per DP rank) starts
first, then the batching model's steppers (one per rank, none on the fixed model), then the
lean HTTP server (``cortex.front.server.HttpServer``) serving ``engine.handler``; the started
value is the base URL (``http://host:port``), also ``engine.url``. Cancelling the nursery stops
them all.

Two timing models (``engine_model``), one ``generation`` contract:

``"fixed"`` (the default of in-process engines; ``cortex.sim.serving``), one generation request
(``engine.generation(...)``, an async context manager):

1. it joins its rank's FIFO queue (``serving.RankQueue``) and waits for a slot in the batch;
2. once started, its prompt is admitted into the rank's prefix cache with ``hold=True`` (one
   scheduler step: the KV events go out), which gives ``cached_tokens``;
3. its tokens come out on the ``serving.plan`` timetable (trio's clock): prefill of the
   uncached tokens, then one decode step per token; running requests never slow each other;
4. on exit — finished, failed, or cancelled because the client went away — the cache hold is
   released and the request leaves the queue or batch, which starts the next waiting request.

``"batching"`` (a continuous-batching model per rank, ``cortex.sim.batching``, run by the rank's
``cortex.sim.stepper.RankStepper`` on trio's clock; settings ``BatchingSettings``):

1. after the step profile's ``request_s`` (the real engine's API server works on a request
   before its scheduler sees it), the request is added to its rank's model (400 when it could
   never fit the KV pool) and waits until a step schedules it, which gives ``cached_tokens``;
2. each token is ready at the end of the step that produced it (steps are shared by every
   running request: a long prefill delays the others' tokens, a full pool preempts), and each
   step's KV events go out at its end;
3. on exit before the last token (the client went away, or a failure) the request is aborted
   in the model: its blocks are freed. A rank restart fails its requests (502).

PD roles (``cortex.sim.pd``) run on either model, through the same ``generation``:

* ``hold_kv`` (the prefill leg): the caller takes ``gen.lease`` to keep the prompt's KV past
  the request and gives it back with ``release_kv`` (fixed: the prompt's cache hold; batching:
  the request, held in the model by ``SimRequest.hold_kv``, its blocks counting against the
  pool until then);
* ``kv_received`` (the decode leg): the uncached prompt tokens arrive at
  ``transfer_tokens_per_s`` instead of being computed. Fixed: the transfer replaces the prefill
  time in the request's timetable. Batching: the request waits for the transfer first
  (``uncached`` = what the rank's cache does not hold then, ``BatchingEngine.local_hit``; on
  the engine's clock; counted as waiting in ``load``), then joins the model as
  ``SimRequest.kv_received``: blocks for its whole prompt, no prefill, its first token from its
  first decode step, so it shares steps with the running decodes but never slows them with a
  prefill (what disaggregation buys). What the received prompt does to the cache is the
  flavour's (vLLM caches it, SGLang's decode keeps no radix cache), as ``cache_prompt`` says on
  the fixed model.

Output text is deterministic: token ``i`` is ``OUTPUT_WORDS[i % len(OUTPUT_WORDS)]``
(``cortex.sim.generation``).

Faults (``SimFaults``, ``cortex.sim.http_faults``; mutable at runtime through
``engine.faults.update`` or ``POST /sim/faults``) are read by the HTTP side for every generation
request; see ``cortex.sim.http_engine``.

The engine's parts (``http_engine``, ``bodies``, ``pd``) see it as a ``SimEngineView``
(``cortex.sim.engine_view``) and do not import this module; ``SimEngine`` must keep offering
every member that protocol lists.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import trio

from cortex.errors import BadRequest, ConfigError
from cortex.front.limits import ServerLimits
from cortex.host_literal import host_port
from cortex.ledger.kv_events import EngineFamily
from cortex.profile.model_profile import ModelProfile
from cortex.sim.batching.core import SimRequest
from cortex.sim.batching.factory import BatchingSettings, RankModels, rank_models
from cortex.sim.engine_view import RankLoad
from cortex.sim.generation import Generation, RankCounters, SteppedGeneration, TokenStream
from cortex.sim.http_engine import SimHttpHandler
from cortex.sim.http_faults import SimFaults
from cortex.sim.kv_engine import SimEndpointConfig, SimHashConfig, SimKVEngine
from cortex.sim.pd import PdSimSettings, SimPd
from cortex.sim.serving import RankQueue, TimingConfig, TokenPlan, plan
from cortex.sim.stepper import RankStepper
from cortex.sim.tokenize import SimTokenizer
from cortex.sim.wire import WireProfile, profile_named

ENGINE_MODELS = ("fixed", "batching")


class SimEngine:
    """A simulated engine: ``dp_size`` ranks, each with its prefix cache, queue and publisher."""

    def __init__(
        self,
        name: str,
        profile: str | WireProfile,
        model_profile: ModelProfile | None,
        *,
        dp_size: int = 1,
        block_size: int = 16,
        capacity_blocks: int = 4096,
        timing: TimingConfig = TimingConfig(),
        http_host: str = "127.0.0.1",
        http_port: int = 0,
        served_model_name: str | None = None,
        faults: SimFaults | None = None,
        kv_endpoints: SimEndpointConfig = SimEndpointConfig(),
        hashing: SimHashConfig = SimHashConfig(),
        # uvicorn (vLLM, SGLang) takes a client's end of stream for a disconnect: so does the
        # simulator, so an aborted upstream exchange (Cortex closing it) cancels the request
        limits: ServerLimits = ServerLimits(eof_is_gone=True),
        topic: str = "",
        rng: random.Random | None = None,
        max_model_len: int = 131_072,
        pd_role: str | None = None,
        bootstrap_port: int | None = None,
        pd_settings: PdSimSettings = PdSimSettings(),
        engine_model: str = "fixed",
        batching: BatchingSettings = BatchingSettings(),
    ) -> None:
        self.name = name
        # the process start time a real engine exposes (vLLM: process_start_time_seconds)
        self.started_at = time.time()
        self.wire = profile_named(profile)
        self.family: EngineFamily = self.wire.family
        self.model_profile = model_profile
        if served_model_name is None:
            served_model_name = model_profile.model if model_profile is not None else name
        self.served_model_name = served_model_name
        self.timing = timing
        self.max_model_len = max_model_len
        self.http_host = http_host
        self.http_port = http_port
        self.limits = limits
        self.faults = faults if faults is not None else SimFaults()
        self.engine_model = engine_model
        self.batching = batching
        models: RankModels | None = None
        if engine_model == "batching":
            models = rank_models(self.family, batching, capacity_blocks=capacity_blocks,
                                 block_size=block_size)
        elif engine_model != "fixed":
            raise ConfigError([(f"engine_model must be one of {ENGINE_MODELS}, "
                               f"not {engine_model!r}")])
        self.kv = SimKVEngine(
            self.wire,
            block_size=block_size,
            capacity_blocks=capacity_blocks,
            dp_size=dp_size,
            topic=topic,
            endpoints=kv_endpoints,
            hashing=hashing,
            rng=rng,
            batching=None if models is None else models.make,
        )
        self.tokenizer = SimTokenizer(model_profile, self.wire.family)
        self.queues = [RankQueue(timing.max_running) for _ in range(dp_size)]
        self.counters = [RankCounters() for _ in range(dp_size)]
        # the batching model's shells, one per rank; empty on the fixed model
        self.steppers = [RankStepper(self.kv, rank, self.counters[rank],
                                     speedup=batching.speedup)
                         for rank in range(dp_size)] if models is not None else []
        self._batch_limit = timing.max_running if models is None else models.max_running
        self.running: list[dict[int, Generation]] = [{} for _ in range(dp_size)]
        self._receiving = [0] * dp_size  # batching: PD decode requests waiting for their KV
        self.lora_names = frozenset(a.name for a in hashing.lora_adapters)
        self.url: str | None = None
        self._ids = itertools.count(1)
        self._start_signals: dict[int, trio.Event] = {}
        # prefill/decode role (cortex.sim.pd); None: an ordinary (aggregated) engine
        self.pd = None if pd_role is None else SimPd(self, pd_role, bootstrap_port, pd_settings)
        self.handler = SimHttpHandler(self)

    @property
    def dp_size(self) -> int:
        return self.kv.dp_size

    @property
    def block_size(self) -> int:
        return self.kv.block_size

    @property
    def version(self) -> str:
        return ".".join(str(part) for part in self.wire.version)

    # ------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the KV side, then the HTTP server; report the base URL; serve until cancelled."""
        from cortex.front.server import HttpServer  # lazily: only a served engine needs it

        server = HttpServer(self.handler, self.limits, server_header=b"cortex-sim")
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.kv.run)
                for stepper in self.steppers:
                    await nursery.start(stepper.run)
                if self.pd is not None:
                    await nursery.start(self.pd.run, self.http_host)
                host, port = await nursery.start(server.serve, self.http_host, self.http_port)
                self.url = f"http://{host_port(host, port)}"
                task_status.started(self.url)
        finally:
            self.url = None

    # ------------------------------------------------------------ requests

    def check_rank(self, rank: int) -> int:
        if not 0 <= rank < self.dp_size:
            raise BadRequest(f"data parallel rank {rank} is out of range [0, {self.dp_size})")
        return rank

    @asynccontextmanager
    async def generation(
        self,
        rank: int,
        token_ids: Sequence[int],
        output_tokens: int,
        *,
        lora_name: str | None = None,
        cache_salt: str | None = None,
        kv_received: bool = False,
        cache_prompt: bool = True,
        read_limit: int | None = None,
        hold_kv: bool = False,
    ) -> AsyncIterator[TokenStream]:
        """Queue, admit and run one request on ``rank`` (see the module docstring).

        PD (``cortex.sim.pd``): with ``hold_kv`` the caller may take ``gen.lease`` and keep the
        prompt's KV past the request (``release_kv`` gives it back); with ``kv_received`` the
        uncached tokens arrive from the prefill peer (transfer time instead of prefill time);
        without ``cache_prompt`` (fixed model; on the batching model the flavour decides for a
        received prompt) the prompt does not enter the prefix cache (no events, nothing
        cached). ``read_limit``: prompt tokens the request may read from the cache
        (``tokenize.cache_read_limit``)."""
        self.check_rank(rank)
        if self.steppers:
            if not (cache_prompt or kv_received):
                raise ConfigError(["the batching model caches every prompt it computes"])
            async with self._stepped(rank, token_ids, output_tokens, lora_name=lora_name,
                                     cache_salt=cache_salt, read_limit=read_limit,
                                     hold_kv=hold_kv, kv_received=kv_received) as gen:
                yield gen
            return
        queue, counters = self.queues[rank], self.counters[rank]
        request_id = next(self._ids)
        started = self._start_signals[request_id] = trio.Event()
        gen: Generation | None = None
        finished = False
        try:
            self._signal(queue.arrive(request_id))
            await started.wait()
            cached, lease = 0, None
            if cache_prompt:
                result = self.kv.submit(rank, token_ids, lora_name=lora_name,
                                        cache_salt=cache_salt, hold=True, read_limit=read_limit)
                cached, lease = result.cached_tokens, result.lease
            counters.requests += 1
            counters.prompt_tokens += len(token_ids)
            counters.cached_tokens += cached
            uncached = len(token_ids) - cached
            now = trio.current_time()
            if kv_received and self.pd is not None:
                tokens = TokenPlan(now, uncached / self.pd.settings.transfer_tokens_per_s,
                                   self.timing.decode_s_per_token, output_tokens)
            else:
                tokens = plan(self.timing, now, uncached, output_tokens)
            gen = Generation(request_id, rank, len(token_ids), cached, tokens, lease=lease,
                             _counters=counters)
            self.running[rank][request_id] = gen
            yield gen
            finished = True
        finally:
            self.running[rank].pop(request_id, None)
            if not finished:
                counters.aborted += 1
            if gen is not None and gen.lease is not None:
                self.kv.release(rank, gen.lease)
                gen.lease = None
            self._signal(queue.leave(request_id))
            del self._start_signals[request_id]

    @asynccontextmanager
    async def _stepped(self, rank: int, token_ids: Sequence[int], output_tokens: int, *,
                       lora_name: str | None, cache_salt: str | None, read_limit: int | None,
                       hold_kv: bool, kv_received: bool) -> AsyncIterator[SteppedGeneration]:
        """One request on the rank's batching model (see the module docstring)."""
        stepper, counters = self.steppers[rank], self.counters[rank]
        request = SimRequest(next(self._ids), tuple(token_ids), output_tokens,
                             lora_name=lora_name, cache_salt=cache_salt, read_limit=read_limit,
                             hold_kv=hold_kv, kv_received=kv_received)
        front_s = self.batching.step_profile.request_s  # the API server's own time per request
        if front_s > 0:
            await trio.sleep(front_s / self.batching.speedup)
        if kv_received:
            await self._receive_kv(rank, request)
        try:
            progress = stepper.add(request)
        except ValueError as exc:  # longer than the KV pool holds: vLLM refuses it (400)
            raise BadRequest(str(exc)) from None
        gen: SteppedGeneration | None = None
        try:
            cached = await progress.wait_scheduled()
            counters.requests += 1
            counters.prompt_tokens += len(token_ids)
            counters.cached_tokens += cached
            gen = SteppedGeneration(request.request_id, rank, len(token_ids), cached,
                                    output_tokens, progress, _counters=counters,
                                    lease=request.request_id if hold_kv else None)
            yield gen
        finally:
            if not progress.finished:
                stepper.abort(request.request_id)
                counters.aborted += 1
            elif hold_kv and (gen is None or gen.lease is not None):  # held, nobody took it
                stepper.release(request.request_id)

    async def _receive_kv(self, rank: int, request: SimRequest) -> None:
        """A PD decode request's KV transfer, before it joins the rank's model: the prompt
        tokens the rank's cache does not hold now, at ``transfer_tokens_per_s`` of the
        engine's clock."""
        settings = self.pd.settings if self.pd is not None else PdSimSettings()
        uncached = len(request.tokens) - self.steppers[rank].model.local_hit(request)
        self._receiving[rank] += 1
        try:
            await trio.sleep(uncached / settings.transfer_tokens_per_s / self.batching.speedup)
        finally:
            self._receiving[rank] -= 1

    def release_kv(self, rank: int, lease: int) -> None:
        """Give back the KV hold taken from a generation (``TokenStream.lease``)."""
        if self.steppers:
            self.steppers[rank].release(lease)
        else:
            self.kv.release(rank, lease)

    def _signal(self, started: list[int]) -> None:
        for request_id in started:
            self._start_signals[request_id].set()

    def active_tokens(self, rank: int) -> int:
        """Fixed model: KV tokens the rank's running requests use (prompt + output so far;
        shared prefixes counted per request): the load the engines report, unlike the cache
        fill, which also counts evictable blocks."""
        return sum(g.prompt_tokens + g.produced for g in self.running[rank].values())

    def load(self, rank: int) -> RankLoad:
        """The rank's load now: the batching model's own figures, or (fixed model) its queue
        and the tokens of its running requests."""
        if self.steppers:
            model = self.steppers[rank].model
            return RankLoad(model.running, model.waiting + self._receiving[rank],
                            model.kv_usage, self._batch_limit)
        queue = self.queues[rank]
        total = self.kv.capacity_blocks * self.block_size
        usage = min(self.active_tokens(rank) / total, 1.0) if total else 0.0
        return RankLoad(queue.running, queue.waiting, usage, self._batch_limit)

    def busy(self) -> bool:
        return any(load.running or load.waiting
                   for load in map(self.load, range(self.dp_size)))

    def flush_cache(self) -> bool:
        """Clear every rank's cache (AllBlocksCleared), or refuse while requests run or wait."""
        if self.busy():
            return False
        cleared = [self.kv.clear(rank) for rank in range(self.dp_size)]
        return all(cleared)
