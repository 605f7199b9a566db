"""Demos, benchmarks and test harnesses leave nothing behind in the temporary directory.

Each creator runs in a child process whose ``TMPDIR`` is a fresh folder; once the child has
exited, that folder must be empty: ``cortex-test-template-*`` (``tests/gateway_cluster.py``),
``cortex-replay-*`` (``perf/replay_cluster.py``: ``make demo`` and ``perf/replay.py``),
``cortex-soak-*`` (``perf/soak.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO


def run_with_tmpdir(tmpdir: Path, argv: list[str], timeout_s: float = 120.0) -> str:
    tmpdir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORTEX_")}
    env["TMPDIR"] = str(tmpdir)
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_gateway_harness_template_goes_with_its_process(tmp_path):
    tmpdir = tmp_path / "tmp"
    out = run_with_tmpdir(tmpdir, [sys.executable, "-c", textwrap.dedent("""
        from tests.gateway_cluster import template_path
        print(template_path())
    """)])
    path = Path(out.splitlines()[-1])
    assert path.parent.parent == tmpdir and path.parent.name.startswith("cortex-test-template-")
    assert list(tmpdir.iterdir()) == []


def test_a_replay_run_removes_its_folder_when_stopped(tmp_path):
    tmpdir = tmp_path / "tmp"
    out = run_with_tmpdir(tmpdir, [sys.executable, "-c", textwrap.dedent("""
        import os
        from perf import replay_cluster as rc

        procs = rc.Procs()
        template = procs.template()
        assert os.path.exists(template)
        procs.stop()
        print(procs.tmpdir, os.path.exists(procs.tmpdir))
    """)])
    folder, exists = out.split()
    assert Path(folder).name.startswith("cortex-replay-") and exists == "False"
    assert list(tmpdir.iterdir()) == []


@pytest.mark.slow
def test_a_soak_run_leaves_no_folder(tmp_path):
    tmpdir = tmp_path / "tmp"
    run_with_tmpdir(tmpdir, [sys.executable, "-m", "perf.soak", "--minutes", "0.02",
                             "--clients", "2", "--sample-s", "0.5"])
    assert list(tmpdir.iterdir()) == []
