"""Fit the simulator's step-time profile to the real vLLM CPU engine, and write it as a profile
file (``cortex/sim/profiles/vllm-cpu-tiny.toml`` by default).

    PYTHONPATH=$PWD .venv/bin/python perf/fit_step_profile.py [--model qwen-tiny] [--quick]

What it does:

1. Starts one real vLLM CPU server (``tests/real_engine/vllm_server.py``, the suite's own
   settings: ``--block-size 32 --enforce-eager``, bf16, one OpenMP thread) with
   ``--enable-logging-iteration-details``: the engine logs one line per step with its context
   (prefill) requests and tokens, its generation (decode) requests, and the step's elapsed time.
   The server runs ``--distributed-executor-backend mp`` although the suite runs ``uni``: under
   ``uni`` the forward pass runs inside ``execute_model(non_block=True)`` before vLLM's
   iteration timer starts (``EngineCore.step``), so the logged time is only the sampling; under
   ``mp`` the timer waits for the worker's whole forward pass. ``--compare-uni`` measures what
   that costs: the client-side inter-token latency of one stream under each executor.
2. Drives a grid, one experiment at a time with the engine idle in between, every prompt made
   of fresh random token ids (no accidental prefix sharing): single prefills of several lengths;
   prefills over a cached prefix (the prefix sent first, then prefix + suffix); and decode
   batches of several sizes and prompt lengths (``ignore_eos``, a fixed number of tokens each).
3. Reconstructs each logged step's work (``StepWork``): the log gives only counts, so each
   experiment replays vLLM's FCFS order over its known requests (prompt length, cached tokens,
   tokens to generate); a step the replay cannot explain is dropped and counted.
4. Fits the five coefficients by non-negative least squares on relative errors (every step
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
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from benchkit import machine_info

from cortex.sim.step_profiles import COEFFICIENTS, read_step_profile
from cortex.sim.step_time import Chunk, StepProfile, StepWork
from tests.real_engine.vllm_server import VllmOptions, VllmServer, engine_env, start_all

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "cortex" / "sim" / "profiles" / "vllm-cpu-tiny.toml"
BUDGET = 2048  # --max-num-batched-tokens: prompts up to this run in one step
ITERATION = re.compile(
    r"Iteration\((\d+)\): (\d+) context requests, (\d+) context tokens, (\d+) generation "
    r"requests, (\d+) generation tokens, iteration elapsed time: ([\d.]+) ms")
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

class LogTail:
    """The server's log from a byte offset on: the iteration lines written since."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size

    def take(self) -> list[tuple[int, int, int, int, float]]:
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            text = handle.read()
        self.offset += len(text)
        return [(int(m[2]), int(m[3]), int(m[4]), int(m[5]), float(m[6]) / 1000)
                for m in ITERATION.finditer(text.decode(errors="replace"))]


def prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(*TOKEN_IDS) for _ in range(n)]


def complete(server: VllmServer, tokens: list[int], output: int) -> None:
    status, answer = server.post("/v1/completions", {
        "model": server.options.served_name, "prompt": tokens, "max_tokens": output,
        "min_tokens": output, "ignore_eos": True, "temperature": 0.0}, timeout_s=300)
    if status != 200:
        raise RuntimeError(f"completion answered {status}: {answer}")


def wait_logged(tail: LogTail, expected_min: int) -> list[tuple[int, int, int, int, float]]:
    """The iteration lines of the experiment just finished (the frontend logs a step when it
    takes its outputs, around the time the response leaves: wait until they stop coming)."""
    lines: list[tuple[int, int, int, int, float]] = []
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
        complete(server, head, 1)
        alone = Experiment("prefill", f"prefill {experiment.prefix}",
                           [Request(experiment.prefix, 1)])
        replay(alone, wait_logged(tail, 1))
        experiment.prefix_steps = alone.steps
        experiment.dropped += alone.dropped
        prompts = [head + prompt(rng, request.prompt - experiment.prefix)]
    else:
        prompts = [prompt(rng, request.prompt) for request in experiment.requests]
    jobs = [pool.submit(complete, server, tokens, request.output)
            for tokens, request in zip(prompts, experiment.requests, strict=True)]
    for job in jobs:
        job.result()
    replay(experiment, wait_logged(tail, max(r.output for r in experiment.requests)))


def replay(experiment: Experiment, lines: list[tuple[int, int, int, int, float]]) -> None:
    """Each logged step's work, replaying vLLM's FCFS order over the experiment's requests:
    running decodes first, then prefill tokens to the earliest requests with prompt left."""
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
    pairs = sum(c.tokens * (c.context + c.tokens / 2) for c in work.chunks)
    return [1.0, float(work.prefill_tokens), pairs, float(work.decodes),
            float(work.decode_context)]


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
    scale = [max(row[j] for row in rows) or 1.0 for j in range(len(COEFFICIENTS))]
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
        spread = 1.4826 * median([abs(r - median(relative)) for r in relative]) or 1e-9
        weights = [(1 - (r / (4.685 * spread)) ** 2) ** 2 if abs(r) < 4.685 * spread else 0.0
                   for r in relative]
    values = {name: x[j] / scale[j] for j, name in enumerate(COEFFICIENTS)}
    return StepProfile(name="vllm-cpu-tiny", **values), groups, weights


def residuals(profile: StepProfile, steps: list[tuple[StepWork, float]]) -> dict[str, float]:
    errors = sorted(profile.seconds(work) / seconds - 1 for work, seconds in steps)
    absolute = sorted(abs(e) for e in errors)
    return {"steps": len(errors),
            "rms_relative": round(math.sqrt(sum(e * e for e in errors) / len(errors)), 4),
            "median_abs_relative": round(absolute[len(absolute) // 2], 4),
            "p90_abs_relative": round(absolute[int(0.9 * (len(absolute) - 1))], 4),
            "max_abs_relative": round(absolute[-1], 4),
            "mean_relative": round(sum(errors) / len(errors), 4)}


# ------------------------------------------------------------------------------ the file

def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


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
    small = ("; the five coefficients have no cost per prefill step, which this engine has (see "
             "the uncertainty), hence the wider tolerance")
    wanted = [("a 32-token prefill", 0.5, small,
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
                  weights: list[float], meta: dict[str, object]) -> None:
    every = residuals(profile, steps)
    medians = residuals(profile, [(g.work, g.seconds) for g in groups])
    kept = residuals(profile, [(g.work, g.seconds)
                               for g, w in zip(groups, weights, strict=True) if w > 0])
    by_kind = {kind: residuals(profile, data)
               for kind in KINDS if (data := [s for e in experiments for s in e.data(kind)])}
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
            "(--enable-logging-iteration-details) and its work reconstructed from the log's "
            f"counts; non-negative least squares on relative errors over the {len(groups)} "
            "shapes' median times, robustly reweighted. The grid, every step's work and time, "
            f"the residuals and the command are in [fit]. Machine: {meta['machine']}."),
        "step_s = " + toml_value(
            "fitted intercept: a step's cost whatever its work (the tiny model's lm_head over "
            "its whole vocabulary, sampling, preparing the batch, the executor's round trip)"),
        "prefill_token_s = " + toml_value("fitted: per prompt token computed"),
        "attention_pair_s = " + toml_value(
            "fitted: per (new token, context token) pair of a prefill chunk"),
        "decode_seq_s = " + toml_value("fitted: per sequence decoded in the step"),
        "decode_kv_token_s = " + toml_value(
            "fitted: per KV token a decoding sequence reads"),
        "uncertainty = " + toml_value(
            f"Relative error of the profile against the median step of each shape: median "
            f"{medians['median_abs_relative']:.0%}, p90 {medians['p90_abs_relative']:.0%} "
            f"({medians['steps']} shapes; {medians['steps'] - kept['steps']} rejected as "
            f"outliers); against single steps: median {every['median_abs_relative']:.0%}, p90 "
            f"{every['p90_abs_relative']:.0%}. Decode-only shapes: median error "
            f"{median(decodes or [0.0]):+.0%}; prefills of at most 256 new tokens: median "
            f"{median(small or [0.0]):+.0%}" + (
                ": a prefill step costs a few ms more than a decode step of the same size "
                "whatever its length here (new requests' set-up, the prefill attention path), a "
                "cost the five coefficients have no term for, so small prefills come out short"
                if median(small or [0.0]) < -0.15 else "") + ". The machine is shared (2 cores "
            "under other "
            "developers' load): single steps scatter by tens of percent, and repeated runs of "
            "this script give coefficients that differ by 20 % (step_s, prefill_token_s) to a "
            "factor of 2 or 3 (decode_kv_token_s, a small term here). The steps were timed "
            "under --distributed-executor-backend mp, the suite runs uni (under uni vLLM's "
            "timer misses the forward pass)" + (
                f"; one stream's inter-token latency was {executor['mp_stream_itl_ms']} ms "
                f"under mp and {executor['uni_stream_itl_ms']} ms under uni ([fit.executor])."
                if executor else ".")),
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
    if executor:
        lines += ["", "[fit.executor]",
                  *(f"{key} = {toml_value(value)}" for key, value in executor.items())]
    lines += ["", "[fit.data]",
              "# per shape: prefill tokens, attention pairs, decodes, decode context (the",
              "# members' means), steps, median measured ms, fitted ms, final weight",
              "shapes = ["]
    for g, weight in sorted(zip(groups, weights, strict=True), key=lambda gw: gw[0].features):
        f = g.features
        lines.append(f"  [{f[1]:.0f}, {f[2]:.0f}, {f[3]:.0f}, {f[4]:.0f}, {g.count}, "
                     f"{g.seconds * 1000:.3f}, {profile.seconds(g.work) * 1000:.3f}, "
                     f"{weight:.2f}],")
    lines += ["]", "# per step, in the order run: prefill tokens, attention pairs, decodes,",
              "# decode context, measured ms, fitted ms", "steps = ["]
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
    options = VllmOptions(env.model(args.model), args.model.split("-")[0], extra_args=extra)
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
                            "tokens; first to last token over the gaps) under each executor: "
                            "what timing the steps under mp changes against the suite's uni")
    steps = [s for kind in KINDS for e in experiments for s in e.data(kind)]
    profile, groups, weights = fit(steps)
    meta = {
        "description": f"vLLM {vllm[1] if vllm else '?'} CPU build serving the tiny "
                       f"{args.model} model (2 layers, hidden 128; .engines/models) with the "
                       "real-engine suite's settings: the simulator's timing for the "
                       "real-engine tests",
        "vllm": vllm[1] if vllm else "unknown", "model": args.model,
        "machine": ", ".join(f"{k} {v}" for k, v in machine_info().items()),
        "command": "PYTHONPATH=$PWD .venv/bin/python perf/fit_step_profile.py "
                   + shlex.join(sys.argv[1:]),
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%MZ"),
        "server_args": server_args(server), "executor": executor, "passes": args.passes}
    write_profile(args.out, profile, experiments, steps, groups, weights, meta)
    print(f"{len(steps)} steps in {time.monotonic() - started:.0f} s")
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
