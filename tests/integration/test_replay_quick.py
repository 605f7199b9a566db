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
        [sys.executable, str(REPO / "perf" / "replay.py"), "--quick",
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
