"""Giving freed memory back: glibc's malloc_trim found here, called every interval off the
trio thread, never when the interval is 0."""

from __future__ import annotations

import threading

import trio
import trio.testing

from cortex import memory_trim


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
