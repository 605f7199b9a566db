"""sd_notify against a real AF_UNIX datagram socket bound by the test: path and abstract
addresses, message format, watchdog pings from the trio loop (and their absence while the loop
is wedged), and the environment rules (``WATCHDOG_USEC``, ``WATCHDOG_PID``)."""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import trio

from cortex.systemd import Notifier, run_watchdog, socket_address, watchdog_period_s


@contextmanager
def notify_socket(abstract: bool = False) -> Iterator[tuple[str, socket.socket]]:
    """A bound datagram socket as systemd's manager has, and its NOTIFY_SOCKET value."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:
        name = f"@cortex-test-{os.getpid()}-{id(sock)}"
        sock.bind(socket_address(name))
    else:
        directory = tempfile.mkdtemp(prefix="cortex-notify-")
        name = os.path.join(directory, "notify")
        sock.bind(name)
    sock.setblocking(False)
    try:
        yield name, sock
    finally:
        sock.close()
        if not abstract:
            os.unlink(name)
            os.rmdir(os.path.dirname(name))


def received(sock: socket.socket) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


def test_messages_reach_a_path_socket_one_datagram_each():
    with notify_socket() as (name, sock):
        notifier = Notifier.from_environ({"NOTIFY_SOCKET": name})
        assert notifier.enabled and notifier.watchdog_s is None
        assert notifier.ready("serving on port 8080")
        assert notifier.status("line one\nline two")
        assert notifier.watchdog()
        assert notifier.stopping()
        notifier.close()
        assert received(sock) == ["READY=1\nSTATUS=serving on port 8080",
                                  "STATUS=line one line two", "WATCHDOG=1", "STOPPING=1"]


def test_abstract_namespace_socket():
    with notify_socket(abstract=True) as (name, sock):
        assert name.startswith("@")
        notifier = Notifier.from_environ({"NOTIFY_SOCKET": name})
        assert notifier.ready()
        assert received(sock) == ["READY=1"]
        notifier.close()


def test_without_notify_socket_every_send_is_a_no_op():
    notifier = Notifier.from_environ({"WATCHDOG_USEC": "1000000"})
    assert not notifier.enabled
    assert not notifier.ready() and not notifier.watchdog()


def test_a_vanished_manager_never_raises(tmp_path, caplog):
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": str(tmp_path / "gone")})
    assert not notifier.ready()
    assert not notifier.ready()
    assert len([r for r in caplog.records if "notify" in r.getMessage()]) == 1  # once per kind
    notifier.close()


def test_watchdog_period_from_the_environment():
    pid = os.getpid()
    assert watchdog_period_s({"WATCHDOG_USEC": "30000000"}) == 30.0
    assert watchdog_period_s({"WATCHDOG_USEC": "500000", "WATCHDOG_PID": str(pid)}) == 0.5
    assert watchdog_period_s({"WATCHDOG_USEC": "500000", "WATCHDOG_PID": str(pid + 1)}) is None
    assert watchdog_period_s({"WATCHDOG_USEC": "0"}) is None
    assert watchdog_period_s({"WATCHDOG_USEC": "soon"}) is None
    assert watchdog_period_s({}) is None


def test_the_one_file_launchers_watchdog_is_ours():
    # systemd names its main process, the one-file executable's launcher, our parent.
    env = {"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "4242"}
    assert watchdog_period_s(env, pid=4243, launcher=4242) == 30.0
    assert watchdog_period_s(env, pid=4243, launcher=None) is None  # not frozen: not ours
    assert watchdog_period_s(env, pid=4243, launcher=4241) is None


async def test_watchdog_pings_while_the_loop_runs_and_stop_while_it_is_wedged():
    with notify_socket() as (name, sock):
        notifier = Notifier(name, watchdog_s=0.2)  # a ping every 0.1 s
        async with trio.open_nursery() as nursery:
            await nursery.start(run_watchdog, notifier)
            pings: list[float] = []
            with trio.fail_after(30):
                while len(pings) < 4:  # they keep coming
                    await trio.lowlevel.wait_readable(sock)
                    pings += [time.monotonic() for _ in received(sock)]
            # No checkpoint since the last read: the watchdog task cannot run until the loop
            # turns again, so a wedged loop (here a blocking call) sends nothing.
            time.sleep(0.6)  # noqa: ASYNC251 (the point: a blocked event loop)
            assert received(sock) == []
            with trio.fail_after(30):
                await trio.lowlevel.wait_readable(sock)  # they resume with the loop
            assert received(sock) == ["WATCHDOG=1"]
            nursery.cancel_scope.cancel()
        notifier.close()


async def test_no_watchdog_task_without_a_watchdog():
    with notify_socket() as (name, sock):
        notifier = Notifier(name, watchdog_s=None)
        with trio.fail_after(5):
            await run_watchdog(notifier)  # returns at once
        assert received(sock) == []
        notifier.close()
