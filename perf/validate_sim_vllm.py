"""Validate the simulated vLLM engine against the real vLLM CPU engine: one seeded arrival
sequence through both, per-request ``cached_tokens``, TTFT and end-to-end time compared.

    PYTHONPATH=$PWD .venv/bin/python perf/validate_sim_vllm.py [--requests 60] [--seed 34]

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
arrival time (``drive``).

Per request: ``cached_tokens`` (``usage.prompt_tokens_details``), TTFT (sent to the first
``data:`` event) and end-to-end time (sent to the end of the stream). Per engine: the
preemptions (``vllm:num_preemptions_total`` on its ``/metrics``, the difference over the run).
Each engine first serves a short warm-up (the real one's first forwards of each shape are
slow), then its prefix cache is reset and the measured run starts from an empty cache.

Report (``compare``): requests whose ``cached_tokens`` differ (with the prompt's kind), the
relative error (sim / real - 1) of TTFT and of end-to-end time per request, median of the
absolute values, p90 and signed median, and both preemption counts. A table on stderr, JSON on
stdout; the same with every request's figures in ``--out`` (``--skip-real FILE`` reuses the
real engine's from an earlier one: iterating on the simulator).

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
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import trio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from benchkit import machine_info

from cortex.upstream.limits import PoolLimits
from cortex.upstream.pool import UpstreamPool
from tests.real_engine.vllm_server import EngineEnv, VllmOptions, VllmServer, engine_env, start_all

ROOT = HERE.parent
MODEL = "qwen"  # served model name of both engines
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
    rate_per_s: float = 10.0  # Poisson arrivals
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
    upstream = UpstreamPool(limits)
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

def metric(text: str, name: str) -> float:
    """Sum of a Prometheus sample family in ``text``."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            total += float(line.rsplit(" ", 1)[1])
    return total


@dataclass(slots=True)
class EngineRun:
    outcomes: list[Outcome]
    preemptions: int


def run_on(server: VllmServer | SimProcess, arrivals: list[Arrival],
           warm: list[Arrival]) -> EngineRun:
    """Warm up, empty the prefix cache, run the arrivals; the preemptions over the run."""
    trio.run(partial(drive, server.url, warm, paced=False))
    server.reset_prefix_cache()
    before = metric(server.get("/metrics")[1].decode(), PREEMPTIONS)
    outcomes = trio.run(drive, server.url, arrivals)
    after = metric(server.get("/metrics")[1].decode(), PREEMPTIONS)
    return EngineRun(outcomes, round(after - before))


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
        self.process = None

    def get(self, path: str) -> tuple[int, bytes]:
        from tests.real_engine.vllm_server import _request
        return _request("GET", self.url + path, None, 10.0)

    def reset_prefix_cache(self) -> None:
        from tests.real_engine.vllm_server import _request
        status, _ = _request("POST", self.url + "/reset_prefix_cache", b"", 10.0)
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


# ------------------------------------------------------------------------------ the report

def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def errors(real: list[float], sim: list[float]) -> dict[str, float]:
    """Relative errors sim / real - 1: median and p90 of their absolute values, signed median."""
    relative = [s / r - 1 for r, s in zip(real, sim, strict=True) if r > 0]
    absolute = [abs(e) for e in relative]
    return {"median_abs": round(quantile(absolute, 0.5), 4),
            "p90_abs": round(quantile(absolute, 0.9), 4),
            "median_signed": round(quantile(relative, 0.5), 4)}


def compare(arrivals: list[Arrival], real: EngineRun, sim: EngineRun) -> dict[str, object]:
    """The validation's figures (pure)."""
    kinds = {a.index: a.kind for a in arrivals}
    lengths = {a.index: len(a.prompt) for a in arrivals}
    pairs = list(zip(real.outcomes, sim.outcomes, strict=True))
    failed = [r.index for r, s in pairs if r.status != 200 or s.status != 200
              or r.completion_tokens != s.completion_tokens]
    differ = [{"index": r.index, "kind": kinds[r.index], "prompt": lengths[r.index],
               "real": r.cached_tokens, "sim": s.cached_tokens}
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
        "ttft_ms_median": {"real": round(quantile([r.ttft_s for r, _ in ok], 0.5) * 1000, 1),
                           "sim": round(quantile([s.ttft_s for _, s in ok], 0.5) * 1000, 1)},
        "e2e_ms_median": {"real": round(quantile([r.e2e_s for r, _ in ok], 0.5) * 1000, 1),
                          "sim": round(quantile([s.e2e_s for _, s in ok], 0.5) * 1000, 1)},
        "preemptions": {"real": real.preemptions, "sim": sim.preemptions},
        "late_ms_max": round(max(o.late_s for o in [*real.outcomes, *sim.outcomes]) * 1000, 1),
    }


def table(report: dict[str, object]) -> str:
    ttft, e2e = report["ttft"], report["e2e"]
    pre = report["preemptions"]
    lines = [
        "| requests | cached identical | TTFT err median / p90 (signed median) "
        "| e2e err median / p90 (signed median) | preemptions real / sim |",
        "|---|---|---|---|---|",
        f"| {report['requests']} | {report['cached_identical']} / {report['requests']} "
        f"| {ttft['median_abs']:.0%} / {ttft['p90_abs']:.0%} ({ttft['median_signed']:+.0%}) "
        f"| {e2e['median_abs']:.0%} / {e2e['p90_abs']:.0%} ({e2e['median_signed']:+.0%}) "
        f"| {pre['real']} / {pre['sim']} |"]
    for d in report["cached_differ"]:
        lines.append(f"  request {d['index']} ({d['kind']}, {d['prompt']} tokens): cached "
                     f"real {d['real']}, sim {d['sim']}")
    if report["failed"]:
        lines.append(f"  failed or short: {report['failed']}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ main

def main(argv: list[str] | None = None) -> int:
    base, mix0 = Settings(), Mix()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=34)
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
    parser.add_argument("--skip-real", type=Path, metavar="JSON",
                        help="reuse the real engine's outcomes from an earlier --out file")
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
    arrivals = workload(args.seed, mix)
    warm = warmup(args.seed)
    logs = ROOT / "build" / "validate_sim_vllm"
    if args.skip_real:
        earlier = json.loads(args.skip_real.read_text())
        real = EngineRun([Outcome(**o) for o in earlier["real_requests"]],
                         earlier["report"]["preemptions"]["real"])
    else:
        server = real_server(env, settings, logs, step_log=args.step_log)
        start_all([server])
        try:
            real = run_on(server, arrivals, warm)
        finally:
            server.stop()
    with sim_process(settings, env.model("qwen-tiny") / "tokenizer.json",
                     logs / "sim.log") as sim:
        simulated = run_on(sim, arrivals, warm)
    report = compare(arrivals, real, simulated)
    print(table(report), file=sys.stderr)
    out = {"command": "PYTHONPATH=$PWD .venv/bin/python perf/validate_sim_vllm.py "
                      + shlex.join(sys.argv[1:]),
           "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
           "machine": machine_info(), "settings": asdict(settings), "mix": asdict(mix),
           "seed": args.seed, "report": report,
           "kinds": [a.kind for a in arrivals],
           "real_requests": [asdict(o) for o in real.outcomes],
           "sim_requests": [asdict(o) for o in simulated.outcomes]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(json.dumps({k: out[k] for k in ("command", "settings", "report")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
