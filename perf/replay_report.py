"""Figures of one replay: per-router summary of the request records, and its tables.

``summarize(results, params, engines, ledger, roles)`` -> the per-router figures (hit rate,
TTFT, its parts, prefill tokens, duplicated blocks, req/s, load spread, work spread,
utilization, ledger accuracy); ``table`` (terminal) and ``markdown`` (perf/RESULTS.md) print a comparison, and
``pd_notes`` what the columns mean for a prefill/decode row. Pure.

A prefill/decode cluster (``roles`` given: worker -> both | prefill | decode) is read per leg:

* a request's prefill engine is its ``prefill_worker`` (none when Cortex let the decode
  engine serve it alone: vLLM bypass), its decode engine the one that answered (``worker``);
* hit rate, prefill tokens, wait and ledger exactness use ``cached_tokens``, which for a PD
  request is the prefill engine's report (the engine that computed the prefill), compared with
  Cortex's prediction for its prefill pick;
* load spread and utilization are per pool: the table shows the prefill pool's (prefill legs
  per prefill engine; prefill time over the prefill engines' slots), the JSON both;
* duplicated blocks: the table shows the prefill pool's; vLLM decode engines also cache every
  prompt they receive (``by_pool`` in the JSON).
"""

from __future__ import annotations

from typing import Any

from perf.benchkit import percentile


def _pool(counts: dict[str, int], workers: list[str]) -> float:
    """Busiest worker's requests / the pool's mean (workers with none count as 0)."""
    mean = sum(counts.get(w, 0) for w in workers) / len(workers) if workers else 0.0
    return round(max((counts.get(w, 0) for w in workers), default=0) / mean, 3) if mean else 0.0


def _work_spread(ok: list[Any], p: Any, workers: list[str]) -> float:
    """Busiest engine's busy time / the mean over ``workers``, with busy time as the engines'
    timing model has it: prefill of the uncached tokens (on the prefill engine of a PD
    request), one decode step per output token after the first (on the answering engine). A
    router that balances work rather than request counts shows it here."""
    busy: dict[str, float] = {}
    for r in ok:
        own_prefill = (r.prompt_tokens - r.cached_tokens) / p.prefill_tokens_per_s
        decode_time = max(r.output_tokens - 1, 0) * p.decode_ms_per_token / 1000
        prefill_on = getattr(r, "prefill_worker", "") or r.worker
        busy[prefill_on] = busy.get(prefill_on, 0.0) + own_prefill
        busy[r.worker] = busy.get(r.worker, 0.0) + decode_time
    mean = sum(busy.get(w, 0.0) for w in workers) / len(workers) if workers else 0.0
    return round(max(busy.get(w, 0.0) for w in workers) / mean, 3) if mean else 0.0


def _pd_figures(ok: list[Any], p: Any, roles: dict[str, str], ledger: dict | None,
                span: float) -> dict:
    """The per-pool figures of a PD run (module docstring)."""
    prefill = sorted(w for w, r in roles.items() if r == "prefill")
    decode = sorted(w for w, r in roles.items() if r == "decode")
    prefill_legs: dict[str, int] = {}
    decode_legs: dict[str, int] = {}
    prefill_busy = decode_busy = 0.0
    for r in ok:
        own_prefill = (r.prompt_tokens - r.cached_tokens) / p.prefill_tokens_per_s
        decode_time = max(r.output_tokens - 1, 0) * p.decode_ms_per_token / 1000
        decode_legs[r.worker] = decode_legs.get(r.worker, 0) + 1
        if r.prefill_worker:
            prefill_legs[r.prefill_worker] = prefill_legs.get(r.prefill_worker, 0) + 1
            prefill_busy += own_prefill
            decode_busy += decode_time  # + the KV transfer, ~0 at the sim's 2M tokens/s
        else:  # decode alone: it prefilled the rest itself
            decode_busy += own_prefill + decode_time
    by_role = (ledger or {}).get("by_role", {})
    return {
        "prefill_engines": len(prefill), "decode_engines": len(decode),
        "bypassed": sum(1 for r in ok if not r.prefill_worker),
        "load_spread": {"prefill": _pool(prefill_legs, prefill),
                        "decode": _pool(decode_legs, decode)},
        "utilization": {
            "prefill": round(prefill_busy / (len(prefill) * p.engine_slots() * span), 3)
            if prefill else 0.0,
            "decode": round(decode_busy / (len(decode) * p.engine_slots() * span), 3)
            if decode else 0.0},
        "duplicated_blocks": {role: by_role[role]["duplicated_blocks"] for role in by_role},
        "blocks_held": {role: by_role[role]["blocks_held"] for role in by_role},
        "answer_cached_tokens": sum(r.answer_cached_tokens for r in ok),
        "counters": (ledger or {}).get("pd"),
    }


def killed_figures(results: list[Any], at_s: float) -> dict:
    """A replica killed ``at_s`` into the schedule: the requests that failed — in flight then
    (through it, or on the way), or sent after (through the others) — and the token hit rate
    of the requests sent before and after."""
    def hit(rs: list[Any]) -> float | None:
        prompt = sum(r.prompt_tokens for r in rs)
        return round(sum(r.cached_tokens for r in rs) / prompt, 4) if prompt else None
    failed = [r for r in results if r.status != 200]
    ok = [r for r in results if r.status == 200]
    return {"at_s": round(at_s, 2),
            "failed_in_flight": sum(1 for r in failed if r.sent_s <= at_s <= r.sent_s + r.total_s),
            "failed_before": sum(1 for r in failed if r.sent_s + r.total_s < at_s),
            "failed_after": sum(1 for r in failed if r.sent_s > at_s),
            "hit_before": hit([r for r in ok if r.sent_s <= at_s]),
            "hit_after": hit([r for r in ok if r.sent_s > at_s])}


def summarize(results: list[Any], p: Any, engines: int, ledger: dict | None,
              roles: dict[str, str] | None = None) -> dict:
    """One router's figures; ``roles`` (worker -> role) for a PD cluster."""
    ok = [r for r in results if r.status == 200]
    ttft = [r.ttft_s * 1000 for r in ok]
    gaps = [gap * 1000 for r in ok for gap in getattr(r, "gaps_s", ())]  # inter-token, ms
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    per_worker: dict[str, int] = {}  # PD: each worker's legs in its role
    for r in ok:
        per_worker[r.worker] = per_worker.get(r.worker, 0) + 1
        if getattr(r, "prefill_worker", ""):
            per_worker[r.prefill_worker] = per_worker.get(r.prefill_worker, 0) + 1
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
    pd = _pd_figures(ok, p, roles, ledger, span) if roles else None
    # every engine of the cluster (one that got nothing counts as idle), or the prefill pool
    worker_names = (sorted(w for w, role in roles.items() if role == "prefill") if roles
                    else sorted(per_worker) + [""] * max(engines - len(per_worker), 0))
    summary = {
        "requests": len(results), "failed": len(results) - len(ok),
        "hit_rate": round(cached / prompt, 4) if prompt else 0.0,
        "itl_ms": {"p50": round(percentile(gaps, 0.5), 2),
                   "p99": round(percentile(gaps, 0.99), 2)},
        "output_tokens_per_s": round(sum(r.output_tokens for r in ok) / span, 1),
        "ttft_ms": {"mean": round(sum(ttft) / len(ttft), 1) if ttft else 0.0,
                    "p50": round(percentile(ttft, 0.5), 1),
                    "p99": round(percentile(ttft, 0.99), 1)},
        "ttft_parts_ms": {"own_prefill_mean": round(sum(own) / len(own), 1) if own else 0.0,
                          "wait_mean": round(sum(wait) / len(wait), 1) if wait else 0.0,
                          "wait_p99": round(percentile(wait, 0.99), 1)},
        "prompt_tokens": prompt, "prefill_tokens": prompt - cached,
        "duplicated_blocks": None if ledger is None else ledger["duplicated_blocks"],
        "blocks_held": None if ledger is None else ledger["blocks_held"],
        "req_per_s": round(len(ok) / span, 2),
        "load_spread": round(max(per_worker.values(), default=0) / mean_load, 3)
        if mean_load else 0.0,
        "work_spread": _work_spread(ok, p, worker_names),
        "per_worker": dict(sorted(per_worker.items())),
        "modes": modes,
        "utilization": round(busy / (engines * p.engine_slots() * span), 3),
        "client_late_ms_p99": round(percentile([r.late_s * 1000 for r in results], 0.99), 1),
        "ledger": {"predicted": len(predicted),
                   "exact_share": round(exact / len(predicted), 4) if predicted else None,
                   # false hits: predicted more cached tokens than the engine reported
                   "over_share": round(sum(r.predicted > r.cached_tokens for r in predicted)
                                       / len(predicted), 4) if predicted else None,
                   "abs_error_tokens": sum(abs(r.predicted - r.cached_tokens)
                                           for r in predicted)},
    }
    if pd is not None:  # the table's columns for a PD row: the prefill pool's figures
        summary["pd"] = pd
        summary["load_spread"] = pd["load_spread"]["prefill"]
        summary["utilization"] = pd["utilization"]["prefill"]
        if pd["duplicated_blocks"].get("prefill") is not None:
            summary["duplicated_blocks"] = pd["duplicated_blocks"]["prefill"]
    return summary


def pd_notes(result: dict) -> str:
    """What the columns of each PD row mean, and its decode pool's figures."""
    lines = []
    for name, r in result["routers"].items():
        pd = r.get("pd")
        if pd is None:
            continue
        lines.append(
            f"{name}: {pd['prefill_engines']} prefill + {pd['decode_engines']} decode engines "
            f"(same total). hit / prefill tok / ledger exact: the prefill engine's "
            f"cached_tokens vs Cortex's prediction for its prefill pick ({pd['bypassed']} "
            f"requests served by decode alone count decode's own report); spread / util / dup "
            f"blocks: the prefill pool's. Decode pool: spread "
            f"{pd['load_spread']['decode']:.2f}, util {pd['utilization']['decode']:.0%}, "
            f"dup blocks {pd['duplicated_blocks'].get('decode', 0):,} (vLLM decode caches the "
            f"prompts it receives); cached tokens the answering decode engines reported: "
            f"{pd['answer_cached_tokens']:,}.")
    return "\n".join(lines)


def table(result: dict) -> str:
    cols = ("hit", "ttft mean", "p50", "p99", "itl p99", "prefill tok", "dup blocks", "req/s",
            "spread", "work spread", "util", "ledger exact", "false hits", "preempted")
    lines = [f"{'router':<16}" + "".join(f"{c:>13}" for c in cols)]
    for name, r in result["routers"].items():
        exact = r["ledger"]["exact_share"]
        cells = (f"{r['hit_rate']:.1%}", f"{r['ttft_ms']['mean']:.0f} ms",
                 f"{r['ttft_ms']['p50']:.0f} ms", f"{r['ttft_ms']['p99']:.0f} ms",
                 f"{r.get('itl_ms', {}).get('p99', 0.0):.0f} ms", f"{r['prefill_tokens']:,}", f"{r['duplicated_blocks']:,}",
                 f"{r['req_per_s']:.1f}", f"{r['load_spread']:.2f}",
                 f"{r.get('work_spread', 0.0):.2f}", f"{r['utilization']:.0%}",
                 "-" if exact is None else f"{exact:.1%}",
                 "-" if r["ledger"].get("over_share") is None
                 else f"{r['ledger']['over_share']:.1%}",
                 "-" if r.get("preemptions") is None else f"{r['preemptions']:,}")
        lines.append(f"{name:<16}" + "".join(f"{c:>13}" for c in cells))
    notes = pd_notes(result)
    return "\n".join(lines) + ("\n" + notes if notes else "")


def markdown(result: dict) -> str:
    """The comparison as a Markdown table (perf/RESULTS.md)."""
    head = ("| router | hit rate | TTFT mean | p50 | p99 | wait mean (p99) | ITL p50 / p99 "
            "| out tok/s | prefill tokens | dup blocks | req/s | load max/mean | work max/mean "
            "| util | ledger exact |")
    lines = [head, "|" + "|".join("---" for _ in range(head.count("|") - 1)) + "|"]
    for name, r in result["routers"].items():
        exact = r["ledger"]["exact_share"]
        t, w, itl = r["ttft_ms"], r["ttft_parts_ms"], r.get("itl_ms", {})
        lines.append(
            f"| {name} | {r['hit_rate']:.1%} | {t['mean']:.0f} ms | {t['p50']:.0f} ms "
            f"| {t['p99']:.0f} ms | {w['wait_mean']:.0f} ({w['wait_p99']:.0f}) ms "
            f"| {itl.get('p50', 0.0):.1f} / {itl.get('p99', 0.0):.1f} ms "
            f"| {r.get('output_tokens_per_s', 0.0):.0f} | {r['prefill_tokens']:,} | {r['duplicated_blocks']:,} | {r['req_per_s']:.1f} "
            f"| {r['load_spread']:.2f} | {r.get('work_spread', 0.0):.2f} "
            f"| {r['utilization']:.0%} "
            f"| {'-' if exact is None else f'{exact:.1%}'} |")
    notes = pd_notes(result)
    return "\n".join(lines) + ("\n\n" + notes if notes else "")


