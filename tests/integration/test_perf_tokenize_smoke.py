"""perf/bench_tokenize.py still runs (``--quick``); figures are reported, not checked."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO


def test_tokenize_benchmark_runs_quick():
    done = subprocess.run(
        [sys.executable, str(REPO / "perf" / "bench_tokenize.py"), "--quick"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["machine"]
    assert result["prompt_tokens"] > 3500
    assert result["cache"]["hits"] > 0
