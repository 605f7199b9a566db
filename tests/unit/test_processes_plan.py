"""``cortex.processes``' pure parts: where the processes of one service meet, the command line
that makes process ``i``, and the start line process 0 waits for."""

from __future__ import annotations

import sys

import pytest

from cortex.cli import build_parser
from cortex.config import load_config
from cortex.control.readiness import Readiness
from cortex.errors import ConfigError
from cortex.processes import ProcessPlan, started_control_port


def config(**flags: str):  # type: ignore[no-untyped-def]
    args = build_parser().parse_args(["serve", *[part for key, value in flags.items()
                                                 for part in (f"--{key}", value)]])
    return load_config(args, {})


def test_every_process_hears_every_other_and_the_configured_peers():
    plan = ProcessPlan(3, "/run/x")
    assert plan.peers(1, "") == "ipc:///run/x/replica-0,ipc:///run/x/replica-2"
    assert plan.peers(0, "tcp://h:1") == (
        "ipc:///run/x/replica-1,ipc:///run/x/replica-2,tcp://h:1")
    first = plan.first_config(config(**{"replicas-peers": "tcp://h:1"}))
    assert first.server.reuse_port
    assert first.replicas.listen == "ipc:///run/x/replica-0"
    assert first.replicas.peers.endswith(",tcp://h:1")


def test_process_i_starts_with_process_0s_arguments_then_its_own():
    plan = ProcessPlan(2, "/run/x")
    argv = ["serve", "--server-port", "0", "--control-port", "9000"]
    command = plan.command(argv, 1, 4321, config(**{"replicas-peers": "tcp://h:1"}))
    assert command[:3] == [sys.executable, "-m", "cortex"]
    assert command[3:8] == argv
    args = build_parser().parse_args(command[3:])
    own = load_config(args, {})
    assert args.process_index == 1
    assert (own.server.port, own.server.reuse_port, own.server.processes) == (4321, True, 1)
    assert (own.control.host, own.control.port) == ("127.0.0.1", 0)
    assert own.replicas.listen == "ipc:///run/x/replica-1"
    assert own.replicas.peers == "ipc:///run/x/replica-0,tcp://h:1"


def test_the_start_line():
    assert started_control_port(
        b"cortex: data plane on 0.0.0.0:8080, control plane on 127.0.0.1:39001") == 39001
    assert started_control_port(b"cortex: data plane on [::]:8080, control plane on "
                                b"[::1]:81\r") == 81
    assert started_control_port(b"something else 127.0.0.1:39001") is None


def test_processes_and_a_replica_listen_endpoint_are_refused_together():
    with pytest.raises(ConfigError, match="replicas.listen with server.processes"):
        config(**{"server-processes": "2", "replicas-listen": "tcp://0.0.0.0:5610"})
    with pytest.raises(ConfigError, match=r"processes must be in \[1, 256\]"):
        config(**{"server-processes": "0"})
    assert config(**{"server-processes": "4", "replicas-peers": "tcp://h:1"}).server.processes == 4


def test_readiness_with_reasons_degrades_only_what_is_ready():
    assert Readiness(True).with_reasons([]) == Readiness(True)
    assert Readiness(True).with_reasons(["process 1: not serving"]) == Readiness(
        True, True, ("process 1: not serving",))
    assert Readiness(False, reasons=("no workers registered",)).with_reasons(["x"]) == Readiness(
        False, reasons=("no workers registered",))
