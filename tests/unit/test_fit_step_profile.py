"""perf/fit_step_profile.py without an engine: the replay that turns vLLM's per-step counts into
each step's work, the pure-Python NNLS, and the robust fit's recovery of known coefficients."""

from __future__ import annotations

import random
import sys

import pytest

from cortex.sim.step_time import Chunk, StepProfile, StepWork
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "perf"))

from fit_step_profile import ITERATION, Experiment, Request, fit, group, nnls, replay


def test_the_iteration_line_of_vllm_0_32_parses():
    line = ("(APIServer pid=1) INFO 12-06 02:55:25 [loggers.py:199] Engine 000: Iteration(4): "
            "1 context requests, 992 context tokens, 0 generation requests, 0 generation "
            "tokens, iteration elapsed time: 45.68 ms, CPU KV cache usage: 0.0%")
    (match,) = ITERATION.finditer(line)
    assert match.groups() == ("4", "1", "992", "0", "0", "45.68")


def test_replay_assigns_chunks_and_decode_contexts_in_fcfs_order():
    # two 3000-token prompts under a 2048-token budget, 3 tokens each
    experiment = Experiment("decode", "t", [Request(3000, 3), Request(3000, 3)])
    lines = [(1, 2048, 0, 0, 0.1),  # A: 2048 of 3000
             (2, 2048, 0, 0, 0.1),  # A: its last 952 (first token), B: 1096
             (1, 1904, 1, 1, 0.1),  # A decodes (context 3001), B: its last 1904
             (0, 0, 2, 2, 0.1),  # A's third token, B's second
             (0, 0, 1, 1, 0.1)]  # B's third
    replay(experiment, lines)
    assert experiment.dropped == 0
    assert [work for work, _ in experiment.steps] == [
        StepWork((Chunk(2048, 0),)),
        StepWork((Chunk(952, 2048), Chunk(1096, 0))),
        StepWork((Chunk(1904, 1096),), 1, 3001),
        StepWork((), 2, 3002 + 3001),
        StepWork((), 1, 3002)]


def test_replay_learns_the_cached_prefix_from_the_log_and_drops_what_it_cannot_explain():
    cached = Experiment("cached", "t", [Request(1088, 1, cached=None)], prefix=1024)
    replay(cached, [(1, 64, 0, 0, 0.02)])
    assert cached.steps == [(StepWork((Chunk(64, 1024),)), 0.02)]
    odd = Experiment("decode", "t", [Request(100, 2)])
    replay(odd, [(1, 100, 0, 0, 0.01), (0, 0, 2, 2, 0.01)])  # two decodes of one request?
    assert (len(odd.steps), odd.dropped) == (1, 1)


def test_nnls_matches_the_unconstrained_answer_when_it_is_feasible_and_clips_when_not():
    rng = random.Random(3)
    a = [[rng.random() for _ in range(4)] for _ in range(40)]
    b = [2 * r[0] + 0.5 * r[1] + 3 * r[3] for r in a]
    assert nnls(a, b) == pytest.approx([2, 0.5, 0, 3], abs=1e-9)
    b = [r[0] - 2 * r[1] for r in a]  # the best unconstrained fit has a negative weight
    x = nnls(a, b)
    assert min(x) >= 0 and x[1] == 0


def test_the_robust_fit_recovers_known_coefficients_through_outliers():
    truth = StepProfile("t", step_s=5e-3, prefill_token_s=1e-5, attention_pair_s=2e-8,
                        decode_seq_s=2e-4, decode_kv_token_s=4e-8)
    rng = random.Random(7)
    steps = []
    for _ in range(300):
        if rng.random() < 0.3:
            n = rng.randrange(16, 2048)
            work = StepWork((Chunk(n, rng.choice((0, 512, 1024))),))
        else:
            b = rng.randrange(1, 17)
            work = StepWork((), b, b * rng.randrange(32, 1100))
        noise = rng.gauss(1, 0.03) * (rng.choice((0.2, 3.0)) if rng.random() < 0.08 else 1)
        steps.append((work, truth.seconds(work) * noise))
    profile, groups, weights = fit(steps)
    for name in ("step_s", "prefill_token_s", "attention_pair_s", "decode_seq_s",
                 "decode_kv_token_s"):
        assert getattr(profile, name) == pytest.approx(getattr(truth, name), rel=0.15), name
    assert len(groups) == len(weights) > 200  # random shapes: mostly one step per shape
    assert weights.count(0.0) >= 15  # the injected outliers (about 24) end without weight


def test_steps_of_one_shape_are_fitted_as_their_median():
    decode = [(StepWork((), 4, 4 * 100 + i), 0.010 + 0.001 * (i % 3)) for i in range(9)]
    decode.append((StepWork((), 4, 4 * 100 + 9), 0.2))  # one step stalled by the machine
    prefill = [(StepWork((Chunk(512, 0),)), 0.03), (StepWork((Chunk(512, 10),)), 0.05),
               (StepWork((Chunk(512, 0),)), 0.04)]  # context 10 and 0: the same to 64 tokens
    groups = sorted(group(decode + prefill), key=lambda g: g.count)
    assert [(g.count, g.seconds) for g in groups] == [(3, 0.04), (10, 0.011)]
    assert groups[1].features == pytest.approx([1, 0, 0, 4, 404.5])
