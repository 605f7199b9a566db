"""Step-time profile files (cortex/sim/step_profiles.py, cortex/sim/profiles/*.toml): the loader
reports every problem at once, built-in names and paths resolve, the shipped profiles load, the
GPU profile reproduces the published figures it cites, and the packaging carries the files."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from cortex.errors import ConfigError
from cortex.sim.step_profiles import (
    COEFFICIENTS,
    PROFILE_DIR,
    builtin_profiles,
    load_step_profile,
    parse_step_profile,
    profile_path,
    read_step_profile,
)
from cortex.sim.step_time import Chunk, StepProfile, StepWork

REPO = Path(__file__).resolve().parents[2]
GPU = "llama-3.1-8b-h100-vllm"
CPU = "vllm-cpu-tiny"

VALID = """
name = "test"
[coefficients]
step_s = 0.001
prefill_token_s = 1e-6
attention_pair_s = 0
decode_seq_s = 1e-5
decode_kv_token_s = 1e-8
prefill_step_s = 0.002
request_s = 0.003
[source]
summary = "made up for a test"
step_s = "a"
prefill_token_s = "b"
attention_pair_s = "c"
decode_seq_s = "d"
decode_kv_token_s = "e"
prefill_step_s = "f"
request_s = "g"
[[checks]]
what = "one decode"
decodes = 1
decode_context = 100
seconds = 0.00101
tolerance = 0.05
source = "arithmetic"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "profile.toml"
    path.write_text(text)
    return path


def problems_of(spec: str | Path) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        read_step_profile(spec)
    return caught.value.problems


# ------------------------------------------------------------------------------ the loader

def test_a_valid_file_loads_by_path_as_str_or_path(tmp_path):
    path = write(tmp_path, VALID)
    for spec in (path, str(path)):
        loaded = read_step_profile(spec)
        assert loaded.profile.name == "test"
        assert loaded.profile.step_s == 0.001 and loaded.profile.attention_pair_s == 0.0
        assert loaded.profile.prefill_step_s == 0.002
        assert loaded.profile.request_s == 0.003  # no part of a step: not in seconds()
        assert loaded.origin == str(path)
        assert loaded.profile.source.startswith("made up for a test\nstep_s: a")
        (check,) = loaded.checks
        assert check.work == StepWork((), 1, 100)
        assert check.error(loaded.profile) == pytest.approx(0.001011 / 0.00101 - 1)


def test_a_step_with_prompt_tokens_pays_prefill_step_s_once_whatever_its_chunks(tmp_path):
    profile = read_step_profile(write(tmp_path, VALID)).profile
    decode = StepWork((), 2, 200)
    assert profile.seconds(decode) == pytest.approx(0.001 + 2e-5 + 2e-6)
    one = StepWork((Chunk(10, 0),))
    two = StepWork((Chunk(10, 0), Chunk(10, 0)), 2, 200)
    assert profile.seconds(one) == pytest.approx(0.001 + 0.002 + 1e-5)
    assert profile.seconds(two) == pytest.approx(0.001 + 0.002 + 2e-5 + 2e-5 + 2e-6)
    assert profile.seconds(StepWork()) == 0.0


def test_builtin_names_resolve_to_the_packaged_files():
    assert {GPU, CPU} <= set(builtin_profiles())
    for name in builtin_profiles():
        assert profile_path(name) == PROFILE_DIR / f"{name}.toml"
        assert load_step_profile(name).name == name  # a built-in is named after its file
    # a relative path with a separator, or a .toml name, is a path, never a built-in
    assert profile_path("./x.toml") == Path("./x.toml")
    assert profile_path(f"{GPU}.toml") == Path(f"{GPU}.toml")


def test_an_unknown_builtin_names_the_known_ones():
    (problem,) = problems_of("no-such-profile")
    assert "no-such-profile" in problem and GPU in problem and CPU in problem


def test_a_missing_file_and_bad_toml_are_config_errors(tmp_path):
    (missing,) = problems_of(tmp_path / "absent.toml")
    assert "absent.toml" in missing
    (bad,) = problems_of(write(tmp_path, "name = "))
    assert "not valid TOML" in bad


def test_every_problem_is_reported_at_once(tmp_path):
    text = """
colour = "blue"
[coefficients]
step_s = -1.0
prefill_token_s = true
attention_pair_s = inf
decode_seq_s = 1e-5
speed = 3
[source]
summary = ""
step_s = "a"
who = "me"
[[checks]]
what = ""
chunks = [[0, 5], [10, 0]]
decodes = -1
seconds = 0
tolerance = 2
extra = 1
[[checks]]
what = "nothing computed"
seconds = 0.1
tolerance = 0.1
source = "x"
"""
    problems = problems_of(write(tmp_path, text))
    expected = [
        "unknown key 'colour'", "name: a non-empty string is required",
        "coefficients: unknown key 'speed'", "coefficients.step_s: a finite number >= 0",
        "coefficients.prefill_token_s: a finite number", "coefficients.attention_pair_s: a "
        "finite number", "coefficients.decode_kv_token_s: missing",
        "coefficients.prefill_step_s: missing", "coefficients.request_s: missing",
        "source: unknown key 'who'", "source.summary: the provenance is required",
        *(f"source.{key}: the provenance is required" for key in COEFFICIENTS[1:]),
        "checks[0]: unknown key 'extra'", "checks[0]: what:", "checks[0]: source:",
        "checks[0]: chunks: [0, 5]", "checks[0]: decodes:", "checks[0]: seconds:",
        "checks[0]: tolerance:", "checks[1]: the step computes nothing"]
    for part in expected:
        assert sum(part in problem for problem in problems) == 1, (part, problems)
    assert len(problems) == len(expected)
    assert all(problem.startswith("step profile ") for problem in problems)


def test_a_check_the_coefficients_miss_is_a_problem_even_beside_others(tmp_path):
    text = VALID.replace("seconds = 0.00101", "seconds = 0.002").replace('summary = "made up '
                                                                         'for a test"', "")
    problems = problems_of(write(tmp_path, text))
    assert len(problems) == 2
    assert any("source.summary" in problem for problem in problems)
    (miss,) = [problem for problem in problems if "check 'one decode'" in problem]
    assert "gives 0.001011 s, -49.5% off the figure 0.002 s (tolerance 5%)" in miss


def test_a_missing_table_is_one_problem_not_five():
    with pytest.raises(ConfigError) as caught:
        parse_step_profile({"name": "x"}, "memory")
    assert caught.value.problems == [
        "step profile memory: [coefficients]: the table is required",
        "step profile memory: [source]: the table is required",
        *(f"step profile memory: source.{key}: the provenance is required (a non-empty "
          "string)" for key in ("summary", *COEFFICIENTS))]


# ------------------------------------------------------------------------------ the shipped profiles

@pytest.mark.parametrize("name", builtin_profiles())
def test_each_shipped_profile_loads_with_provenance_for_every_coefficient(name):
    loaded = read_step_profile(name)  # its checks hold, or this raises
    assert loaded.profile.step_s > 0
    for key in COEFFICIENTS:
        assert f"\n{key}: " in loaded.profile.source
    assert loaded.checks, "a shipped profile says which figures it reproduces"
    assert loaded.description


def test_the_gpu_profile_reproduces_the_published_figures_it_cites():
    profile = load_step_profile(GPU)

    def within(work: StepWork, published_s: float, tolerance: float) -> None:
        assert profile.seconds(work) == pytest.approx(published_s, rel=tolerance)

    # vLLM 0.21.0 on one H100, Llama-3.1-8B (InferenceBench): TPOT p50 6.48 ms at
    # concurrency 1 and 6.59 ms at concurrency 4 (short prompts: ~256 tokens of context)
    within(StepWork(decodes=1, decode_context=256), 6.48e-3, 0.10)
    within(StepWork(decodes=4, decode_context=4 * 256), 6.59e-3, 0.10)
    # Vidur's H100 per-operation measurements scaled to Llama-3.1-8B, plus FlashAttention-3's
    # measured attention: a 1k-token prefill of 23.5 ms and a batch-32 decode step (1k of
    # context each) of 8.25 ms
    within(StepWork(chunks=(Chunk(1024, 0),)), 23.48e-3, 0.15)
    within(StepWork(decodes=32, decode_context=32 * 1024), 8.248e-3, 0.10)
    # the roofline it rests on: decode is bounded below by streaming 15.0 GB of weights at
    # 3.35 TB/s (4.48 ms), prefill by 13.96 GFLOP per token at 989.4 TFLOPS (14.1 us)
    assert 4.48e-3 < profile.step_s < 2 * 4.48e-3
    assert 14.1e-6 < profile.prefill_token_s < 2 * 14.1e-6
    # 128 KiB of KV per token read at no more than 3.35 TB/s
    assert profile.decode_kv_token_s >= 131072 / 3.35e12


def test_the_cpu_profile_carries_its_fit():
    loaded = read_step_profile(CPU)
    fit = loaded.fit
    assert "-m perf.fit_step_profile" in fit["command"]
    assert len(fit["data"]["steps"]) == fit["steps_used"] > 100
    assert len(fit["data"]["shapes"]) == fit["shapes"] > 20
    assert {"prefill", "cached", "decode", "shapes", "shapes_kept"} <= fit["residuals"].keys()
    # the profile against the median step of each shape (single steps scatter far more)
    assert fit["residuals"]["shapes_kept"]["median_abs_relative"] < 0.25


# ------------------------------------------------------------------------------ packaging

def test_the_packaging_carries_every_profile_file():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["cortex.sim"]
    files = sorted(PROFILE_DIR.glob("*.toml"))
    assert files
    for path in files:
        assert any(path.relative_to(PROFILE_DIR.parent).match(p) for p in patterns), path
    spec = (REPO / "packaging" / "cortex.spec").read_text()
    assert '"/cortex/sim/profiles/*.toml", "cortex/sim/profiles"' in spec
    assert "step_profiles" in spec.split("datas=", 1)[1].split("\n", 1)[0]


def test_a_scaled_profile_times_scaled_work_as_the_real_size_work():
    """Work shrunk k times (each token stands for k) on the profile scaled by k takes what the
    real-size work takes on the profile."""
    base = load_step_profile("llama-3.1-8b-h100-vllm")
    k = 16
    real = StepWork((Chunk(4096, 8192),), decodes=12, decode_context=12 * 16_000)
    shrunk = StepWork((Chunk(4096 // k, 8192 // k),), decodes=12,
                      decode_context=12 * 16_000 // k)
    assert base.scaled(k).seconds(shrunk) == pytest.approx(base.seconds(real), rel=1e-9)
    assert base.scaled(1) == base
    with pytest.raises(ConfigError):
        base.scaled(0)


def test_prefill_speed_under_load_and_a_decodes_cost():
    flat = StepProfile("t", step_s=0.01, prefill_token_s=0.001, attention_pair_s=0.0,
                       decode_seq_s=0.002, decode_kv_token_s=1e-6)
    assert flat.prefill_tokens_per_s(90) == pytest.approx(90 / (0.01 + 0.09))
    assert flat.decode_seq_cost_s(1000) == pytest.approx(0.003)
