"""One started generation request of a simulated engine: its cache hit, its token stream, and
the per-rank totals it feeds.

``SimEngine.generation`` (``cortex.sim.engine``) makes one once the request has started; the
HTTP side (``cortex.sim.http_engine``) and the PD role (``cortex.sim.pd``) read its tokens. Two
kinds, one reading surface (``TokenStream``: ``request_id``, ``rank``, ``prompt_tokens``,
``cached_tokens``, ``output_tokens``, ``produced``, async iteration):

* ``Generation`` (the fixed model, ``cortex.sim.serving``): tokens at the times of its
  precomputed ``TokenPlan``.
* ``SteppedGeneration`` (the batching model): each token when the rank's stepper
  (``cortex.sim.stepper``) has delivered it, at the end of the step that produced it.

Rules:

* Output text is deterministic (``cortex.sim.output_text``): token ``i`` is
  ``OUTPUT_WORDS[i % len(OUTPUT_WORDS)]``, its id a stand-in stable per word (``output_token``).
* Both yield ``(index, text, token_id)`` and count each token in their rank's ``RankCounters``;
  they are plain async iterators, so abandoning one midway needs no ``aclose``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import trio

from cortex.sim.output_text import OUTPUT_WORDS, output_token
from cortex.sim.rank_counters import RankCounters
from cortex.sim.serving import TokenPlan

if TYPE_CHECKING:
    from cortex.sim.stepper import RequestProgress

__all__ = ["OUTPUT_WORDS", "Generation", "RankCounters", "SteppedGeneration", "TokenStream",
           "output_token"]



class TokenStream(Protocol):
    """What the HTTP side and the PD role read of a started request."""

    request_id: int
    rank: int
    prompt_tokens: int
    cached_tokens: int
    produced: int  # tokens handed out so far
    # the KV hold the request releases when it ends (fixed model: always; batching: with
    # hold_kv); whoever keeps the KV past the request takes it (sets None) and later gives it
    # to ``SimEngine.release_kv``
    lease: int | None

    @property
    def output_tokens(self) -> int:
        """Tokens it produces in all."""
        ...

    def __aiter__(self) -> TokenStream: ...

    async def __anext__(self) -> tuple[int, str, int]: ...


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

    @property
    def output_tokens(self) -> int:
        return self.plan.output_tokens

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


@dataclass(slots=True)
class SteppedGeneration:
    """One request on a batching model: its tokens as its rank's stepper delivers them."""

    request_id: int
    rank: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    progress: RequestProgress = field(repr=False)
    produced: int = 0
    lease: int | None = None  # hold_kv: the request id, released with its KV
    _counters: RankCounters = field(repr=False, default_factory=RankCounters)

    def __aiter__(self) -> SteppedGeneration:
        return self

    async def __anext__(self) -> tuple[int, str, int]:
        """``(index, text, token_id)`` of the next output token, once the step that produced
        it has ended (``EngineCrashed`` if the engine restarted meanwhile)."""
        i = self.produced
        if i >= self.output_tokens:
            raise StopAsyncIteration
        await self.progress.wait_token(i)
        self.produced += 1
        self._counters.generation_tokens += 1
        return (i, *output_token(i))
