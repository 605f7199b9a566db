"""Validate the simulated vLLM engine against the real vLLM CPU engine: one seeded arrival
sequence through both, per-request ``cached_tokens``, TTFT and end-to-end time compared.

    .venv/bin/python -m perf.validate_sim_vllm [--requests 60] [--rate 8]

The two engines, run one after the other (never side by side: the machine has 2 cores):

* **real**: one vLLM 0.32 CPU server (``tests/real_engine/vllm_server.py``: the suite's
  settings, ``qwen-tiny``, block size 32, bf16, eager, one OpenMP thread) with a small KV pool
  (``--num-gpu-blocks-override``), an explicit ``--max-num-batched-tokens`` and
  ``--max-num-seqs``, and ``--enable-prompt-tokens-details`` (``cached_tokens`` in usage).
* **sim**: one ``cortex sim --engine vllm --engine-model batching --step-profile vllm-cpu-tiny
  --speedup 1`` with exactly the same block size, pool (``--capacity-blocks`` = the real
  pool less vLLM's null block), budget and sequence cap.

The workload (``workload``, pure and seeded): requests arrive as a Poisson process, fast enough
that several overlap; each prompt is made of token ids (both engines then see identical
tokens, no tokenizer involved): a fresh prompt of mixed length, or one of a few shared prefixes
followed by a fresh suffix, or an exact repeat of an earlier prompt (the last-token rule). The
pool holds about four prompts, so blocks are evicted and running requests preempted. Every
request is a streamed ``/v1/completions`` (``stream_options.include_usage``) with ``max_tokens =
min_tokens`` fixed, ``ignore_eos`` and temperature 0, so no output stops early, sent at its
arrival time (``drive``). At the default 8 requests/s the engine is busy but not saturated:
queues form in bursts and drain (``--rate 13`` saturates it: every queue then grows, and a
few % of speed error becomes tens of % of TTFT by the end).

The batching model alone (``model_run``: no HTTP, its own timeline) says what the simulator
decides once timing is taken away: ``timing_races`` runs it at 0.7-1.3x its speed and names
the requests whose ``cached_tokens`` change, a hit that hangs on which of two requests' steps
comes first (a block evicted a step earlier or later). A request whose figures differ is
reported with that: a timing race, or not. The default seed has no race.

Per request: ``cached_tokens`` (``usage.prompt_tokens_details``), TTFT (sent to the first
``data:`` event) and end-to-end time (sent to the end of the stream). Per engine: the
preemptions (``vllm:num_preemptions_total`` on its ``/metrics``, the difference over the run).
Each engine first serves a short warm-up (the real one's first forwards of each shape are
slow), then its prefix cache is reset before each measured run, which starts from an empty
cache. The real engine runs the workload ``--repeat`` times (3), each compared with the
simulator, and its first run with the others: the real engine against itself is the noise
floor (a TTFT of ~40 ms moves by a step, ~25 %, with the phase of an arrival against the
steps, and the whole engine by 20-30 % from one run to the next). The client runs at a higher
priority than the engines while it drives them (``client_priority``): starved, it sent up to a
second late and reordered arrivals.

Report (``compare``): requests whose ``cached_tokens`` differ (with the prompt's kind and
why), the relative error (sim / real - 1) of TTFT and of end-to-end time per request, median of
the absolute values, p90 and signed median, the distributions' p50 and p90 on each side, both
preemption counts, the client's worst lateness, the TTFTs of the warm-up's lone requests, and
the CPU time other processes took during the real runs (``others_cpu``). A table on stderr, JSON on stdout; the same with every request's
figures in ``--out`` (``--skip-real FILE`` reuses the real engine's from an earlier one:
iterating on the simulator). ``--step-log`` has the real engine log every step.

The machine is shared: the real engine's speed drifts by 20-30 % from one run to the next with
the other sessions' load (the load average is recorded), the simulator's does not.

The real server takes ~35 s to start, the run itself ~10 s per engine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path

import trio

from cortex.ledger.kv_events import BlockRemoved
from cortex.sim.batching.core import SimRequest
from cortex.sim.batching.vllm import VllmBatchingEngine, VllmSchedulerConfig
from cortex.sim.engine_hashes import VllmChainHasher
from cortex.sim.step_profiles import COEFFICIENTS, load_step_profile
from cortex.upstream.connection_pool import ConnectionPool
from cortex.upstream.limits import PoolLimits
from perf.benchkit import machine_info, percentile
from tests.real_engine.vllm_server import (
    EngineEnv,
    VllmOptions,
    VllmServer,
    engine_env,
    metric_sum,
    start_all,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SEED = 35
MODEL = "qwen-tiny"  # served model name of both engines (as the suite's farm names it)
TOKEN_IDS = (1000, 30000)  # plain vocabulary of both tiny models (no special tokens)
PREEMPTIONS = "vllm:num_preemptions_total"
_CACHED = re.compile(rb'"cached_tokens":\s*(\d+)')
_PROMPT = re.compile(rb'"prompt_tokens":\s*(\d+)')
_OUTPUT = re.compile(rb'"completion_tokens":\s*(\d+)')


@dataclass(frozen=True, slots=True)
class Settings:
    """What both engines are given, identically."""

    block_size: int = 32
    num_gpu_blocks: int = 65  # vLLM's count, the null block included: 64 blocks hold KV
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 8
    max_model_len: int = 2048  # vLLM refuses a pool smaller than one max-length request
    profile: str = "vllm-cpu-tiny"

    @property
    def capacity_blocks(self) -> int:
        return self.num_gpu_blocks - 1

    def vllm_args(self) -> tuple[str, ...]:
        return ("--max-num-batched-tokens", str(self.max_num_batched_tokens),
                "--max-num-seqs", str(self.max_num_seqs))

    def sim_args(self) -> list[str]:
        return ["--engine", "vllm", "--engine-model", "batching", "--model", MODEL,
                "--block-size", str(self.block_size),
                "--capacity-blocks", str(self.capacity_blocks),
                "--max-num-batched-tokens", str(self.max_num_batched_tokens),
                "--max-num-seqs", str(self.max_num_seqs),
                "--step-profile", self.profile, "--speedup", "1"]


# ------------------------------------------------------------------------------ the workload

@dataclass(frozen=True, slots=True)
class Arrival:
    index: int
    at_s: float  # after the run's start
    prompt: tuple[int, ...]
    max_tokens: int
    kind: str  # "fresh", "prefix N" (shared prefix N + a fresh suffix), "repeat of I"


@dataclass(frozen=True, slots=True)
class Mix:
    """The workload's shape (the defaults are the validation's)."""

    requests: int = 60
    rate_per_s: float = 8.0  # Poisson arrivals
    max_tokens: int = 48
    fresh: tuple[int, int] = (48, 720)  # a fresh prompt's length, uniform
    prefixes: tuple[int, ...] = (96, 224, 320, 480)  # the shared prefixes' lengths
    suffix: tuple[int, int] = (8, 400)  # a prefixed prompt's own tail, uniform
    share_prefix: float = 0.5
    repeat: float = 0.1


def workload(seed: int, mix: Mix = Mix()) -> list[Arrival]:
    """The seeded arrival sequence (pure: the same seed gives the same requests)."""
    rng = random.Random(seed)

    def fresh(n: int) -> tuple[int, ...]:
        return tuple(rng.randrange(*TOKEN_IDS) for _ in range(n))

    prefixes = [fresh(n) for n in mix.prefixes]
    arrivals: list[Arrival] = []
    at = 0.0
    for index in range(mix.requests):
        if index:
            at += rng.expovariate(mix.rate_per_s)
        draw = rng.random()
        if draw < mix.repeat and arrivals:
            earlier = rng.choice(arrivals)
            prompt, kind = earlier.prompt, f"repeat of {earlier.index}"
        elif draw < mix.repeat + mix.share_prefix:
            which = rng.randrange(len(prefixes))
            prompt, kind = prefixes[which] + fresh(rng.randint(*mix.suffix)), f"prefix {which}"
        else:
            prompt, kind = fresh(rng.randint(*mix.fresh)), "fresh"
        arrivals.append(Arrival(index, round(at, 4), prompt, mix.max_tokens, kind))
    return arrivals


def warmup(seed: int) -> list[Arrival]:
    """A few requests of several lengths, one at a time, before the measured run."""
    rng = random.Random(seed + 1)
    return [Arrival(i, 0.0, tuple(rng.randrange(*TOKEN_IDS) for _ in range(n)), 8, "warm-up")
            for i, n in enumerate((40, 300, 700, 130))]


# ------------------------------------------------------------------------------ the model alone

@dataclass(slots=True)
class ModelRun:
    """The batching model run alone on the arrivals (no HTTP, no clock: its own timeline)."""

    cached: dict[int, int]  # request index: cached_tokens
    ttft_s: dict[int, float]  # request index: its first token's step end less its arrival
    preemptions: int
    evicted: int  # blocks evicted (BlockRemoved hashes)
    steps: int


def model_run(arrivals: list[Arrival], settings: Settings, *, scale: float = 1.0,
              sent: list[float] | None = None) -> ModelRun:
    """The vLLM batching model on ``arrivals`` (at ``sent`` times if given, else their own),
    its steps ``scale`` times as long as the profile says; pure. What the simulator decides
    when the HTTP side and the clock are taken away: whether a figure depends on timing shows
    by running it at other speeds."""
    base = load_step_profile(settings.profile)
    profile = replace(base, **{name: getattr(base, name) * scale for name in COEFFICIENTS})
    config = VllmSchedulerConfig(num_gpu_blocks=settings.num_gpu_blocks,
                                 block_size=settings.block_size,
                                 max_num_batched_tokens=settings.max_num_batched_tokens,
                                 max_num_seqs=settings.max_num_seqs)
    engine = VllmBatchingEngine(config, profile, VllmChainHasher(bytes(32)))
    times = sent if sent is not None else [a.at_s for a in arrivals]
    order = sorted(range(len(arrivals)), key=lambda i: times[i])
    now, next_one = 0.0, 0
    run = ModelRun({}, {}, 0, 0, 0)
    while next_one < len(order) or engine.running or engine.waiting:
        while next_one < len(order) and times[order[next_one]] <= now:
            a = arrivals[order[next_one]]
            engine.add(SimRequest(a.index, a.prompt, a.max_tokens))
            next_one += 1
        outcome = engine.step()
        if outcome is None:  # idle until the next arrival
            now = times[order[next_one]]
            continue
        now += outcome.seconds
        run.steps += 1
        run.cached.update(outcome.scheduled)
        for index in outcome.first_tokens:
            run.ttft_s[index] = now - times[index]
        run.preemptions += len(outcome.preempted)
        run.evicted += sum(len(e.block_hashes) for e in outcome.events
                           if isinstance(e, BlockRemoved))
    return run


SCALES = (0.7, 0.8, 0.9, 1.1, 1.2, 1.3)  # model speeds that tell a timing race


def timing_races(arrivals: list[Arrival], settings: Settings,
                 sent: list[float] | None = None) -> dict[int, list[int]]:
    """The requests whose ``cached_tokens`` the model changes when its steps run at another
    speed (``SCALES``): each with the values it takes (pure)."""
    runs = [model_run(arrivals, settings, scale=scale, sent=sent) for scale in (1.0, *SCALES)]
    return {a.index: sorted({run.cached[a.index] for run in runs}) for a in arrivals
            if len({run.cached[a.index] for run in runs}) > 1}


# ------------------------------------------------------------------------------ the client

@dataclass(slots=True)
class Outcome:
    index: int
    status: int
    cached_tokens: int | None
    prompt_tokens: int | None
    completion_tokens: int | None
    events: int  # data: events before [DONE] (tokens, then the usage event)
    ttft_s: float
    e2e_s: float
    late_s: float  # how late the client sent it


def body(arrival: Arrival) -> bytes:
    return json.dumps({"model": MODEL, "prompt": list(arrival.prompt),
                       "max_tokens": arrival.max_tokens, "min_tokens": arrival.max_tokens,
                       "ignore_eos": True, "temperature": 0.0, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()


async def drive(url: str, arrivals: list[Arrival], *, paced: bool = True) -> list[Outcome]:
    """Send every request at its arrival time (``paced``; else one after another) and stream
    every answer to its end."""
    limits = PoolLimits(max_connections_per_worker=1024, max_idle_per_worker=1024,
                        acquire_timeout_s=300.0)
    upstream = ConnectionPool(limits)
    headers = [(b"content-type", b"application/json")]
    payloads = [body(a) for a in arrivals]
    outcomes: list[Outcome] = []

    async def one(i: int, due: float) -> None:
        sent = trio.current_time()
        first = None
        status = 0
        events = 0
        tail = b""
        try:
            async with upstream.request(url, b"POST", b"/v1/completions", headers,
                                        payloads[i]) as response:
                status = response.status
                async for chunk in response.body_chunks():
                    if first is None and b"data:" in chunk:
                        first = trio.current_time()
                    events += chunk.count(b"data: {")
                    tail = (tail + chunk)[-4096:]
        except Exception as error:  # noqa: BLE001 - a failed request is a result
            print(f"request {arrivals[i].index}: {error!r}", file=sys.stderr)
        end = trio.current_time()
        found = [pattern.search(tail) for pattern in (_CACHED, _PROMPT, _OUTPUT)]
        cached, prompt, output = (int(m.group(1)) if m else None for m in found)
        outcomes.append(Outcome(arrivals[i].index, status, cached, prompt, output, events,
                                (first or end) - sent, end - sent, sent - due))

    async with trio.open_nursery() as nursery:
        await nursery.start(upstream.run)
        if paced:
            async with trio.open_nursery() as requests:
                start = trio.current_time() + 0.1
                for i, arrival in enumerate(arrivals):
                    due = start + arrival.at_s
                    await trio.sleep_until(due)
                    requests.start_soon(one, i, due)
        else:
            for i in range(len(arrivals)):
                await one(i, trio.current_time())
        nursery.cancel_scope.cancel()
    outcomes.sort(key=lambda o: o.index)
    return outcomes


# ------------------------------------------------------------------------------ the engines

@dataclass(slots=True)
class EngineRun:
    outcomes: list[Outcome]
    preemptions: int
    warmup: list[Outcome] = field(default_factory=list)  # one at a time: a lone request's TTFT


def run_on(server: VllmServer | SimProcess, arrivals: list[Arrival], warm: list[Arrival],
           repeat: int = 1) -> list[EngineRun]:
    """Warm up, then ``repeat`` times: empty the prefix cache and run the arrivals; each run's
    outcomes and preemptions."""
    lone = trio.run(partial(drive, server.url, warm, paced=False))
    runs = []
    for _ in range(repeat):
        server.reset_prefix_cache()
        before = metric_sum(server.get("/metrics")[1].decode(), PREEMPTIONS)
        with client_priority():
            outcomes = trio.run(drive, server.url, arrivals)
        after = metric_sum(server.get("/metrics")[1].decode(), PREEMPTIONS)
        runs.append(EngineRun(outcomes, round(after - before), lone))
    return runs


@contextmanager
def client_priority(nice: int = -5) -> Iterator[None]:
    """This process (the client) ahead of the engines while it drives them: a client starved
    of CPU by the 2 cores' other work sends late (seconds, once) and reorders the arrivals.
    The engines, started before, keep their own priority. Where not permitted, unchanged."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError:
        yield
        return
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)


def real_server(env: EngineEnv, settings: Settings, logs: Path, name: str = "validate",
                step_log: bool = False) -> VllmServer:
    extra = settings.vllm_args() + (("--enable-logging-iteration-details",) if step_log else ())
    options = VllmOptions(env.model("qwen-tiny"), MODEL, block_size=settings.block_size,
                          num_blocks=settings.num_gpu_blocks,
                          max_model_len=settings.max_model_len, extra_args=extra)
    return VllmServer(name, options, env, logs)


class SimProcess:
    """``cortex sim`` with one vLLM engine on the batching model, as a child process; the same
    plain-HTTP helpers the tests' ``VllmServer`` has."""

    def __init__(self, settings: Settings, tokenizer: Path | None, log_path: Path) -> None:
        self.argv = [sys.executable, "-m", "cortex", "sim", *settings.sim_args(),
                     "--port", "0", "--count", "1"]
        if tokenizer is not None:
            self.argv += ["--tokenizer", str(tokenizer)]
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=log,
                                            cwd=ROOT, env=env, start_new_session=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode().split()  # once it listens
        if len(line) < 3:
            self.stop()
            raise RuntimeError(f"cortex sim did not start: {self.log_path.read_text()[-2000:]}")
        self.url = line[2]

    def stop(self) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.process = None

    def get(self, path: str) -> tuple[int, bytes]:
        from tests.real_engine.vllm_server import http_request
        return http_request("GET", self.url + path, None, 10.0)

    def reset_prefix_cache(self) -> None:
        from tests.real_engine.vllm_server import http_request
        status, _ = http_request("POST", self.url + "/reset_prefix_cache", b"", 10.0)
        if status != 200:
            raise RuntimeError(f"cortex sim: /reset_prefix_cache answered {status}")


@contextmanager
def sim_process(settings: Settings, tokenizer: Path | None, log_path: Path
                ) -> Iterator[SimProcess]:
    sim = SimProcess(settings, tokenizer, log_path)
    sim.start()
    try:
        yield sim
    finally:
        sim.stop()


@contextmanager
def others_cpu(pgid: int) -> Iterator[dict[str, float]]:
    """What the machine's CPUs did while the block ran, in CPU seconds (filled in at its end):
    ``busy`` in all, ``server`` (the process group ``pgid``), ``client`` (this process) and
    ``others`` (the rest: other sessions' work, which slows the real engine)."""
    def busy() -> float:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
        return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # less idle

    def group() -> float:
        total = 0
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as stat:
                        fields = stat.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(fields[2]) == pgid:  # the process group
                    total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / os.sysconf("SC_CLK_TCK")

    def own() -> float:
        times = os.times()
        return times.user + times.system

    figures: dict[str, float] = {}
    start = busy(), group(), own(), time.monotonic()
    yield figures
    end = busy(), group(), own(), time.monotonic()
    spent = [b - a for a, b in zip(start, end, strict=True)]
    figures.update({"seconds": round(spent[3], 1), "busy": round(spent[0], 1),
                    "server": round(spent[1], 1), "client": round(spent[2], 1),
                    "others": round(spent[0] - spent[1] - spent[2], 1)})


# ------------------------------------------------------------------------------ the report

def errors(real: list[float], sim: list[float]) -> dict[str, float]:
    """Relative errors sim / real - 1: median and p90 of their absolute values, signed median."""
    relative = [s / r - 1 for r, s in zip(real, sim, strict=True) if r > 0]
    absolute = [abs(e) for e in relative]
    return {"median_abs": round(percentile(absolute, 0.5), 4),
            "p90_abs": round(percentile(absolute, 0.9), 4),
            "median_signed": round(percentile(relative, 0.5), 4)}


def compare(arrivals: list[Arrival], real: EngineRun, sim: EngineRun,
            races: dict[int, list[int]] | None = None) -> dict[str, object]:
    """The validation's figures (pure). ``races``: ``timing_races`` of the run, which say why a
    request's ``cached_tokens`` differ when they do because of timing."""
    races = races or {}
    kinds = {a.index: a.kind for a in arrivals}
    lengths = {a.index: len(a.prompt) for a in arrivals}
    pairs = list(zip(real.outcomes, sim.outcomes, strict=True))
    failed = [r.index for r, s in pairs if r.status != 200 or s.status != 200
              or r.completion_tokens != s.completion_tokens]
    differ = [{"index": r.index, "kind": kinds[r.index], "prompt": lengths[r.index],
               "real": r.cached_tokens, "sim": s.cached_tokens,
               "why": (f"a timing race: the model alone gives {races[r.index]} at "
                       f"{min(SCALES)}-{max(SCALES)}x its speed"
                       + (", the real value among them" if r.cached_tokens in races[r.index]
                          else "") if r.index in races else "not a timing race: the model "
                       f"alone gives one value at {min(SCALES)}-{max(SCALES)}x its speed")}
              for r, s in pairs if r.cached_tokens != s.cached_tokens]
    ok = [(r, s) for r, s in pairs if r.index not in failed]
    return {
        "requests": len(pairs),
        "failed": failed,
        "cached_identical": len(pairs) - len(differ),
        "cached_differ": differ,
        "cached_tokens": {"real": sum(r.cached_tokens or 0 for r, _ in pairs),
                          "sim": sum(s.cached_tokens or 0 for _, s in pairs),
                          "prompt": sum(lengths.values())},
        "ttft": errors([r.ttft_s for r, _ in ok], [s.ttft_s for _, s in ok]),
        "e2e": errors([r.e2e_s for r, _ in ok], [s.e2e_s for _, s in ok]),
        # the distributions (not request by request): p50 and p90, ms
        "ttft_ms": {side: [round(percentile(values, q) * 1000, 1) for q in (0.5, 0.9)]
                    for side, values in (("real", [r.ttft_s for r, _ in ok]),
                                         ("sim", [s.ttft_s for _, s in ok]))},
        "e2e_ms": {side: [round(percentile(values, q) * 1000, 1) for q in (0.5, 0.9)]
                   for side, values in (("real", [r.e2e_s for r, _ in ok]),
                                        ("sim", [s.e2e_s for _, s in ok]))},
        "preemptions": {"real": real.preemptions, "sim": sim.preemptions},
        # the warm-up, one request at a time (the first of each engine is its slowest)
        "lone_ttft_ms": {"real": [round(o.ttft_s * 1000, 1) for o in real.warmup],
                         "sim": [round(o.ttft_s * 1000, 1) for o in sim.warmup]},
        "late_ms_max": round(max(o.late_s for o in [*real.outcomes, *sim.outcomes]) * 1000, 1),
    }


def table(rows: list[tuple[str, dict[str, object]]]) -> str:
    """One line per comparison (``compare``'s reports, labelled), then what differs."""
    lines = ["| compared | requests | cached identical | TTFT err median / p90 (signed median) "
             "| e2e err median / p90 (signed median) | TTFT p50 / p90 ms | e2e p50 / p90 ms "
             "| preemptions | client late, ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for label, report in rows:
        ttft, e2e, pre = report["ttft"], report["e2e"], report["preemptions"]
        lines.append(
            f"| {label} | {report['requests']} | {report['cached_identical']} / "
            f"{report['requests']} | {ttft['median_abs']:.0%} / {ttft['p90_abs']:.0%} "
            f"({ttft['median_signed']:+.0%}) | {e2e['median_abs']:.0%} / {e2e['p90_abs']:.0%} "
            f"({e2e['median_signed']:+.0%}) "
            f"| {'/'.join(f'{x:.0f}' for x in report['ttft_ms']['real'])} : "
            f"{'/'.join(f'{x:.0f}' for x in report['ttft_ms']['sim'])} "
            f"| {'/'.join(f'{x:.0f}' for x in report['e2e_ms']['real'])} : "
            f"{'/'.join(f'{x:.0f}' for x in report['e2e_ms']['sim'])} "
            f"| {pre['real']} / {pre['sim']} "
            f"| {report['late_ms_max']:.0f} |")
        for d in report["cached_differ"]:
            notes.append(f"  {label}: request {d['index']} ({d['kind']}, {d['prompt']} "
                         f"tokens): cached {d['real']} / {d['sim']}: {d['why']}")
        if report["failed"]:
            notes.append(f"  {label}: failed or short: {report['failed']}")
    return "\n".join(lines + notes)


# ------------------------------------------------------------------------------ main

def main(argv: list[str] | None = None) -> int:
    base, mix0 = Settings(), Mix()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--requests", type=int, default=mix0.requests)
    parser.add_argument("--rate", type=float, default=mix0.rate_per_s,
                        help="arrivals per second (Poisson)")
    parser.add_argument("--max-tokens", type=int, default=mix0.max_tokens)
    parser.add_argument("--num-gpu-blocks", type=int, default=base.num_gpu_blocks)
    parser.add_argument("--max-num-batched-tokens", type=int,
                        default=base.max_num_batched_tokens)
    parser.add_argument("--max-num-seqs", type=int, default=base.max_num_seqs)
    parser.add_argument("--step-profile", default=base.profile)
    parser.add_argument("--step-log", action="store_true",
                        help="the real engine logs every step (its counts and time) to its log")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of the workload on the real engine (the first is compared "
                             "with the others too: the real engine's own noise)")
    parser.add_argument("--skip-real", type=Path, metavar="JSON",
                        help="reuse the real engine's outcomes (and seed, workload, settings) "
                             "from an earlier --out file")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "validate_sim_vllm.json")
    args = parser.parse_args(argv)
    env, why = engine_env()
    if env is None:
        print(why, file=sys.stderr)
        return 2
    settings = Settings(num_gpu_blocks=args.num_gpu_blocks,
                        max_num_batched_tokens=args.max_num_batched_tokens,
                        max_num_seqs=args.max_num_seqs, profile=args.step_profile)
    mix = Mix(requests=args.requests, rate_per_s=args.rate, max_tokens=args.max_tokens)
    seed = args.seed
    earlier = json.loads(args.skip_real.read_text()) if args.skip_real else None
    if earlier is not None:
        settings = replace(Settings(**earlier["settings"]), profile=args.step_profile)
        mix = Mix(**{k: tuple(x) if isinstance(x, list) else x
                     for k, x in earlier["mix"].items()})
        seed = earlier["seed"]
    arrivals = workload(seed, mix)
    warm = warmup(seed)
    logs = ROOT / "build" / "validate_sim_vllm"
    if earlier is not None:
        reals = [EngineRun([Outcome(**o) for o in run["outcomes"]], run["preemptions"],
                           [Outcome(**o) for o in run["warmup"]]) for run in earlier["real"]]
        busy = earlier["other_cpu"]
    else:
        server = real_server(env, settings, logs, step_log=args.step_log)
        start_all([server])
        try:
            assert server.process is not None
            with others_cpu(server.process.pid) as busy:
                reals = run_on(server, arrivals, warm, args.repeat)
        finally:
            server.stop()
    with sim_process(settings, env.model("qwen-tiny") / "tokenizer.json",
                     logs / "sim.log") as sim:
        (simulated,) = run_on(sim, arrivals, warm)
    sent = [a.at_s + o.late_s for a, o in zip(arrivals, reals[0].outcomes, strict=True)]
    races = timing_races(arrivals, settings, sent)
    alone = model_run(arrivals, settings, sent=sent)
    versus = [compare(arrivals, real, simulated, races) for real in reals]
    noise = [compare(arrivals, reals[0], real) for real in reals[1:]]
    rows = [(f"real #{i + 1} / sim", r) for i, r in enumerate(versus)]
    rows += [(f"real #1 / real #{i + 2}", r) for i, r in enumerate(noise)]
    print(table(rows), file=sys.stderr)
    print(f"other processes' CPU during the real runs: {busy}", file=sys.stderr)
    report = {"versus_sim": versus, "real_vs_real": noise, "other_cpu": busy,
              "model_alone": {"preemptions": alone.preemptions, "evicted_blocks": alone.evicted,
                              "steps": alone.steps, "timing_races": sorted(races)}}
    out = {"command": ".venv/bin/python -m perf.validate_sim_vllm "
                      + shlex.join(sys.argv[1:]),
           "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
           "machine": machine_info(), "settings": asdict(settings), "mix": asdict(mix),
           "seed": seed, "other_cpu": busy, "report": report,
           "kinds": [a.kind for a in arrivals],
           "real": [{"outcomes": [asdict(o) for o in run.outcomes],
                     "preemptions": run.preemptions,
                     "warmup": [asdict(o) for o in run.warmup]} for run in reals],
           "sim": {"outcomes": [asdict(o) for o in simulated.outcomes],
                   "preemptions": simulated.preemptions,
                   "warmup": [asdict(o) for o in simulated.warmup]}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(json.dumps({k: out[k] for k in ("command", "settings", "report")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
