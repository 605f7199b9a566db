"""perf/bench_scheduler.py still runs (``--quick``); figures are not checked, only sanity."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO


def test_scheduler_benchmark_runs_quick():
    done = subprocess.run(
        [sys.executable, str(REPO / "perf" / "bench_scheduler.py"), "--quick"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["machine"] and result["workers"] == 64 and result["prompt_blocks"] == 256
    assert sum(result["modes"].values()) == result["queries"]
    assert result["decision_us"]["p99"] > 0
