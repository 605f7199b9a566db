"""The benchmarks in perf/ still run (``--quick``): CI smoke-runs them, figures are not checked."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.parametrize("script", ["bench_ingest.py", "bench_ledger.py"])
def test_benchmark_runs_quick(script):
    done = subprocess.run(
        [sys.executable, str(REPO / "perf" / script), "--quick"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["machine"]
    if script == "bench_ingest.py":
        assert result["over_zeromq"]["gaps"] == 0
        assert result["over_zeromq"]["state"] == "ready"
        assert result["stores_only"]["ledger_entries_after"] == result["stores_only"]["blocks_stored"]
