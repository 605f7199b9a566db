"""The monitor's timing and reports, over a scripted fetch on trio's virtual clock.

Real sockets are in tests/integration/test_workers_monitor_http.py; here time is virtual
(``autojump_clock``), so intervals, timeouts and breaker periods are asserted exactly.
"""

from __future__ import annotations

import json

import pytest
import trio

from cortex.errors import UpstreamError
from cortex.workers.breaker import BreakerState
from cortex.workers.health import HealthSettings
from cortex.workers.load import RankLoad
from cortex.workers.monitor import LoadPoller, run_monitor
from cortex.workers.registry import WorkerRegistry
from cortex.workers.spec import WorkerSpec

SETTINGS = HealthSettings(interval_s=2.0, timeout_s=1.0, failures_to_open=3, open_s=10.0,
                          load_interval_s=1.0)
HANG = object()

VLLM_METRICS = (b'# TYPE vllm:num_requests_running gauge\n'
                b'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
                b'vllm:num_requests_waiting{engine="0",model_name="m"} 5.0\n'
                b'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n')


class ScriptedEngines:
    """Answers per (origin, path): (status, body), an exception to raise, or HANG."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, str], object] = {}
        self.calls: list[tuple[float, str, str]] = []

    def set(self, spec: WorkerSpec, path: str, answer: object) -> None:
        self.answers[spec.origin, path] = answer

    def times(self, spec: WorkerSpec, path: str, start: float = 0.0) -> list[float]:
        """When ``path`` was fetched from ``spec``'s origin, in seconds after ``start``."""
        return [round(t - start, 6) for t, origin, p in self.calls
                if (origin, p) == (spec.origin, path)]

    async def fetch(self, origin: str, path: str, timeout_s: float) -> tuple[int, bytes]:
        self.calls.append((trio.current_time(), origin, path))
        await trio.sleep(0.01)  # a round trip
        answer = self.answers.get((origin, path), (404, b"not found"))
        if answer is HANG:
            await trio.sleep_forever()
        if isinstance(answer, BaseException):
            raise answer
        return answer  # type: ignore[return-value]


@pytest.fixture
def engines() -> ScriptedEngines:
    return ScriptedEngines()


@pytest.fixture
def registry() -> WorkerRegistry:
    return WorkerRegistry(SETTINGS, trio.current_time)


VLLM = WorkerSpec("v", "http://10.0.0.1:8000", engine="vllm")
SGLANG = WorkerSpec("s", "http://10.0.0.2:30000", engine="sglang", dp_size=2)


async def test_probes_every_interval_and_load_only_when_healthy(
        autojump_clock, registry, engines) -> None:
    engines.set(VLLM, "/health", (200, b""))
    engines.set(VLLM, "/metrics", (200, VLLM_METRICS))
    registry.add(VLLM)
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        await nursery.start(run_monitor, registry, engines.fetch, SETTINGS)
        await trio.sleep(5.5)
        nursery.cancel_scope.cancel()
    assert engines.times(VLLM, "/health", start) == [0.0, 2.0, 4.0]
    # Load polling starts as soon as the first probe answered.
    assert engines.times(VLLM, "/metrics", start) == [0.01, 1.01, 2.01, 3.01, 4.01, 5.01]
    assert registry.status("v").loads == {0: RankLoad(2, 5, 0.5)}
    [view] = registry.views(lambda name: None, lambda name: (0,))
    assert view.healthy and view.engine_queue == 5 and view.kv_usage == 0.5


async def test_failures_open_the_breaker_and_a_trial_closes_it(
        autojump_clock, registry, engines) -> None:
    engines.set(VLLM, "/health", (200, b""))
    registry.add(VLLM)
    health_log: list[tuple[float, bool, BreakerState]] = []

    def on_change(kind: str, name: str) -> None:
        if kind == "health":
            status = registry.status(name)
            health_log.append((round(trio.current_time() - start, 6), status.live,
                               status.breaker))

    registry.on_change(on_change)
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        await nursery.start(run_monitor, registry, engines.fetch, SETTINGS)
        await trio.sleep(1.0)
        engines.set(VLLM, "/health", (503, b""))  # probes at 2, 4, 6 fail
        await trio.sleep(6.5)
        assert registry.status("v").breaker is BreakerState.OPEN
        engines.set(VLLM, "/health", (200, b""))  # back; the trial comes at 6.01 + 10
        await trio.sleep(10.0)
        nursery.cancel_scope.cancel()
    assert health_log == [
        (0.01, True, BreakerState.CLOSED),
        (2.01, False, BreakerState.CLOSED),  # unhealthy within one interval
        (6.01, False, BreakerState.OPEN),
        (16.02, True, BreakerState.CLOSED),  # the half-open trial succeeded
    ]
    # No probe while open.
    assert engines.times(VLLM, "/health", start) == [0.0, 2.0, 4.0, 6.0, 16.01]
    assert registry.counters("v").breaker_opens == 1


async def test_a_hanging_probe_is_cut_at_its_timeout(autojump_clock, registry, engines) -> None:
    engines.set(VLLM, "/health", HANG)
    registry.add(VLLM)
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        await nursery.start(run_monitor, registry, engines.fetch, SETTINGS)
        await trio.sleep(1.5)
        status = registry.status("v")
        assert not status.healthy
        assert status.last_error == "/health: no answer within 1.0 s"
        await trio.sleep(4.0)
        nursery.cancel_scope.cancel()
    # Cut at 1 s each, the interval still counts from each probe's start.
    assert engines.times(VLLM, "/health", start) == [0.0, 2.0, 4.0]
    assert registry.status("v").breaker is BreakerState.OPEN


@pytest.mark.parametrize("error", [UpstreamError("connection refused"),
                                   ConnectionResetError(104, "reset")])
async def test_fetch_errors_are_probe_failures(autojump_clock, registry, engines,
                                               error) -> None:
    engines.set(VLLM, "/health", error)
    registry.add(VLLM)
    async with trio.open_nursery() as nursery:
        await nursery.start(run_monitor, registry, engines.fetch, SETTINGS)
        await trio.sleep(0.5)
        nursery.cancel_scope.cancel()
    status = registry.status("v")
    assert not status.healthy and status.last_error.startswith("/health: ")
    assert registry.counters("v").probe_failures == 1


async def test_sglang_falls_back_to_get_load_and_remembers(autojump_clock, registry,
                                                           engines) -> None:
    engines.set(SGLANG, "/health", (200, b""))
    engines.set(SGLANG, "/get_load", (200, json.dumps([
        {"dp_rank": 0, "num_reqs": 3, "num_waiting_reqs": 1},
        {"dp_rank": 1, "num_reqs": 4, "num_waiting_reqs": 4}]).encode()))
    registry.add(SGLANG)
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        await nursery.start(run_monitor, registry, engines.fetch, SETTINGS)
        await trio.sleep(3.5)
        nursery.cancel_scope.cancel()
    assert engines.times(SGLANG, "/v1/loads", start) == [0.01]
    assert len(engines.times(SGLANG, "/get_load")) == 4  # 0.02, 1.01, 2.01, 3.01
    assert registry.status("s").loads == {0: RankLoad(2, 1), 1: RankLoad(0, 4)}
    [view] = registry.views(lambda name: None, lambda name: (0, 1))
    assert view.engine_queue == 5 and view.kv_usage is None


async def test_load_poller_switches_back_when_get_load_goes(autojump_clock, engines) -> None:
    poller = LoadPoller(SGLANG, engines.fetch, 1.0)
    engines.set(SGLANG, "/get_load", (200, b'[{"dp_rank": 0, "num_reqs": 1, '
                                          b'"num_waiting_reqs": 0}]'))
    assert await poller.poll() == {0: RankLoad(1, 0)}
    assert poller.path == "/get_load"
    engines.answers.clear()
    engines.set(SGLANG, "/v1/loads", (200, b'{"loads": [{"dp_rank": 0, "num_running_reqs": 0,'
                                           b' "num_waiting_reqs": 2, "token_usage": 0.5}]}'))
    assert await poller.poll() == {0: RankLoad(0, 2, 0.5)}
    assert poller.path == "/v1/loads"


async def test_bad_load_reports_are_counted_and_make_load_unknown(
        autojump_clock, registry, engines) -> None:
    engines.set(VLLM, "/health", (200, b""))
    engines.set(VLLM, "/metrics", (200, VLLM_METRICS))
    registry.add(VLLM)
    async with trio.open_nursery() as nursery:
        await nursery.start(run_monitor, registry, engines.fetch, SETTINGS)
        await trio.sleep(1.5)
        assert registry.status("v").loads
        engines.set(VLLM, "/metrics", (200, b"<html>oops</html>"))
        await trio.sleep(1.0)
        assert registry.status("v").loads == {}
        assert registry.counters("v").load_parse_errors == 1
        engines.set(VLLM, "/metrics", HANG)
        await trio.sleep(2.0)
        nursery.cancel_scope.cancel()
    counters = registry.counters("v")
    assert counters.load_failures >= 1 and registry.status("v").healthy
    assert registry.status("v").last_error.endswith("no answer within 1.0 s")


async def test_workers_added_and_removed_at_runtime(autojump_clock, registry, engines) -> None:
    engines.set(VLLM, "/health", (200, b""))
    engines.set(SGLANG, "/health", (200, b""))
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        await nursery.start(run_monitor, registry, engines.fetch, SETTINGS)
        await trio.sleep(1.0)
        registry.add(VLLM)
        await trio.sleep(0.5)
        assert registry.is_live("v")
        registry.add(SGLANG)
        await trio.sleep(2.0)
        registry.remove("v")
        await trio.sleep(5.0)
        nursery.cancel_scope.cancel()
    assert engines.times(VLLM, "/health", start) == [1.0, 3.0]
    assert len(engines.times(SGLANG, "/health")) == 4
    # The listener is gone with the monitor.
    registry.add(WorkerSpec("late", "http://10.0.0.3:1"))
    assert registry.status("late").last_ok_at is None


async def test_removed_mid_probe_is_harmless(autojump_clock, registry, engines) -> None:
    engines.set(VLLM, "/health", HANG)
    registry.add(VLLM)
    async with trio.open_nursery() as nursery:
        await nursery.start(run_monitor, registry, engines.fetch, SETTINGS)
        await trio.sleep(0.5)
        registry.remove("v")
        registry.add(VLLM)  # the same name again: a fresh task
        engines.set(VLLM, "/health", (200, b""))
        await trio.sleep(0.5)
        assert registry.is_live("v")
        nursery.cancel_scope.cancel()


async def test_a_fetch_enforcing_a_timeout_itself_is_a_failure_not_a_crash(
        autojump_clock, registry, engines) -> None:
    """A fetch whose own ``fail_after`` fires first raises ``TooSlowError`` through the
    monitor's scope: a failure like any other."""
    engines.set(VLLM, "/health", HANG)
    engines.set(VLLM, "/metrics", HANG)

    async def strict_fetch(origin: str, path: str, timeout_s: float) -> tuple[int, bytes]:
        with trio.fail_after(timeout_s / 2):
            return await engines.fetch(origin, path, timeout_s)

    registry.add(VLLM)
    async with trio.open_nursery() as nursery:
        await nursery.start(run_monitor, registry, strict_fetch, SETTINGS)
        await trio.sleep(5.5)
        nursery.cancel_scope.cancel()
    status = registry.status("v")
    assert status.last_error == "/health: no answer within 1.0 s"
    assert registry.counters("v").probe_failures == 3
    poller = LoadPoller(VLLM, strict_fetch, 1.0)
    assert await poller.poll() == ("/metrics: no answer within 1.0 s", False)


async def test_a_draining_worker_is_still_probed_and_polled(autojump_clock, registry,
                                                            engines) -> None:
    engines.set(VLLM, "/health", (200, b""))
    engines.set(VLLM, "/metrics", (200, VLLM_METRICS))
    registry.add(VLLM)
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        await nursery.start(run_monitor, registry, engines.fetch, SETTINGS)
        await trio.sleep(0.5)
        assert not registry.drain("v", in_flight=3)
        await trio.sleep(2.0)
        nursery.cancel_scope.cancel()
    assert engines.times(VLLM, "/health", start) == [0.0, 2.0]
    assert engines.times(VLLM, "/metrics", start) == [0.01, 1.01, 2.01]
    status = registry.status("v")
    assert status.draining and not status.live and status.loads
