"""Instructions per request of two Cortex checkouts, counted by callgrind: an A/B that this
noisy 2-core machine's CPU time cannot settle.

``perf/bench_cpu_ab.py`` divides CPU seconds by requests; a neighbour's burst or a cache
state moves one round by ±5-10%, so a few-percent difference between two checkouts needs many
rounds and stays uncertain. Callgrind counts the instructions the gateway process executes
(``Ir``), the same for the same code and inputs whatever else the machine does; the cost is
speed (the gateway runs ~50x slower under valgrind), so the load is small and sequential.

For each checkout: the same two mocks with KV-event endpoints (``perf.peers.start_mock``),
``cortex serve`` from that checkout under ``valgrind --tool=callgrind --instr-atstart=no``
(``perf.peers.start_cortex``: ready once it answers a chat completion), ``--warmup``
requests, then counting switched on (``callgrind_control -i on``) for ``--requests`` small
chat requests (``perf/bench_gateway.py``'s bodies) on one connection, off again, dumped.
The figure is the dump's instruction total divided by the requests (Python's own interpreter
included: this is the whole request path as the process runs it, HTTP legs and all).

Usage: ``python -m perf.bench_instructions_ab --baseline <checkout> [--requests 300]
[--warmup 50]`` (JSON on stdout; without ``--baseline`` this checkout is measured twice, a
check that the count repeats).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import trio

from perf import peers
from perf.bench_gateway import MODEL, Bodies, Client
from perf.benchkit import machine_info
from tests import deepseek_profile as ds

HERE = Path(__file__).resolve().parent


async def send(port: int, requests: int) -> None:
    """``requests`` small chat completions, one after another on one connection."""
    bodies = Bodies(25, seed=3)
    client = await Client.connect(port)
    for _ in range(requests):
        await client.post(bodies.next())


def counted(out_file: str) -> int:
    """The instruction total of a callgrind dump (its ``summary:``/``totals:`` line)."""
    total = 0
    for path in glob.glob(out_file + "*"):
        with open(path) as f:
            for line in f:
                if line.startswith(("summary:", "totals:")):
                    total = max(total, int(line.split()[1]))
    return total


def measure(name: str, repo: Path, mocks: list[peers.Running], template: str, workdir: str,
            requests: int, warmup: int) -> float:
    out_file = os.path.join(workdir, f"{name}.callgrind")
    wrapper = ("valgrind", "--tool=callgrind", "--instr-atstart=no",
               f"--callgrind-out-file={out_file}")
    running = peers.start_cortex(mocks, MODEL, ds.TOKENIZER_JSON, template, name, repo,
                                 wrapper=wrapper, ready_timeout_s=900.0)
    try:
        trio.run(send, running.port, warmup)
        pid = str(running.process.pid)
        subprocess.run(["callgrind_control", "-i", "on", pid], check=True, capture_output=True)
        trio.run(send, running.port, requests)
        subprocess.run(["callgrind_control", "-i", "off", pid], check=True, capture_output=True)
        subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)
    finally:
        running.stop()
    total = counted(out_file)
    if not total:
        raise RuntimeError(f"{name}: no callgrind total in {out_file}*")
    return total / requests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--baseline", type=Path, default=HERE.parent,
                        help="the other checkout (its extensions built)")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50)
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    workdir = tempfile.mkdtemp(prefix="bench-instructions-")
    template = os.path.join(workdir, "chat.jinja")
    with open(template, "w") as f:
        f.write(ds.TEMPLATE)
    mocks: list[peers.Running] = []
    try:
        mocks = [peers.start_mock(MODEL, f"mock{i}", kv_events=True) for i in range(2)]
        per_request = {
            "cortex": measure("cortex", HERE.parent, mocks, template, workdir,
                              args.requests, args.warmup),
            "cortex-baseline": measure("cortex-baseline", args.baseline.resolve(), mocks,
                                       template, workdir, args.requests, args.warmup),
        }
    finally:
        for running in mocks:
            running.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    json.dump({
        "benchmark": "instructions_ab", "baseline": str(args.baseline.resolve()),
        "requests": args.requests, "warmup": args.warmup,
        "instructions_per_request": {name: round(value) for name, value in per_request.items()},
        "ratio": round(per_request["cortex"] / per_request["cortex-baseline"], 4),
        "machine": machine_info(),
    }, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
