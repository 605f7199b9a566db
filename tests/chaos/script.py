"""A seeded chaos script over a ``ChaosCluster``: one trio task that keeps starting faults.

Every ``step_s`` (jittered) the script draws one fault for one engine and runs it as its own
task for a drawn duration, then undoes it. Faults that stop an engine from serving through
Cortex (kill and restart, hang, failing with 503, unhealthy) are "outages": at most
``max_outages`` run at a time, so some worker can always serve, and ``Availability`` records
them. A worker coming back counts as available only once the registry has it live again.

Faults (names are the keys of ``ChaosScript.counts``):

* ``kill`` — the engine vanishes (HTTP and events), then a fresh engine starts on its ports;
* ``hang`` / ``fail_503`` / ``fail_500`` / ``fail_429`` / ``unhealthy`` — HTTP faults of the
  simulated engine (outages: a failing answer before the first byte is retried on another
  worker, so a client never sees it while another worker stays up);
* ``slow`` — an extra delay before every response head; ``die_mid_stream`` — streamed
  responses break after a few events;
* ``kv_restart`` — the engine's KV side restarts (cache emptied silently, sequence back to 0);
* ``drop`` / ``duplicate`` / ``reorder`` — per-batch probabilities on the event stream;
* ``stall`` — the event stream sends nothing for a while (batches queue up).

``calm()`` undoes every fault and brings every killed engine back.
"""

from __future__ import annotations

import random
from collections import Counter

import trio

from cortex.sim.faults import FaultProbabilities
from tests.chaos.cluster import ChaosCluster
from tests.chaos.load import Availability

OUTAGES = ("kill", "hang", "fail_503", "fail_500", "fail_429", "unhealthy")
HARMLESS = ("slow", "die_mid_stream", "kv_restart", "drop", "duplicate", "reorder", "stall")


class ChaosScript:
    def __init__(self, cluster: ChaosCluster, availability: Availability, rng: random.Random,
                 *, step_s: float = 0.25, max_outages: int = 2) -> None:
        self.cluster = cluster
        self.availability = availability
        self.rng = rng
        self.step_s = step_s
        self.max_outages = max_outages
        self.counts: Counter[str] = Counter()
        self.busy: set[str] = set()  # engines with an outage running
        self.back_up_s: list[float] = []  # outage over -> registry has the worker live again

    async def run(self, duration_s: float) -> None:
        """Start faults for ``duration_s``; returns once every started fault was undone."""
        async with trio.open_nursery() as nursery:
            end = trio.current_time() + duration_s
            while trio.current_time() < end:
                self._start_one(nursery)
                await trio.sleep(self.step_s * (0.5 + self.rng.random()))

    def _start_one(self, nursery: trio.Nursery) -> None:
        names = sorted(self.cluster.slots)
        name = self.rng.choice(names)
        fault = self.rng.choice(OUTAGES + HARMLESS)
        if fault in OUTAGES and (
                name in self.busy or self.availability.down_now() >= self.max_outages):
            fault = self.rng.choice(HARMLESS)
        duration = 0.2 + self.rng.random() * 1.0
        if self.cluster.slots[name].engine is None:
            return  # killed: nothing to do to it until it is back
        self.counts[fault] += 1
        if fault in OUTAGES:
            self.busy.add(name)
            self.availability.down(name)
        nursery.start_soon(getattr(self, "_" + fault), name, duration)

    async def _back_up(self, name: str) -> None:
        """The outage is over: available again once the registry has the worker live."""
        began = trio.current_time()
        try:
            await self.cluster.until(lambda: self.cluster.live(name), timeout_s=30)
        except trio.TooSlowError:
            status = self.cluster.running.registry.status(name)
            before = trio.current_time()
            await trio.sleep(0.01)
            lag = trio.current_time() - before - 0.01
            raise AssertionError(f"{name} not live 30 s after its outage ended: {status}; "
                                 f"engine up: {self.cluster.slots[name].engine is not None}; "
                                 f"upstream pool: {self.cluster.upstream_stats(name)}; "
                                 f"event loop lag now {lag:.3f} s") from None
        else:
            self.back_up_s.append(trio.current_time() - began)
        finally:
            self.availability.up(name)
            self.busy.discard(name)

    async def _kill(self, name: str, duration: float) -> None:
        await self.cluster.kill(name)
        await trio.sleep(duration)
        await self.cluster.revive(name)
        await self._back_up(name)

    async def _engine_fault(self, name: str, duration: float, changes: dict[str, object],
                            undo: dict[str, object]) -> None:
        engine = self.cluster.slots[name].engine
        if engine is not None:
            engine.faults.update(changes)
        await trio.sleep(duration)
        engine = self.cluster.slots[name].engine  # may have been replaced by a kill meanwhile
        if engine is not None:
            engine.faults.update(undo)

    async def _hang(self, name: str, duration: float) -> None:
        await self._engine_fault(name, duration, {"hang": True}, {"hang": False})
        await self._back_up(name)

    async def _fail_503(self, name: str, duration: float) -> None:
        await self._fail(name, duration, 503)

    async def _fail_500(self, name: str, duration: float) -> None:
        await self._fail(name, duration, 500)

    async def _fail_429(self, name: str, duration: float) -> None:
        await self._fail(name, duration, 429)

    async def _fail(self, name: str, duration: float, status: int) -> None:
        await self._engine_fault(name, duration, {"fail_status": status}, {"fail_status": None})
        await self._back_up(name)

    async def _unhealthy(self, name: str, duration: float) -> None:
        await self._engine_fault(name, duration, {"unhealthy": True}, {"unhealthy": False})
        await self._back_up(name)

    async def _slow(self, name: str, duration: float) -> None:
        delay = 0.05 + self.rng.random() * 0.3
        await self._engine_fault(name, duration, {"slow_s": delay}, {"slow_s": 0.0})

    async def _die_mid_stream(self, name: str, duration: float) -> None:
        chunks = self.rng.randrange(0, 4)
        await self._engine_fault(name, duration, {"die_after_chunks": chunks},
                                 {"die_after_chunks": None})

    async def _kv_restart(self, name: str, duration: float) -> None:
        engine = self.cluster.slots[name].engine
        if engine is not None:
            engine.kv.restart(0)  # running requests' leases become no-ops (prefix_cache)

    async def _probabilities(self, name: str, duration: float, **changes: float) -> None:
        engine = self.cluster.slots[name].engine
        if engine is None:
            return
        injector = engine.kv.faults(0)
        injector.probabilities = FaultProbabilities(**changes)
        await trio.sleep(duration)
        injector.probabilities = FaultProbabilities()

    async def _drop(self, name: str, duration: float) -> None:
        await self._probabilities(name, duration, drop=0.3)

    async def _duplicate(self, name: str, duration: float) -> None:
        await self._probabilities(name, duration, duplicate=0.3)

    async def _reorder(self, name: str, duration: float) -> None:
        await self._probabilities(name, duration, reorder=0.3)

    async def _stall(self, name: str, duration: float) -> None:
        engine = self.cluster.slots[name].engine
        if engine is not None:
            engine.kv.publisher(0).stall(min(duration, 0.8))

    async def calm(self) -> None:
        """Undo every fault: default switches, no event faults, killed engines back, all live."""
        for name, slot in self.cluster.slots.items():
            if slot.engine is None:
                await self.cluster.revive(name)
            engine = self.cluster.engine(name)
            engine.faults.update({"slow_s": 0.0, "fail_status": None, "hang": False,
                                  "die_after_chunks": None, "unhealthy": False})
            engine.kv.faults(0).probabilities = FaultProbabilities()
            engine.kv.publisher(0).resume()
        await self.cluster.until(lambda: all(self.cluster.live(n) for n in self.cluster.slots),
                                 timeout_s=30)
