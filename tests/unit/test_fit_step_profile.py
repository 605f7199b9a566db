"""perf/fit_step_profile.py without an engine: the replay that turns vLLM's per-step counts into
each step's work, the time stamps that give what vLLM's timer misses of a step, the pure-Python
NNLS, and the robust fit's recovery of known coefficients."""

from __future__ import annotations

import random

import pytest

from cortex.sim.step_time import Chunk, StepProfile, StepWork
from perf.fit_step_profile import (
    ITERATION,
    Experiment,
    Request,
    fit,
    fit_gap,
    group,
    iteration_lines,
    nnls,
    replay,
    request_overheads,
    timed,
)


def test_the_iteration_line_of_vllm_0_32_parses():
    line = ("(APIServer pid=1) INFO 12-06 02:55:25 [loggers.py:199] Engine 000: Iteration(4): "
            "1 context requests, 992 context tokens, 0 generation requests, 0 generation "
            "tokens, iteration elapsed time: 45.68 ms, CPU KV cache usage: 0.0%")
    (match,) = ITERATION.finditer(line)
    assert match.groups() == ("4", "1", "992", "0", "0", "45.68")


def test_time_stamped_lines_give_each_steps_gap_after_the_one_before():
    log = (
        "1796527000.100000 7 INFO Application startup complete.\n"
        "1796527000.200000 7 INFO Engine 000: Iteration(0): 1 context requests, 64 context "
        "tokens, 0 generation requests, 0 generation tokens, iteration elapsed time: 9.00 ms\n"
        "1796527000.207500 7 INFO Engine 000: Iteration(1): 0 context requests, 0 context "
        "tokens, 1 generation requests, 1 generation tokens, iteration elapsed time: 6.00 ms")
    lines = iteration_lines(log)
    assert lines == [(1, 64, 0, 0, 0.009, 1796527000.2), (0, 0, 1, 1, 0.006, 1796527000.2075)]
    experiment = Experiment("decode", "t", [Request(64, 2)])
    replay(experiment, lines)
    assert [work for work, _ in experiment.steps] == [StepWork((Chunk(64, 0),)),
                                                      StepWork((), 1, 65)]
    ((requests, gap),) = experiment.gaps  # the first step has no period
    assert requests == 1 and gap == pytest.approx(0.0015, abs=1e-6)  # stamps of 1.8e9 s


def test_the_gap_is_a_line_in_the_requests_of_the_step_without_the_idle_ones():
    gaps = [(1, 0.0003), (1, 0.0004), (1, 0.0005), (4, 0.0007), (4, 0.0006), (4, 0.0008),
            (16, 0.0019), (16, 0.0018), (16, 0.0017), (16, 0.5)]  # 0.5: the engine went idle
    gap = fit_gap(gaps)
    assert gap.medians == {1: (0.0004, 3), 4: (0.0007, 3), 16: (0.0018, 3)}
    assert gap.base_s == pytest.approx(0.0003, abs=5e-5)
    assert gap.per_request_s == pytest.approx(0.0001, rel=0.1)
    work = StepWork((Chunk(10, 0),), 3, 300)  # four requests
    assert timed([(work, 0.01)], gap) == [(work, pytest.approx(0.01 + gap.seconds(work)))]
    assert gap.seconds(work) == pytest.approx(gap.base_s + 4 * gap.per_request_s)


def test_a_lone_requests_overhead_is_what_its_client_waited_beyond_its_steps():
    gap = fit_gap([(1, 0.001)])  # 1 ms a step, whatever its requests
    experiment = Experiment("prefill", "t", [Request(64, 1)])
    step = (StepWork((Chunk(64, 0),)), 0.009)
    experiment.lone.append((0.025, [step]))
    warmup = Experiment("warmup", "w", [Request(64, 1)])
    warmup.lone.append((1.0, [step]))  # a warm-up's first forwards are slow: left out
    assert request_overheads([experiment, warmup], gap) == [pytest.approx(0.015)]


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
                        decode_seq_s=2e-4, decode_kv_token_s=4e-8, prefill_step_s=2e-3)
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
                 "decode_kv_token_s", "prefill_step_s"):
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
    assert groups[1].features == pytest.approx([1, 0, 0, 4, 404.5, 0])
    assert groups[0].features[5] == 1  # a step with prefill
