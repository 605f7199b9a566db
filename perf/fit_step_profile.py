"""Fit the simulator's step-time profile to the real vLLM CPU engine, and write it as a profile
file (``cortex/sim/profiles/vllm-cpu-tiny.toml`` by default).

    .venv/bin/python -m perf.fit_step_profile [--model qwen-tiny] [--quick]

What it does:

1. Starts one real vLLM CPU server (``tests/real_engine/vllm_server.py``, the suite's own
   settings: ``--block-size 32 --enforce-eager``, bf16, one OpenMP thread) with
   ``--enable-logging-iteration-details``: the engine logs one line per step with its context
   (prefill) requests and tokens, its generation (decode) requests, and the step's elapsed time;
   a logging config (``LOG_CONFIG``) stamps every line with its time to the microsecond. The
   server runs ``--distributed-executor-backend mp``, as the suite's servers do although they
   ask for ``uni``: vLLM's CPU platform turns ``uni`` into ``mp`` (``platforms/cpu.py``: OpenMP
   needs the mp executor), so under either the iteration timer waits for the worker's forward
   pass. ``--compare-uni`` checks that: one stream's client-side inter-token latency under each.
2. Drives a grid of streamed completions (as clients send them: the API server's work on each
   streamed token competes with the engine for the 2 cores, and slows its steps), one
   experiment at a time with the engine idle in between, every prompt made
   of fresh random token ids (no accidental prefix sharing): single prefills of several lengths;
   prefills over a cached prefix (the prefix sent first, then prefix + suffix); and decode
   batches of several sizes and prompt lengths (``ignore_eos``, a fixed number of tokens each).
3. Reconstructs each logged step's work (``StepWork``): the log gives only counts, so each
   experiment replays vLLM's FCFS order over its known requests (prompt length, cached tokens,
   tokens to generate); a step the replay cannot explain is dropped and counted.
4. Times each step as the client sees it: the iteration timer runs from the forward pass's
   dispatch to its result, so it misses the engine core's scheduling and output handling and
   the API server's share of each step; the log's time stamps (the API server logs a step when
   it takes the step's outputs) give the period between two steps of a busy engine, and what
   the timer misses is fitted as ``a + b x requests in the step`` (``fit_gap``) over every step
   whose period is known, then added to every step's logged time.
5. Fits the six coefficients by non-negative least squares on relative errors (every step
   weighs the same whatever its length), in pure Python (Cortex's venv has no numpy), and
   writes the profile with the fit's data, residuals and this command.

Keep it short: the machine is shared; the default grid takes a few minutes including the ~45 s
server start.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import random
import re
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from cortex.sim.step_profiles import COEFFICIENTS, STEP_COEFFICIENTS, read_step_profile
from cortex.sim.step_time import Chunk, StepProfile, StepWork
from perf.benchkit import machine_info, percentile
from tests.real_engine.vllm_server import VllmOptions, VllmServer, engine_env, start_all

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "cortex" / "sim" / "profiles" / "vllm-cpu-tiny.toml"
BUDGET = 2048  # --max-num-batched-tokens: prompts up to this run in one step
ITERATION = re.compile(
    r"Iteration\((\d+)\): (\d+) context requests, (\d+) context tokens, (\d+) generation "
    r"requests, (\d+) generation tokens, iteration elapsed time: ([\d.]+) ms")
STAMP = re.compile(r"(\d{9,}\.\d+) ")  # LOG_CONFIG's time stamp opening a line
# vLLM's own logging layout but for the time: seconds since the epoch to the microsecond
# (vLLM's default stamps whole seconds); uvicorn's lines too (the ready line is one of them)
LOG_CONFIG = {
    "version": 1, "disable_existing_loggers": False,
    "formatters": {"stamped": {"()": "vllm.logging_utils.NewLineFormatter",
                               "format": "%(created).6f %(process)d %(levelname)s %(message)s"}},
    "handlers": {"stamped": {"class": "logging.StreamHandler", "formatter": "stamped",
                             "level": "INFO", "stream": "ext://sys.stdout"}},
    "loggers": {name: {"handlers": ["stamped"], "level": level, "propagate": False}
                for name, level in (("vllm", "INFO"), ("uvicorn", "INFO"),
                                    ("uvicorn.access", "WARNING"))}}
GAP_IDLE_S = 0.02  # a period this much longer than the step's own time had the engine idle
KINDS = ("prefill", "cached", "decode")
TOKEN_IDS = (1000, 30000)  # plain vocabulary of both tiny models (no special tokens)


# ------------------------------------------------------------------------------ the grid

@dataclass
class Request:
    prompt: int  # prompt tokens
    output: int  # tokens it generates
    cached: int | None = 0  # prompt tokens the engine reuses; None: learnt from the log
    remaining: int = 0  # prompt tokens still to compute (replay state)
    generated: int = 0


@dataclass
class Experiment:
    kind: str  # "prefill", "cached", "decode", "warmup"
    label: str
    requests: list[Request]  # in arrival (FCFS) order
    prefix: int = 0  # "cached": prefix tokens sent first, as their own request
    steps: list[tuple[StepWork, float]] = field(default_factory=list)
    prefix_steps: list[tuple[StepWork, float]] = field(default_factory=list)  # "cached" only
    dropped: int = 0
    # (requests in the step, its period less its logged time) for each step whose period is
    # known: the one before it was logged in the same experiment, with a time stamp
    gaps: list[tuple[int, float]] = field(default_factory=list)
    # a request alone on an idle engine (a prefill, one token out): the seconds its client
    # waited, and its steps
    lone: list[tuple[float, list[tuple[StepWork, float]]]] = field(default_factory=list)

    def data(self, kind: str) -> list[tuple[StepWork, float]]:
        """This experiment's steps of one kind (a "cached" one's prefix steps are prefills)."""
        if self.kind == "warmup":
            return []
        return (self.steps if self.kind == kind else []) + (
            self.prefix_steps if kind == "prefill" else [])


def grid(quick: bool, passes: int, rng: random.Random) -> list[Experiment]:
    """The experiments in running order: warm-ups, then ``passes`` rounds of the grid, each
    round shuffled (load from other processes then spreads over every shape instead of
    landing on whichever ran at that moment)."""
    prefill = (32, 256, 1024) if quick else (32, 128, 256, 512, 1024, 1536)
    cached = (((512, 64),) if quick else
              ((256, 32), (512, 64), (1024, 32), (1024, 256), (1536, 128), (1024, 960)))
    batches = (1, 4) if quick else (1, 2, 4, 8, 16)
    contexts = (32, 1024) if quick else (32, 512, 1024)
    output = 12 if quick else 24
    experiments = [Experiment("warmup", "warm-up", [Request(300, 4)]),
                   Experiment("warmup", "warm-up", [Request(1024, 4) for _ in range(2)])]
    for _ in range(passes):
        round_ = [Experiment("prefill", f"prefill {n}", [Request(n, 1)]) for n in prefill]
        round_ += [Experiment("cached", f"{p} cached + {s}",
                              [Request(p + s, 1, cached=None)], prefix=p) for p, s in cached]
        round_ += [Experiment("decode", f"decode {b} x {n}",
                              [Request(n, output) for _ in range(b)])
                   for b in batches for n in contexts]
        rng.shuffle(round_)
        experiments += round_
    return experiments


# ------------------------------------------------------------------------------ running it

Line = tuple[int, int, int, int, float, float | None]  # counts, logged s, stamp (or None)


def log_config(directory: Path) -> Path:
    """``LOG_CONFIG`` as the file ``VLLM_LOGGING_CONFIG_PATH`` names."""
    path = directory / "vllm-logging.json"
    directory.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(LOG_CONFIG))
    return path


def iteration_lines(text: str) -> list[Line]:
    """The iteration lines of a log: context requests and tokens, generation requests and
    tokens, the logged time in seconds, and the line's time stamp (None without one)."""
    lines: list[Line] = []
    for line in text.splitlines():
        match = ITERATION.search(line)
        if match:
            stamp = STAMP.match(line)
            lines.append((int(match[2]), int(match[3]), int(match[4]), int(match[5]),
                          float(match[6]) / 1000, float(stamp[1]) if stamp else None))
    return lines


class LogTail:
    """The server's log from a byte offset on: the iteration lines written since."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size

    def take(self) -> list[Line]:
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            text = handle.read()
        cut = text.rfind(b"\n") + 1  # a line still being written waits for the next take
        self.offset += cut
        return iteration_lines(text[:cut].decode(errors="replace"))


def prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(*TOKEN_IDS) for _ in range(n)]


def complete(server: VllmServer, tokens: list[int], output: int) -> float:
    """One completion, streamed as clients (and Cortex) ask for them and read to its end; the
    seconds to its first token, as its client saw them. Streamed, because the API server's
    work on every token of every stream shares the 2 cores with the engine: a one-token decode
    step of ~6 ms when the answers were not streamed came out ~9 ms apart in one stream."""
    body = json.dumps({"model": server.options.served_name, "prompt": tokens,
                       "max_tokens": output, "min_tokens": output, "ignore_eos": True,
                       "temperature": 0.0, "stream": True}).encode()
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=300)
    try:
        started = time.perf_counter()
        connection.request("POST", "/v1/completions", body, {"content-type": "application/json"})
        answer = connection.getresponse()
        if answer.status != 200:
            raise RuntimeError(f"completion answered {answer.status}: {answer.read()!r}")
        first = None
        for line in answer:
            if first is None and line.startswith(b"data: {"):
                first = time.perf_counter()
    finally:
        connection.close()
    if first is None:
        raise RuntimeError("a streamed completion without a token")
    return first - started


def wait_logged(tail: LogTail, expected_min: int) -> list[Line]:
    """The iteration lines of the experiment just finished (the frontend logs a step when it
    takes its outputs, around the time the response leaves: wait until they stop coming)."""
    lines: list[Line] = []
    quiet_since = time.monotonic()
    while True:
        time.sleep(0.1)
        new = tail.take()
        lines += new
        quiet = time.monotonic() - quiet_since
        if new:
            quiet_since = time.monotonic()
        elif (len(lines) >= expected_min and quiet > 0.4) or quiet > 5:
            return lines


def run(server: VllmServer, experiment: Experiment, rng: random.Random, tail: LogTail,
        pool: ThreadPoolExecutor) -> None:
    tail.take()
    if experiment.prefix:  # the prefix first, alone: its prefill is a data point of its own
        (request,) = experiment.requests
        head = prompt(rng, experiment.prefix)
        took = complete(server, head, 1)
        alone = Experiment("prefill", f"prefill {experiment.prefix}",
                           [Request(experiment.prefix, 1)])
        replay(alone, wait_logged(tail, 1))
        experiment.prefix_steps = alone.steps
        experiment.dropped += alone.dropped
        experiment.gaps += alone.gaps
        if not alone.dropped:
            experiment.lone.append((took, alone.steps))
        prompts = [head + prompt(rng, request.prompt - experiment.prefix)]
    else:
        prompts = [prompt(rng, request.prompt) for request in experiment.requests]
    jobs = [pool.submit(complete, server, tokens, request.output)
            for tokens, request in zip(prompts, experiment.requests, strict=True)]
    took = [job.result() for job in jobs]
    replay(experiment, wait_logged(tail, max(r.output for r in experiment.requests)))
    if experiment.kind == "prefill" and not experiment.dropped:
        experiment.lone.append((took[0], experiment.steps))


def replay(experiment: Experiment, lines: list[Line] | list[tuple[int, int, int, int, float]]
           ) -> None:
    """Each logged step's work, replaying vLLM's FCFS order over the experiment's requests:
    running decodes first, then prefill tokens to the earliest requests with prompt left; and
    each time-stamped step's gap (its period less its logged time) after a time-stamped one."""
    stamps = [line[5] if len(line) > 5 else None for line in lines]
    for i in range(1, len(lines)):
        before, now = stamps[i - 1], stamps[i]
        if before is not None and now is not None:
            ctx_requests, _, gen_requests, _, seconds = lines[i][:5]
            experiment.gaps.append((ctx_requests + gen_requests, now - before - seconds))
    lines = [line[:5] for line in lines]
    requests = experiment.requests
    if any(request.cached is None for request in requests):  # one request: learnt from the log
        (request,) = requests
        request.cached = request.prompt - sum(line[1] for line in lines)
    for request in requests:
        request.remaining = request.prompt - request.cached
        request.generated = 0
    for ctx_requests, ctx_tokens, gen_requests, gen_tokens, seconds in lines:
        decoding = [r for r in requests if r.remaining == 0 and 0 < r.generated < r.output]
        prefilling = [r for r in requests if r.remaining > 0]
        if gen_requests != len(decoding) or gen_tokens != gen_requests:
            experiment.dropped += 1  # a step this replay cannot explain (should not happen)
            continue
        decode_context = 0
        for r in decoding:
            decode_context += r.prompt + r.generated  # the KV it reads, its new token included
            r.generated += 1
        chunks = []
        left = ctx_tokens
        for r in prefilling[:ctx_requests]:
            take = min(r.remaining, left)
            chunks.append(Chunk(take, r.prompt - r.remaining))
            r.remaining -= take
            left -= take
            if r.remaining == 0:
                r.generated = 1  # the step that computes the last prompt token samples one
        if left or len(chunks) != ctx_requests:
            experiment.dropped += 1
            continue
        experiment.steps.append((StepWork(tuple(chunks), len(decoding), decode_context), seconds))


# ------------------------------------------------------------------------------ the fit

def features(work: StepWork) -> list[float]:
    """The step's value of each coefficient's term, in ``STEP_COEFFICIENTS`` order."""
    pairs = sum(c.tokens * (c.context + c.tokens / 2) for c in work.chunks)
    return [1.0, float(work.prefill_tokens), pairs, float(work.decodes),
            float(work.decode_context), 1.0 if work.prefills else 0.0]


@dataclass(frozen=True)
class Gap:
    """What vLLM's iteration timer misses of a step: ``base_s + per_request_s x requests``."""

    base_s: float
    per_request_s: float
    medians: dict[int, tuple[float, int]]  # requests in the step: (median gap, steps)

    def seconds(self, work: StepWork) -> float:
        return self.base_s + self.per_request_s * (len(work.chunks) + work.decodes)


def fit_gap(gaps: list[tuple[int, float]]) -> Gap:
    """A straight line, non-negative, through the median gap per number of requests in the
    step (weights: the square root of the steps behind each median); gaps of an engine that
    went idle in between (over ``GAP_IDLE_S``) are left out."""
    by_requests: dict[int, list[float]] = {}
    for requests, gap in gaps:
        if gap < GAP_IDLE_S:
            by_requests.setdefault(requests, []).append(gap)
    medians = {n: (percentile(values, 0.5), len(values))
               for n, values in sorted(by_requests.items())}
    if not medians:
        return Gap(0.0, 0.0, {})
    rows = [[math.sqrt(count), math.sqrt(count) * n] for n, (_, count) in medians.items()]
    targets = [math.sqrt(count) * value for value, count in medians.values()]
    base, per_request = nnls(rows, targets)
    return Gap(base, per_request, medians)


def request_overheads(experiments: list[Experiment], gap: Gap) -> list[float]:
    """For each request alone on an idle engine: what its client waited beyond its steps
    (each its logged time plus ``gap``): the API server's work on the request before the
    scheduler saw it and on its answer after."""
    return [took - sum(seconds + gap.seconds(work) for work, seconds in steps)
            for e in experiments if e.kind != "warmup" for took, steps in e.lone]


def timed(steps: list[tuple[StepWork, float]], gap: Gap) -> list[tuple[StepWork, float]]:
    """Each step's logged time plus what the timer misses of it."""
    return [(work, seconds + gap.seconds(work)) for work, seconds in steps]


def nnls(a: list[list[float]], b: list[float], iterations: int = 200) -> list[float]:
    """min |A x - b| subject to x >= 0 (Lawson and Hanson's active-set method), for the few
    columns here; solved through the normal equations with partial-pivoting elimination."""
    n = len(a[0])
    ata = [[sum(row[i] * row[j] for row in a) for j in range(n)] for i in range(n)]
    atb = [sum(row[i] * y for row, y in zip(a, b, strict=True)) for i in range(n)]

    def solve(free: list[int]) -> list[float]:
        m = [[ata[i][j] for j in free] + [atb[i]] for i in free]
        size = len(free)
        for col in range(size):
            pivot = max(range(col, size), key=lambda r: abs(m[r][col]))
            m[col], m[pivot] = m[pivot], m[col]
            if abs(m[col][col]) < 1e-300:
                continue
            for r in range(size):
                if r != col:
                    factor = m[r][col] / m[col][col]
                    m[r] = [x - factor * y for x, y in zip(m[r], m[col], strict=True)]
        z = [0.0] * n
        for k, i in enumerate(free):
            z[i] = m[k][size] / m[k][k] if abs(m[k][k]) >= 1e-300 else 0.0
        return z

    def gradient(x: list[float]) -> list[float]:  # A^T (b - A x)
        return [atb[i] - sum(ata[i][j] * x[j] for j in range(n)) for i in range(n)]

    x = [0.0] * n
    free: list[int] = []
    for _ in range(iterations):
        w = gradient(x)
        candidates = [i for i in range(n) if i not in free and w[i] > 1e-12]
        if not candidates:
            break
        free.append(max(candidates, key=lambda i: w[i]))
        while True:
            z = solve(sorted(free))
            if all(z[i] > 0 for i in free):
                x = z
                break
            alpha = min(x[i] / (x[i] - z[i]) for i in free if z[i] <= 0)
            x = [x[i] + alpha * (z[i] - x[i]) for i in range(n)]
            free = [i for i in free if x[i] > 1e-15]
    return x


@dataclass
class Group:
    """Steps of one shape (``shape``): their median time is what the fit sees."""

    work: StepWork  # the member whose time is the median
    features: list[float]  # the members' mean features
    seconds: float  # the members' median time
    count: int


def shape(work: StepWork) -> tuple[object, ...]:
    """Steps with the same chunks (contexts to 64 tokens) and decodes, whose contexts per
    sequence agree to 64 tokens: a decode experiment's steps fall into one or two groups."""
    per_sequence = work.decode_context // (64 * work.decodes) if work.decodes else 0
    return (tuple((c.tokens, c.context // 64) for c in work.chunks), work.decodes, per_sequence)


def group(steps: list[tuple[StepWork, float]]) -> list[Group]:
    members: dict[tuple[object, ...], list[tuple[StepWork, float]]] = {}
    for step in steps:
        members.setdefault(shape(step[0]), []).append(step)
    groups = []
    for same in members.values():
        middle = sorted(same, key=lambda step: step[1])[len(same) // 2]
        rows = [features(work) for work, _ in same]
        groups.append(Group(middle[0], [sum(col) / len(rows) for col in zip(*rows, strict=True)],
                            middle[1], len(same)))
    return groups


def fit(steps: list[tuple[StepWork, float]], rounds: int = 20) -> tuple[StepProfile, list[Group],
                                                                         list[float]]:
    """The coefficients, the groups they were fitted to, and each group's final weight (0: an
    outlier).

    Single steps scatter widely on a shared machine (the engine core can lose its core right
    after handing a step to the worker, so vLLM's timer starts late, or while the worker runs),
    so the fit sees the median time of each shape (``group``), weighted by the square root of
    its count. Errors are relative to the fitted value (every shape weighs the same whatever
    its length, and a group measured too short does not get a huge weight), with Tukey's
    bisquare weights re-estimated each round from the residuals' median absolute deviation
    (iteratively reweighted least squares), so what interference is left in a median ends as
    an outlier with weight 0 instead of pulling the fit."""
    groups = group(steps)
    rows = [g.features for g in groups]
    measured = [g.seconds for g in groups]
    base = [math.sqrt(g.count) for g in groups]
    scale = [max(row[j] for row in rows) or 1.0 for j in range(len(STEP_COEFFICIENTS))]
    weights = [1.0] * len(groups)
    predicted = measured[:]
    x = [0.0] * len(scale)
    for _ in range(rounds):
        w = [b * r for b, r in zip(base, weights, strict=True)]
        a = [[wi * row[j] / scale[j] / p for j in range(len(scale))]
             for row, p, wi in zip(rows, predicted, w, strict=True)]
        b = [wi * y / p for y, p, wi in zip(measured, predicted, w, strict=True)]
        x = nnls(a, b)
        predicted = [max(sum(x[j] * row[j] / scale[j] for j in range(len(scale))), 1e-6)
                     for row in rows]
        relative = [(p - y) / p for y, p in zip(measured, predicted, strict=True)]
        center = percentile(relative, 0.5)
        spread = 1.4826 * percentile([abs(r - center) for r in relative], 0.5) or 1e-9
        weights = [(1 - (r / (4.685 * spread)) ** 2) ** 2 if abs(r) < 4.685 * spread else 0.0
                   for r in relative]
    values = {name: x[j] / scale[j] for j, name in enumerate(STEP_COEFFICIENTS)}
    return StepProfile(name="vllm-cpu-tiny", **values), groups, weights


def residuals(profile: StepProfile, steps: list[tuple[StepWork, float]]) -> dict[str, float]:
    errors = sorted(profile.seconds(work) / seconds - 1 for work, seconds in steps)
    absolute = sorted(abs(e) for e in errors)
    return {"steps": len(errors),
            "rms_relative": round(math.sqrt(sum(e * e for e in errors) / len(errors)), 4),
            "median_abs_relative": round(percentile(absolute, 0.5), 4),
            "p90_abs_relative": round(percentile(absolute, 0.9), 4),
            "max_abs_relative": round(absolute[-1], 4),
            "mean_relative": round(sum(errors) / len(errors), 4)}


# ------------------------------------------------------------------------------ the file

def toml_value(value: object) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, float):
        return f"{value:.6g}" if value and math.isfinite(value) else repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return str(value)


def check_entries(groups: list[Group]) -> list[dict[str, object]]:
    """Measured figures the profile must reproduce: the median steps of well-sampled shapes (a
    short and a long prefill, a single decode, a batch of 16)."""
    wanted = [("a 32-token prefill", 0.35, "",
               lambda w: w.chunks == (Chunk(32, 0),) and not w.decodes),
              ("a 1024-token prefill", 0.35, "",
               lambda w: w.chunks == (Chunk(1024, 0),) and not w.decodes),
              ("one decode, short context", 0.35, "",
               lambda w: w.decodes == 1 and not w.chunks and w.decode_context < 128),
              ("16 decodes, about 1k context each", 0.35, "",
               lambda w: w.decodes == 16 and not w.chunks and w.decode_context >= 16 * 1024)]
    entries = []
    for what, tolerance, why, match in wanted:
        found = [g for g in groups if match(g.work) and g.count >= 5]
        if found:
            g = max(found, key=lambda g: g.count)
            entries.append({"what": f"{what}: median measured step", "work": g.work,
                            "seconds": g.seconds, "n": g.count, "tolerance": tolerance,
                            "why": why})
    return entries


def write_profile(path: Path, profile: StepProfile, experiments: list[Experiment],
                  steps: list[tuple[StepWork, float]], groups: list[Group],
                  weights: list[float], gap: Gap, overheads: list[float],
                  meta: dict[str, object]) -> None:
    """The profile file; ``steps`` are timed as fitted (logged time plus ``gap``),
    ``overheads`` are ``request_overheads``."""
    every = residuals(profile, steps)
    medians = residuals(profile, [(g.work, g.seconds) for g in groups])
    kept = residuals(profile, [(g.work, g.seconds)
                               for g, w in zip(groups, weights, strict=True) if w > 0])
    by_kind = {kind: residuals(profile, timed(data, gap))
               for kind in KINDS if (data := [s for e in experiments for s in e.data(kind)])}
    gaps = sum(count for _, count in gap.medians.values())
    executor = meta["executor"]
    small = [profile.seconds(g.work) / g.seconds - 1 for g in groups
             if g.work.chunks and g.work.prefill_tokens <= 256 and not g.work.decodes]
    decodes = [profile.seconds(g.work) / g.seconds - 1 for g in groups
               if g.work.decodes and not g.work.chunks]
    lines = [
        "# Fitted to the real vLLM CPU engine by perf/fit_step_profile.py; regenerate it with",
        "# the command in [fit] rather than editing it.",
        f"name = {toml_value(profile.name)}",
        f"description = {toml_value(meta['description'])}",
        "",
        "[coefficients]",
        *(f"{name} = {getattr(profile, name):.6g}" for name in COEFFICIENTS),
        "",
        "[source]",
        "summary = " + toml_value(
            f"Fitted to {every['steps']} steps of the real vLLM {meta['vllm']} CPU engine "
            f"serving {meta['model']}, each timed by the engine's own per-step log "
            "(--enable-logging-iteration-details) plus what that timer misses of a step (the "
            "engine core's scheduling and output handling, the API server's share: "
            f"{gap.base_s * 1000:.2f} ms + {gap.per_request_s * 1000:.3f} ms per request in the "
            f"step, fitted to the periods between the log's time stamps of {gaps} steps of a "
            "busy engine, [fit.gap]), and its work reconstructed from the log's "
            f"counts; non-negative least squares on relative errors over the {len(groups)} "
            "shapes' median times, robustly reweighted. The grid, every step's work and time, "
            f"the residuals and the command are in [fit]. Machine: {meta['machine']}."),
        "step_s = " + toml_value(
            "fitted intercept: a step's cost whatever its work (the tiny model's lm_head over "
            "its whole vocabulary, sampling, preparing the batch, the executor's round trip, "
            "scheduling and handing out the outputs)"),
        "prefill_token_s = " + toml_value("fitted: per prompt token computed"),
        "attention_pair_s = " + toml_value(
            "fitted: per (new token, context token) pair of a prefill chunk"),
        "decode_seq_s = " + toml_value("fitted: per sequence decoded in the step"),
        "decode_kv_token_s = " + toml_value(
            "fitted: per KV token a decoding sequence reads"),
        "prefill_step_s = " + toml_value(
            "fitted: once per step that computes prompt tokens, whatever their number (the "
            "prefill attention path, new requests' set-up): on this engine a 32-token prefill "
            "takes a few ms more than a one-token decode"),
        "request_s = " + toml_value(
            f"measured, no part of a step: the median over {len(overheads)} requests sent "
            "alone to the idle engine (a prefill, one token out) of the time their client "
            "waited for the token beyond their steps (each timed as above): the API server's "
            "work on a request before the scheduler sees it and on its answer after "
            f"(quartiles {percentile(overheads, 0.25) * 1000:.1f} / "
            f"{percentile(overheads, 0.75) * 1000:.1f} ms; [fit.request])"),
        "uncertainty = " + toml_value(
            f"Relative error of the profile against the median step of each shape: median "
            f"{medians['median_abs_relative']:.0%}, p90 {medians['p90_abs_relative']:.0%} "
            f"({medians['steps']} shapes; {medians['steps'] - kept['steps']} rejected as "
            f"outliers); against single steps: median {every['median_abs_relative']:.0%}, p90 "
            f"{every['p90_abs_relative']:.0%}. Decode-only shapes: median error "
            f"{percentile(decodes, 0.5):+.0%}; prefills of at most 256 new tokens: median "
            f"{percentile(small, 0.5):+.0%}. The machine is shared (2 cores under other "
            "developers' load): single steps scatter by tens of percent, and the engine's speed "
            "as a whole drifts by 20-30 % from one run to the next (its one-decode step logged "
            "4.7 to 6.2 ms, median, in runs ten minutes apart on 2026-12-06); repeated runs of "
            "this script give coefficients that differ by 20 % (step_s, prefill_token_s) to a "
            "factor of 2 or 3 (decode_seq_s, decode_kv_token_s: small terms here, which trade "
            "off against each other). The steps were timed under "
            "--distributed-executor-backend mp, as the "
            "suite's servers run (vLLM's CPU platform turns their uni into mp)" + (
                f"; one stream's inter-token latency was {executor['mp_stream_itl_ms']} ms "
                f"asking for mp and {executor['uni_stream_itl_ms']} ms asking for uni "
                "([fit.executor])." if executor else ".")),
    ]
    for entry in check_entries(groups):
        work: StepWork = entry["work"]
        lines += ["", "[[checks]]", f"what = {toml_value(entry['what'])}",
                  f"chunks = {toml_value([[ch.tokens, ch.context] for ch in work.chunks])}",
                  f"decodes = {work.decodes}", f"decode_context = {work.decode_context}",
                  f"seconds = {entry['seconds']:.6g}", f"tolerance = {entry['tolerance']}",
                  "source = " + toml_value(f"this fit's data: the median of {entry['n']} "
                                           f"measured steps of that shape{entry['why']}")]
    lines += [
        "", "[fit]", f"command = {toml_value(meta['command'])}",
        f"date = {toml_value(meta['date'])}", f"vllm = {toml_value(meta['vllm'])}",
        f"model = {toml_value(meta['model'])}",
        f"server_args = {toml_value(meta['server_args'])}",
        f"grid = {toml_value(sorted({e.label for e in experiments if e.kind != 'warmup'}))}",
        f"passes = {meta['passes']}",
        f"steps_used = {len(steps)}",
        f"steps_dropped = {sum(e.dropped for e in experiments)}",
        f"shapes = {len(groups)}",
        f"shapes_rejected_as_outliers = {sum(1 for w in weights if w == 0)}",
        "method = " + toml_value(
            "steps grouped by shape (same chunks, contexts to 64 tokens, same decodes, context "
            "per sequence to 64 tokens); non-negative least squares on each shape's median "
            "time, errors relative to the fitted value, weights sqrt(count) x Tukey's bisquare "
            "(c = 4.685 x 1.4826 x MAD) re-estimated over 20 rounds. Residuals: fitted / "
            "measured - 1"),
        "", "[fit.residuals]", "# against every single step",
        *(f"{key} = {toml_value(value)}" for key, value in every.items()),
        "", "[fit.residuals.shapes]", "# against each shape's median step",
        *(f"{key} = {toml_value(value)}" for key, value in medians.items()),
        "", "[fit.residuals.shapes_kept]", "# the shapes the robust fit kept",
        *(f"{key} = {toml_value(value)}" for key, value in kept.items())]
    for kind, values in by_kind.items():
        lines += ["", f"[fit.residuals.{kind}]", f"# single steps of the {kind} experiments",
                  *(f"{key} = {toml_value(value)}" for key, value in values.items())]
    lines += ["", "[fit.gap]",
              "# what vLLM's iteration timer misses of a step: the period between the time",
              "# stamps of two consecutive steps of a busy engine less the second's logged time",
              f"base_ms = {gap.base_s * 1000:.4g}",
              f"per_request_ms = {gap.per_request_s * 1000:.4g}",
              "# requests in the step (prefill chunks and decodes): median gap ms, steps",
              "medians = [" + ", ".join(f"[{n}, {value * 1000:.3f}, {count}]"
                                        for n, (value, count) in gap.medians.items()) + "]"]
    lines += ["", "[fit.request]",
              "# requests alone on the idle engine: seconds their client waited beyond their",
              "# steps, sorted",
              f"overheads_ms = {toml_value([round(o * 1000, 2) for o in sorted(overheads)])}"]
    if executor:
        lines += ["", "[fit.executor]",
                  *(f"{key} = {toml_value(value)}" for key, value in executor.items())]
    lines += ["", "[fit.data]",
              "# per shape: prefill tokens, attention pairs, decodes, decode context (the",
              "# members' means), steps, median measured ms (logged + [fit.gap]), fitted ms,",
              "# final weight",
              "shapes = ["]
    for g, weight in sorted(zip(groups, weights, strict=True), key=lambda gw: gw[0].features):
        f = g.features
        lines.append(f"  [{f[1]:.0f}, {f[2]:.0f}, {f[3]:.0f}, {f[4]:.0f}, {g.count}, "
                     f"{g.seconds * 1000:.3f}, {profile.seconds(g.work) * 1000:.3f}, "
                     f"{weight:.2f}],")
    lines += ["]", "# per step, in the order run: prefill tokens, attention pairs, decodes,",
              "# decode context, measured ms (logged + [fit.gap]), fitted ms", "steps = ["]
    for work, seconds in steps:
        f = features(work)
        lines.append(f"  [{f[1]:.0f}, {f[2]:.0f}, {f[3]:.0f}, {f[4]:.0f}, "
                     f"{seconds * 1000:.3f}, {profile.seconds(work) * 1000:.3f}],")
    lines += ["]", ""]
    path.write_text("\n".join(lines))


# ------------------------------------------------------------------------------ main

def itl_ms(server: VllmServer, rng: random.Random, tokens: int = 64) -> float:
    """Client-side inter-token latency of one stream (prompt 32, ``tokens`` out): the time from
    its first token to its last over the gaps between them (single gaps mislead: the server's
    events can reach the client several to a read)."""
    body = json.dumps({"model": server.options.served_name, "prompt": prompt(rng, 32),
                       "max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True,
                       "stream": True}).encode()
    times = []
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=120)
    connection.request("POST", "/v1/completions", body, {"content-type": "application/json"})
    answer = connection.getresponse()
    for line in answer:
        if line.startswith(b"data: {"):
            times.append(time.perf_counter())
    connection.close()
    return round((times[-1] - times[0]) / (len(times) - 1) * 1000, 3)


def server_args(server: VllmServer) -> str:
    """The server's arguments, without this run's ports and paths."""
    args = server.command()[3:]
    kept = []
    skip = False
    for arg, following in zip(args, [*args[1:], ""], strict=True):
        if skip:
            skip = False
        elif arg in ("--host", "--port", "--kv-events-config"):
            skip = True
        elif arg == "--model":
            kept += [arg, f".engines/models/{Path(following).name}"]
            skip = True
        else:
            kept.append(arg)
    last = {arg: i for i, arg in enumerate(kept) if arg.startswith("--")}
    flags = [i for i, arg in enumerate(kept) if arg.startswith("--")]
    dropped = set()
    for i in flags:  # a flag given twice: the last one wins, so show only that
        if last[kept[i]] != i:
            dropped.add(i)
            if i + 1 < len(kept) and not kept[i + 1].startswith("--"):
                dropped.add(i + 1)
    return shlex.join(arg for i, arg in enumerate(kept) if i not in dropped)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen-tiny", choices=("qwen-tiny", "deepseek-tiny"))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--quick", action="store_true", help="a smaller grid (smoke run)")
    parser.add_argument("--compare-uni", action="store_true",
                        help="also start a uni-executor server and compare stream ITLs")
    parser.add_argument("--passes", type=int, default=2,
                        help="rounds of the grid, each in a shuffled order (default 2)")
    parser.add_argument("--seed", type=int, default=34)
    args = parser.parse_args()
    env, why = engine_env()
    if env is None:
        print(why, file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    logs = ROOT / "build" / "fit_step_profile"
    extra = ("--enable-logging-iteration-details", "--max-num-batched-tokens", str(BUDGET),
             "--distributed-executor-backend", "mp")
    stamped = (("VLLM_LOGGING_CONFIG_PATH", str(log_config(logs))),)
    options = VllmOptions(env.model(args.model), args.model.split("-")[0], extra_args=extra,
                          env=stamped)
    server = VllmServer("fit", options, env, logs)
    experiments = grid(args.quick, args.passes, random.Random(args.seed))
    executor: dict[str, object] = {}
    started = time.monotonic()
    start_all([server])
    try:
        tail = LogTail(server.log_path)
        with ThreadPoolExecutor(max_workers=16) as pool:
            for experiment in experiments:
                run(server, experiment, rng, tail, pool)
                print(f"{experiment.label:>22}: {len(experiment.steps)} steps"
                      + (f", {experiment.dropped} dropped" if experiment.dropped else ""))
        if args.compare_uni:
            executor["mp_stream_itl_ms"] = itl_ms(server, rng)
        vllm = re.search(r"V1 LLM engine \(v([\w.+-]+)\)", server.log_path.read_text())
    finally:
        server.stop()
    if args.compare_uni:
        uni = VllmServer("fit-uni", VllmOptions(env.model(args.model), options.served_name),
                         env, logs)
        start_all([uni])
        try:
            itl_ms(uni, rng, 8)  # warm-up
            executor["uni_stream_itl_ms"] = itl_ms(uni, rng)
        finally:
            uni.stop()
        executor["note"] = ("client-side inter-token latency of one stream (32-token prompt, 64 "
                            "tokens; first to last token over the gaps) asking for each executor; "
                            "vLLM's CPU platform runs both as mp, so they differ by the "
                            "machine's noise only")
    gap = fit_gap([g for e in experiments if e.kind != "warmup" for g in e.gaps])
    steps = timed([s for kind in KINDS for e in experiments for s in e.data(kind)], gap)
    profile, groups, weights = fit(steps)
    overheads = request_overheads(experiments, gap)
    profile = replace(profile, request_s=max(percentile(overheads, 0.5), 0.0))
    meta = {
        "description": f"vLLM {vllm[1] if vllm else '?'} CPU build serving the tiny "
                       f"{args.model} model (2 layers, hidden 128; .engines/models) with the "
                       "real-engine suite's settings: the simulator's timing for the "
                       "real-engine tests",
        "vllm": vllm[1] if vllm else "unknown", "model": args.model,
        "machine": ", ".join(f"{k} {v}" for k, v in machine_info().items()),
        "command": ".venv/bin/python -m perf.fit_step_profile "
                   + shlex.join(sys.argv[1:]),
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%MZ"),
        "server_args": server_args(server), "executor": executor, "passes": args.passes}
    write_profile(args.out, profile, experiments, steps, groups, weights, gap, overheads, meta)
    print(f"{len(steps)} steps in {time.monotonic() - started:.0f} s; what the timer misses: "
          f"{gap.base_s * 1000:.2f} ms + {gap.per_request_s * 1000:.3f} ms per request")
    for name in COEFFICIENTS:
        print(f"  {name} = {getattr(profile, name):.6g}")
    shapes = residuals(profile, [(g.work, g.seconds) for g in groups])
    print(f"  shapes: {len(groups)}, rejected as outliers: {weights.count(0.0)}")
    for key, value in residuals(profile, steps).items():
        print(f"  {key}: {value} (shape medians: {shapes[key]})")
    read_step_profile(args.out)  # the file loads, and its checks hold
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
