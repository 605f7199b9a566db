"""The worker registry: every known worker's spec and status, and who is live.

Rules and invariants:

* Single owner (the trio thread), no locks, no I/O. Time comes from the injected clock
  (``trio.current_time`` in the gateway) and feeds each worker's ``CircuitBreaker``.
* A worker is **live** (may get new requests) when it is healthy, its breaker is ``CLOSED`` and
  it is not draining. A half-open breaker is not live: its one trial is the monitor's probe, so
  no request traffic rides on an unproven worker, and live-ness only ever changes on an
  explicit report — never silently with the clock.
* A new worker is not healthy until its first probe succeeds (``last_ok_at`` is ``None``).
* Reports: ``probe_result`` (monitor), ``load_result`` / ``load_failed`` (monitor),
  ``upstream_connect_failed`` / ``upstream_answer_failed`` / ``upstream_ok`` (data plane).
  Failures of probes, upstream connections and upstream answers (a 5xx, a broken or timed-out
  exchange, a stream dying midway) count alike toward opening the breaker; a failed probe or
  connection also makes the worker unhealthy at once (a refused connection is the first sign of a crashed or restarting engine: it gets
  no new request, and its ledger is suspect, until a probe succeeds again). Reports about a
  worker that is no longer registered are ignored (a probe can finish just after its worker
  was removed).
* ``drain(name, in_flight)`` takes the worker out of the live pool at once; it is removed as
  soon as the in-flight count the caller reports (there, or later through ``report_in_flight``)
  is 0.
* Listeners (``on_change``) are called synchronously, in subscription order, AFTER the change
  is in the registry: when a listener runs, ``live()``/``views()`` already tell the new truth.
  Kinds: ``"added"``, ``"removed"``, ``"health"`` (healthy or breaker changed), ``"load"``
  (engine figures changed), ``"draining"``, ``"restarted"`` (a load report named another
  engine process than the one before: its ``instance``, the process start time, changed —
  a restart no probe saw). A worker that dies emits ``"health"`` before
  anything else, so a listener takes it out of the routing views first and only then prunes
  its ledger entries (architecture.md §2); removal likewise happens before ``"removed"``.
  A listener's exception propagates to the reporter (a bug, not a condition).
* An unhealthy worker's load is unknown: its figures are dropped when a probe fails (after the
  ``"health"`` event) and a load report arriving while it is unhealthy is not kept.
* ``views()`` builds the scheduler's ``WorkerView`` per worker, in registration order:
  ``healthy`` is live-ness, ``engine_queue`` the sum of waiting requests over the reported
  ranks, ``kv_usage`` the highest usage among them, both ``None`` while unknown.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from cortex.errors import ConfigError, NotFound
from cortex.ledger.state import TargetState
from cortex.scheduling.view import WorkerView
from cortex.workers.breaker import BreakerState, CircuitBreaker
from cortex.workers.health import HealthSettings, WorkerCounters
from cortex.workers.load import RankLoad
from cortex.workers.spec import WorkerSpec, engine_address

ChangeKind = Literal["added", "removed", "health", "load", "draining", "restarted"]
Listener = Callable[[ChangeKind, str], None]

_NO_LOADS: Mapping[int, RankLoad] = types.MappingProxyType({})


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    healthy: bool  # the last probe succeeded
    breaker: BreakerState
    draining: bool
    last_error: str | None  # the last failure seen (probe, upstream or load), kept after recovery
    loads: Mapping[int, RankLoad]  # per DP rank, from the last good load poll; empty = unknown
    last_ok_at: float | None  # clock time of the last successful probe
    consecutive_failures: int

    @property
    def live(self) -> bool:
        return self.healthy and self.breaker is BreakerState.CLOSED and not self.draining


class _Entry:
    __slots__ = (
        "breaker",
        "counters",
        "draining",
        "healthy",
        "instance",
        "last_error",
        "last_ok_at",
        "loads",
        "spec",
    )

    def __init__(self, spec: WorkerSpec, breaker: CircuitBreaker) -> None:
        self.spec = spec
        self.breaker = breaker
        self.healthy = False
        self.draining = False
        self.last_error: str | None = None
        self.loads: Mapping[int, RankLoad] = _NO_LOADS
        self.last_ok_at: float | None = None
        self.counters = WorkerCounters()
        self.instance: float | None = None  # the engine's process start time, if reported

    @property
    def live(self) -> bool:
        return (self.healthy and not self.draining
                and self.breaker.state is BreakerState.CLOSED)

    def health_key(self) -> tuple[bool, BreakerState]:
        return self.healthy, self.breaker.state


class WorkerRegistry:
    def __init__(self, settings: HealthSettings, clock: Callable[[], float]) -> None:
        self._settings = settings
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._listeners: list[Listener] = []

    # ----------------------------------------------------------------- membership

    def add(self, spec: WorkerSpec) -> None:
        problems = spec.validate()
        if spec.name in self._entries:
            problems.append(f"worker {spec.name} is already registered")
        elif not problems:
            twin = next((entry.spec.name for entry in self._entries.values()
                         if engine_address(entry.spec.url) == engine_address(spec.url)),
                        None)
            if twin is not None:
                problems.append(f"worker {spec.name}: {spec.url} is already worker {twin}")
        if problems:
            raise ConfigError(problems)
        breaker = CircuitBreaker(self._settings.failures_to_open, self._settings.open_s,
                                 self._clock)
        self._entries[spec.name] = _Entry(spec, breaker)
        self._emit("added", spec.name)

    def drain(self, name: str, in_flight: int = 0) -> bool:
        """Stop new requests to ``name``; true when it was removed at once (nothing in flight)."""
        entry = self._entry(name)
        if not entry.draining:
            entry.draining = True
            self._emit("draining", name)
        return self.report_in_flight(name, in_flight)

    def report_in_flight(self, name: str, in_flight: int) -> bool:
        """The caller's in-flight count of a worker; a draining one at 0 is removed (true)."""
        entry = self._entries.get(name)
        if entry is None or not entry.draining or in_flight > 0:
            return False
        self.remove(name)
        return True

    def remove(self, name: str) -> None:
        self._entry(name)
        del self._entries[name]
        self._emit("removed", name)

    def on_change(self, listener: Listener) -> Callable[[], None]:
        """Subscribe ``listener(kind, name)``; returns the function that unsubscribes it."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    # ----------------------------------------------------------------- queries

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def specs(self) -> list[WorkerSpec]:
        return [entry.spec for entry in self._entries.values()]

    def spec(self, name: str) -> WorkerSpec:
        return self._entry(name).spec

    def status(self, name: str) -> WorkerStatus:
        entry = self._entry(name)
        return WorkerStatus(entry.healthy, entry.breaker.state, entry.draining,
                            entry.last_error, entry.loads, entry.last_ok_at,
                            entry.breaker.consecutive_failures)

    def counters(self, name: str) -> WorkerCounters:
        """The worker's live counters object (read it, do not write it)."""
        return self._entry(name).counters

    def is_live(self, name: str) -> bool:
        entry = self._entries.get(name)
        return entry is not None and entry.live

    def live(self) -> list[WorkerSpec]:
        return [entry.spec for entry in self._entries.values() if entry.live]

    def views(self, ledger_state_of: Callable[[str], TargetState | None],
              targets_of: Callable[[str], tuple[int, ...]]) -> list[WorkerView]:
        result = []
        for name, entry in self._entries.items():
            loads = entry.loads.values()
            result.append(WorkerView(
                worker=name,
                targets=targets_of(name),
                healthy=entry.live,
                ledger_state=ledger_state_of(name),
                role=entry.spec.role,
                engine_queue=sum(load.waiting for load in loads) if loads else None,
                kv_usage=_max_usage(entry.loads),
            ))
        return result

    # ----------------------------------------------------------------- reports

    def back_in(self, names: Iterable[str]) -> float | None:
        """Seconds until one of ``names`` may take requests again, as far as the registry can
        tell (a 503's ``Retry-After``): an open breaker's trial probe, a half-open one's trial
        timeout, an unhealthy worker's next probe; ``None`` when none is expected back (none
        registered, or all draining)."""
        settings = self._settings
        soonest: float | None = None
        for name in names:
            entry = self._entries.get(name)
            if entry is None or entry.draining:
                continue
            state = entry.breaker.state
            if state is BreakerState.OPEN:
                retry_at = entry.breaker.retry_at()
                assert retry_at is not None
                wait = retry_at - self._clock() + settings.timeout_s
            elif state is BreakerState.HALF_OPEN:
                wait = settings.timeout_s
            elif not entry.healthy:
                wait = settings.interval_s
            else:
                wait = 0.0  # live already (it left the pool for another reason)
            if soonest is None or wait < soonest:
                soonest = wait
        return soonest

    def probe_wait(self, name: str) -> float | None:
        """Seconds until the next probe of ``name`` may go: 0.0 now (in ``HALF_OPEN`` this
        hands out the one trial, whose outcome must then be reported), ``None`` when the
        worker is not registered."""
        entry = self._entries.get(name)
        if entry is None:
            return None
        if entry.breaker.allow():
            return 0.0
        if entry.breaker.state is BreakerState.OPEN:
            retry_at = entry.breaker.retry_at()
            assert retry_at is not None
            return max(retry_at - self._clock(), 1e-9)  # wait for the half-open trial
        return self._settings.timeout_s  # the trial is out: look again after its timeout

    def probe_result(self, name: str, error: str | None) -> None:
        """Outcome of one health probe: ``None`` for healthy, else why it failed."""
        entry = self._entries.get(name)
        if entry is None:
            return
        entry.counters.probes += 1
        before = entry.health_key()
        if error is None:
            entry.healthy = True
            entry.last_ok_at = self._clock()
            entry.breaker.record_success()
        else:
            entry.counters.probe_failures += 1
            entry.healthy = False
            entry.last_error = error
            if entry.breaker.record_failure():
                entry.counters.breaker_opens += 1
        self._health_changed(name, entry, before)
        if error is not None:
            self.forget_load(name)  # after "health": the worker left the pool first

    def upstream_connect_failed(self, name: str, error: str) -> None:
        """The data plane could not open a connection to ``name``: unhealthy at once."""
        self._upstream_failed(name, error, refused=True)

    def upstream_answer_failed(self, name: str, error: str) -> None:
        """An exchange with ``name`` failed after connecting (5xx, broken, timed out)."""
        self._upstream_failed(name, error, refused=False)

    def _upstream_failed(self, name: str, error: str, refused: bool) -> None:
        entry = self._entries.get(name)
        if entry is None:
            return
        entry.counters.upstream_failures += 1
        entry.last_error = error
        before = entry.health_key()
        if refused:
            entry.healthy = False
        if entry.breaker.record_failure():
            entry.counters.breaker_opens += 1
        self._health_changed(name, entry, before)
        if refused:
            self.forget_load(name)  # after "health": the worker left the pool first

    def upstream_ok(self, name: str) -> None:
        """The data plane exchanged a response with ``name``: ends a run of failures."""
        entry = self._entries.get(name)
        if entry is None or entry.breaker.state is not BreakerState.CLOSED:
            return
        entry.breaker.record_success()

    def load_result(self, name: str, loads: Mapping[int, RankLoad],
                    instance: float | None = None) -> None:
        """A load report; ``instance`` (the engine's process start time, when it says) tells
        a restarted engine from the one seen before."""
        entry = self._entries.get(name)
        if entry is None:
            return
        entry.counters.load_polls += 1
        if not entry.healthy:
            return  # answered after the worker was found dead: stale already
        if instance is not None:
            before, entry.instance = entry.instance, instance
            if before is not None and before != instance:
                entry.last_error = f"engine restarted (process start {before} -> {instance})"
                self._emit("restarted", name)
        if dict(loads) != dict(entry.loads):
            entry.loads = types.MappingProxyType(dict(loads))
            self._emit("load", name)

    def load_failed(self, name: str, error: str, *, parse_error: bool) -> None:
        """A load poll failed (request or, with ``parse_error``, its report): load unknown."""
        entry = self._entries.get(name)
        if entry is None:
            return
        entry.counters.load_polls += 1
        if parse_error:
            entry.counters.load_parse_errors += 1
        else:
            entry.counters.load_failures += 1
        entry.last_error = error
        self.forget_load(name)

    def forget_load(self, name: str) -> None:
        """Mark the engine's load unknown (stale figures are never shown as current)."""
        entry = self._entries.get(name)
        if entry is not None and entry.loads:
            entry.loads = _NO_LOADS
            self._emit("load", name)

    # ----------------------------------------------------------------- internals

    def _entry(self, name: str) -> _Entry:
        entry = self._entries.get(name)
        if entry is None:
            raise NotFound(f"no worker named {name!r}")
        return entry

    def _health_changed(self, name: str, entry: _Entry,
                        before: tuple[bool, BreakerState]) -> None:
        if entry.health_key() != before:
            self._emit("health", name)

    def _emit(self, kind: ChangeKind, name: str) -> None:
        for listener in tuple(self._listeners):
            listener(kind, name)


def _max_usage(loads: Mapping[int, RankLoad]) -> float | None:
    usages = [load.kv_usage for load in loads.values() if load.kv_usage is not None]
    return max(usages) if usages else None
