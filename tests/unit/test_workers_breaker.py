"""Circuit breaker transitions over a fake clock."""

from __future__ import annotations

import pytest

from cortex.errors import ConfigError
from cortex.workers.breaker import BreakerState, CircuitBreaker


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def breaker(clock: FakeClock) -> CircuitBreaker:
    return CircuitBreaker(failures_to_open=3, open_s=10.0, clock=clock)


def test_opens_after_consecutive_failures_only(breaker: CircuitBreaker) -> None:
    assert breaker.state is BreakerState.CLOSED
    assert not breaker.record_failure()
    assert not breaker.record_failure()
    breaker.record_success()  # the run is broken
    assert breaker.consecutive_failures == 0
    assert not breaker.record_failure()
    assert not breaker.record_failure()
    assert breaker.state is BreakerState.CLOSED and breaker.allow()
    assert breaker.record_failure()  # third in a row
    assert breaker.state is BreakerState.OPEN
    assert not breaker.allow()


def test_half_open_after_open_s_hands_out_one_trial(breaker: CircuitBreaker,
                                                     clock: FakeClock) -> None:
    for _ in range(3):
        breaker.record_failure()
    assert breaker.retry_at() == 110.0
    clock.now = 109.999
    assert breaker.state is BreakerState.OPEN and not breaker.allow()
    clock.now = 110.0
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.allow()  # the trial
    assert not breaker.allow()  # only one
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED
    assert breaker.retry_at() is None
    assert breaker.allow() and breaker.allow()


def test_failed_trial_reopens_for_another_period(breaker: CircuitBreaker,
                                                 clock: FakeClock) -> None:
    for _ in range(3):
        breaker.record_failure()
    clock.now += 10.0
    assert breaker.allow()
    assert breaker.consecutive_failures == 3
    assert breaker.record_failure()  # the trial failed: open again, at once
    assert breaker.state is BreakerState.OPEN and breaker.consecutive_failures == 4
    assert breaker.retry_at() == clock.now + 10.0
    clock.now += 10.0
    assert breaker.state is BreakerState.HALF_OPEN and breaker.allow()


def test_outcomes_while_open_change_nothing(breaker: CircuitBreaker, clock: FakeClock) -> None:
    for _ in range(3):
        breaker.record_failure()
    opened_until = breaker.retry_at()
    clock.now += 5.0
    breaker.record_success()  # a late answer of an exchange started before
    assert not breaker.record_failure()
    assert breaker.state is BreakerState.OPEN
    assert breaker.retry_at() == opened_until


def test_single_failure_threshold(clock: FakeClock) -> None:
    breaker = CircuitBreaker(1, 0.5, clock)
    assert breaker.record_failure()
    assert breaker.state is BreakerState.OPEN


@pytest.mark.parametrize("failures, open_s", [(0, 1.0), (3, 0.0), (3, -1.0)])
def test_invalid_settings(failures: int, open_s: float, clock: FakeClock) -> None:
    with pytest.raises(ConfigError):
        CircuitBreaker(failures, open_s, clock)


def test_a_trial_never_reported_is_handed_out_again_after_open_s(breaker: CircuitBreaker,
                                                                 clock: FakeClock) -> None:
    for _ in range(3):
        breaker.record_failure()
    clock.now += 10.0
    assert breaker.allow()  # its owner is cancelled and never reports
    clock.now += 9.0
    assert not breaker.allow()
    clock.now += 1.0
    assert breaker.allow()
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED
