"""Giving freed memory back to the system after a flood: glibc's ``malloc_trim``, now and then.

Why: what a flood allocates (300k KV-event batches, 10 MB request bodies) is freed when it is
over, but freed memory stays in the process: glibc returns a heap's free pages only from its
top, and each thread has its own arena (the ZeroMQ I/O threads, the tokenizer's threads);
CPython's object arenas go back only when wholly empty. Measured (``perf/flood_rss.py``,
2026-12-02, before this module: perf/RESULTS.md "Memory after floods", last row): RSS
138 → 168 MiB after 300k batches that left the ledger where it was (+22%), 178 MiB after 10
bodies of 10 MiB (+29%). ``malloc_trim(0)`` gives back every free page of every arena (not
CPython's partly used object arenas: what stays after the event flood is those).

Rules:

* ``find_trim()`` is glibc's ``malloc_trim`` (as ``() -> None``), or ``None`` where there is
  none (musl, macOS): then nothing runs, and the start says so once.
* ``run_memory_trim(interval_s)`` calls it every ``interval_s`` seconds (``server.memory_trim_s``,
  0: never) in a worker thread, never on the trio thread: it takes each arena's lock in turn
  (milliseconds on a heap of hundreds of MiB), which only ever delays another thread's
  allocation. It reports ready through ``task_status`` and runs until cancelled.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable

import trio

log = logging.getLogger("cortex.memory")


def find_trim() -> Callable[[], None] | None:
    """glibc's ``malloc_trim(0)``, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def trim_all() -> None:
        trim(0)

    return trim_all


async def run_memory_trim(interval_s: float, *,
                          task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
                          ) -> None:
    trim = find_trim() if interval_s > 0 else None
    if interval_s > 0 and trim is None:
        log.info("no malloc_trim in this C library: freed memory is not given back early")
    task_status.started()
    if trim is None:
        return
    while True:
        await trio.sleep(interval_s)
        await trio.to_thread.run_sync(trim, abandon_on_cancel=True)
