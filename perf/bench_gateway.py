"""The gateway against its peers: direct, Cortex, sglang-router (cache_aware), nginx round robin.

``cortex-2proc`` is Cortex with ``server.processes = 2`` (two processes on one port, replica
sync over IPC; ``cortex-2proc-nosync`` without it, on request); ``targets.<name>_over_one`` is
its throughput at 64 connections over one process's. ``cortex-passthrough`` is Cortex serving the model as ``passthrough`` (no template, tokenizer,
ledger or KV decision: its two HTTP legs, the body's parse and a round-robin pick). Measured
in the same rounds, it splits Cortex's added latency into the floor of its HTTP stack and what
the KV-aware request path (template, tokens, block keys, match, decision) adds on top.

Two fast mock workers (``perf/mock_worker.py``, one process each) answer at once; every system
runs as its own process(es) (``perf/peers.py``) in front of both, and this process is the load
generator (trio + h11 keep-alive connections). Each mock binds an SGLang KV-event publisher
that never publishes (an engine with an empty cache): Cortex subscribes, its ledgers turn READY
and it routes on its KV path, as in service (``match_modes`` in each phase says which
decisions it made); ``--no-kv-events`` leaves the endpoints out (Cortex's fallback chain).
Every figure comes from one run: the systems are measured in the same run, in interleaved
rounds (the order rotates each round) so that a noisy moment of the shared VM falls on all of
them alike.

Workload: chat bodies for the DeepSeek chat template Cortex renders; every request has a new
user message (a sentence from a fixed pool plus a unique request number) after a fixed system
prompt, so Cortex's segment cache helps only as it would in service. ``small`` is ~100 prompt
tokens, ``large`` ~4k (the counts, with the template, are in the output).

Figures per system (``direct`` = straight to one mock worker, the baseline):

* ``latency_small`` / ``latency_large``: round trip at concurrency 1, percentiles (with min and
  p10); ``added_us`` = the router's p10 (p50, p99) minus direct's p10 (p50, p99). Targets use
  p50; p10 is the noise-filtered reference (a busy neighbour inflates the middle and the tail).
* ``ttfb``: time to the first body byte of an SSE response (``"stream": true``, small body)
  at concurrency 1; ``added_us`` likewise.
* ``throughput_c64``: requests per second with 64 connections sending back to back (small
  body), and the load generator's own share of a core (near 1.0 = the client is the limit).
  The machine's load average before and after is in the output: on a shared 2-vCPU VM a busy
  neighbour slows every system, Python ones with more wake-ups per request the most.
* ``cpu_us_per_request`` of the system's processes (``/proc/<pid>/stat`` utime+stime deltas
  over the phase, divided by its requests; 10 ms clock ticks, so short runs are coarse) and
  ``rss_mib`` after start and after the run. For ``direct`` these are the mock worker's own
  (the lean server's cost of one request, for scale).

``targets`` compares Cortex with sglang-router (issue 4): added latency at c=1 ≤ 1.5× for both
sizes, throughput at 64 connections ≥ 0.5×, added TTFB ≤ 1 ms (p50), each "met"/"not met";
``http_floor`` (informational) gives cortex-passthrough's added p10/p50 over sglang-router's
and the share of Cortex's added p50 that the passthrough floor accounts for.

``--baseline DIR`` adds ``cortex-baseline``: Cortex run from another checkout (its extensions
built), measured in the same interleaved rounds — a before/after comparison under one machine
load; ``targets`` then also gives ``vs_baseline`` (Cortex's added p50 / the baseline's).
``--baseline-python`` runs the baseline with another interpreter (the same checkout twice then
compares interpreters).

Usage: ``python -m perf.bench_gateway [--quick] [--systems cortex,sglang-router,nginx]
[--baseline DIR [--baseline-python PYTHON]]``
(JSON on stdout). A peer that is not installed is skipped with the reason in ``skipped``;
Cortex failing to start is an error (exit 1).
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

import h11
import trio

from perf import peers
from perf.bench_tokenize import sentence
from perf.benchkit import machine_info, percentile, percentiles_us
from perf.gateway_report import added, targets, versus_baseline
from tests import deepseek_profile as ds

MODEL = "mock-model"
ROUTERS = ("cortex", "cortex-2proc", "cortex-passthrough", "sglang-router", "nginx")
PARAMS = {
    "full": {"rounds": 40, "small": 800, "large": 400, "sse": 800, "warmup": 50,
             "tput_rounds": 3, "tput_slice_s": 4.0, "connections": 64},
    "quick": {"rounds": 4, "small": 60, "large": 20, "sse": 60, "warmup": 10,
              "tput_rounds": 1, "tput_slice_s": 1.0, "connections": 64},
}


# -- workload ----------------------------------------------------------------------------------

class Bodies:
    """Request bodies with a fixed system prompt and a new user message each time."""

    def __init__(self, system_words: int, seed: int) -> None:
        rng = random.Random(seed)
        self.system = sentence(rng, system_words)
        self.pool = [json.dumps(sentence(rng, 45))[1:-1] for _ in range(500)]
        head = json.dumps({"model": MODEL, "max_tokens": 16, "messages": [
            {"role": "system", "content": self.system}, {"role": "user", "content": "@"}]})
        self.head, self.tail = (part.encode() for part in head.split('"@"'))
        self.count = 0

    def next(self, stream: bool = False) -> bytes:
        self.count += 1
        user = f'"{self.pool[self.count % len(self.pool)]} (request {self.count})"'.encode()
        return (self.head + user + self.tail[:-1]
                + (b', "stream":true}' if stream else b"}"))

    def prompt_tokens(self) -> int:
        from jinja2 import Template
        text = Template(ds.TEMPLATE).render(
            messages=[{"role": "system", "content": self.system},
                      {"role": "user", "content": self.pool[0] + " (request 1)"}],
            bos_token=ds.BOS, eos_token=ds.EOS, add_generation_prompt=True)
        return len(ds.tokenizer().encode(text, add_special_tokens=False).ids)


# -- client ------------------------------------------------------------------------------------

class Client:
    """One keep-alive connection posting chat bodies; ``post`` returns the nanoseconds to the
    first body byte and to the end of the response."""

    def __init__(self, stream: trio.SocketStream, port: int) -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.CLIENT)
        self.host = f"{peers.HOST}:{port}"
        self.last_headers: dict[str, str] = {}

    @classmethod
    async def connect(cls, port: int) -> Client:
        return cls(await trio.open_tcp_stream(peers.HOST, port), port)

    async def post(self, body: bytes) -> tuple[int, int]:
        conn = self.conn
        request = h11.Request(method="POST", target="/v1/chat/completions", headers=[
            ("host", self.host), ("content-type", "application/json"),
            ("content-length", str(len(body)))])
        clock = time.perf_counter_ns
        start = clock()
        await self.stream.send_all(conn.send(request) + conn.send(h11.Data(data=body))
                                   + conn.send(h11.EndOfMessage()))
        first = 0
        status = 0
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await self.stream.receive_some(65536))
            elif type(event) is h11.Data:
                if not first:
                    first = clock()
            elif type(event) is h11.Response:
                status = event.status_code
                self.last_headers = {k.decode(): v.decode() for k, v in event.headers}
            elif type(event) is h11.EndOfMessage:
                break
            else:
                raise RuntimeError(f"unexpected {event!r}")
        end = clock()
        if status != 200 or not first:
            raise RuntimeError(f"{self.host}: status {status}, first body byte {first}")
        conn.start_next_cycle()
        return first - start, end - start

    async def aclose(self) -> None:
        await self.stream.aclose()


# -- accounting --------------------------------------------------------------------------------

def cpu_s(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total / os.sysconf("SC_CLK_TCK")


def rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return round(total / 1024, 1)


def spread_us(samples_ns: list[int]) -> dict[str, float]:
    """``percentiles_us`` plus min and p10: the low end is what a quiet machine would show."""
    ordered = sorted(samples_ns)
    return {"min": round(ordered[0] / 1000, 3),
            "p10": round(percentile(ordered, 0.1) / 1000, 3), **percentiles_us(ordered)}


class Tally:
    """Samples, requests and CPU seconds of one system in one phase, summed over its slices."""

    def __init__(self) -> None:
        self.first: list[int] = []
        self.total: list[int] = []
        self.requests = 0
        self.cpu = 0.0
        self.wall = 0.0
        self.modes: dict[str, int] = {}  # Cortex's x-cortex-match-mode, per answer

    def count_mode(self, headers: dict[str, str]) -> None:
        mode = headers.get("x-cortex-match-mode")
        if mode is not None:
            self.modes[mode] = self.modes.get(mode, 0) + 1

    def report(self, kind: str) -> dict[str, object]:
        out: dict[str, object] = {"requests": self.requests}
        if kind == "ttfb":
            out["first_byte_us"] = spread_us(self.first)
            out["round_trip_us"] = spread_us(self.total)
        elif kind == "latency":
            out["round_trip_us"] = spread_us(self.total)
        else:
            out["req_per_s"] = round(self.requests / self.wall)
        if self.cpu:
            out["cpu_us_per_request"] = round(self.cpu / self.requests * 1e6, 1)
        if self.modes:
            out["match_modes"] = dict(sorted(self.modes.items()))
        return out


# -- phases ------------------------------------------------------------------------------------

async def sequential_phase(systems: dict[str, tuple[int, list[int]]], bodies: Bodies,
                           rounds: int, per_slice: int, stream: bool) -> dict[str, Tally]:
    tallies = {name: Tally() for name in systems}
    clients = {name: await Client.connect(port) for name, (port, _) in systems.items()}
    names = list(systems)
    for round_ in range(rounds):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            client, tally, pids = clients[name], tallies[name], systems[name][1]
            work = [bodies.next(stream) for _ in range(per_slice)]
            cpu = cpu_s(pids)
            for body in work:
                first, total = await client.post(body)
                tally.first.append(first)
                tally.total.append(total)
                tally.count_mode(client.last_headers)
            kind = client.last_headers.get("content-type", "")
            if stream != kind.startswith("text/event-stream"):
                raise RuntimeError(f"{name} answered {kind!r} to stream={stream}")
            tally.cpu += cpu_s(pids) - cpu
            tally.requests += per_slice
    for client in clients.values():
        await client.aclose()
    return tallies


async def throughput_phase(systems: dict[str, tuple[int, list[int]]], bodies: Bodies,
                           rounds: int, slice_s: float, connections: int,
                           ) -> tuple[dict[str, Tally], dict[str, float]]:
    tallies = {name: Tally() for name in systems}
    client_share: dict[str, list[float]] = {name: [] for name in systems}
    pool = [bodies.next() for _ in range(20_000)]  # built before timing; wraps if exceeded
    names = list(systems)
    for round_ in range(rounds):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            port, pids = systems[name]
            clients = [await Client.connect(port) for _ in range(connections)]
            done = [0]
            cursor = [round_ * 5000]

            async def run(client: Client) -> None:
                while True:
                    cursor[0] += 1
                    await client.post(pool[cursor[0] % len(pool)])
                    done[0] += 1

            own = time.process_time()
            cpu, wall = cpu_s(pids), time.perf_counter()
            with trio.move_on_after(slice_s):
                async with trio.open_nursery() as nursery:
                    for client in clients:
                        nursery.start_soon(run, client)
            wall = time.perf_counter() - wall
            tally = tallies[name]
            tally.cpu += cpu_s(pids) - cpu
            tally.wall += wall
            tally.requests += done[0]
            client_share[name].append((time.process_time() - own) / wall)
            for client in clients:
                await trio.aclose_forcefully(client.stream)
    return tallies, {name: round(sum(v) / len(v), 2) for name, v in client_share.items()}


async def measure(systems: dict[str, tuple[int, list[int]]], params: dict[str, float],
                  ) -> dict[str, object]:
    small, large = Bodies(25, seed=1), Bodies(3000, seed=2)
    await sequential_phase(systems, small, 1, int(params["warmup"]), False)
    await sequential_phase(systems, large, 1, int(params["warmup"]), False)
    rounds = int(params["rounds"])
    phases = {
        "latency_small": ("latency", await sequential_phase(
            systems, small, rounds, int(params["small"]) // rounds, False)),
        "latency_large": ("latency", await sequential_phase(
            systems, large, rounds, int(params["large"]) // rounds, False)),
        "ttfb": ("ttfb", await sequential_phase(
            systems, small, rounds, int(params["sse"]) // rounds, True)),
    }
    tput, client_share = await throughput_phase(
        systems, small, int(params["tput_rounds"]), params["tput_slice_s"],
        int(params["connections"]))
    out: dict[str, object] = {"prompt_tokens": {"small": small.prompt_tokens(),
                                                "large": large.prompt_tokens()}}
    for name in systems:
        figures: dict[str, object] = {}
        for phase, (kind, tallies) in phases.items():
            figures[phase] = tallies[name].report(kind)
        figures["throughput_c64"] = {**tput[name].report("throughput"),
                                     "client_core_share": client_share[name]}
        out[name] = figures
    return out


async def drive(port: int, seconds: float, connections: int, large: bool) -> dict[str, object]:
    """Load for a profiler (``--drive``): back-to-back requests, nothing measured."""
    bodies = Bodies(3000 if large else 25, seed=3)
    clients = [await Client.connect(port) for _ in range(connections)]
    done = [0]

    async def run(client: Client) -> None:
        while True:
            await client.post(bodies.next())
            done[0] += 1

    with trio.move_on_after(seconds):
        async with trio.open_nursery() as nursery:
            for client in clients:
                nursery.start_soon(run, client)
    return {"requests": done[0], "seconds": seconds, "connections": connections}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (few requests)")
    parser.add_argument("--systems", default=",".join(ROUTERS),
                        help="comma-separated routers to measure besides direct")
    parser.add_argument("--drive", type=float, metavar="SECONDS",
                        help="no measurement: load the first of --systems for a profiler "
                             "(py-spy record --subprocesses) for SECONDS")
    parser.add_argument("--drive-connections", type=int, default=1)
    parser.add_argument("--drive-large", action="store_true", help="~4k-token bodies")
    parser.add_argument("--no-kv-events", action="store_true",
                        help="mocks without KV-event endpoints: Cortex routes on its fallback "
                             "chain (how runs before session 9 measured it)")
    parser.add_argument("--baseline", type=Path,
                        help="also measure Cortex run from this checkout (cortex-baseline)")
    parser.add_argument("--baseline-python", default=sys.executable,
                        help="the interpreter that runs cortex-baseline (its venv's python, "
                             "with the checkout's extensions built by it; default: this one)")
    args = parser.parse_args()
    wanted = [name for name in args.systems.split(",") if name]
    params = PARAMS["quick" if args.quick else "full"]
    skipped = {name: why for name, why in peers.missing_peers().items() if name in wanted}
    started: dict[str, peers.Running] = {}
    error = None
    workdir = tempfile.mkdtemp(prefix="bench-gateway-")
    template = os.path.join(workdir, "chat_template.jinja")
    with open(template, "w") as f:
        f.write(ds.TEMPLATE)
    try:
        mocks = [peers.start_mock(MODEL, f"mock{i}", kv_events=not args.no_kv_events)
                 for i in range(2)]
        for index, mock in enumerate(mocks):
            started[f"mock{index}"] = mock
        urls = [mock.url for mock in mocks]
        systems: dict[str, tuple[int, list[int]]] = {
            "direct": (mocks[0].port, [mocks[0].process.pid])}
        if args.baseline is not None:
            wanted.append("cortex-baseline")
        for name in wanted:
            if name in skipped:
                continue
            try:
                if name == "cortex":
                    running = peers.start_cortex(mocks, MODEL, ds.TOKENIZER_JSON, template)
                elif name in peers.PROCESS_FLAGS:
                    running = peers.start_cortex(mocks, MODEL, ds.TOKENIZER_JSON, template,
                                                 name, flags=peers.PROCESS_FLAGS[name])
                elif name == "cortex-passthrough":
                    running = peers.start_cortex(mocks, MODEL, ds.TOKENIZER_JSON, template,
                                                 name, passthrough=True)
                elif name == "cortex-baseline":
                    running = peers.start_cortex(mocks, MODEL, ds.TOKENIZER_JSON, template,
                                                 name, args.baseline.resolve(),
                                                 args.baseline_python)
                elif name == "sglang-router":
                    running = peers.start_sglang_router(urls, MODEL)
                else:
                    running = peers.start_nginx(urls, MODEL)
            except peers.StartError as failure:
                if name.startswith("cortex"):
                    error = str(failure)
                    break
                skipped[name] = f"did not start: {failure}"
                continue
            started[name] = running
            systems[name] = (running.port, running.pids())
        result: dict[str, object] = {"machine": machine_info(), "quick": args.quick,
                                     "parameters": {**params, "workers": 2, "model": MODEL,
                                                    "kv_events": not args.no_kv_events},
                                     "systems": list(systems), "skipped": skipped}
        if args.baseline is not None:
            result["baseline"] = {"checkout": str(args.baseline.resolve()),
                                  "python": args.baseline_python}
        if args.drive and error is None:
            result["drive"] = trio.run(drive, systems[wanted[0]][0], args.drive,
                                       args.drive_connections, args.drive_large)
            wanted = []
        result["load_average_before"] = [round(x, 2) for x in os.getloadavg()]
        if error is None and wanted:
            rss_before = {name: rss_mib(pids) for name, (_, pids) in systems.items() if pids}
            figures = trio.run(measure, systems, params)
            result["prompt_tokens"] = figures.pop("prompt_tokens")
            added(figures, list(systems))
            for name, (_, pids) in systems.items():
                if pids:
                    figures[name]["rss_mib"] = {"after_start": rss_before[name],
                                                "after_run": rss_mib(pids)}
            result.update(figures)
            result["targets"] = targets(figures)
            for name in peers.PROCESS_FLAGS:  # issue 36: >= 1.3x
                if name in figures and "cortex" in figures:
                    result["targets"][f"{name}_over_one"] = round(
                        figures[name]["throughput_c64"]["req_per_s"]
                        / figures["cortex"]["throughput_c64"]["req_per_s"], 2)
            if "cortex-baseline" in figures and "cortex" in figures:
                result["targets"]["vs_baseline"] = versus_baseline(figures)
            result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        elif error is not None:
            result["error"] = error
    finally:
        for running in started.values():
            running.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result, indent=2))
    return 1 if error else 0


if __name__ == "__main__":
    sys.exit(main())
