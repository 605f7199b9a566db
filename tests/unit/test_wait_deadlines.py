"""WaitDeadlines: each watched wait expires at its own deadline, never before, never twice."""

from __future__ import annotations

import trio
import trio.testing

from cortex.wait_deadlines import WaitDeadlines


class FakeWait:
    def __init__(self, name: str, log: list[tuple[str, float]]) -> None:
        self.name = name
        self.log = log

    def expire(self) -> None:
        self.log.append((self.name, trio.current_time()))


async def test_waits_expire_at_their_deadlines_in_order(autojump_clock):
    log: list[tuple[str, float]] = []
    keeper = WaitDeadlines()
    late, early, gone = (FakeWait(n, log) for n in ("late", "early", "gone"))
    async with trio.open_nursery() as nursery:
        await nursery.start(keeper.run)
        assert keeper.running
        start = trio.current_time()
        keeper.watch(late, start + 600)
        keeper.watch(gone, start + 5)
        await trio.testing.wait_all_tasks_blocked()
        keeper.watch(early, start + 10)  # earlier than the keeper's current sleep (600)
        keeper.unwatch(gone)  # its wait ended in time: never expired
        await trio.sleep(700)
        keeper.watch(late, trio.current_time() + 1)  # a new wait of the same connection
        await trio.sleep(2)
        nursery.cancel_scope.cancel()
    assert not keeper.running
    assert [(name, round(at - start, 6)) for name, at in log] == [("early", 10), ("late", 600),
                                                        ("late", 701)]


async def test_now_is_the_runs_clock_while_running_and_trio_current_time_otherwise(
        autojump_clock):
    keeper = WaitDeadlines()
    assert keeper.now is trio.current_time
    async with trio.open_nursery() as nursery:
        await nursery.start(keeper.run)
        assert keeper.now() == trio.current_time()  # the mock clock: the same reading
        await trio.sleep(42)
        assert keeper.now() == trio.current_time()
        nursery.cancel_scope.cancel()
    assert keeper.now is trio.current_time
