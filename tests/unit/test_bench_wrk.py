"""perf/bench_wrk.py: wrk's coordinated-omission correction undone exactly on its histogram."""

from __future__ import annotations

import random

from perf.bench_wrk import percentile, uncorrect


def wrk_correct(raw: dict[int, int], expected: int) -> dict[int, int]:
    """wrk's ``stats_correct`` (src/stats.c), transcribed: every sample ``n >= 2e`` adds one at
    ``n - e``, ``n - 2e``, ... while above ``e``."""
    data = dict(raw)
    for n in range(expected * 2, max(raw) + 1):
        count = raw.get(n, 0)  # data[n] is still raw here: additions land below n
        m = n - expected
        while count and m > expected:
            data[m] = data.get(m, 0) + count
            m -= expected
    return data


def test_uncorrect_gives_back_the_recorded_samples() -> None:
    rng = random.Random(7)
    for _ in range(200):
        expected = rng.randint(1, 50)
        raw: dict[int, int] = {}
        for _ in range(rng.randint(1, 300)):
            value = rng.choice([rng.randint(1, 3 * expected), rng.randint(1, 40 * expected)])
            raw[value] = raw.get(value, 0) + rng.randint(1, 3)
        corrected = sorted(wrk_correct(raw, expected).items())
        assert uncorrect(corrected, expected) == sorted(raw.items())


def test_percentile_is_wrks_rank() -> None:
    histogram = [(10, 98), (20, 1), (500, 1)]  # 100 samples; rank = C's round(p% of 100 + 0.5)
    assert percentile(histogram, 50) == 10
    assert percentile(histogram, 98) == 20  # rank 99
    assert percentile(histogram, 99) == 500  # rank 100
    assert percentile([(1, 2), (2, 2)], 50) == 2  # rank round(2.5) = 3 in C (Python's: 2)
