"""Admission: what happens when every worker of a model is above its watermarks (trio).

Rules:

* A request whose decision finds the pool saturated (``NoWorkerAvailable.saturated``: workers
  alive, all above a watermark) waits in the model's admission queue for capacity, up to
  ``max_wait_s``; it is decided again each time pending work leaves a worker or a worker's
  engine figures change. Nothing is piled onto a worker above its watermark.
* At most ``max_waiting`` requests wait per model; one more is refused at once with 429 and
  ``Retry-After`` (``Overloaded``). A request that waited out its deadline gets 503 with
  ``Retry-After``. A pool with no live worker at all fails at once (waiting would not help).
* Waiters are woken together and race for the capacity; the queue bounds memory and waiting
  time, not order. Every outcome is counted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import trio

from cortex.dispatch.settings import AdmissionSettings
from cortex.errors import NoWorkerAvailable, Overloaded

T = TypeVar("T")


@dataclass(slots=True)
class AdmissionCounters:
    waited: int = 0  # requests that found the pool saturated and queued
    admitted_after_wait: int = 0
    rejected_queue_full: int = 0  # 429
    timed_out: int = 0  # 503 after max_wait_s


class Admission:
    def __init__(self, settings: AdmissionSettings | None = None) -> None:
        self.settings = settings or AdmissionSettings()
        self.counters = AdmissionCounters()
        self.waiting = 0
        self._changed = trio.Event()

    def capacity_changed(self, *_: object) -> None:
        """Wake every waiter (called when pending work leaves a worker or figures change)."""
        if self.waiting:
            self._changed.set()
            self._changed = trio.Event()

    async def admit(self, decide: Callable[[], T]) -> T:
        """``decide()``, waiting for capacity while the pool is saturated (rules at the top)."""
        try:
            return decide()
        except NoWorkerAvailable as error:
            if not error.saturated:
                raise
            return await self.wait_for_capacity(decide, error)

    async def wait_for_capacity(self, decide: Callable[[], T], saturated: NoWorkerAvailable) -> T:
        """``admit`` after its first ``decide()`` found the pool ``saturated`` (the request
        path decides at once itself, without a coroutine, and comes here only then)."""
        settings = self.settings
        if self.waiting >= settings.max_waiting:
            self.counters.rejected_queue_full += 1
            raise Overloaded(f"{self.waiting} requests already wait for capacity "
                             f"({saturated})", retry_after_s=settings.retry_after_s)
        self.waiting += 1
        self.counters.waited += 1
        try:
            with trio.move_on_after(settings.max_wait_s):
                while True:
                    await self._changed.wait()
                    try:
                        found = decide()
                    except NoWorkerAvailable as error:
                        if not error.saturated:
                            raise
                        saturated = error
                        continue
                    self.counters.admitted_after_wait += 1
                    return found
        finally:
            self.waiting -= 1
        self.counters.timed_out += 1
        raise NoWorkerAvailable(f"waited {settings.max_wait_s:g} s for capacity: {saturated}",
                                saturated=True, retry_after_s=settings.retry_after_s)
