"""Routing quality on continuous-batching engines, every workload x cache x load, every router.

One cell = one ``perf/replay.py`` comparison (every router in the same run, each on a fresh
cluster of 8 batching engines, 4 vLLM + 4 SGLang, timed by the default GPU profile): a
workload (``conversation``, ``synthetic`` — Mooncake traces; ``gsp`` — SGLang's shared-prefix
benchmark; ``herd`` — herds of one new prefix at once; ``agentic`` — closed-loop agent
sessions), a cache regime (``all``: every engine can hold the whole slice, nothing is ever
evicted; ``15%``: the cluster holds 15% of the slice's unique blocks, each engine at least
its longest prompt, as vLLM requires to start) and a load (the share of the cluster's time round robin would keep
busy, estimated offline: 0.5 and 0.85).

Usage: ``python -m perf.replay_matrix --out DIR [--workloads ...] [--caches all,15%]
[--loads 0.5,0.85] [--routers ...]``; every cell's JSON goes to ``DIR/<cell>.json`` as it ends
(a cell already there is not run again: a long run can be resumed); ``--render DIR`` prints
the summary and the full table as Markdown.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from perf import replay
from perf.replay_workload import Params

WORKLOADS = {"conversation": {}, "synthetic": {}, "gsp": {}, "herd": {},
             "agentic": {"max_blocks": 128}}
CACHES = ("all", "15%")
LOADS = (0.5, 0.85)
ROUTERS = ("cortex", "round_robin", "consistent_hash", "p2c", "dynamo-ref", "llmd-ref",
           "sglang-router")


def cell_params(workload: str, cache: str, load: float) -> Params:
    p = replace(Params(), trace=workload, utilization=load, capacity_basis="slice",
                **WORKLOADS[workload])
    if cache == "all":
        return replace(p, capacity=float(p.engines))  # each engine: the whole slice
    return replace(p, capacity=float(cache.rstrip("%")) / 100)


def cell_name(workload: str, cache: str, load: float) -> str:
    return f"{workload}-{cache.rstrip('%')}{'pct' if cache.endswith('%') else ''}-{load:g}"


def run(out: Path, workloads: list[str], caches: list[str], loads: list[float],
        routers: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    log = lambda message: print(message, file=sys.stderr, flush=True)
    for workload in workloads:
        for cache in caches:
            for load in loads:
                path = out / f"{cell_name(workload, cache, load)}.json"
                if path.exists():
                    continue
                log(f"cell {path.stem}")
                result = replay.compare(cell_params(workload, cache, load), routers, log=log)
                result["cell"] = {"workload": workload, "cache": cache, "load": load}
                path.write_text(json.dumps(result, indent=1))
                log(replay.table(result))


def _cells(out: Path) -> list[dict]:
    cells = [json.loads(path.read_text()) for path in sorted(out.glob("*.json"))]
    order = {w: i for i, w in enumerate(WORKLOADS)}
    return sorted(cells, key=lambda c: (order.get(c["cell"]["workload"], 99),
                                        CACHES.index(c["cell"]["cache"]), c["cell"]["load"]))


def _label(cell: dict) -> str:
    c = cell["cell"]
    return f"{c['workload']} / {c['cache']} / {c['load']:g}"


def summary(cells: list[dict]) -> str:
    """Per cell: Cortex's figures against the best other router on TTFT mean and on p99."""
    lines = ["| workload / cache / load | Cortex hit | Cortex TTFT mean / p99 ms | best other "
             "mean | best other p99 | Cortex ITL p99 / best other | exact / false hits | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for cell in cells:
        routers = cell["routers"]
        mine = routers.get("cortex")
        others = {name: r for name, r in routers.items() if name != "cortex"}
        if mine is None or not others:
            continue
        best_mean = min(others, key=lambda n: others[n]["ttft_ms"]["mean"])
        best_p99 = min(others, key=lambda n: others[n]["ttft_ms"]["p99"])
        best_itl = min(others, key=lambda n: others[n]["itl_ms"]["p99"])
        lost = []
        for figure, best in (("mean", best_mean), ("p99", best_p99)):
            theirs, ours = others[best]["ttft_ms"][figure], mine["ttft_ms"][figure]
            if ours > theirs:
                lost.append(f"{figure} to {best} (+{ours / theirs - 1:.0%})")
        itl_ok = mine["itl_ms"]["p99"] <= others[best_itl]["itl_ms"]["p99"]
        verdict = "lowest mean and p99" if not lost else "loses " + ", ".join(lost)
        if mine["failed"]:
            verdict += f", {mine['failed']} failed"
        lines.append(
            f"| {_label(cell)} | {mine['hit_rate']:.1%} | {mine['ttft_ms']['mean']:,.0f} / "
            f"{mine['ttft_ms']['p99']:,.0f} | {best_mean} {others[best_mean]['ttft_ms']['mean']:,.0f}"
            f" | {best_p99} {others[best_p99]['ttft_ms']['p99']:,.0f} | "
            f"{mine['itl_ms']['p99']:,.0f} / {others[best_itl]['itl_ms']['p99']:,.0f}"
            f"{'' if itl_ok else ' (worse)'} | {_prediction(mine)} | "
            f"{verdict} |")
    return "\n".join(lines)


def _prediction(router: dict) -> str:
    """Exact predictions / false hits (predicted more than the engine reported) of a router."""
    exact, over = router["ledger"]["exact_share"], router["ledger"].get("over_share")
    if exact is None:
        return "-"
    return f"{exact:.1%}" + ("" if over is None else f" / {over:.1%}")


def full_table(cells: list[dict]) -> str:
    lines = ["| workload / cache / load | router | hit | TTFT mean / p50 / p99 ms | ITL p50 / p99 "
             "ms | out tok/s | spread | exact / false hits | failed |", "|---|---|---|---|---|---|---|---|---|"]
    for cell in cells:
        for name, r in cell["routers"].items():
            t, i = r["ttft_ms"], r["itl_ms"]
            lines.append(
                f"| {_label(cell)} | {name} | {r['hit_rate']:.1%} | {t['mean']:,.0f} / "
                f"{t['p50']:,.0f} / {t['p99']:,.0f} | {i['p50']:,.1f} / {i['p99']:,.0f} | "
                f"{r['output_tokens_per_s']:,.0f} | {r['load_spread']:.2f} | "
                f"{_prediction(r)} | {r['failed']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="")
    parser.add_argument("--render", default="", help="print a run's directory as Markdown")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--caches", default=",".join(CACHES))
    parser.add_argument("--loads", default=",".join(f"{load:g}" for load in LOADS))
    parser.add_argument("--routers", default=",".join(ROUTERS))
    args = parser.parse_args(argv)
    if args.render:
        cells = _cells(Path(args.render))
        print(summary(cells) + "\n\n" + full_table(cells))
        return 0
    if not args.out:
        parser.error("give --out DIR (or --render DIR)")
    run(Path(args.out), args.workloads.split(","), args.caches.split(","),
        [float(v) for v in args.loads.split(",")], args.routers.split(","))
    return 0


if __name__ == "__main__":
    sys.exit(main())
