"""Scripted and random delivery faults of a simulated publisher. Pure: decides, never sends.

Two moments per batch:

* ``decide()`` when the batch is published (gets its sequence number): scripted faults
  (``drop_next``, ``reorder_next``, ``duplicate_next``) are used up first, in publish order;
  otherwise ``probabilities`` apply, drawn from the injected ``random.Random`` (one draw per
  enabled fault per batch), so a seeded run repeats exactly. Deciding at publish time makes
  "the next N batches" mean the next N the engine publishes, however late the sender runs.
* ``route(batch, faults)`` when the sender gets to it; returns what to send now, in order:

1. drop: a dropped batch is not sent (it stays in the replay buffer, like a PUB high-water-mark
   drop, so a consumer sees a gap it can repair). A held batch (rule 2) is released instead.
2. reorder: the batch is held back and sent right after the next batch (a swap). A held batch
   that waits too long is released by the publisher through ``take_held``.
3. duplicate: the batch is sent twice in a row.

A stall (sending paused for ``stall_s`` before the batch) is decided here and timed by the
publisher.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(slots=True)
class FaultProbabilities:
    """Per-batch probabilities of each fault (0 = never)."""

    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    stall: float = 0.0
    stall_s: float = 0.05


@dataclass(frozen=True, slots=True)
class BatchFaults:
    """What happens to one batch on its way out."""

    drop: bool = False
    duplicate: bool = False
    reorder: bool = False
    stall_s: float = 0.0


@dataclass(slots=True)
class FaultCounters:
    dropped: int = 0  # decided at publish time, like duplicated and stalled
    duplicated: int = 0
    reordered: int = 0  # counted when a batch is actually held back
    stalled: int = 0


class FaultInjector(Generic[T]):
    """Decides, batch by batch, what a publisher actually sends."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self.rng = rng if rng is not None else random.Random()
        self.probabilities = FaultProbabilities()
        self.counters = FaultCounters()
        self._drops = 0
        self._duplicates = 0
        self._reorders = 0
        self._held: T | None = None

    def drop_next(self, count: int = 1) -> None:
        self._drops += count

    def duplicate_next(self, count: int = 1) -> None:
        self._duplicates += count

    def reorder_next(self, count: int = 1) -> None:
        """Swap each of the next ``count`` batches with the batch after it."""
        self._reorders += count

    @property
    def holding(self) -> bool:
        return self._held is not None

    def decide(self) -> BatchFaults:
        """The faults of the batch being published now."""
        p = self.probabilities
        if self._decide("_drops", p.drop):
            self.counters.dropped += 1
            return BatchFaults(drop=True)
        faults = BatchFaults(
            duplicate=self._decide("_duplicates", p.duplicate),
            reorder=self._decide("_reorders", p.reorder),
            stall_s=p.stall_s if p.stall > 0 and self.rng.random() < p.stall else 0.0,
        )
        self.counters.duplicated += int(faults.duplicate)
        self.counters.stalled += int(faults.stall_s > 0)
        return faults

    def route(self, item: T, faults: BatchFaults) -> list[T]:
        """What to send now for ``item``, in order."""
        if faults.drop:
            return self.take_held()
        copies = 2 if faults.duplicate else 1
        if self._held is not None:
            held, self._held = self._held, None
            return [item] * copies + [held]
        if faults.reorder:  # (a batch that releases a held one is not held itself)
            self.counters.reordered += 1
            self._held = item
            return [item] * (copies - 1)
        return [item] * copies

    def take_held(self) -> list[T]:
        """Release a held batch (nothing came after it in time)."""
        held, self._held = self._held, None
        return [] if held is None else [held]

    def reset(self) -> None:
        """The publisher restarted: a held batch is lost; scripted faults stay armed."""
        self._held = None

    def _decide(self, scripted: str, probability: float) -> bool:
        pending = getattr(self, scripted)
        if pending > 0:
            setattr(self, scripted, pending - 1)
            return True
        return probability > 0 and self.rng.random() < probability
