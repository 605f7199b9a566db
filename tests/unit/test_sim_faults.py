"""Delivery fault decisions of a simulated publisher (pure)."""

from __future__ import annotations

import random

from cortex.sim.faults import FaultInjector


def _send_all(injector: FaultInjector[int], items: range) -> list[int]:
    """Publish every item (deciding its faults), then send them all."""
    decided = [(item, injector.decide()) for item in items]
    sent: list[int] = []
    for item, faults in decided:
        sent += injector.route(item, faults)
    return sent + injector.take_held()


def test_no_faults_sends_everything_in_order() -> None:
    assert _send_all(FaultInjector(random.Random(0)), range(5)) == [0, 1, 2, 3, 4]


def test_scripted_faults_are_used_up_in_order() -> None:
    injector: FaultInjector[int] = FaultInjector(random.Random(0))
    injector.drop_next(2)
    assert _send_all(injector, range(4)) == [2, 3]
    injector.duplicate_next()
    assert _send_all(injector, range(2)) == [0, 0, 1]
    injector.reorder_next()
    assert _send_all(injector, range(3)) == [1, 0, 2]
    counters = injector.counters
    assert (counters.dropped, counters.duplicated, counters.reordered) == (2, 1, 1)


def test_a_held_batch_is_released_by_a_drop_or_take_held() -> None:
    injector: FaultInjector[int] = FaultInjector(random.Random(0))
    injector.reorder_next()
    assert injector.route(0, injector.decide()) == [] and injector.holding
    injector.drop_next()
    assert injector.route(1, injector.decide()) == [0]
    injector.reorder_next()
    injector.route(2, injector.decide())
    assert injector.take_held() == [2] and injector.take_held() == []
    injector.reorder_next()
    injector.route(3, injector.decide())
    injector.reset()  # restart: the held batch is lost
    assert not injector.holding and injector.route(4, injector.decide()) == [4]


def test_scripted_faults_bind_to_publish_order_not_send_order() -> None:
    injector: FaultInjector[int] = FaultInjector(random.Random(0))
    injector.duplicate_next()
    first = injector.decide()
    injector.reorder_next()
    second, third = injector.decide(), injector.decide()
    assert first.duplicate and not first.reorder
    assert second.reorder and not second.duplicate and third == type(third)()


def test_random_faults_repeat_with_the_same_seed() -> None:
    def run(seed: int) -> tuple[list[int], float]:
        injector: FaultInjector[int] = FaultInjector(random.Random(seed))
        p = injector.probabilities
        p.drop, p.duplicate, p.reorder = 0.2, 0.2, 0.2
        sent = _send_all(injector, range(200))
        p.drop = p.duplicate = p.reorder = 0.0
        p.stall = 0.3
        stalls = sum(injector.decide().stall_s for _ in range(100))
        return sent, stalls

    first, again, other = run(7), run(7), run(8)
    assert first == again and first != other
    sent, stalls = first
    assert 0 < stalls < 100 * 0.05
    assert len(set(sent)) < 200  # some dropped
    assert len(sent) != len(set(sent))  # some duplicated
    assert sent != sorted(sent)  # some swapped


def test_certain_probabilities() -> None:
    injector: FaultInjector[int] = FaultInjector(random.Random(1))
    injector.probabilities.drop = 1.0
    assert _send_all(injector, range(3)) == []
    injector.probabilities.drop = 0.0
    injector.probabilities.duplicate = 1.0
    assert _send_all(injector, range(2)) == [0, 0, 1, 1]
