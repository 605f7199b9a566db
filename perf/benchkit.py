"""Shared by the benchmarks: what machine a result came from, and latency percentiles."""

from __future__ import annotations

import os
import platform


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


def percentiles_us(samples_ns: list[int]) -> dict[str, float]:
    """Count, p50, p90, p99 and max of nanosecond samples, in microseconds."""
    ordered = sorted(samples_ns)

    def pick(q: float) -> float:
        return round(ordered[min(int(q * len(ordered)), len(ordered) - 1)] / 1000, 3)

    return {"n": len(ordered), "p50": pick(0.50), "p90": pick(0.90), "p99": pick(0.99),
            "max": pick(1.0)}
