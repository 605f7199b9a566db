"""Shared by the benchmarks: what machine a result came from, and percentiles."""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Iterable


def machine_info() -> dict[str, object]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile (0 <= q <= 1: 0.5 for p50, 0.99 for p99) of ``values``, by linear
    interpolation between the two nearest ranks — numpy's default (``method="linear"``,
    Hyndman & Fan's type 7): the sorted values sit at positions 0 .. n-1 and the quantile is
    read at position ``q * (n - 1)``. So p50 of an even count is the mean of the middle two,
    ``q=0`` the least value, ``q=1`` the greatest; a position that falls on a value gives that
    value exactly. 0.0 for no values.

    The one percentile of perf/ (the replays' reports, every benchmark's p50/p90/p99);
    ``bench_wrk.percentile`` is apart: it reproduces wrk's own rule over wrk's histogram."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must lie in [0, 1], not {q}")
    ordered = sorted(values)
    if not ordered:
        return 0.0
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def percentiles_us(samples_ns: Iterable[int]) -> dict[str, float]:
    """Count, p50, p90, p99 and max of nanosecond samples, in microseconds (``percentile``)."""
    ordered = sorted(samples_ns)
    return {"n": len(ordered),
            **{name: round(percentile(ordered, q) / 1000, 3)
               for name, q in (("p50", 0.50), ("p90", 0.90), ("p99", 0.99), ("max", 1.0))}}
