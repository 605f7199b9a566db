"""Timing model of one simulated engine rank: FIFO queue, batch limit, prefill and decode time.

Pure (no I/O, no clock of its own): callers pass ``now`` in seconds from any monotonic origin,
so a test drives it with plain numbers and a run repeats exactly.

Rules:

* ``RankQueue``: requests wait in arrival order (FIFO); at most ``max_running`` run at once. A
  request starts as soon as it is at the head of the queue and a slot is free. ``arrive`` and
  ``leave`` return the requests that start because of them, in FIFO order. ``leave`` covers
  both ends of a request: finished, or aborted while waiting or running; leaving twice, or
  leaving an unknown id, is a no-op. Invariants: ``running <= max_running``; nobody waits while
  a slot is free.
* ``plan``: a started request's tokens. Its cache hit is known only when it starts (an engine
  matches the prefix when it schedules the request, not when it arrives), so the plan is made
  then: prefill takes ``uncached_tokens / prefill_tokens_per_s`` and yields the first token;
  every later token takes ``decode_s_per_token``. Running requests do not slow each other (the
  simple model): load shows up as queueing once the batch is full. A cache hit therefore lowers
  the time to first token by ``cached_tokens / prefill_tokens_per_s``.
* ``simulate`` runs a whole arrival list through one queue and returns when each request
  started, got its first token and finished: the reference the async engine follows.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from cortex.errors import ConfigError


@dataclass(frozen=True, slots=True)
class TimingConfig:
    prefill_tokens_per_s: float = 50_000.0  # uncached prompt tokens per second
    decode_s_per_token: float = 0.001  # per output token after the first, per request
    max_running: int = 64  # batch limit of one rank; more requests wait (FIFO)

    def __post_init__(self) -> None:
        problems = []
        if not self.prefill_tokens_per_s > 0:
            problems.append("prefill_tokens_per_s must be > 0")
        if not self.decode_s_per_token >= 0:
            problems.append("decode_s_per_token must be >= 0")
        if not (isinstance(self.max_running, int) and self.max_running >= 1):
            problems.append("max_running must be an integer >= 1")
        if problems:
            raise ConfigError(problems)


@dataclass(frozen=True, slots=True)
class TokenPlan:
    """When each output token of a started request is ready."""

    start_s: float
    prefill_s: float
    decode_s_per_token: float
    output_tokens: int

    @property
    def first_token_at(self) -> float:
        return self.start_s + self.prefill_s

    def token_at(self, index: int) -> float:
        """Token ``index`` (0-based) is ready at this time."""
        return self.first_token_at + index * self.decode_s_per_token

    @property
    def finish_at(self) -> float:
        return self.token_at(max(self.output_tokens - 1, 0))


def plan(
    timing: TimingConfig, start_s: float, uncached_tokens: int, output_tokens: int
) -> TokenPlan:
    """The token times of a request that starts at ``start_s`` with this many uncached tokens."""
    if uncached_tokens < 0 or output_tokens < 0:
        raise ValueError("token counts must not be negative")
    return TokenPlan(
        start_s,
        uncached_tokens / timing.prefill_tokens_per_s,
        timing.decode_s_per_token,
        output_tokens,
    )


class RankQueue:
    """FIFO queue in front of a batch of at most ``max_running`` requests (ids are ints)."""

    __slots__ = ("_running", "_waiting", "max_running")

    def __init__(self, max_running: int) -> None:
        if max_running < 1:
            raise ValueError("max_running must be >= 1")
        self.max_running = max_running
        self._waiting: deque[int] = deque()
        self._running: set[int] = set()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._running)

    def is_running(self, request_id: int) -> bool:
        return request_id in self._running

    def arrive(self, request_id: int) -> list[int]:
        if request_id in self._running or request_id in self._waiting:
            raise ValueError(f"request {request_id} is already queued")
        self._waiting.append(request_id)
        return self._fill()

    def leave(self, request_id: int) -> list[int]:
        if request_id in self._running:
            self._running.discard(request_id)
            return self._fill()
        try:
            self._waiting.remove(request_id)  # O(waiting); aborts while queued are rare
        except ValueError:
            pass
        return []

    def _fill(self) -> list[int]:
        started = []
        while self._waiting and len(self._running) < self.max_running:
            request_id = self._waiting.popleft()
            self._running.add(request_id)
            started.append(request_id)
        return started


@dataclass(frozen=True, slots=True)
class Arrival:
    at_s: float
    uncached_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class Outcome:
    start_s: float
    first_token_s: float
    finish_s: float

    def ttft(self, arrival: Arrival) -> float:
        return self.first_token_s - arrival.at_s


def simulate(timing: TimingConfig, arrivals: Sequence[Arrival]) -> list[Outcome]:
    """Every request of ``arrivals`` (sorted by time) through one rank, to completion."""
    if any(b.at_s < a.at_s for a, b in itertools.pairwise(arrivals)):
        raise ValueError("arrivals must be sorted by time")
    queue = RankQueue(timing.max_running)
    plans: dict[int, TokenPlan] = {}
    pending_arrivals = deque(enumerate(arrivals))

    def start(ids: list[int], now: float) -> None:
        for i in ids:
            a = arrivals[i]
            plans[i] = plan(timing, now, a.uncached_tokens, a.output_tokens)

    while pending_arrivals or queue.running:
        next_arrival = pending_arrivals[0][1].at_s if pending_arrivals else float("inf")
        running = [(p.finish_at, i) for i, p in plans.items() if queue.is_running(i)]
        next_finish, finisher = min(running, default=(float("inf"), -1))
        if next_finish <= next_arrival:  # a slot frees before (or as) the next one arrives
            start(queue.leave(finisher), next_finish)
        else:
            i, arrival = pending_arrivals.popleft()
            start(queue.arrive(i), arrival.at_s)
    return [
        Outcome(plans[i].start_s, plans[i].first_token_at, plans[i].finish_at)
        for i in range(len(arrivals))
    ]
