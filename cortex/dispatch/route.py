"""A routing decision bound to its worker: what a serving strategy sends and holds.

``ModelPool.decide`` makes one per attempt; the caller enters its ``hold`` (the in-flight
accounting) for the life of the upstream exchange and releases it when the exchange ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cortex.scheduling import Decision
from cortex.scheduling.inflight import Hold
from cortex.workers.spec import WorkerSpec


@dataclass(slots=True)
class Route:
    decision: Decision
    worker: WorkerSpec
    rank: int | None
    hold: Hold
    prompt_tokens: int | None  # None when the prompt was not tokenized
    timings: dict[str, float] = field(default_factory=dict)  # tokenize_s, hash_s
