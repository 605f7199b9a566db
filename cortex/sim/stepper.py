"""One DP rank of a simulated engine on a continuous-batching model: the trio task that steps
the rank's model on trio's clock and hands each step's results to the requests waiting on them.

A thin I/O shell: the model (``cortex.sim.batching``, a ``BatchingEngine`` held by the rank in
``SimKVEngine``) decides everything; this task only sleeps and delivers. ``RankStepper.run``:

1. While the model has work: ``step()``; the requests it scheduled for the first time learn
   their ``cached_tokens`` at once (the engine matches the prefix when it schedules); sleep
   until the step's end on trio's clock (so ``trio.testing.MockClock`` drives tests); then, at
   the step's end, publish its KV events as one batch (``SimKVEngine.publish_events``) and
   deliver its outputs: one more ready token for each request that produced one, the end for
   those that finished.
2. When ``step()`` answers None (nothing can run): publish the model's ``idle_events()`` once,
   then wait for new work (``add`` or ``abort`` sets an Event; nothing polls).

The steps keep to the engine's own timeline: a step that follows another starts when that one
ended on it (its end plus ``seconds / speedup``), not when the shell got round to it. A sleep
wakes late (epoll counts whole milliseconds) and the shell's own work between steps (the
model's scheduling, delivering, the HTTP side streaming the tokens) takes real time too; timed
from "now", every step of a busy engine would add both to its duration (about 1 ms on a 6 ms
step here: the simulated vLLM CPU engine ran 15% slow against the real one,
``perf/validate_sim_vllm.py``). A shell more than ``MAX_LAG_S`` behind its timeline drops the
rest of the lag instead of running steps back to back to catch up. After an idle spell the next
step starts when its work arrived.

Requests: ``add`` queues a ``SimRequest`` in the model and returns its ``RequestProgress``, which
its reader awaits (``wait_scheduled``, ``wait_token``); ``abort`` (the client went away) takes
it out of the model at once; ``release`` frees what a finished ``hold_kv`` request (a PD
prefill leg) still holds. Both wake the stepper: the blocks they free may admit a request. A restart of the rank (``SimKVEngine.restart``) replaces the model:
the step in flight is dropped unpublished (its blocks died with the old process) and every
request fails with ``EngineCrashed``.

Invariants: a token is ready only once the step that produced it has ended, and that step's
events are published before its tokens are delivered (vLLM publishes at the end of
``update_from_output``, before the outputs leave the engine core); the steps of a rank never
overlap; what a step computed for a request aborted during it is dropped.
"""

from __future__ import annotations

import trio

from cortex.sim.batching.core import BatchingEngine, SimRequest, StepOutcome
from cortex.sim.http_faults import EngineCrashed
from cortex.sim.kv_engine import SimKVEngine
from cortex.sim.rank_counters import RankCounters

__all__ = ["MAX_LAG_S", "RankStepper", "RequestProgress"]

MAX_LAG_S = 0.05  # the most the shell may run behind the engine's timeline (then it drops it)


class RequestProgress:
    """What the stepper has delivered of one request: its cache hit once scheduled, how many
    of its tokens are ready, whether it finished, or why it failed."""

    __slots__ = ("_changed", "cached_tokens", "failure", "finished", "ready", "request")

    def __init__(self, request: SimRequest) -> None:
        self.request = request
        self.cached_tokens: int | None = None  # set when first scheduled
        self.ready = 0  # output tokens ready
        self.finished = False
        self.failure: EngineCrashed | None = None
        self._changed = trio.Event()

    async def wait_scheduled(self) -> int:
        """The request's ``cached_tokens``, once the engine has scheduled it."""
        while self.cached_tokens is None:
            await self._wait_change()
        return self.cached_tokens

    async def wait_token(self, index: int) -> None:
        """Return once output token ``index`` (0-based) is ready."""
        while self.ready <= index:
            await self._wait_change()

    async def _wait_change(self) -> None:
        if self.failure is not None:
            raise self.failure
        await self._changed.wait()
        if self.failure is not None:
            raise self.failure

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()


class RankStepper:
    """Steps one rank's batching model and delivers its outcomes (see the module docstring)."""

    def __init__(self, kv: SimKVEngine, rank: int, counters: RankCounters, *,
                 speedup: float = 1.0) -> None:
        if kv.batching(rank) is None:
            raise ValueError(f"rank {rank} has no batching model")
        if not speedup > 0:
            raise ValueError("speedup must be > 0")
        self.kv = kv
        self.rank = rank
        self.counters = counters
        self.speedup = speedup
        self.steps = 0
        self.idle = True
        self._requests: dict[int, RequestProgress] = {}
        self._work = trio.Event()
        self._idle_changed = trio.Event()
        self._step_scope: trio.CancelScope | None = None
        kv.on_restart(self._restarted)

    @property
    def model(self) -> BatchingEngine:
        model = self.kv.batching(self.rank)
        assert model is not None
        return model

    # ------------------------------------------------------------ requests

    def add(self, request: SimRequest) -> RequestProgress:
        """Queue ``request`` in the model (its ``ValueError`` when refused: too long for the
        KV pool, or a bad request) and wake the stepper."""
        self.model.add(request)
        progress = self._requests[request.request_id] = RequestProgress(request)
        self._wake()
        return progress

    def abort(self, request_id: int) -> None:
        """Take the request out of the model (no-op once it finished or failed)."""
        if self._requests.pop(request_id, None) is not None:
            self.model.abort(request_id)
            self._wake()

    def release(self, request_id: int) -> None:
        """Free the KV a finished ``hold_kv`` request holds (a no-op once released, or when a
        restart took it)."""
        self.model.release(request_id)
        self._wake()

    async def wait_idle(self) -> None:
        """Return once the model has nothing it can run."""
        while not self.idle:
            await self._idle_changed.wait()

    # ------------------------------------------------------------ the loop

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        ended: float | None = None  # the last step's end on the engine's timeline; None: idle
        while True:
            model = self.model
            outcome = model.step()
            if outcome is None:
                self.kv.publish_events(self.rank, model.idle_events())
                self._set_idle(True)
                self._work = trio.Event()  # no checkpoint since step(): no wake-up is lost
                ended = None
                await self._work.wait()
                continue
            self._set_idle(False)
            self.steps += 1
            now = trio.current_time()
            start = now if ended is None or ended < now - MAX_LAG_S else ended
            ended = start + outcome.seconds / self.speedup
            with trio.CancelScope() as self._step_scope:
                self._deliver_scheduled(outcome)
                await trio.sleep_until(ended)
                self.kv.publish_events(self.rank, outcome.events, outcome.hash_digests)
                self._deliver_outputs(outcome)
            if self._step_scope.cancelled_caught:
                ended = None  # the process restarted: its timeline went with it
            self._step_scope = None

    def _deliver_scheduled(self, outcome: StepOutcome) -> None:
        for request_id, cached in outcome.scheduled.items():
            progress = self._requests.get(request_id)
            if progress is not None:
                progress.cached_tokens = cached
                progress._notify()

    def _deliver_outputs(self, outcome: StepOutcome) -> None:
        self.counters.preemptions += len(outcome.preempted)
        requests = self._requests
        changed: list[RequestProgress] = []
        for ids in (outcome.first_tokens, outcome.tokens):
            for request_id in ids:
                progress = requests.get(request_id)
                if progress is not None:
                    progress.ready += 1
                    changed.append(progress)
        for request_id in outcome.finished:
            progress = requests.pop(request_id, None)
            if progress is not None:
                progress.finished = True
        for progress in changed:
            progress._notify()

    # ------------------------------------------------------------ wake-ups

    def _wake(self) -> None:
        self._set_idle(False)
        self._work.set()

    def _set_idle(self, idle: bool) -> None:
        if idle != self.idle:
            self.idle = idle
            self._idle_changed.set()
            self._idle_changed = trio.Event()

    def _restarted(self, rank: int) -> None:
        """The rank's process restarted: drop the step in flight, fail every request."""
        if rank != self.rank:
            return
        if self._step_scope is not None:
            self._step_scope.cancel()
        requests, self._requests = self._requests, {}
        for progress in requests.values():
            progress.failure = EngineCrashed(f"the engine's rank {rank} restarted")
            progress._notify()
        self._wake()
