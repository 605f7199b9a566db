"""The simulated engine's timing model: FIFO queue, batch limit, prefill of uncached tokens."""

from __future__ import annotations

import pytest

from cortex.errors import ConfigError
from cortex.sim.serving import Arrival, RankQueue, TimingConfig, plan, simulate

TIMING = TimingConfig(prefill_tokens_per_s=1000.0, decode_s_per_token=0.01, max_running=2)


def test_plan_prefills_uncached_tokens_then_decodes_each_token():
    p = plan(TIMING, 5.0, uncached_tokens=500, output_tokens=4)
    assert p.first_token_at == pytest.approx(5.5)
    assert [p.token_at(i) for i in range(4)] == pytest.approx([5.5, 5.51, 5.52, 5.53])
    assert p.finish_at == pytest.approx(5.53)


def test_queue_is_fifo_behind_the_batch_limit():
    q = RankQueue(2)
    assert q.arrive(1) == [1]
    assert q.arrive(2) == [2]
    assert q.arrive(3) == []
    assert q.arrive(4) == []
    assert (q.running, q.waiting) == (2, 2)
    assert q.leave(2) == [3]  # the oldest waiting request takes the slot
    assert q.leave(1) == [4]
    assert (q.running, q.waiting) == (2, 0)


def test_aborting_a_waiting_request_frees_its_place_not_a_slot():
    q = RankQueue(1)
    q.arrive(1)
    q.arrive(2)
    q.arrive(3)
    assert q.leave(2) == []  # aborted while queued
    assert q.leave(1) == [3]
    assert q.leave(1) == []  # twice: no-op
    assert q.leave(99) == []
    with pytest.raises(ValueError):
        q.arrive(3)


def test_cache_hit_lowers_time_to_first_token():
    cold, warm = simulate(TIMING, [Arrival(0.0, 1000, 8), Arrival(10.0, 1000 - 960, 8)])
    assert cold.first_token_s == pytest.approx(1.0)
    assert warm.first_token_s - 10.0 == pytest.approx(0.04)


def test_batch_limit_makes_the_third_request_wait_for_the_first_to_finish():
    arrivals = [Arrival(0.0, 100, 10), Arrival(0.0, 200, 10), Arrival(0.05, 100, 1)]
    first, second, third = simulate(TIMING, arrivals)
    assert first.finish_s == pytest.approx(0.1 + 0.09)
    assert second.start_s == 0.0
    assert third.start_s == pytest.approx(first.finish_s)  # queued, FIFO
    assert third.ttft(arrivals[2]) == pytest.approx(first.finish_s + 0.1 - 0.05)


def test_fifo_order_is_kept_under_load():
    timing = TimingConfig(prefill_tokens_per_s=1000.0, decode_s_per_token=0.0, max_running=1)
    arrivals = [Arrival(0.0, 100 * (5 - i), 1) for i in range(5)]  # later ones are shorter
    starts = [o.start_s for o in simulate(timing, arrivals)]
    assert starts == sorted(starts)
    assert starts == pytest.approx([0.0, 0.5, 0.9, 1.2, 1.4])


def test_invalid_timing_lists_every_problem():
    with pytest.raises(ConfigError) as info:
        TimingConfig(prefill_tokens_per_s=0, decode_s_per_token=-1, max_running=0)
    assert len(info.value.problems) == 3
