"""A simulated engine rank's monotonic totals, read by its metrics and load endpoints and
counted by both timing models (``cortex.sim.generation`` for the fixed one, ``cortex.sim.stepper``
for the batching one). Pure."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RankCounters"]


@dataclass(slots=True)
class RankCounters:
    """Monotonic per-rank totals (tokens), exposed on the metrics and load endpoints."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generation_tokens: int = 0
    aborted: int = 0
    preemptions: int = 0  # requests the batching model preempted (recomputed later)
