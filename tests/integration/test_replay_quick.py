"""perf/replay.py --quick: a trace slice through real engines, the gateway and the client.

Figures are not checked (perf/RESULTS.md reports them); only that every request went through,
every router got its own cluster, and the ledger's predictions were seen by the engines."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_replay_quick_runs_cortex_and_round_robin() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "perf.replay", "--quick",
         "--routers", "cortex,round_robin"],
        capture_output=True, timeout=300, cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    result = json.loads(done.stdout)
    assert set(result["routers"]) == {"cortex", "round_robin"}
    assert result["params"]["requests"] == 40
    for name, run in result["routers"].items():
        assert run["failed"] == 0, name
        assert run["requests"] == 40
        assert run["ledger_states"] == ["ready"]
        assert run["prompt_tokens"] > 0 and 0.0 <= run["hit_rate"] < 1.0
        assert sum(run["per_worker"].values()) == 40
    cortex = result["routers"]["cortex"]
    assert cortex["ledger"]["predicted"] == 40
    # A burst opens the slice: a request decided before an earlier one on the same worker
    # stored its blocks finds more cached than predicted. Later requests are exact.
    assert cortex["ledger"]["exact_share"] >= 0.75
    assert "cortex" in done.stderr.decode()  # the table


@pytest.mark.slow
def test_replay_quick_runs_the_prefill_decode_row() -> None:
    """``cortex-pd``: half the engines prefill, half decode, per flavor; every request goes
    through a pair of one flavor, and its hit is the prefill engine's report."""
    done = subprocess.run(
        [sys.executable, "-m", "perf.replay", "--quick", "--routers", "cortex-pd",
         "--requests", "12", "--keep-results"],
        capture_output=True, timeout=300, cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    run = json.loads(done.stdout)["routers"]["cortex-pd"]
    assert run["failed"] == 0 and run["requests"] == 12
    assert run["ledger_states"] == ["ready"]
    pd = run["pd"]
    assert (pd["prefill_engines"], pd["decode_engines"]) == (2, 2)  # 4 quick engines, mixed
    assert pd["counters"]["served"] + pd["counters"]["bypassed"] == 12
    assert pd["counters"]["failed"] == 0
    for r in run["results"]:
        decode = r["worker"]  # names: flavor letter, p|d, index (replay_cluster)
        assert decode[1] == "d", r
        if r["prefill_worker"]:
            assert r["prefill_worker"][1] == "p" and r["prefill_worker"][0] == decode[0], r
        if decode[0] == "s":  # SGLang decode has no prefix cache: its own report is 0
            assert r["answer_cached_tokens"] == 0, r
    # the hit rate is the prefill engines' (the shared first block is cached after a burst)
    assert sum(r["cached_tokens"] for r in run["results"]) > 0
    assert run["ledger"]["predicted"] == 12
    assert "cortex-pd: 2 prefill + 2 decode" in done.stderr.decode()
