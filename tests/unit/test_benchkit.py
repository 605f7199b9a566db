"""perf/benchkit.py's ``percentile``: the one percentile of perf/, linear interpolation."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perf.benchkit import percentile, percentiles_us


def test_linear_interpolation_between_the_nearest_ranks():
    values = [40.0, 10.0, 30.0, 20.0]  # sorted: positions 0..3
    assert percentile(values, 0.0) == 10.0
    assert percentile(values, 0.5) == 25.0  # position 1.5: the mean of the middle two
    assert percentile(values, 0.9) == pytest.approx(37.0)  # position 2.7
    assert percentile(values, 1.0) == 40.0
    assert percentile([0.0004, 0.0003, 0.0005], 0.5) == 0.0004  # on a value: that value
    assert percentile([7], 0.99) == 7
    assert percentile([], 0.5) == 0.0


def test_q_outside_zero_to_one_is_refused():
    with pytest.raises(ValueError):
        percentile([1.0], 99)


@given(st.lists(st.floats(-1e6, 1e6), min_size=2, max_size=50))
def test_agrees_with_the_standard_library_s_inclusive_quantiles(values):
    """``statistics.quantiles(method="inclusive")`` is the same definition (numpy's default)."""
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    for index, cut in enumerate(cuts, start=1):
        assert percentile(values, index / 100) == pytest.approx(cut, abs=1e-6)
    assert percentile(values, 0.5) == pytest.approx(statistics.median(values), abs=1e-6)


def test_percentiles_us_keeps_its_shape():
    assert percentiles_us([1000, 2000, 3000, 4000]) == {
        "n": 4, "p50": 2.5, "p90": 3.7, "p99": 3.97, "max": 4.0}
