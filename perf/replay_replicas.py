"""Cortex as operators deploy it: N replicas behind one port, against one replica.

For each workload, each N of ``--replicas`` and (N > 1) without and with the replicas telling
each other their requests in flight (``--sync``; ``cortex.replicas``), one ``perf/replay.py``
run of Cortex alone (``--replicas N``: N gateway processes bound to one port with
``SO_REUSEPORT``, the kernel spreading the client's connections among them by a hash of their addresses; each replica
subscribes to every engine and keeps its own ledger and its own count of requests in flight),
on a fresh cluster of the cell's engines (``perf/replay_matrix.py``'s cell parameters: the
same workloads, cache regimes and loads). The client's keep-alive connections are reused in
any order, so a conversation's next turn may go to another replica than its last one, and a
herd's requests reach every replica at once.

Per cell and N: token hit rate, TTFT mean / p99, load spread (max / mean requests per
engine), Cortex's exact predictions and false hits; and each N against N = 1 of the same
cell (``vs_one``: hit-rate ratio, TTFT mean and p99 ratios). The replicas share the 2 vCPUs
of this machine with the engines and the client: N processes cost CPU that one does not;
``--gateway-cpus 0 --engine-cpus 1`` keeps the engines' CPU apart, so their speed does not
depend on N.

Usage: ``python -m perf.replay_replicas --out DIR [--workloads conversation,herd,gsp,agentic]
[--caches all] [--loads 0.5] [--replicas 1,2,4] [--sync 0,1] [--gateway-cpus L]
[--engine-cpus L] [--client-cpus L]``; a cell already in ``DIR`` is not run again;
``--render DIR`` prints the table as Markdown.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields, replace
from pathlib import Path

from perf import replay
from perf.replay_matrix import WORKLOADS, cell_name, cell_params
from perf.replay_workload import Params


def run(out: Path, workloads: list[str], caches: list[str], loads: list[float],
        counts: list[int], syncs: list[int], extra: dict[str, object] | None = None) -> None:
    """``extra``: more ``replay_workload.Params`` fields for every cell (CPU pins, cost)."""
    out.mkdir(parents=True, exist_ok=True)
    log = lambda message: print(message, file=sys.stderr, flush=True)
    for workload in workloads:
        for cache in caches:
            for load in loads:
                for n in counts:
                    for sync in syncs if n > 1 else [0]:
                        path = out / f"{cell_name(workload, cache, load)}-x{n}-s{sync}.json"
                        if path.exists():
                            continue
                        p = replace(cell_params(workload, cache, load), replicas=n,
                                    replica_sync=sync, **(extra or {}))
                        log(f"{path.stem}: ...")
                        result = replay.compare(p, ["cortex"], log=log)
                        path.write_text(json.dumps(result, indent=1))


def _row(result: dict) -> dict:
    cortex = result["routers"]["cortex"]
    return {"hit": cortex["hit_rate"], "mean": cortex["ttft_ms"]["mean"],
            "p99": cortex["ttft_ms"]["p99"], "spread": cortex["load_spread"],
            "exact": cortex["ledger"]["exact_share"], "over": cortex["ledger"]["over_share"],
            "failed": cortex["failed"]}


def render(out: Path) -> str:
    cells: dict[str, dict[tuple[int, int], dict]] = {}
    for path in sorted(out.glob("*-x*-s*.json")):
        cell, rest = path.stem.rsplit("-x", 1)
        n, sync = rest.split("-s")
        cells.setdefault(cell, {})[int(n), int(sync)] = _row(json.loads(path.read_text()))
    lines = ["| cell | replicas | sharing | hit | TTFT mean / p99 ms | spread | exact / false "
             "hits | vs one: hit, mean, p99 | failed |", "|---|---|---|---|---|---|---|---|---|"]
    for cell, rows in cells.items():
        one = rows.get((1, 0))
        for (n, sync), row in sorted(rows.items()):
            versus = "—" if one is None or n == 1 else (
                f"{row['hit'] / one['hit']:.3f}x, {row['mean'] / one['mean']:.2f}x, "
                f"{row['p99'] / one['p99']:.2f}x" if one["hit"] and one["mean"] else "—")
            exact = "—" if row["exact"] is None else f"{row['exact']:.1%} / {row['over']:.1%}"
            lines.append(f"| {cell} | {n} | {'yes' if sync else 'no'} | {row['hit']:.1%} | "
                         f"{row['mean']:,.0f} / "
                         f"{row['p99']:,.0f} | {row['spread']:.2f} | {exact} | {versus} | "
                         f"{row['failed']} |")
    return "\n".join(lines)


def params(pairs: list[str]) -> dict[str, object]:
    """``FIELD=VALUE`` pairs as ``replay_workload.Params`` fields, each of its field's type."""
    types = {f.name: type(f.default) for f in fields(Params)}
    out: dict[str, object] = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name not in types:
            raise SystemExit(f"--param {pair}: no replay parameter {name!r}")
        out[name] = types[name](value)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="")
    parser.add_argument("--render", default="", help="print a run's directory as Markdown")
    parser.add_argument("--workloads", default="conversation,herd,gsp,agentic")
    parser.add_argument("--caches", default="all")
    parser.add_argument("--loads", default="0.5")
    parser.add_argument("--replicas", default="1,2,4")
    parser.add_argument("--param", action="append", default=[], metavar="FIELD=VALUE",
                        help="another replay parameter for every cell (e.g. tie_band_s=0.05)")
    for pin in ("gateway", "engine", "client"):
        parser.add_argument(f"--{pin}-cpus", default="",
                            help=f"taskset -c list the {pin} processes run on (default: any)")
    parser.add_argument("--sync", default="0,1",
                        help="replicas without (0) and with (1) sharing their requests")
    args = parser.parse_args(argv)
    if args.render:
        print(render(Path(args.render)))
        return 0
    if not args.out:
        parser.error("give --out DIR (or --render DIR)")
    workloads = args.workloads.split(",")
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads: {sorted(unknown)}")
    run(Path(args.out), workloads, args.caches.split(","),
        [float(x) for x in args.loads.split(",")], [int(x) for x in args.replicas.split(",")],
        [int(x) for x in args.sync.split(",")],
        {**{f"{pin}_cpus": getattr(args, f"{pin}_cpus") for pin in ("gateway", "engine",
                                                                     "client")},
         **params(args.param)})
    print(render(Path(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
