"""The gateway benchmark's report, computed from its measured figures (``perf/bench_gateway.py``).

* ``added``: each system's round trip (or first byte) minus direct's, per percentile.
* ``targets``: issue 4's targets for Cortex against sglang-router, each "met" / "not met", and
  the informational ``http_floor`` when cortex-passthrough was measured.
* ``versus_baseline``: Cortex's added p50 (and throughput) over the baseline checkout's.
"""

from __future__ import annotations


def added(results: dict[str, object], systems: list[str]) -> None:
    direct = results["direct"]
    for name in systems:
        if name == "direct":
            continue
        mine = results[name]
        for phase, key in (("latency_small", "round_trip_us"), ("latency_large", "round_trip_us"),
                           ("ttfb", "first_byte_us")):
            mine[phase]["added_us"] = {
                q: round(mine[phase][key][q] - direct[phase][key][q], 1)
                for q in ("p10", "p50", "p99")}


def targets(results: dict[str, object]) -> dict[str, object]:
    if "cortex" not in results:
        return {}
    cortex = results["cortex"]
    out: dict[str, object] = {}
    ttfb = cortex["ttfb"]["added_us"]["p50"]
    out["added_ttfb_le_1ms"] = {"cortex_added_p50_us": ttfb,
                                "met": "met" if ttfb <= 1000 else "not met"}
    if "sglang-router" not in results:
        out["vs_sglang_router"] = "skipped (sglang-router not measured)"
        return out
    peer = results["sglang-router"]
    for phase in ("latency_small", "latency_large"):
        ratio = _ratios(cortex[phase]["added_us"], peer[phase]["added_us"], ("p10", "p50", "p99"))
        out[f"added_{phase}_le_1.5x"] = {
            "ratio": ratio, "met": "met" if ratio["p50"] is not None and ratio["p50"] <= 1.5
            else "not met"}
    ratio = round(cortex["throughput_c64"]["req_per_s"]
                  / peer["throughput_c64"]["req_per_s"], 2)
    out["throughput_c64_ge_0.5x"] = {"ratio": ratio, "met": "met" if ratio >= 0.5 else "not met"}
    if "cortex-passthrough" in results:
        out["http_floor"] = http_floor(cortex, results["cortex-passthrough"], peer)
    return out


def http_floor(cortex: dict, floor: dict, peer: dict) -> dict[str, object]:
    """Informational: cortex-passthrough's added latency over sglang-router's (p10, p50), and
    the share of Cortex's added p50 the passthrough floor accounts for."""
    out: dict[str, object] = {}
    for phase in ("latency_small", "latency_large"):
        mine = floor[phase]["added_us"]
        full = cortex[phase]["added_us"]["p50"]
        out[phase] = {
            "vs_sglang_router": _ratios(mine, peer[phase]["added_us"], ("p10", "p50")),
            "share_of_cortex_p50": round(mine["p50"] / full, 2) if full > 0 else None}
    return out


def _ratios(mine: dict, theirs: dict, quantiles: tuple[str, ...]) -> dict[str, float | None]:
    """``mine / theirs`` per quantile, 2 decimals; ``None`` where theirs is not positive."""
    return {q: round(mine[q] / theirs[q], 2) if theirs[q] > 0 else None for q in quantiles}


def versus_baseline(results: dict[str, object]) -> dict[str, float | None]:
    """Cortex's added p50 (and throughput) over the baseline checkout's, same run."""
    mine, base = results["cortex"], results["cortex-baseline"]
    out: dict[str, float | None] = {}
    for phase in ("latency_small", "latency_large", "ttfb"):
        theirs = base[phase]["added_us"]["p50"]
        out[f"{phase}_added_p50"] = (round(mine[phase]["added_us"]["p50"] / theirs, 3)
                                     if theirs > 0 else None)
    out["throughput_c64"] = round(mine["throughput_c64"]["req_per_s"]
                                  / base["throughput_c64"]["req_per_s"], 3)
    return out
