"""systemd's notify protocol (``sd_notify``): READY, STOPPING, STATUS and watchdog pings.

Rules (systemd.service(5), sd_notify(3)):

* ``NOTIFY_SOCKET`` names the manager's ``AF_UNIX`` datagram socket: a filesystem path, or an
  abstract-namespace name written with a leading ``@`` (sent as a leading NUL byte). Unset or
  empty: not under systemd (or ``Type=`` is not ``notify``): every send is a no-op.
* One message is one datagram of newline-separated ``KEY=VALUE`` assignments (``READY=1``,
  ``STOPPING=1``, ``WATCHDOG=1``, ``STATUS=free text``); a datagram is sent whole or not at all.
* ``WATCHDOG_USEC`` (microseconds) is set when the unit has ``WatchdogSec=``; it is ours only
  when ``WATCHDOG_PID`` is unset or equals our pid, or our parent's pid when we run frozen:
  the one-file executable (PyInstaller) is a launcher that systemd starts as the main process
  (so ``WATCHDOG_PID`` names it) and that forks the real Cortex, then only forwards signals
  and waits (the unit's ``NotifyAccess=all`` lets that child's messages in). The service must
  send ``WATCHDOG=1`` more often than that; Cortex pings every half period from the trio loop,
  so a wedged loop (a blocking call, a busy loop) stops the pings and systemd restarts it.
* Sending never raises: a manager that went away must not take the gateway down with it; a
  failed send is logged once per kind and reported as ``False``.

The sender is synchronous and tiny (one ``sendto`` per message); ``run_watchdog`` is the only
trio code here.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Mapping

import trio

log = logging.getLogger("cortex.systemd")


def socket_address(value: str) -> str | bytes:
    """The ``sendto`` address of a ``NOTIFY_SOCKET`` value (``@name``: abstract namespace)."""
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    return value


def one_file_launcher_pid() -> int | None:
    """The pid of the one-file executable's launcher (our parent) when we run frozen, else None."""
    return os.getppid() if getattr(sys, "frozen", False) else None


def watchdog_period_s(env: Mapping[str, str], pid: int | None = None,
                      launcher: int | None = None) -> float | None:
    """Seconds of the watchdog timeout systemd gave this process (or the one-file ``launcher``
    it started), or ``None`` (no watchdog)."""
    usec = env.get("WATCHDOG_USEC", "")
    owner = env.get("WATCHDOG_PID", "")
    ours = {str(os.getpid() if pid is None else pid)} | ({str(launcher)} if launcher else set())
    if owner and owner not in ours:
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 1e6 if value > 0 else None


class Notifier:
    """Sends notify messages to one socket; ``Notifier.from_environ()`` for the real one."""

    def __init__(self, address: str | None, watchdog_s: float | None = None) -> None:
        self.address = address
        self.watchdog_s = watchdog_s  # the manager's timeout; pings go every half of it
        self._sock: socket.socket | None = None
        self._warned: set[str] = set()

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> Notifier:
        env = os.environ if env is None else env
        return cls(env.get("NOTIFY_SOCKET") or None,
                   watchdog_period_s(env, launcher=one_file_launcher_pid()))

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, **fields: object) -> bool:
        """Send ``KEY=value`` lines (``send(READY=1, STATUS="...")``); true when delivered."""
        if self.address is None:
            return False
        lines = []
        for key, value in fields.items():
            text = str(value).replace("\n", " ")  # a newline would start another assignment
            lines.append(f"{key}={text}")
        payload = "\n".join(lines).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(payload, socket_address(self.address))
        except OSError as error:
            kind = ",".join(fields)
            if kind not in self._warned:
                self._warned.add(kind)
                log.warning("systemd notify %s to %s failed: %s", kind, self.address, error)
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        return self.send(READY=1, **({"STATUS": status} if status else {}))

    def stopping(self, status: str | None = None) -> bool:
        return self.send(STOPPING=1, **({"STATUS": status} if status else {}))

    def status(self, text: str) -> bool:
        return self.send(STATUS=text)

    def watchdog(self) -> bool:
        return self.send(WATCHDOG=1)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


async def run_watchdog(notifier: Notifier, *,
                       task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Ping ``WATCHDOG=1`` every half watchdog period until cancelled (returns at once when
    systemd set no watchdog). The pings come from the trio loop itself: if the loop wedges,
    they stop."""
    period = notifier.watchdog_s
    task_status.started()
    if period is None or not notifier.enabled:
        return
    while True:
        notifier.watchdog()
        await trio.sleep(period / 2)
