"""CPU per request of two Cortex checkouts in front of the same mocks, measured alternately.

The gateway benchmark's ``cpu_us_per_request`` comes from one throughput phase per system, so a
neighbour's burst lands on one system and not the other; here the same load is driven at this
checkout's Cortex and at ``--baseline``'s (both started at once, as ``perf/bench_gateway.py``
starts them, KV-event mocks included) in alternating rounds, and each round's CPU (``/proc``
utime + stime of the ``cortex serve`` process) is divided by its requests.

Each round (each system first in every other round): a 1 s warm-up drive, then ``--seconds`` of back-to-back chat requests (small
bodies, ``perf/bench_gateway.py``'s client) on ``--connections`` keep-alive connections.

Usage: ``python -m perf.bench_cpu_ab --baseline <checkout> [--connections 64] [--seconds 5]
[--rounds 4] [--baseline-python PY]`` (JSON on stdout); without ``--baseline`` this checkout
is its own baseline (a sanity run: the ratio is noise); ``--quick``: a smoke run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import trio

from perf import peers
from perf.bench_gateway import MODEL, cpu_s, drive
from perf.benchkit import machine_info
from tests import deepseek_profile as ds

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--baseline", type=Path, default=HERE.parent,
                        help="the other checkout (its extensions built); default: this one")
    parser.add_argument("--baseline-python", default=sys.executable)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="smoke run (4 connections, 1 round)")
    args = parser.parse_args()
    if args.quick:
        args.connections, args.seconds, args.rounds = 4, 0.5, 1
    workdir = tempfile.mkdtemp(prefix="bench-cpu-ab-")
    template = os.path.join(workdir, "chat_template.jinja")
    with open(template, "w") as f:
        f.write(ds.TEMPLATE)
    started: list[peers.Running] = []
    try:
        mocks = [peers.start_mock(MODEL, f"mock{i}", kv_events=True) for i in range(2)]
        started += mocks
        systems = {
            "cortex": peers.start_cortex(mocks, MODEL, ds.TOKENIZER_JSON, template),
            "cortex-baseline": peers.start_cortex(mocks, MODEL, ds.TOKENIZER_JSON, template,
                                                  "cortex-baseline", args.baseline.resolve(),
                                                  args.baseline_python),
        }
        started += systems.values()
        load_before = [round(x, 2) for x in os.getloadavg()]
        rounds: dict[str, list[float]] = {name: [] for name in systems}
        for index in range(args.rounds):
            order = list(systems.items())
            if index % 2:  # each system goes first in every other round
                order.reverse()
            for name, running in order:
                trio.run(drive, running.port, 1.0, args.connections, False)
                before = cpu_s(running.pids())
                done = trio.run(drive, running.port, args.seconds, args.connections, False)
                used = cpu_s(running.pids()) - before
                rounds[name].append(round(used / done["requests"] * 1e6, 1))
        result = {
            "benchmark": "cpu_ab",
            "baseline": {"checkout": str(args.baseline.resolve()),
                         "python": args.baseline_python},
            "connections": args.connections, "seconds": args.seconds,
            "cpu_us_per_request": rounds,
            "median": {name: statistics.median(values) for name, values in rounds.items()},
            "ratio_median": round(statistics.median(rounds["cortex"])
                                  / statistics.median(rounds["cortex-baseline"]), 3),
            "load_average_before": load_before,
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "machine": machine_info(),
        }
    finally:
        for running in started:
            running.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
