"""Giving freed memory back to the system after a flood: glibc's ``malloc_trim``, now and then.

Why: what a flood allocates (300k KV-event batches, 10 MB request bodies) is freed when it is
over, but freed memory stays in the process: glibc returns a heap's free pages only from its
top, and each thread has its own arena (the ZeroMQ I/O threads, the tokenizer's threads);
CPython's object arenas go back only when wholly empty. Measured (``perf/flood_rss.py``,
2026-12-02, before this module: perf/RESULTS.md "Memory after floods", last row): RSS
138 → 168 MiB after 300k batches that left the ledger where it was (+22%), 178 MiB after 10
bodies of 10 MiB (+29%). ``malloc_trim(0)`` gives back every free page of every arena (not
CPython's partly used object arenas).

What ``malloc_trim`` leaves: the free top of every heap but the main one (glibc trims those
tops only inside ``free``, once the top is larger than the trim threshold), and glibc raises
that threshold — to twice the largest block it ever gave back to the system, up to 64 MiB —
from the first large block freed (reading a tokenizer file is one). What the ZeroMQ I/O thread
allocated during a flood (every received message) then stays in its arena's top: +3.4 MiB
after 301k batches, most of what was left (``flood_rss.py``'s growth by mapping,
2026-12-02). So the thresholds are fixed instead (``mallopt``): a heap's top is trimmed once it
exceeds ``TRIM_THRESHOLD_BYTES``, and blocks from ``MMAP_THRESHOLD_BYTES`` up are mapped on
their own, given back the moment they are freed (a 10-MiB body costs its page faults, well
under a millisecond).

Rules:

* ``fix_thresholds()`` sets glibc's trim and mmap thresholds (``False`` where there is no
  ``mallopt``); ``run_memory_trim`` calls it once at start when trimming is on.
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
from typing import Any

import trio

log = logging.getLogger("cortex.memory")

TRIM_THRESHOLD_BYTES = 1 << 20
MMAP_THRESHOLD_BYTES = 1 << 20
_M_TRIM_THRESHOLD = -1  # glibc malloc.h
_M_MMAP_THRESHOLD = -3


def _libc_function(name: str) -> Any:
    library = ctypes.util.find_library("c")
    if library is None:
        return None
    try:
        return getattr(ctypes.CDLL(library), name)
    except (OSError, AttributeError):
        return None


def fix_thresholds() -> bool:
    """Fixed trim and mmap thresholds (module docstring); False where there is no mallopt."""
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
                and mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


def find_trim() -> Callable[[], None] | None:
    """glibc's ``malloc_trim(0)``, or None where the C library has none."""
    trim = _libc_function("malloc_trim")
    if trim is None:
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
    if trim is not None and not fix_thresholds():
        log.info("glibc's mallopt refused the trim and mmap thresholds: thread heaps keep "
                 "their free tops")
    task_status.started()
    if trim is None:
        return
    while True:
        await trio.sleep(interval_s)
        await trio.to_thread.run_sync(trim, abandon_on_cancel=True)
