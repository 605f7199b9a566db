"""Cold prompts through ``cortex serve``: what the event loop waits for, and what cores buy.

Two fast mock workers (``perf/mock_worker.py``, empty KV-event publishers: Cortex routes on
its KV path) and, each its own process(es) in front of both (``perf/peers.py``):

* ``cortex``: new text of cold prompts encoded inline or, when long, in a worker thread
  (fastokens once its start check passed: the benchmark waits for it);
* ``cortex-1cpu``: the same pinned to one CPU (``taskset -c 0``): Cortex on one core;
* ``cortex-2proc``: ``server.processes = 2`` (two processes on one port, replica sync over
  IPC; ``two_processes_over_one`` = its requests per second over ``cortex``'s);
* ``sglang-router`` (``cache_aware``), for reference, in the throughput phases.

Texts (``--text``): ``code`` (lines of Cortex's own sources, shuffled per prompt), ``zh``
(Chinese characters), ``en`` (English sentences from ``bench_tokenize``'s small vocabulary). Every cold prompt is one user message that starts with a unique line, so no part of it
is in any cache (the segment cache keys on the whole message).

Phases (systems in interleaved rounds, the order rotating, so that a noisy moment of the
shared VM falls on all of them alike):

* ``stall`` (issue 24, Measure 2): small chat requests (~100 tokens, ``bench_gateway``'s)
  at concurrency 1, first alone (``idle``), then while a second connection sends cold
  ~32k-token prompts back to back (``loaded``; only small requests that overlapped a cold
  one are kept). ``added_us`` = loaded − idle per percentile (target: ≤ 1,000 µs);
  ``cold_ms``: the cold prompts' round trip.
* ``cold_tput`` (Measure 3): unique cold ~8k-token prompts, ``--connections`` connections
  back to back, requests per second. ``ratios``: each system over ``cortex-1cpu``;
  ``one_to_two_cores``: each configuration on both CPUs over the same pinned to one (target:
  ≥ 1.7x). ``cpu_ms_per_request`` (every process of the system) and
  ``main_process_cpu_ms_per_request`` (the first alone) do not depend on how busy the machine
  is: on an otherwise idle host with ``n`` cores, a system whose event loop costs ``m`` and
  whose worker threads ``c - m`` per request can serve up to ``n / c`` and at most ``1 / m``
  requests per second.
* ``warm_tput``: warm multi-turn turns: the same ~8k-token context (cached after the first
  request) plus a new short user message each time, 64 connections, requests per second:
  where one event loop saturates when tokenization is not the cost.

``--baseline PATH`` adds, for every system named ``base-<name>``, ``<name>`` run from that
checkout, in the same rounds (before/after figures of one run).

Usage: ``python -m perf.bench_cold [--quick] [--text code,zh] [--systems ...]
[--phases stall,cold_tput,warm_tput] [--baseline PATH]`` (JSON on stdout).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import trio

from perf import peers
from perf.bench_gateway import MODEL, Bodies, Client, cpu_s
from perf.bench_tokenize import sentence
from perf.benchkit import machine_info, percentiles_us
from tests import deepseek_profile as ds

HERE = Path(__file__).resolve().parent

SYSTEMS = {  # name -> (extra cortex flags, cpus); sglang-router apart
    "cortex": ((), None),
    "cortex-1cpu": ((), "0"),
    "cortex-2proc": (peers.PROCESS_FLAGS["cortex-2proc"], None),  # server.processes = 2
}
ONE_CORE_TWINS = {"cortex": "cortex-1cpu"}
PARAMS = {
    "full": {"rounds": 3, "idle": 300, "colds": 6, "slice_s": 6.0, "connections": 8,
             "warm_connections": 64},
    "quick": {"rounds": 1, "idle": 40, "colds": 2, "slice_s": 1.5, "connections": 4,
              "warm_connections": 16},
}
CHARS_PER_TOKEN = {"code": 4.4, "zh": 1.03, "en": 4.4}  # DeepSeek-V3, measured
HAN = ("的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下"
       "过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两"
       "体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线")


CODE_TAG_LINES = 12  # ~450 characters of code: at least two tags in every 1,024-character chunk


class Texts:
    """Base texts of about ``tokens`` tokens; ``cold(i)`` is base ``i % n`` behind a unique
    first line (the whole message is then new to every cache). Code has lines: the segment
    cache keeps a long piece's line chunks (``cortex.tokenize.line_cuts``, >= 1,024 characters
    each), so a base's chunks would be warm from its second use on; its cold text carries a
    unique comment line every ``CODE_TAG_LINES`` lines (every chunk holds one)."""

    def __init__(self, kind: str, tokens: int, seed: int, count: int = 24) -> None:
        rng = random.Random(seed)
        chars = int(tokens * CHARS_PER_TOKEN[kind])
        lines = [line for path in sorted((HERE.parent / "cortex").rglob("*.py"))
                 for line in path.read_text().splitlines() if line.strip()]
        self.bases = []
        for _ in range(count):
            if kind == "code":
                rng.shuffle(lines)
                text = "\n".join(lines)
                while len(text) < chars:
                    text += "\n" + text
            elif kind == "zh":
                text = "".join(rng.choice(HAN) for _ in range(chars))
            else:
                text = sentence(rng, chars // 5)
            self.bases.append(text[:chars])
        self.kind = kind
        self.tag = rng.getrandbits(32)
        self.groups = [["\n".join(lines[k:k + CODE_TAG_LINES])
                        for k in range(0, len(lines), CODE_TAG_LINES)]
                       for lines in (base.split("\n") for base in self.bases)] \
            if kind == "code" else []

    def cold(self, i: int) -> bytes:
        if self.groups:
            base = "\n".join(f"# {self.tag}-{i}-{k}\n{group}"
                             for k, group in enumerate(self.groups[i % len(self.groups)]))
        else:
            base = self.bases[i % len(self.bases)]
        text = f"request {self.tag}-{i}\n{base}"
        return json.dumps({"model": MODEL, "max_tokens": 8, "messages": [
            {"role": "user", "content": text}]}).encode()

    def warm(self, i: int) -> bytes:
        return json.dumps({"model": MODEL, "max_tokens": 8, "messages": [
            {"role": "system", "content": self.bases[0]},
            {"role": "user", "content": f"What does line {i} of this do?"}]}).encode()


async def stall_phase(systems: dict[str, tuple[int, list[int]]], texts: Texts,
                      params: dict[str, float]) -> dict[str, object]:
    small = Bodies(25, seed=5)
    idle: dict[str, list[int]] = {name: [] for name in systems}
    loaded: dict[str, list[int]] = {name: [] for name in systems}
    cold: dict[str, list[int]] = {name: [] for name in systems}
    names = list(systems)
    counter = [0]
    for round_ in range(int(params["rounds"])):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            port = systems[name][0]
            client, heavy = await Client.connect(port), await Client.connect(port)
            for _ in range(20):  # warm the connection and the system prompt's pieces
                await client.post(small.next())
            for _ in range(int(params["idle"]) // int(params["rounds"])):
                idle[name].append((await client.post(small.next()))[1])
            in_cold = [0]
            done = trio.Event()

            async def colds(heavy: Client = heavy, name: str = name, done: trio.Event = done,
                            in_cold: list[int] = in_cold) -> None:
                for _ in range(int(params["colds"])):
                    counter[0] += 1
                    in_cold[0] += 1
                    cold[name].append((await heavy.post(texts.cold(counter[0])))[1])
                    in_cold[0] -= 1
                done.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(colds)
                while not done.is_set():
                    before = in_cold[0]
                    total = (await client.post(small.next()))[1]
                    if before and in_cold[0]:
                        loaded[name].append(total)
            await client.aclose()
            await heavy.aclose()
    out: dict[str, object] = {}
    for name in names:
        a, b = percentiles_us(idle[name]), percentiles_us(loaded[name])
        out[name] = {"idle_us": a, "loaded_us": b,
                     "added_us": {q: round(b[q] - a[q]) for q in ("p50", "p90", "p99")},
                     "cold_ms": {q: round(v / 1000, 1)
                                 for q, v in percentiles_us(cold[name]).items() if q != "n"}}
    return out


async def tput_phase(systems: dict[str, tuple[int, list[int]]], make, connections: int,
                     params: dict[str, float]) -> dict[str, dict[str, float]]:
    done = {name: 0 for name in systems}
    wall = {name: 0.0 for name in systems}
    cpu = {name: 0.0 for name in systems}
    main_cpu = {name: 0.0 for name in systems}  # the first process's alone: Cortex's loop
    names = list(systems)
    cursor = [0]
    for round_ in range(int(params["rounds"])):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            port, pids = systems[name]
            clients = [await Client.connect(port) for _ in range(connections)]

            async def run(client: Client, name: str = name) -> None:
                while True:
                    cursor[0] += 1
                    await client.post(make(cursor[0]))
                    done[name] += 1

            used, main, start = cpu_s(pids), cpu_s(pids[:1]), time.perf_counter()
            with trio.move_on_after(params["slice_s"]):
                async with trio.open_nursery() as nursery:
                    for client in clients:
                        nursery.start_soon(run, client)
            wall[name] += time.perf_counter() - start
            cpu[name] += cpu_s(pids) - used
            main_cpu[name] += cpu_s(pids[:1]) - main
            for client in clients:
                await trio.aclose_forcefully(client.stream)
    return {name: {"req_per_s": round(done[name] / wall[name], 1),
                   "cores_used": round(cpu[name] / wall[name], 2),
                   "cpu_ms_per_request": round(cpu[name] / done[name] * 1e3, 2),
                   "main_process_cpu_ms_per_request": round(main_cpu[name] / done[name] * 1e3,
                                                            2)} for name in names}


def ratios(figures: dict[str, dict[str, float]]) -> dict[str, float]:
    base = figures.get("cortex-1cpu", {}).get("req_per_s")
    return {name: round(f["req_per_s"] / base, 2) for name, f in figures.items()
            if base and name != "cortex-1cpu"}


def two_processes(figures: dict[str, dict[str, float]]) -> float | None:
    """``server.processes = 2`` over one process, both on every core (issue 36: >= 1.3x)."""
    if "cortex-2proc" in figures and "cortex" in figures:
        return round(figures["cortex-2proc"]["req_per_s"] / figures["cortex"]["req_per_s"], 2)
    return None


def against_baseline(figures: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each system over its ``base-`` twin (the ``--baseline`` checkout) in the same run."""
    return {name: round(f["req_per_s"] / figures[f"base-{name}"]["req_per_s"], 2)
            for name, f in figures.items() if f"base-{name}" in figures}


def scaling(figures: dict[str, dict[str, float]]) -> dict[str, float]:
    """Both cores over one, per configuration measured both ways (the 1 -> 2 core target)."""
    return {name: round(figures[name]["req_per_s"] / figures[one]["req_per_s"], 2)
            for name, one in ONE_CORE_TWINS.items() if name in figures and one in figures}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="smoke run")
    parser.add_argument("--text", help="comma-separated: code, zh, en (default: code,zh; "
                                       "--quick: code)")
    parser.add_argument("--systems", default=",".join([*SYSTEMS, "sglang-router"]))
    parser.add_argument("--phases", default="stall,cold_tput,warm_tput")
    parser.add_argument("--baseline", type=Path,
                        help="another checkout (extensions built): systems named base-<name> "
                        "run its Cortex, in the same rounds")
    args = parser.parse_args()
    params = PARAMS["quick" if args.quick else "full"]
    texts_wanted = args.text or ("code" if args.quick else "code,zh")
    wanted = [name for name in args.systems.split(",") if name]
    phases = set(args.phases.split(","))
    skipped = {name: why for name, why in peers.missing_peers().items() if name in wanted}
    started: dict[str, peers.Running] = {}
    workdir = tempfile.mkdtemp(prefix="bench-cold-")
    template = os.path.join(workdir, "chat_template.jinja")
    with open(template, "w") as f:
        f.write(ds.TEMPLATE)
    result: dict[str, object] = {"machine": machine_info(), "quick": args.quick,
                                 "parameters": params, "skipped": skipped}
    try:
        mocks = [peers.start_mock(MODEL, f"mock{i}", kv_events=True) for i in range(2)]
        started.update({f"mock{i}": mock for i, mock in enumerate(mocks)})
        systems: dict[str, tuple[int, list[int]]] = {}
        for name in wanted:
            if name in skipped:
                continue
            if name == "sglang-router":
                running = peers.start_sglang_router([mock.url for mock in mocks], MODEL)
            else:
                base = name.startswith("base-")
                flags, cpus = SYSTEMS[name.removeprefix("base-")]
                repo = args.baseline.resolve() if base and args.baseline else peers.REPO
                running = peers.start_cortex(mocks, MODEL, ds.TOKENIZER_JSON, template, name,
                                             flags=flags, cpus=cpus, repo=repo)
            started[name] = running
            systems[name] = (running.port, running.pids())
        cortexes = {name: v for name, v in systems.items() if "cortex" in name}
        result["load_average_before"] = [round(x, 2) for x in os.getloadavg()]
        for kind in texts_wanted.split(","):
            out: dict[str, object] = {}
            if "stall" in phases:
                out["stall_32k"] = trio.run(stall_phase, cortexes, Texts(kind, 32_000, 1),
                                            params)
            if "cold_tput" in phases:
                texts = Texts(kind, 8_000, 2)
                figures = trio.run(tput_phase, systems, texts.cold,
                                   int(params["connections"]), params)
                out["cold_tput_8k"] = {**figures, "ratios": ratios(figures),
                                       "one_to_two_cores": scaling(figures),
                                       "two_processes_over_one": two_processes(figures),
                                       "against_baseline": against_baseline(figures)}
            if "warm_tput" in phases:
                texts = Texts(kind, 8_000, 3)
                figures = trio.run(tput_phase, systems, texts.warm,
                                   int(params["warm_connections"]), params)
                out["warm_tput_8k"] = {**figures, "ratios": ratios(figures),
                                       "two_processes_over_one": two_processes(figures),
                                       "against_baseline": against_baseline(figures)}
            result[kind] = out
        result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        for running in started.values():
            running.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
