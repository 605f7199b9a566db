"""Giving freed memory back: glibc's malloc_trim found here, called every interval off the
trio thread, never when the interval is 0."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import trio
import trio.testing

from cortex import memory_trim

REPO = Path(__file__).resolve().parents[2]


def test_glibc_trim_is_found_and_runs():
    trim = memory_trim.find_trim()
    assert trim is not None  # this machine's C library is glibc
    trim()


async def test_trim_runs_every_interval_in_a_worker_thread(monkeypatch):
    send, receive = trio.open_memory_channel[bool](10)
    trio_thread = threading.get_ident()
    token = trio.lowlevel.current_trio_token()

    def trim() -> None:
        trio.from_thread.run_sync(send.send_nowait, threading.get_ident() != trio_thread,
                                  trio_token=token)

    monkeypatch.setattr(memory_trim, "find_trim", lambda: trim)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            started = trio.current_time()
            await nursery.start(memory_trim.run_memory_trim, 0.05)
            for i in range(1, 4):
                assert await receive.receive()  # off the trio thread
                assert trio.current_time() - started >= i * 0.05
            nursery.cancel_scope.cancel()


async def test_an_interval_of_zero_never_trims(monkeypatch):
    monkeypatch.setattr(memory_trim, "find_trim", lambda: (_ for _ in ()).throw(AssertionError))
    with trio.fail_after(5):
        await memory_trim.run_memory_trim(0)  # returns at once


# A thread fills its own glibc heap with 4-KiB blocks and frees them all, after the process
# freed one large block (which raises glibc's dynamic trim threshold); then malloc_trim runs.
THREAD_HEAP_SCRIPT = """
import ctypes, sys, threading
from cortex import memory_trim
if sys.argv[1] == "fixed":
    assert memory_trim.fix_thresholds()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
libc.free(libc.malloc(30 << 20))
def churn():
    blocks = [libc.malloc(4096) for _ in range(2048)]
    for block in blocks:
        ctypes.memset(block, 1, 4096)
    for block in blocks:
        libc.free(block)
before = rss()
thread = threading.Thread(target=churn)
thread.start()
thread.join()
memory_trim.find_trim()()
print(rss() - before)
"""


def thread_heap_growth(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", THREAD_HEAP_SCRIPT, mode], check=True,
                          capture_output=True, text=True, cwd=REPO)
    return int(done.stdout)


def test_fixed_thresholds_give_a_thread_heaps_free_top_back():
    """The ZeroMQ I/O thread's heap kept what a flood allocated in it (issue 22 §6): malloc_trim
    leaves the free tops of thread heaps, and glibc's raised dynamic threshold kept them."""
    assert thread_heap_growth("dynamic") > 6 << 20  # 8 MiB written, kept
    assert thread_heap_growth("fixed") < 2 << 20
