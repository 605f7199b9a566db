"""Cortex and sglang-router under wrk: fresh connections all at once, then back-to-back requests.

Two instant mock workers (``perf/mock_worker.py``, with their empty KV-event publishers, as in
``perf/bench_gateway.py``); in front, each its own process (``perf/peers.py``): Cortex
(``python -m cortex serve``, DeepSeek tokenizer and template, block size 16), sglang-router
(``--policy cache_aware``) and, with ``--baseline DIR``, ``cortex-baseline``: Cortex run from
another checkout (its extensions built). For every cell (duration × connections) each system
gets one ``wrk -t2 -c<N> -d<S>s --latency`` run, the order rotating per cell, so a noisy moment
of the shared VM falls on all of them alike; each system first gets a discarded 1 s run at 64
connections. wrk opens its N connections at once when it starts, so every run begins with a
burst of N new connections (what issue 33 §3 measured: the client's max and p99, not the
gateway's own request times).

Requests: a wrk Lua script POSTs small chat bodies (``bench_gateway.Bodies(25)``: a fixed
system prompt, a user message from a pool with a unique number, ~100 prompt tokens).

Latency, per run, from wrk's histogram (1 µs buckets; dumped by the Lua ``done()``):

* ``corrected``: what wrk reports (``--latency``): wrk adds, for every sample above the
  expected interval ``e = duration / (requests / connections)``, samples at ``v - e``,
  ``v - 2e``, ... (its coordinated-omission correction, ``stats_correct``), so a stall weighs
  as the requests it held back. ``p99_printed`` is wrk's own printed 99% line (a check).
* ``raw``: every request's own time (``c->start`` when it was written, to its last byte),
  uncorrected: the correction undone exactly on the dumped histogram (for ``v > e``,
  ``raw[v] = corrected[v] - corrected[v + e]``; below that nothing was added). ``raw.n``
  equals wrk's request count (checked). Max is the same in both.

``ratio_to_sglang_router``: Cortex's (and the baseline's) figure over sglang-router's, same
cell, same run; ``req_per_s_over_one_process``: ``cortex-2proc`` (``server.processes = 2``)
and ``cortex-2proc-nosync`` (without replica sync between them), when asked for, over
``cortex``. Usage: ``python -m perf.bench_wrk [--durations 3,30] [--connections 64,256]
[--threads 2] [--baseline DIR] [--quick]`` (JSON on stdout). Needs ``wrk`` (apt-get install
wrk): without it the result says so in ``not_run`` and nothing runs; a peer not installed is
skipped with the reason in ``skipped``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from perf import peers
from perf.bench_gateway import MODEL, Bodies
from perf.benchkit import machine_info
from tests import deepseek_profile as ds

WRK = shutil.which("wrk")
MARK = "WRK-HISTOGRAM"
LUA = """\
local pool = {%(pool)s}
local head = [==[%(head)s]==]
local tail = [==[%(tail)s]==]
local headers = {["Content-Type"] = "application/json"}
local threads = 0
local n = 0

function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end

function request()
  n = n + 1
  local user = '"' .. pool[n %% #pool + 1] .. ' (request ' .. tid .. '-' .. n .. ')"'
  return wrk.format("POST", "/v1/chat/completions", headers, head .. user .. tail)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write("%(mark)s ", summary.duration, " ", summary.requests, " ", e.connect, " ", e.read,
           " ", e.write, " ", e.status, " ", e.timeout, "\\n")
  local parts = {}
  for i = 1, #latency do
    local value, count = latency(i)
    parts[#parts + 1] = string.format("%%d:%%d", value, count)
  end
  io.write(table.concat(parts, " "), "\\n")
end
"""


def lua_script(bodies: Bodies) -> str:
    def long_string(text: str) -> str:
        assert "]==]" not in text
        return text
    pool = ", ".join(f"[==[{long_string(s)}]==]" for s in bodies.pool[:100])
    return LUA % {"pool": pool, "head": long_string(bodies.head.decode()),
                  "tail": long_string(bodies.tail.decode()), "mark": MARK}


# -- wrk's histogram ---------------------------------------------------------------------------

def percentile(histogram: list[tuple[int, int]], p: float) -> int:
    """wrk's ``stats_percentile`` over (value, count) pairs in ascending order (``p`` in
    percent). Not ``benchkit.percentile`` on purpose: wrk's own rounding over its histogram,
    so that figures read from the histogram are the ones wrk prints."""
    total = sum(count for _, count in histogram)
    rank = math.floor(p / 100.0 * total + 0.5 + 0.5)  # C's round(): halves away from zero
    seen = 0
    for value, count in histogram:
        seen += count
        if seen >= rank:
            return value
    return 0


def uncorrect(histogram: list[tuple[int, int]], interval: int) -> list[tuple[int, int]]:
    """The samples wrk recorded, before ``stats_correct(latency, interval)`` added its own."""
    corrected = dict(histogram)
    raw = []
    for value, count in histogram:
        own = count - corrected.get(value + interval, 0) if value > interval else count
        assert own >= 0, (value, count, interval)
        if own:
            raw.append((value, own))
    return raw


def figures(histogram: list[tuple[int, int]]) -> dict[str, float]:
    ms = 1000.0
    return {"n": sum(count for _, count in histogram),
            "p50_ms": percentile(histogram, 50) / ms, "p99_ms": percentile(histogram, 99) / ms,
            "max_ms": histogram[-1][0] / ms if histogram else 0.0}


def parse(stdout: str, connections: int) -> dict[str, object]:
    lines = stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(MARK))
    duration, requests, *errors = (int(x) for x in lines[at].split()[1:])
    histogram = [tuple(int(x) for x in pair.split(":")) for pair in lines[at + 1].split()]
    out: dict[str, object] = {"requests": requests, "req_per_s": round(requests / duration * 1e6)}
    errors_by_name = dict(zip(("connect", "read", "write", "status", "timeout"), errors))
    if any(errors_by_name.values()):
        out["errors"] = errors_by_name
    out["corrected"] = figures(histogram)
    printed = re.search(r"^\s+99%\s+(\S+)", stdout, re.MULTILINE)
    out["corrected"]["p99_printed"] = printed.group(1) if printed else None
    if requests // connections > 0:
        interval = duration // (requests // connections)  # as wrk computes it
        raw = uncorrect(histogram, interval)
        out["interval_ms"] = interval / 1000
    else:
        raw = histogram
    out["raw"] = figures(raw)
    assert out["raw"]["n"] == requests - errors_by_name["timeout"], (out["raw"], requests)
    return out


def run_wrk(port: int, script: str, threads: int, connections: int, seconds: float,
            ) -> dict[str, object]:
    argv = [WRK, f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "5s",
            "--latency", "-s", script, f"http://{peers.HOST}:{port}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 120)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout[-1000:]}"
                           f"{done.stderr[-1000:]}")
    result = parse(done.stdout, connections)
    result["command"] = " ".join(argv[:-3] + ["-s", "<script>", f"http://{peers.HOST}:<port>"])
    return result


def ratios(cell: dict[str, dict[str, object]]) -> dict[str, dict[str, float]]:
    peer = cell.get("sglang-router")
    out: dict[str, dict[str, float]] = {}
    if peer is None:
        return out
    for name, got in cell.items():
        if name == "sglang-router":
            continue
        row = {}
        for kind in ("corrected", "raw"):
            for figure in ("p99_ms", "max_ms"):
                mine, theirs = got[kind][figure], peer[kind][figure]
                row[f"{kind}_{figure.removesuffix('_ms')}"] = (round(mine / theirs, 2)
                                                              if theirs else None)
        row["req_per_s"] = round(got["req_per_s"] / peer["req_per_s"], 2)
        out[name] = row
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--durations", default="3,30", help="seconds per run, comma-separated")
    parser.add_argument("--connections", default="64,256", help="comma-separated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--systems", default="cortex,sglang-router")
    parser.add_argument("--baseline", type=Path,
                        help="also measure Cortex run from this checkout (cortex-baseline)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: one 1 s run at 64 connections, no warm-up")
    args = parser.parse_args()
    result: dict[str, object] = {"machine": machine_info(), "quick": args.quick}
    if WRK is None:
        result["not_run"] = "wrk is not installed (apt-get install wrk)"
        print(json.dumps(result, indent=2))
        return 0
    durations = [1.0] if args.quick else [float(x) for x in args.durations.split(",")]
    conns = [64] if args.quick else [int(x) for x in args.connections.split(",")]
    wanted = [name for name in args.systems.split(",") if name]
    if args.baseline is not None:
        wanted.append("cortex-baseline")
    skipped = {name: why for name, why in peers.missing_peers().items() if name in wanted}
    started: dict[str, peers.Running] = {}
    workdir = tempfile.mkdtemp(prefix="bench-wrk-")
    template = os.path.join(workdir, "chat_template.jinja")
    with open(template, "w") as f:
        f.write(ds.TEMPLATE)
    script = os.path.join(workdir, "chat.lua")
    with open(script, "w") as f:
        f.write(lua_script(Bodies(25, seed=1)))
    error = None
    try:
        mocks = [peers.start_mock(MODEL, f"mock{i}", kv_events=True) for i in range(2)]
        for index, mock in enumerate(mocks):
            started[f"mock{index}"] = mock
        systems: dict[str, int] = {}
        for name in wanted:
            if name in skipped:
                continue
            try:
                if name == "cortex":
                    running = peers.start_cortex(mocks, MODEL, ds.TOKENIZER_JSON, template)
                elif name == "cortex-baseline":
                    running = peers.start_cortex(mocks, MODEL, ds.TOKENIZER_JSON, template,
                                                 name, args.baseline.resolve())
                elif name in peers.PROCESS_FLAGS:
                    running = peers.start_cortex(mocks, MODEL, ds.TOKENIZER_JSON, template,
                                                 name, flags=peers.PROCESS_FLAGS[name])
                else:
                    running = peers.start_sglang_router([m.url for m in mocks], MODEL)
            except peers.StartError as failure:
                if name.startswith("cortex"):
                    error = str(failure)
                    break
                skipped[name] = f"did not start: {failure}"
                continue
            started[name] = running
            systems[name] = running.port
        result.update({"systems": list(systems), "skipped": skipped, "threads": args.threads,
                       "version": subprocess.run([WRK, "-v"], capture_output=True,
                                                 text=True).stdout.split("\n")[0].strip()})
        if args.baseline is not None:
            result["baseline"] = str(args.baseline.resolve())
        result["load_average_before"] = [round(x, 2) for x in os.getloadavg()]
        if error is None:
            if not args.quick:
                for port in systems.values():
                    run_wrk(port, script, args.threads, 64, 1)
            cells: dict[str, dict[str, object]] = {}
            names = list(systems)
            turn = 0
            for seconds in durations:
                for connections in conns:
                    order = names[turn % len(names):] + names[:turn % len(names)]
                    turn += 1
                    cell = {name: run_wrk(systems[name], script, args.threads, connections,
                                          seconds) for name in order}
                    cells[f"{seconds:g}s_c{connections}"] = {
                        "order": order, **cell, "ratio_to_sglang_router": ratios(cell),
                        "req_per_s_over_one_process": {
                            name: round(cell[name]["req_per_s"] / cell["cortex"]["req_per_s"],
                                        2)
                            for name in peers.PROCESS_FLAGS if name in cell and "cortex" in cell}}
            result["cells"] = cells
            result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        else:
            result["error"] = error
    finally:
        for running in started.values():
            running.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result, indent=2))
    return 1 if error else 0


if __name__ == "__main__":
    sys.exit(main())
