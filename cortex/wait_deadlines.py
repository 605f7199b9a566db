"""Timeouts of many socket waits, kept by one task.

A trio cancel scope per wait costs ~10 µs (more than parsing a response with llhttp), and
setting the deadline of an existing scope ~4 µs plus ~3 to clear it again; a streamed
response waits once per chunk, and a keep-alive connection waits idle once per request.
Instead, a connection about to wait records a deadline here (a dict store) and ``run`` — one
task per upstream pool, one per server — sleeps until the earliest one. A deadline that
passes expires its connection: an upstream connection marks itself timed out and wakes its
waiting task with ``trio.lowlevel.notify_closing`` (which then raises ``UpstreamTimeout`` and
the connection is closed, as with a cancel scope); an idle client connection cancels its
cycles' scope, as its passed deadline would.

Rules:

* ``watch(conn, deadline)`` before a wait, ``unwatch(conn)`` after it (in ``finally``): only
  connections blocked in a wait are held here. Deadlines are in trio's clock.
* ``run`` wakes at the earliest deadline (a later one never wakes it; an earlier one moves
  its sleep forward through the deadline of its one cancel scope), expires every connection
  whose deadline has passed, and repeats. A timeout fires at its deadline, to trio's clock
  resolution — no tick, no polling.
* ``now()`` is trio's clock: while ``run`` runs, the run's clock read directly (one frame;
  ``trio.current_time()`` is three, and it materializes its frame's locals for KeyboardInterrupt
  protection, ~1 µs each time and a request asked it ~7 times), else ``trio.current_time``.
  Connections take their deadlines from it.
* ``running`` is true while ``run`` runs; connections fall back to a cancel scope per wait
  when it is not (a connection used without a pool, or after the pool's ``run`` ended). A
  wait already under way when ``run`` ends loses its deadline: ``run`` ends at shutdown,
  when those waits are being cancelled too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import trio


class Expirable(Protocol):
    def expire(self) -> None:
        """The deadline of the current wait passed: wake the waiting task with a timeout."""


class WaitDeadlines:
    __slots__ = ("_waiting", "_wake", "_wake_at", "now", "running")

    def __init__(self) -> None:
        self._waiting: dict[Expirable, float] = {}
        self._wake: trio.CancelScope | None = None  # the sleep of ``run``
        self._wake_at = math.inf
        self.now: Callable[[], float] = trio.current_time
        self.running = False

    def watch(self, conn: Expirable, deadline: float) -> None:
        self._waiting[conn] = deadline
        if deadline < self._wake_at and self._wake is not None:
            self._wake_at = deadline
            self._wake.deadline = deadline

    def unwatch(self, conn: Expirable) -> None:
        self._waiting.pop(conn, None)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Expire connections as their deadlines pass, until cancelled."""
        self.now = trio.lowlevel.current_clock().current_time
        self.running = True
        try:
            task_status.started()
            while True:
                now = self.now()
                due = math.inf
                expired = [conn for conn, deadline in self._waiting.items() if deadline <= now]
                for conn in expired:
                    del self._waiting[conn]
                    conn.expire()
                for deadline in self._waiting.values():
                    due = min(due, deadline)
                # no checkpoint from here to the sleep: ``watch`` sees this scope at once
                self._wake_at = due
                with trio.CancelScope(deadline=due) as self._wake:
                    await trio.sleep_forever()
        finally:
            self.running = False
            self.now = trio.current_time
            self._wake = None
            self._wake_at = math.inf
