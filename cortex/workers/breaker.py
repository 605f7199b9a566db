"""Circuit breaker of one worker: a pure state machine over an injected clock.

States and rules:

* ``CLOSED`` — normal. Every failure (a failed health probe, an upstream connection that could
  not be opened) adds one to a run of consecutive failures; any success ends the run. The
  ``failures_to_open``-th consecutive failure opens the breaker.
* ``OPEN`` — the worker gets no traffic and no probes. After ``open_s`` seconds (measured from
  the failure that opened it) the breaker is ``HALF_OPEN``; the change is read off the clock,
  nothing has to call in.
* ``HALF_OPEN`` — exactly one trial may go (``allow()`` hands it out once). Its success closes
  the breaker, its failure opens it again for another ``open_s``. While the trial is out,
  ``allow()`` refuses everything else. The trial's owner must report its outcome (a trial that
  times out is a failure); any outcome reported while half-open is taken as the trial's. A
  trial never reported within ``open_s`` (its owner was cancelled) is forgotten and the next
  ``allow()`` hands out a new one, so a lost trial cannot keep a worker out forever.
* Outcomes reported while ``OPEN`` (late answers of exchanges started before it opened) change
  nothing: only the trial decides.

Every method is O(1). Single owner (the trio thread); the clock is any ``() -> float`` in
seconds, monotonic (``trio.current_time`` in the gateway, a fake in tests).
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from cortex.errors import ConfigError


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    __slots__ = (
        "_clock",
        "_failures",
        "_failures_to_open",
        "_open_s",
        "_opened_at",
        "_trial_at",
    )

    def __init__(self, failures_to_open: int, open_s: float,
                 clock: Callable[[], float]) -> None:
        problems = []
        if failures_to_open < 1:
            problems.append("failures_to_open must be >= 1")
        if not open_s > 0:
            problems.append("open_s must be > 0")
        if problems:
            raise ConfigError(problems)
        self._failures_to_open = failures_to_open
        self._open_s = open_s
        self._clock = clock
        self._opened_at: float | None = None  # None: CLOSED
        self._failures = 0  # consecutive failures counted (none while OPEN), 0 after a success
        self._trial_at: float | None = None  # when the half-open trial was handed out

    @property
    def state(self) -> BreakerState:
        if self._opened_at is None:
            return BreakerState.CLOSED
        if self._clock() < self._opened_at + self._open_s:  # the very sum retry_at() gives
            return BreakerState.OPEN
        return BreakerState.HALF_OPEN

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    def retry_at(self) -> float | None:
        """When an open breaker turns half-open (clock time); ``None`` when not open."""
        if self._opened_at is None:
            return None
        return self._opened_at + self._open_s

    def allow(self) -> bool:
        """Whether an exchange may go now; in ``HALF_OPEN`` this hands out the one trial."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.OPEN:
            return False
        now = self._clock()
        if self._trial_at is not None and now < self._trial_at + self._open_s:
            return False
        self._trial_at = now
        return True

    def record_success(self) -> None:
        state = self.state
        if state is BreakerState.OPEN:
            return
        self._opened_at = None
        self._failures = 0
        self._trial_at = None

    def record_failure(self) -> bool:
        """Count one failure; true when this failure opened (or re-opened) the breaker."""
        state = self.state
        if state is BreakerState.OPEN:
            return False
        self._failures += 1
        if state is BreakerState.HALF_OPEN or self._failures >= self._failures_to_open:
            self._opened_at = self._clock()
            self._trial_at = None
            return True
        return False
