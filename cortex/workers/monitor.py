"""The I/O shell of worker health and load: probes and polls every registered worker.

``run_monitor`` keeps one task per registered worker — started when the worker is added
(``"added"``), cancelled when it is removed (``"removed"``) — and reports what it learns to the
registry, which decides everything (``registry.py``, rules in ``health.py``, ``breaker.py``):

* health: ``GET /health`` every ``interval_s`` (start to start), at once for a new worker.
  While the worker's breaker is open no probe goes; when it turns half-open the next probe is
  its one trial. A probe that does not finish within ``timeout_s`` is cut and is a failure,
  whatever ``fetch`` does about its own timeout.
* load: right after the first probe, then every ``load_interval_s``, while the worker is
  healthy and its breaker closed (draining included) — vLLM ``GET /metrics``; SGLang
  ``GET /v1/loads``, and on ``404`` the older ``/get_load`` (the path that answered is
  remembered; a ``404`` there switches back). Failed polls and unparsable reports make the load
  unknown and are counted; they do not touch health. A vLLM poll also reports the engine's
  process start time (``instance``): the registry notices a process that restarted between
  two probes.

``fetch(origin, path, timeout_s) -> (status, body)`` is injected (the app builds it on the
upstream pool). It raises ``UpstreamError`` or ``OSError`` when the exchange fails, or
``trio.TooSlowError`` when a ``fail_after`` of its own fires before the monitor's cut; all of
those are failures of the probe or poll. Anything else it raises is a bug and ends the
monitor. Cancellation passes through untouched.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from cortex.errors import UpstreamError
from cortex.workers.breaker import BreakerState
from cortex.workers.health import HealthSettings, probe_verdict
from cortex.workers.load import (
    LoadParseError,
    RankLoad,
    parse_sglang_loads,
    parse_vllm_metrics,
    vllm_process_start,
)
from cortex.workers.registry import ChangeKind, WorkerRegistry
from cortex.workers.spec import WorkerSpec

Fetch = Callable[[str, str, float], Awaitable[tuple[int, bytes]]]

FETCH_FAILURES = (UpstreamError, OSError, trio.TooSlowError)

HEALTH_PATH = "/health"
VLLM_LOAD_PATH = "/metrics"
SGLANG_LOAD_PATH = "/v1/loads"
SGLANG_OLD_LOAD_PATH = "/get_load"


async def run_monitor(registry: WorkerRegistry, fetch: Fetch, settings: HealthSettings, *,
                      task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Probe and poll every worker of ``registry`` until cancelled."""
    scopes: dict[str, trio.CancelScope] = {}
    async with trio.open_nursery() as nursery:

        def watch(name: str) -> None:
            old = scopes.pop(name, None)
            if old is not None:
                old.cancel()
            scope = scopes[name] = trio.CancelScope()
            nursery.start_soon(_watch_worker, registry, fetch, settings, name, scope,
                               name=f"cortex.workers.monitor:{name}")

        def on_change(kind: ChangeKind, name: str) -> None:
            if kind == "added":
                watch(name)
            elif kind == "removed":
                scope = scopes.pop(name, None)
                if scope is not None:
                    scope.cancel()

        unsubscribe = registry.on_change(on_change)
        try:
            for spec in registry.specs():
                watch(spec.name)
            task_status.started()
            await trio.sleep_forever()
        finally:
            unsubscribe()


async def _watch_worker(registry: WorkerRegistry, fetch: Fetch, settings: HealthSettings,
                        name: str, scope: trio.CancelScope) -> None:
    with scope:
        if name not in registry:
            return
        spec = registry.spec(name)
        first_probe = trio.Event()  # load polling starts once health is known
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_probe_loop, registry, fetch, settings, spec, first_probe)
            nursery.start_soon(_load_loop, registry, fetch, settings, spec, first_probe)


async def _probe_loop(registry: WorkerRegistry, fetch: Fetch, settings: HealthSettings,
                      spec: WorkerSpec, first_probe: trio.Event) -> None:
    while True:
        wait = registry.probe_wait(spec.name)
        if wait is None:
            return
        if wait > 0:
            await trio.sleep(wait)
            continue
        started = trio.current_time()
        registry.probe_result(spec.name, await probe(fetch, spec.origin, settings.timeout_s))
        first_probe.set()
        await trio.sleep_until(started + settings.interval_s)


async def probe(fetch: Fetch, origin: str, timeout_s: float) -> str | None:
    """One health probe: ``None`` when healthy, else why not. Never waits past ``timeout_s``."""
    with trio.move_on_after(timeout_s):
        try:
            status, _ = await fetch(origin, HEALTH_PATH, timeout_s)
        except FETCH_FAILURES as error:
            return f"{HEALTH_PATH}: {_describe(error, timeout_s)}"
        return probe_verdict(status)
    return f"{HEALTH_PATH}: {_describe(None, timeout_s)}"


async def _load_loop(registry: WorkerRegistry, fetch: Fetch, settings: HealthSettings,
                     spec: WorkerSpec, first_probe: trio.Event) -> None:
    poller = LoadPoller(spec, fetch, settings.timeout_s)
    await first_probe.wait()
    while True:
        started = trio.current_time()
        if spec.name not in registry:
            return
        status = registry.status(spec.name)
        if status.healthy and status.breaker is BreakerState.CLOSED:  # draining or not
            outcome = await poller.poll()
            if isinstance(outcome, dict):
                registry.load_result(spec.name, outcome, poller.instance)
            else:
                error, parse_error = outcome
                registry.load_failed(spec.name, error, parse_error=parse_error)
        await trio.sleep_until(started + settings.load_interval_s)


class LoadPoller:
    """Fetches and parses one worker's load report; remembers which SGLang path answers."""

    def __init__(self, spec: WorkerSpec, fetch: Fetch, timeout_s: float) -> None:
        self._origin = spec.origin
        self._fetch = fetch
        self._timeout_s = timeout_s
        self._vllm = spec.engine == "vllm"
        self.path = VLLM_LOAD_PATH if self._vllm else SGLANG_LOAD_PATH
        self.instance: float | None = None  # the engine's process start time, last poll

    async def poll(self) -> dict[int, RankLoad] | tuple[str, bool]:
        """Per-rank loads, or ``(error, is_parse_error)``. Never waits past the timeout."""
        with trio.move_on_after(self._timeout_s):
            try:
                status, body = await self._fetch(self._origin, self.path, self._timeout_s)
                if status == 404 and not self._vllm:
                    self.path = (SGLANG_OLD_LOAD_PATH if self.path == SGLANG_LOAD_PATH
                                 else SGLANG_LOAD_PATH)
                    status, body = await self._fetch(self._origin, self.path, self._timeout_s)
            except FETCH_FAILURES as error:
                return f"{self.path}: {_describe(error, self._timeout_s)}", False
            if status != 200:
                return f"{self.path} answered {status}", False
            try:
                if self._vllm:
                    text = body.decode("utf-8", "replace")
                    self.instance = vllm_process_start(text)
                    return parse_vllm_metrics(text)
                return parse_sglang_loads(body)
            except LoadParseError as error:
                return f"{self.path}: {error}", True
        return f"{self.path}: {_describe(None, self._timeout_s)}", False


def _describe(error: BaseException | None, timeout_s: float) -> str:
    """Why a fetch failed, for ``last_error``: a timeout (ours or the fetch's) or the error."""
    if error is None or isinstance(error, trio.TooSlowError):
        return f"no answer within {timeout_s} s"
    return str(error) or type(error).__name__
