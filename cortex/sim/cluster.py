"""A simulated cluster wired to Cortex's ingestion: engines, ZeroMQ streams, one ledger book.

Used by the demo and the integration tests. ``start_cluster`` starts every engine and the
ingestion of all their (worker, rank) streams in the caller's nursery and returns once all are
running. ``SimCluster.quiet()`` waits until every stream has been applied up to what its engine
published; ``compare`` checks a target's ledger against its engine's true cache.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio

from cortex._fast.blockkeys import block_keys, namespace_seed
from cortex.events.counters import IngestCounters
from cortex.events.source import IngestSettings, worker_sources
from cortex.events.subscriber import IngestionHandle, run_ingestion
from cortex.ledger.book import LedgerBook
from cortex.ledger.state import TargetState
from cortex.sim.kv_engine import SimEndpointConfig, SimKVEngine


@dataclass(frozen=True, slots=True)
class EngineSpec:
    name: str
    profile: str  # wire profile, e.g. "vllm-0.33"
    dp_size: int = 1
    buffer_steps: int = 10_000  # replay buffer of each rank


@dataclass(frozen=True, slots=True)
class Comparison:
    """A target's ledger against its engine's cache, as sets of Cortex block keys."""

    ledger_blocks: int
    engine_blocks: int
    false_hits: int  # in the ledger, not in the engine
    missed: int  # in the engine, not in the ledger

    @property
    def exact(self) -> bool:
        return self.false_hits == 0 and self.missed == 0


class SimCluster:
    def __init__(
        self,
        engines: dict[str, SimKVEngine],
        handle: IngestionHandle,
        book: LedgerBook,
        model: str,
        block_size: int,
    ) -> None:
        self.engines = engines
        self.handle = handle
        self.book = book
        self.model = model
        self.block_size = block_size
        self.target = {(s.worker, s.rank): t for t, s in handle.sources.items()}

    def targets(self) -> Iterator[tuple[str, int, int]]:
        """(worker, rank, target id) of every stream."""
        for (worker, rank), target in self.target.items():
            yield worker, rank, target

    def counters(self, worker: str, rank: int) -> IngestCounters:
        return self.handle.counters[self.target[(worker, rank)]]

    def state(self, worker: str, rank: int) -> TargetState:
        return self.book.state(self.target[(worker, rank)])

    def caught_up(self, worker: str, rank: int) -> bool:
        sync = self.handle.syncs[self.target[(worker, rank)]]
        published = self.engines[worker].publisher(rank).next_seq
        return (
            sync.replay_pending is None
            and sync.state in (TargetState.READY, TargetState.PARTIAL)
            and (published == 0 or sync.next_seq == published)
        )

    async def quiet(self, timeout_s: float = 20.0) -> None:
        """Wait until every stream is applied up to its engine's last published batch.

        A batch dropped on the wire is only noticed when a later one arrives, so callers end
        a faulty phase with some clean traffic before waiting here."""
        try:
            with trio.fail_after(timeout_s):
                while not all(self.caught_up(w, r) for w, r, _ in self.targets()):
                    await trio.sleep(0.005)
        except trio.TooSlowError:
            raise trio.TooSlowError(f"streams not caught up: {self.lagging()}") from None

    def lagging(self) -> list[str]:
        """Streams not applied up to their engine's last batch, and why (diagnostics)."""
        out = []
        for worker, rank, target in self.targets():
            if not self.caught_up(worker, rank):
                sync = self.handle.syncs[target]
                out.append(
                    f"{worker}/{rank}: {sync.state.value} next_seq={sync.next_seq} "
                    f"published={self.engines[worker].publisher(rank).next_seq} "
                    f"replay_pending={sync.replay_pending is not None} held={sync.held}"
                )
        return out

    def truth_keys(self, worker: str, rank: int) -> set[int]:
        """The engine's cached blocks as Cortex keys."""
        return cached_keys(self.engines[worker].truth(rank), self.block_size, self.model)

    def compare(self, worker: str, rank: int) -> Comparison:
        return compare_keys(self.book.target_keys(self.target[(worker, rank)]),
                            self.engines[worker].truth(rank), self.block_size, self.model)


def compare_keys(ledger: Mapping[int, set[int]], truth: Iterable[tuple[Any, Any, Sequence[int]]],
                 block_size: int, model: str) -> Comparison:
    """A target's ledger (``LedgerBook.target_keys``: block size -> keys) against its engine's
    cache (``SimKVEngine.truth``: lora, salt and tokens of every cached block's prefix), as
    sets of Cortex block keys of ``block_size``; a ledger block of another size is an error."""
    unexpected = set(ledger) - {block_size}
    if unexpected:
        raise AssertionError(f"ledger holds blocks of sizes {unexpected}")
    held = ledger.get(block_size, set())
    cached = cached_keys(truth, block_size, model)
    return Comparison(len(held), len(cached), len(held - cached), len(cached - held))


def cached_keys(truth: Iterable[tuple[Any, Any, Sequence[int]]], block_size: int,
                model: str) -> set[int]:
    """An engine's cached blocks (``SimKVEngine.truth``) as Cortex block keys."""
    return {block_keys(tokens, block_size, namespace_seed(model, lora, salt))[-1]
            for lora, salt, tokens in truth}


async def start_cluster(
    nursery: trio.Nursery,
    specs: Sequence[EngineSpec],
    *,
    model: str = "sim-model",
    block_size: int = 16,
    capacity_blocks: int = 4096,
    seed: int = 0,
    settings: IngestSettings | None = None,
) -> SimCluster:
    """Start the engines and the ingestion of all their streams in ``nursery``."""
    engines = {}
    for i, spec in enumerate(specs):
        engine = SimKVEngine(
            spec.profile,
            block_size=block_size,
            capacity_blocks=capacity_blocks,
            dp_size=spec.dp_size,
            endpoints=SimEndpointConfig(buffer_steps=spec.buffer_steps),
            rng=random.Random(seed * 1000 + i),
        )
        await nursery.start(engine.run)
        engines[spec.name] = engine
    sources = []
    for name, engine in engines.items():
        assert engine.base_port is not None
        sources += worker_sources(
            name,
            host="127.0.0.1",
            port=engine.base_port,
            dp_size=engine.dp_size,
            family=engine.profile.family,
            model=model,
            replay_port=engine.replay_base_port,
        )
    book = LedgerBook()
    handle = await nursery.start(partial(run_ingestion, sources, book, settings=settings))
    # Traffic sent before a SUB's subscription reaches the engine is lost (slow joiner), and
    # a short replay buffer may not bring it back: start traffic only once all are subscribed.
    for engine in engines.values():
        for rank in range(engine.dp_size):
            await engine.publisher(rank).wait_subscribed()
    return SimCluster(engines, handle, book, model, block_size)
