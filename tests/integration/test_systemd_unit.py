"""``packaging/cortex.service``: the directives issue 8 asks for, and ``systemd-analyze verify``
finding nothing to say about it (skipped when systemd-analyze is not installed; Debian's
``systemd`` package has it). The notify protocol is tested against a real socket in
``test_serve_systemd_reload.py``; the unit runs under a real systemd manager (PID 1 of private
namespaces) in ``test_systemd_demo.py``."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[2] / "packaging" / "cortex.service"


def directives() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def test_the_unit_has_what_an_operator_relies_on():
    unit = directives()
    expected = {
        "Type": "notify", "NotifyAccess": "all", "Restart": "on-failure", "KillMode": "mixed",
        "DynamicUser": "yes", "NoNewPrivileges": "yes", "ProtectSystem": "strict",
        "ProtectHome": "yes", "PrivateTmp": "yes", "CapabilityBoundingSet": "",
        "LimitNOFILE": "65536", "EnvironmentFile": "-/etc/cortex/cortex.env",
        "ExecStart": "/usr/local/bin/cortex serve --config /etc/cortex/cortex.toml",
        "ExecReload": "/bin/kill -HUP $MAINPID",
    }
    assert {key: unit.get(key, [None])[-1] for key in expected} == expected
    assert unit["WatchdogSec"][-1].endswith("s")
    assert "AmbientCapabilities" not in unit  # only for a port below 1024 (see its comment)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed (Debian package: systemd)")
def test_systemd_analyze_verify_is_silent(tmp_path):
    # verify also checks that ExecStart's program exists: point it at one that does.
    text = UNIT.read_text().replace("/usr/local/bin/cortex", sys.executable)
    (tmp_path / "cortex.service").write_text(text)
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", "./cortex.service"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, "")  # a bad directive is only a warning

    # And it does read the file: a misspelt value is reported.
    (tmp_path / "bad.service").write_text(text.replace("Type=notify", "Type=notfy"))
    bad = subprocess.run(["systemd-analyze", "verify", "--man=no", "./bad.service"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert "notfy" in bad.stderr
