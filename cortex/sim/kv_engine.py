"""A GPU-free engine on the KV-event wire: prefix caches per DP rank feeding real publishers.

``SimKVEngine`` ties the pure parts (engine hashes, prefix cache, wire profile) to one
``EventPublisher`` per DP rank. One ``submit`` is one scheduler step: the request is admitted
into that rank's cache and the step's events, if any, go out as one batch (``ts`` =
``clock()``, ``time.time()`` by default like the engines). An HTTP front can drive it by calling
``submit`` (``hold=True`` keeps the request's blocks in use until ``release``).

With a ``batching`` factory every rank holds a continuous-batching model
(``cortex.sim.batching``, one per rank, made from the rank's block hasher) instead of a
one-shot prefix cache: requests then go through the rank's stepper (``cortex.sim.stepper``),
which publishes each step's events with ``publish_events``; ``submit``/``release`` are refused,
and ``clear``/``restart``/``truth``/``used_blocks`` act on the model (``batching(rank)``).

Lifecycle: construct (caches exist at once), then ``await nursery.start(engine.run)``, which
binds every rank's sockets (ports probed when not given) and returns once all publishers run.
``submit``/``clear``/``restart`` need a running engine; ``truth`` does not.

A restart is an engine process restart: the cache is emptied silently (no AllBlocksCleared,
kv-events.md §4.4), the sequence restarts at 0, the replay buffer is emptied, and a vLLM whose
NONE_HASH is random (no PYTHONHASHSEED before 0.29) hashes differently afterwards. A batching
rank gets a new model (its requests are gone with the old one); ``on_restart`` listeners hear
of it at once (the stepper fails the requests it was serving).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import trio
import zmq

from cortex.ledger.kv_events import BlockRemoved, BlockStored, EngineFamily, Event
from cortex.sim.batching.core import BatchingEngine
from cortex.sim.engine_hashes import (
    ChainHasher,
    LoraAdapter,
    LoraRegistry,
    VllmChainHasher,
    VllmHashAlgo,
    make_chain_hasher,
)
from cortex.sim.faults import FaultInjector
from cortex.sim.prefix_cache import (
    AdmitResult,
    FreeOrder,
    PrefixCache,
    SglangPrefixCache,
    TruthEntry,
    VllmPrefixCache,
)
from cortex.sim.publisher import Batch, EventPublisher, bind_rank_sockets
from cortex.sim.wire import WireProfile, encode_batch, profile_named


@dataclass(frozen=True, slots=True)
class SimEndpointConfig:
    """Where and how the publishers listen. Ports left None are probed (free, contiguous)."""

    host: str = "127.0.0.1"
    base_port: int | None = None
    replay_base_port: int | None = None
    replay: bool = True
    buffer_steps: int = 10_000
    hwm: int = 100_000


@dataclass(frozen=True, slots=True)
class SimHashConfig:
    """How the engine hashes blocks and publishes the hashes."""

    algo: VllmHashAlgo = "sha256"  # vLLM --prefix-caching-hash-algo
    python_hash_seed: str | None = None  # vLLM PYTHONHASHSEED
    int_block_hashes: bool = True  # vLLM VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES
    sglang_dynamo_format: bool = False  # SGLang kv-events format "dynamo" (>= 0.5.22)
    lora_adapters: tuple[LoraAdapter, ...] = ()


@dataclass(frozen=True, slots=True)
class RankEndpoints:
    pub: str
    replay: str | None


@dataclass(slots=True)
class EngineStats:
    batches: int = 0
    blocks_stored: int = 0
    blocks_removed: int = 0
    clears: int = 0
    restarts: int = 0


# One rank's batching model, made from that rank's block hasher (again at each restart).
BatchingFactory = Callable[[ChainHasher], BatchingEngine]


@dataclass(slots=True)
class _Rank:
    cache: PrefixCache | None  # the one-shot prefix cache; None on a batching rank
    model: BatchingEngine | None = None  # the batching model; None on a one-shot rank
    stats: EngineStats = field(default_factory=EngineStats)
    publisher: EventPublisher | None = None


class SimKVEngine:
    """Simulated vLLM or SGLang engine with ``dp_size`` ranks, publishing real KV events."""

    def __init__(
        self,
        profile: str | WireProfile,
        *,
        block_size: int = 16,
        capacity_blocks: int = 4096,
        dp_size: int = 1,
        topic: str = "",
        endpoints: SimEndpointConfig = SimEndpointConfig(),
        hashing: SimHashConfig = SimHashConfig(),
        vllm_free_order: FreeOrder = "tail_first",
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.time,
        context: zmq.Context | None = None,
        batching: BatchingFactory | None = None,
    ) -> None:
        if dp_size < 1:
            raise ValueError("dp_size must be at least 1")
        self.profile = profile_named(profile)
        if self.profile.family is EngineFamily.SGLANG and not hashing.int_block_hashes:
            raise ValueError("SGLang publishes int64 hashes only")
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self.dp_size = dp_size
        self.topic = topic
        self.endpoint_config = endpoints
        self.hashing = hashing
        self.vllm_free_order = vllm_free_order
        self.rng = rng if rng is not None else random.Random()
        self.clock = clock
        self.restart_probability = 0.0  # per submit, per rank: restart before admitting
        self._context = context
        self._loras = LoraRegistry(hashing.lora_adapters)
        self._batching = batching
        self._restart_listeners: list[Callable[[int], None]] = []
        self._ranks = [self._new_rank() for _ in range(dp_size)]
        self.base_port: int | None = None
        self.replay_base_port: int | None = None

    # ------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Bind every rank's sockets, start the publishers, report ready, serve until cancelled."""
        config = self.endpoint_config
        sndhwm = 2 * (config.buffer_steps + 1) if self.profile.name == "vllm-0.33" else None
        sockets, self.base_port, self.replay_base_port = bind_rank_sockets(
            self._context or zmq.Context.instance(),
            self.dp_size,
            host=config.host,
            base_port=config.base_port,
            replay_base_port=config.replay_base_port,
            replay=config.replay,
            hwm=config.hwm,
            router_sndhwm=sndhwm,
        )
        publishers = [
            EventPublisher(
                s.pub,
                s.router,
                topic=self.topic.encode(),
                replay_generation=self.profile.replay_generation,
                buffer_steps=config.buffer_steps,
                rng=random.Random(self.rng.getrandbits(64)),
            )
            for s in sockets
        ]
        try:
            async with trio.open_nursery() as nursery:
                for rank, publisher in zip(self._ranks, publishers, strict=True):
                    await nursery.start(publisher.run)
                    rank.publisher = publisher
                task_status.started()
        finally:
            for rank in self._ranks:
                rank.publisher = None
            for publisher in publishers:  # closes sockets a start never reached
                publisher.pub.close(linger=0)
                if publisher.router is not None:
                    publisher.router.close(linger=0)

    # ------------------------------------------------------------ engine steps

    def submit(
        self,
        rank: int,
        token_ids: Sequence[int],
        *,
        lora_name: str | None = None,
        cache_salt: str | None = None,
        hold: bool = False,
        read_limit: int | None = None,
    ) -> AdmitResult:
        """Admit one request on ``rank`` (one scheduler step) and publish its events;
        ``read_limit``: prompt tokens it may read from the cache at most."""
        cache = self._cache(rank)
        if self.restart_probability > 0 and self.rng.random() < self.restart_probability:
            self.restart(rank)
            cache = self._cache(rank)
        result = cache.admit(token_ids, lora_name=lora_name, cache_salt=cache_salt,
                             hold=hold, read_limit=read_limit)
        self.publish_events(rank, result.events, result.hash_digests)
        return result

    def release(self, rank: int, lease: int) -> None:
        """A held request finished: its blocks become evictable (no event)."""
        self._cache(rank).release(lease)

    def publish_events(self, rank: int, events: Sequence[Event],
                       hash_digests: Mapping[int, bytes] | None = None) -> None:
        """Publish one step's events on ``rank`` as one batch (nothing when there are none);
        ``hash_digests`` (vLLM: every hash's raw digest) is used in the bytes-hash wire mode."""
        if not events:
            return
        state = self._rank(rank)
        digests = None if self.hashing.int_block_hashes else hash_digests
        payload = encode_batch(self.profile, self.clock(), events, rank, hash_digests=digests)
        self._publisher(rank).publish(payload)
        state.stats.batches += 1
        for event in events:
            if isinstance(event, BlockStored):
                state.stats.blocks_stored += len(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                state.stats.blocks_removed += len(event.block_hashes)

    def clear(self, rank: int) -> bool:
        """Reset the prefix cache (publishes AllBlocksCleared). A batching model refuses while
        a request holds blocks (vLLM's rule): False, nothing published."""
        state = self._rank(rank)
        if state.model is not None:
            events = state.model.clear()
        else:
            assert state.cache is not None
            events = state.cache.clear()
        if not events:
            return False
        self.publish_events(rank, events)
        state.stats.clears += 1
        return True

    def restart(self, rank: int) -> None:
        """The rank's engine process restarted: empty cache, sequence 0, empty replay buffer;
        a batching rank gets a new model (every request in it is gone) and the ``on_restart``
        listeners are told."""
        state = self._rank(rank)
        if state.model is not None:
            assert self._batching is not None
            state.model = self._batching(self._new_hasher())
        else:
            assert state.cache is not None
            state.cache.reset(self._new_hasher())  # type: ignore[arg-type]
        self._publisher(rank).restart()
        state.stats.restarts += 1
        for listener in list(self._restart_listeners):
            listener(rank)

    def on_restart(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(rank)`` right after each restart of a rank."""
        self._restart_listeners.append(listener)

    # ------------------------------------------------------------ inspection and faults

    def batching(self, rank: int) -> BatchingEngine | None:
        """The rank's batching model now (a restart replaces it); None on a one-shot rank."""
        return self._rank(rank).model

    def truth(self, rank: int) -> set[TruthEntry]:
        state = self._rank(rank)
        if state.model is not None:
            return state.model.truth()
        assert state.cache is not None
        return state.cache.truth()

    def stats(self, rank: int) -> EngineStats:
        return self._rank(rank).stats

    def used_blocks(self, rank: int) -> int:
        """Blocks the rank's cache holds now (in use or evictable); at most ``capacity_blocks``.
        A batching model counts its cached (hashed) blocks: blocks of requests that are not
        full yet are left out, and the count copies the whole cache (not for a hot path)."""
        state = self._rank(rank)
        if state.model is not None:
            return len(state.model.truth())
        assert state.cache is not None
        return state.cache.used_blocks

    def endpoints(self, rank: int) -> RankEndpoints:
        publisher = self._publisher(rank)
        return RankEndpoints(publisher.pub_endpoint, publisher.replay_endpoint)

    def publisher(self, rank: int) -> EventPublisher:
        """The rank's publisher: ``stall``/``pause``/``resume``, sequence and replay buffer."""
        return self._publisher(rank)

    def faults(self, rank: int) -> FaultInjector[Batch]:
        """The rank's delivery faults: ``drop_next``/``duplicate_next``/``reorder_next`` and
        ``probabilities``."""
        return self._publisher(rank).faults

    # ------------------------------------------------------------ internals

    def _new_hasher(self) -> ChainHasher:
        return make_chain_hasher(
            self.profile.family,
            self.profile.version,
            algo=self.hashing.algo,
            python_hash_seed=self.hashing.python_hash_seed,
            random_bytes=self.rng.randbytes,
            loras=self._loras,
            sglang_dynamo_format=self.hashing.sglang_dynamo_format,
        )

    def _new_rank(self) -> _Rank:
        if self._batching is not None:
            return _Rank(None, self._batching(self._new_hasher()))
        return _Rank(self._new_cache())

    def _new_cache(self) -> PrefixCache:
        hasher = self._new_hasher()
        if isinstance(hasher, VllmChainHasher):
            return VllmPrefixCache(
                hasher,
                block_size=self.block_size,
                capacity_blocks=self.capacity_blocks,
                free_order=self.vllm_free_order,
            )
        return SglangPrefixCache(
            hasher, block_size=self.block_size, capacity_blocks=self.capacity_blocks
        )

    def _rank(self, rank: int) -> _Rank:
        if not 0 <= rank < self.dp_size:
            raise IndexError(f"rank {rank} outside 0..{self.dp_size - 1}")
        return self._ranks[rank]

    def _cache(self, rank: int) -> PrefixCache:
        cache = self._rank(rank).cache
        if cache is None:
            raise RuntimeError("this rank runs a batching model: its requests go through the "
                               "rank's stepper (cortex.sim.stepper), not submit/release")
        return cache

    def _publisher(self, rank: int) -> EventPublisher:
        publisher = self._rank(rank).publisher
        if publisher is None:
            raise RuntimeError("the engine is not running: start it with nursery.start(engine.run)")
        return publisher
