"""One started generation request of a simulated engine: its cache hit, its token timetable, and
the per-rank totals it feeds.

``SimEngine.generation`` (``cortex.sim.engine``) makes a ``Generation`` once the request has a
batch slot; the HTTP side (``cortex.sim.http_engine``) and the PD role (``cortex.sim.pd``) read
its tokens. This module imports none of them.

Rules:

* Output text is deterministic: token ``i`` is ``OUTPUT_WORDS[i % len(OUTPUT_WORDS)]``, its id
  a stand-in stable per word (``output_token``, from ``cortex.sim.output_tokens``).
* A ``Generation`` yields ``(index, text, token_id)`` at each token's planned time (trio's
  clock, ``serving.TokenPlan``) and counts it in its rank's ``RankCounters``; it is a plain
  async iterator, so abandoning it midway needs no ``aclose``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

from cortex.sim.output_tokens import OUTPUT_WORDS, output_token
from cortex.sim.serving import TokenPlan

__all__ = ["OUTPUT_WORDS", "Generation", "RankCounters", "output_token"]


@dataclass(slots=True)
class RankCounters:
    """Monotonic per-rank totals (tokens), exposed on the metrics and load endpoints."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generation_tokens: int = 0
    aborted: int = 0


@dataclass(slots=True)
class Generation:
    """One started request: its cache hit and its token timetable."""

    request_id: int
    rank: int
    prompt_tokens: int
    cached_tokens: int
    plan: TokenPlan
    produced: int = 0
    lease: int | None = None  # the prompt's cache hold, released when the request ends
    _counters: RankCounters = field(repr=False, default_factory=RankCounters)

    def __aiter__(self) -> Generation:
        return self

    async def __anext__(self) -> tuple[int, str, int]:
        """``(index, text, token_id)`` of the next output token, at its planned time.

        A plain iterator rather than an async generator: abandoning it midway needs no
        ``aclose``."""
        i = self.produced
        if i >= self.plan.output_tokens:
            raise StopAsyncIteration
        await trio.sleep_until(self.plan.token_at(i))
        self.produced += 1
        self._counters.generation_tokens += 1
        return (i, *output_token(i))
