"""Figures of one replay: per-router summary of the request records, and its tables.

``summarize(results, params, engines, ledger)`` -> the per-router figures (hit rate,
TTFT, its parts, prefill tokens, duplicated blocks, req/s, load spread, utilization, ledger
accuracy); ``table`` (terminal) and ``markdown`` (perf/RESULTS.md) print a comparison. Pure.
"""

from __future__ import annotations

from typing import Any


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)] if ordered else 0.0


def summarize(results: list[Any], p: Any, engines: int, ledger: dict | None) -> dict:
    ok = [r for r in results if r.status == 200]
    ttft = [r.ttft_s * 1000 for r in ok]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    per_worker: dict[str, int] = {}
    for r in ok:
        per_worker[r.worker] = per_worker.get(r.worker, 0) + 1
    span = max((max((r.sent_s + r.total_s for r in ok), default=0.0)
                - min((r.sent_s for r in ok), default=0.0)), 1e-9)
    # Busy slot time as the engines' timing model has it: prefill of the uncached tokens,
    # then one decode step per output token after the first.
    busy = sum((r.prompt_tokens - r.cached_tokens) / p.prefill_tokens_per_s
               + max(r.output_tokens - 1, 0) * p.decode_ms_per_token / 1000 for r in ok)
    own = [(r.prompt_tokens - r.cached_tokens) / p.prefill_tokens_per_s * 1000 for r in ok]
    wait = [t - o for t, o in zip(ttft, own)]  # queueing + transport, beyond its own prefill
    predicted = [r for r in ok if r.predicted is not None]
    exact = sum(1 for r in predicted if r.predicted == r.cached_tokens)
    mean_load = len(ok) / engines if engines else 0.0
    modes: dict[str, int] = {}
    for r in ok:
        modes[r.mode or "-"] = modes.get(r.mode or "-", 0) + 1
    return {
        "requests": len(results), "failed": len(results) - len(ok),
        "hit_rate": round(cached / prompt, 4) if prompt else 0.0,
        "ttft_ms": {"mean": round(sum(ttft) / len(ttft), 1) if ttft else 0.0,
                    "p50": round(_pct(ttft, 0.5), 1), "p99": round(_pct(ttft, 0.99), 1)},
        "ttft_parts_ms": {"own_prefill_mean": round(sum(own) / len(own), 1) if own else 0.0,
                          "wait_mean": round(sum(wait) / len(wait), 1) if wait else 0.0,
                          "wait_p99": round(_pct(wait, 0.99), 1)},
        "prompt_tokens": prompt, "prefill_tokens": prompt - cached,
        "duplicated_blocks": None if ledger is None else ledger["duplicated_blocks"],
        "blocks_held": None if ledger is None else ledger["blocks_held"],
        "req_per_s": round(len(ok) / span, 2),
        "load_spread": round(max(per_worker.values(), default=0) / mean_load, 3)
        if mean_load else 0.0,
        "per_worker": dict(sorted(per_worker.items())),
        "modes": modes,
        "utilization": round(busy / (engines * p.max_running * span), 3),
        "client_late_ms_p99": round(_pct([r.late_s * 1000 for r in results], 0.99), 1),
        "ledger": {"predicted": len(predicted),
                   "exact_share": round(exact / len(predicted), 4) if predicted else None,
                   "abs_error_tokens": sum(abs(r.predicted - r.cached_tokens)
                                           for r in predicted)},
    }


def table(result: dict) -> str:
    cols = ("hit", "ttft mean", "p50", "p99", "prefill tok", "dup blocks", "req/s", "spread",
            "util", "ledger exact")
    lines = [f"{'router':<16}" + "".join(f"{c:>13}" for c in cols)]
    for name, r in result["routers"].items():
        exact = r["ledger"]["exact_share"]
        cells = (f"{r['hit_rate']:.1%}", f"{r['ttft_ms']['mean']:.0f} ms",
                 f"{r['ttft_ms']['p50']:.0f} ms", f"{r['ttft_ms']['p99']:.0f} ms",
                 f"{r['prefill_tokens']:,}", f"{r['duplicated_blocks']:,}",
                 f"{r['req_per_s']:.1f}", f"{r['load_spread']:.2f}", f"{r['utilization']:.0%}",
                 "-" if exact is None else f"{exact:.1%}")
        lines.append(f"{name:<16}" + "".join(f"{c:>13}" for c in cells))
    return "\n".join(lines)


def markdown(result: dict) -> str:
    """The comparison as a Markdown table (perf/RESULTS.md)."""
    head = ("| router | hit rate | TTFT mean | p50 | p99 | wait mean (p99) | prefill tokens "
            "| dup blocks | req/s | load max/mean | util | ledger exact |")
    lines = [head, "|" + "|".join("---" for _ in range(head.count("|") - 1)) + "|"]
    for name, r in result["routers"].items():
        exact = r["ledger"]["exact_share"]
        t, w = r["ttft_ms"], r["ttft_parts_ms"]
        lines.append(
            f"| {name} | {r['hit_rate']:.1%} | {t['mean']:.0f} ms | {t['p50']:.0f} ms "
            f"| {t['p99']:.0f} ms | {w['wait_mean']:.0f} ({w['wait_p99']:.0f}) ms "
            f"| {r['prefill_tokens']:,} | {r['duplicated_blocks']:,} | {r['req_per_s']:.1f} "
            f"| {r['load_spread']:.2f} | {r['utilization']:.0%} "
            f"| {'-' if exact is None else f'{exact:.1%}'} |")
    return "\n".join(lines)


