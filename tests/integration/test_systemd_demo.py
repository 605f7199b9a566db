"""Cortex running under a real systemd manager (issue 8 §2): ``packaging/systemd-demo.sh``
starts systemd as PID 1 of private namespaces over a throw-away overlay of ``/``, installs the
one-file ``dist/cortex`` and ``packaging/cortex.service`` (unchanged; a drop-in shortens
``WatchdogSec`` to 2 s so the watchdog steps take seconds), runs two ``cortex sim`` engines in
a second unit, and prints what systemd and Cortex did; this test reads that transcript.

Skipped, with the reason, when the binary is not built or is stale (as in
``test_dist_binary.py``), or when no systemd manager can start here (not root, no
``unshare``/systemd/cgroup2, a container without the privileges for namespaces and mounts).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.test_dist_binary import BINARY, ROOT, _skip_reason

SCRIPT = ROOT / "packaging" / "systemd-demo.sh"


@pytest.fixture
def manager(tmp_path: Path):
    """The demo's environment, once a systemd manager has been seen to start (then stopped)."""
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("nsenter") is None:
        pytest.skip("needs root, unshare and nsenter (util-linux)")
    if not Path("/lib/systemd/systemd").exists():
        pytest.skip("systemd is not installed (Debian package: systemd)")
    env = {**os.environ, "CORTEX_DEMO_STATE": str(tmp_path / "demo"),
           "CORTEX_BIN": str(BINARY), "CORTEX_DEMO_WATCHDOG_S": "2"}
    up = subprocess.run([str(SCRIPT), "up"], check=False, env=env, capture_output=True, text=True,
                        timeout=120)
    if up.returncode != 0:
        pytest.skip(f"no systemd manager can run here: {up.stderr.strip()[-600:]}")
    try:
        yield env
    finally:
        subprocess.run([str(SCRIPT), "down"], check=False, env=env, capture_output=True,
                       timeout=120)


def section(transcript: str, title: str) -> str:
    start = transcript.index(f"== {title}")
    end = transcript.find("\n== ", start + 1)
    return transcript[start:] if end < 0 else transcript[start:end]


def test_cortex_under_systemd_notify_watchdog_reload_restart_stop(manager):
    done = subprocess.run([str(SCRIPT), "demo"], check=False, env=manager,
                          capture_output=True, text=True, timeout=600)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "installed packaging/cortex.service unchanged" in out
    assert "verify: no complaint" in out
    assert re.search(r"Overall exposure level for cortex\.service: \d+\.\d", out)

    # Type=notify: activating while the binary unpacks and binds, active once READY=1 came,
    # which Cortex sends right after printing its listeners.
    start = section(out, "Type=notify")
    states = [line for line in start.splitlines() if "ActiveState=" in line]
    assert "ActiveState=activating SubState=start" in states[0]
    assert "StatusText=serving on port 8080 ActiveState=active SubState=running" in states[-1]
    assert start.index("data plane on 127.0.0.1:8080") < start.index("Started cortex.service")
    assert "x-cortex-match-mode=exact_kv_events" in start

    stamps = re.findall(r"WatchdogTimestamp=(.+?) UTC", section(out, "watchdog"))
    assert len(stamps) == 2 and stamps[0] != stamps[1]  # pings arrive

    reload = section(out, "reload")
    ports = re.findall(r"port (\d+)\)?:", reload)
    assert len(ports) == 2 and ports[0] == ports[1]  # the keep-alive connection survived
    assert "stream: 602 chunks, [DONE] seen" in reload
    assert "SIGHUP: workers reloaded: replaced sim1" in reload
    pids = re.findall(r"MainPID=(\d+)", reload)
    assert len(pids) == 2 and pids[0] == pids[1]  # reloaded in place, not restarted

    wedged = section(out, "a wedged loop")
    assert "Watchdog timeout" in wedged and "Failed with result 'watchdog'" in wedged
    assert "NRestarts=1" in wedged and "ActiveState=active" in wedged

    stop = section(out, "stop")
    assert "StatusText=draining ActiveState=deactivating" in stop  # STOPPING=1 + STATUS
    assert "stream: 602 chunks, [DONE] seen" in stop  # the in-flight stream drained
    assert "Result=success ExecMainStatus=0" in stop
