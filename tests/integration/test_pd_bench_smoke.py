"""``perf/bench_pd.py`` still runs (the smallest run: two requests, one flavor, c=1):
its table is whole; figures are reported in perf/RESULTS.md, never checked here."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


def test_bench_pd_runs():
    done = subprocess.run(
        [sys.executable, "-m", "perf.bench_pd", "--requests", "2", "--words", "20",
         "--max-tokens", "4", "--concurrency", "1", "--flavors", "vllm"],
        capture_output=True, text=True, timeout=300, cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| vllm")]
    assert len(rows) == 2  # ttft, e2e
