"""Worker registry: membership, health and breaker reports, drain, views, listeners."""

from __future__ import annotations

import pytest
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from cortex.errors import ConfigError, NotFound
from cortex.ledger.state import TargetState
from cortex.scheduling.inflight import PendingWork
from cortex.scheduling.view import Role, WorkerView
from cortex.workers.breaker import BreakerState
from cortex.workers.health import HealthSettings, WorkerCounters, probe_verdict
from cortex.workers.load import RankLoad
from cortex.workers.registry import WorkerRegistry
from cortex.workers.spec import WorkerSpec


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


SETTINGS = HealthSettings(interval_s=2.0, timeout_s=1.0, failures_to_open=3, open_s=10.0)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def registry(clock: FakeClock) -> WorkerRegistry:
    return WorkerRegistry(SETTINGS, clock)


@pytest.fixture
def events(registry: WorkerRegistry) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    registry.on_change(lambda kind, name: seen.append((kind, name)))
    return seen


def spec(name: str = "a", port: int = 8001, **fields) -> WorkerSpec:
    return WorkerSpec(name=name, url=f"http://127.0.0.1:{port}", **fields)


def healthy(registry: WorkerRegistry, *specs: WorkerSpec) -> None:
    for s in specs:
        registry.add(s)
        registry.probe_result(s.name, None)


def no_state(name: str) -> TargetState | None:
    return None


def no_targets(name: str) -> tuple[int, ...]:
    return ()


# ------------------------------------------------------------------------ membership


def test_new_worker_is_not_live_until_its_first_probe(registry, events, clock) -> None:
    registry.add(spec())
    assert events == [("added", "a")]
    status = registry.status("a")
    assert not status.healthy and not status.live and status.last_ok_at is None
    assert status.breaker is BreakerState.CLOSED and status.loads == {}
    assert registry.live() == []
    clock.now = 5.0
    registry.probe_result("a", None)
    assert registry.status("a").live and registry.status("a").last_ok_at == 5.0
    assert [s.name for s in registry.live()] == ["a"]
    assert events == [("added", "a"), ("health", "a")]


def test_add_rejects_invalid_duplicate_name_and_duplicate_url(registry) -> None:
    registry.add(spec("a", 8001))
    with pytest.raises(ConfigError) as invalid:
        registry.add(WorkerSpec(name="", url="ftp://x", dp_size=0))
    assert len(invalid.value.problems) == 3
    with pytest.raises(ConfigError, match="already registered"):
        registry.add(spec("a", 8002))
    with pytest.raises(ConfigError, match="already worker a"):
        registry.add(WorkerSpec(name="b", url="http://127.0.0.1:8001/"))
    assert [s.name for s in registry.specs()] == ["a"] and len(registry) == 1


def test_remove_and_unknown_names(registry, events) -> None:
    healthy(registry, spec())
    registry.remove("a")
    assert "a" not in registry and events[-1] == ("removed", "a")
    for call in (lambda: registry.remove("a"), lambda: registry.status("a"),
                 lambda: registry.drain("a"), lambda: registry.spec("a")):
        with pytest.raises(NotFound):
            call()
    # Reports about a worker that is gone are ignored.
    registry.probe_result("a", "late")
    registry.upstream_connect_failed("a", "late")
    registry.upstream_ok("a")
    registry.load_result("a", {0: RankLoad(1, 1)})
    registry.load_failed("a", "late", parse_error=True)
    assert registry.probe_wait("a") is None
    assert not registry.is_live("a") and not registry.report_in_flight("a", 0)


# ------------------------------------------------------------------------ health and breaker


def test_one_failed_probe_makes_unhealthy_three_open_the_breaker(registry, events) -> None:
    healthy(registry, spec())
    events.clear()
    registry.probe_result("a", "/health answered 503")
    status = registry.status("a")
    assert not status.live and status.breaker is BreakerState.CLOSED
    assert status.last_error == "/health answered 503" and status.consecutive_failures == 1
    assert events == [("health", "a")]
    registry.probe_result("a", "again")  # no change of health: no event
    assert events == [("health", "a")]
    registry.probe_result("a", "third")
    assert registry.status("a").breaker is BreakerState.OPEN
    assert events == [("health", "a")] * 2
    counters = registry.counters("a")
    assert (counters.probes, counters.probe_failures, counters.breaker_opens) == (4, 3, 1)


def test_open_breaker_waits_then_one_trial_probe_closes_it(registry, clock, events) -> None:
    healthy(registry, spec())
    for _ in range(3):
        assert registry.probe_wait("a") == 0.0
        registry.probe_result("a", "down")
    clock.now = 4.0
    assert registry.probe_wait("a") == pytest.approx(6.0)
    clock.now = 10.0
    assert registry.status("a").breaker is BreakerState.HALF_OPEN
    assert not registry.status("a").live
    assert registry.probe_wait("a") == 0.0  # the trial is handed out
    assert registry.probe_wait("a") == SETTINGS.timeout_s  # no second trial
    events.clear()
    registry.probe_result("a", None)
    assert registry.status("a").live and registry.status("a").breaker is BreakerState.CLOSED
    assert events == [("health", "a")]


def test_failed_trial_reopens(registry, clock) -> None:
    healthy(registry, spec())
    for _ in range(3):
        registry.probe_result("a", "down")
    clock.now = 10.0
    assert registry.probe_wait("a") == 0.0
    registry.probe_result("a", "still down")
    assert registry.status("a").breaker is BreakerState.OPEN
    assert registry.counters("a").breaker_opens == 2
    assert registry.probe_wait("a") == pytest.approx(10.0)


def test_upstream_connect_failures_count_with_probe_failures(registry, events) -> None:
    healthy(registry, spec())
    events.clear()
    registry.upstream_connect_failed("a", "connection refused")
    # unhealthy at once (a crashed or restarting engine), until a probe succeeds again
    assert not registry.is_live("a") and events == [("health", "a")]
    registry.upstream_connect_failed("a", "connection refused")
    assert events == [("health", "a")]  # no change: still unhealthy, breaker closed
    registry.probe_result("a", None)
    assert registry.is_live("a")
    registry.upstream_ok("a")  # a good exchange ends the run
    registry.upstream_connect_failed("a", "refused")
    registry.probe_result("a", "timeout")  # probe and upstream failures in one run
    assert registry.status("a").breaker is BreakerState.CLOSED
    registry.upstream_connect_failed("a", "refused")
    assert registry.status("a").breaker is BreakerState.OPEN
    assert events == [("health", "a")] * 4
    assert registry.counters("a").upstream_failures == 4


def test_upstream_ok_does_not_close_an_open_breaker(registry, clock) -> None:
    healthy(registry, spec())
    for _ in range(3):
        registry.upstream_connect_failed("a", "refused")
    registry.upstream_ok("a")  # a late answer
    assert registry.status("a").breaker is BreakerState.OPEN
    clock.now = 10.0
    registry.upstream_ok("a")
    assert registry.status("a").breaker is BreakerState.HALF_OPEN


def test_dead_worker_leaves_the_pool_before_anything_else(registry, clock) -> None:
    """At its "health" event, live() and views() already exclude it; its load goes after."""
    healthy(registry, spec("a", 8001), spec("b", 8002))
    registry.load_result("a", {0: RankLoad(1, 2, 0.5)})
    seen = []

    def listener(kind: str, name: str) -> None:
        seen.append((kind, name, [s.name for s in registry.live()],
                     {v.worker: v.healthy for v in registry.views(no_state, no_targets)}))

    registry.on_change(listener)
    registry.probe_result("a", "/health answered 503")
    assert seen[0] == ("health", "a", ["b"], {"a": False, "b": True})
    assert seen[1][:2] == ("load", "a")
    assert registry.status("a").loads == {}


# ------------------------------------------------------------------------ drain


def test_drain_with_nothing_in_flight_removes_at_once(registry, events) -> None:
    healthy(registry, spec())
    events.clear()
    assert registry.drain("a", in_flight=0)
    assert events == [("draining", "a"), ("removed", "a")]
    assert "a" not in registry


def test_drain_waits_for_in_flight_to_reach_zero(registry, events) -> None:
    healthy(registry, spec("a", 8001), spec("b", 8002))
    events.clear()
    assert not registry.drain("a", in_flight=2)
    status = registry.status("a")
    assert status.draining and status.healthy and not status.live
    assert [s.name for s in registry.live()] == ["b"]
    assert not registry.drain("a", in_flight=2)  # draining twice: one event
    assert not registry.report_in_flight("a", 1)
    assert not registry.report_in_flight("b", 0)  # not draining: stays
    assert registry.report_in_flight("a", 0)
    assert events == [("draining", "a"), ("removed", "a")]
    assert [s.name for s in registry.specs()] == ["b"]


# ------------------------------------------------------------------------ load and views


def test_views_sum_queue_and_max_usage_over_ranks(registry, events) -> None:
    healthy(registry, spec("a", 8001, dp_size=2, role=Role.PREFILL), spec("b", 8002))
    registry.add(spec("c", 8003))  # never probed
    events.clear()
    registry.load_result("a", {0: RankLoad(4, 2, 0.25), 1: RankLoad(1, 3, 0.75)})
    registry.load_result("a", {0: RankLoad(4, 2, 0.25), 1: RankLoad(1, 3, 0.75)})  # same
    registry.load_result("b", {0: RankLoad(1, 0, None)})
    assert events == [("load", "a"), ("load", "b")]
    states = {"a": TargetState.READY, "b": TargetState.SYNCING}
    targets = {"a": (0, 1), "b": (2,), "c": (3,)}
    views = registry.views(states.get, targets.__getitem__)
    assert views == [
        WorkerView("a", (0, 1), True, TargetState.READY, Role.PREFILL, engine_queue=5,
                   kv_usage=0.75),
        WorkerView("b", (2,), True, TargetState.SYNCING, engine_queue=0, kv_usage=None),
        WorkerView("c", (3,), False, None, engine_queue=None, kv_usage=None),
    ]


def test_failed_load_poll_makes_load_unknown(registry, events) -> None:
    healthy(registry, spec())
    registry.load_result("a", {0: RankLoad(1, 1, 0.1)})
    events.clear()
    registry.load_failed("a", "/metrics: line 3: bad value", parse_error=True)
    registry.load_failed("a", "/metrics answered 500", parse_error=False)
    assert events == [("load", "a")]
    [view] = registry.views(no_state, no_targets)
    assert view.engine_queue is None and view.kv_usage is None and not view.reports_load
    counters = registry.counters("a")
    assert (counters.load_polls, counters.load_parse_errors, counters.load_failures) == (3, 1, 1)
    assert registry.status("a").last_error == "/metrics answered 500"


def test_views_feed_pending_work_tracking(registry) -> None:
    """The registry's views are what PendingWork.track takes; listeners keep them current."""
    pending = PendingWork()

    def retrack(kind: str, name: str) -> None:
        if kind == "removed":
            pending.untrack(name)
            return
        for view in registry.views(no_state, no_targets):
            if view.worker == name:
                pending.track(view)

    registry.on_change(retrack)
    healthy(registry, spec("a", 8001), spec("b", 8002))
    with pending.hold("a", 100):
        registry.probe_result("a", "down")
        assert {v.worker: (v.healthy, v.in_flight) for v in pending.views()} == {
            "a": (False, 1), "b": (True, 0)}
    registry.remove("a")
    assert [v.worker for v in pending.views()] == ["b"]


def test_unsubscribe(registry) -> None:
    seen = []
    unsubscribe = registry.on_change(lambda kind, name: seen.append(kind))
    registry.add(spec())
    unsubscribe()
    unsubscribe()
    registry.remove("a")
    assert seen == ["added"]


# ------------------------------------------------------------------------ health.py


@pytest.mark.parametrize("field", ["interval_s", "timeout_s", "open_s", "load_interval_s"])
def test_health_settings_reject_non_positive(field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        HealthSettings(**{field: 0})


def test_health_settings_report_every_problem() -> None:
    with pytest.raises(ConfigError) as error:
        HealthSettings(interval_s=-1, failures_to_open=0)
    assert len(error.value.problems) == 2


def test_probe_verdict_and_counters() -> None:
    assert probe_verdict(200) is None
    assert probe_verdict(503) == "/health answered 503"
    assert probe_verdict(204) is not None
    total = WorkerCounters(probes=2)
    total.add(WorkerCounters(probes=1, breaker_opens=1))
    assert total.as_dict()["probes"] == 3 and total.breaker_opens == 1


# ------------------------------------------------------------------------ stateful property

NAMES = ("a", "b", "c")


class RegistryMachine(RuleBasedStateMachine):
    """Whatever the reports and the clock do, a listener that re-reads a worker on each of its
    events always knows the live set (live-ness never changes silently), and live-ness is
    exactly healthy + breaker closed + not draining."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.registry = WorkerRegistry(
            HealthSettings(failures_to_open=2, open_s=5.0), self.clock)
        self.known_live: set[str] = set()
        self.probes: dict[str, int] = {}
        self.registry.on_change(self.listener)

    def listener(self, kind: str, name: str) -> None:
        if self.registry.is_live(name):
            self.known_live.add(name)
        else:
            self.known_live.discard(name)

    @rule(name=st.sampled_from(NAMES))
    def add(self, name: str) -> None:
        if name not in self.registry:
            self.registry.add(spec(name, 8000 + NAMES.index(name)))
            self.probes[name] = 0

    @rule(name=st.sampled_from(NAMES), ok=st.booleans())
    def probe(self, name: str, ok: bool) -> None:
        wait = self.registry.probe_wait(name)
        if wait == 0.0:  # the monitor probes only when allowed
            self.registry.probe_result(name, None if ok else "down")
            self.probes[name] += 1

    @rule(name=st.sampled_from(NAMES), ok=st.booleans())
    def upstream(self, name: str, ok: bool) -> None:
        if ok:
            self.registry.upstream_ok(name)
        else:
            self.registry.upstream_connect_failed(name, "refused")

    @rule(seconds=st.sampled_from([0.5, 2.0, 5.0, 7.5]))
    def tick(self, seconds: float) -> None:
        self.clock.now += seconds

    @rule(name=st.sampled_from(NAMES), in_flight=st.integers(0, 2))
    def drain(self, name: str, in_flight: int) -> None:
        if name in self.registry:
            self.registry.drain(name, in_flight)

    @rule(name=st.sampled_from(NAMES), in_flight=st.integers(0, 1))
    def report(self, name: str, in_flight: int) -> None:
        self.registry.report_in_flight(name, in_flight)

    @rule(name=st.sampled_from(NAMES))
    def remove(self, name: str) -> None:
        if name in self.registry:
            self.registry.remove(name)

    @rule(name=st.sampled_from(NAMES), waiting=st.integers(0, 3))
    def load(self, name: str, waiting: int) -> None:
        self.registry.load_result(name, {0: RankLoad(1, waiting, 0.5)})

    @invariant()
    def live_set_is_known_from_events(self) -> None:
        assert self.known_live == {s.name for s in self.registry.live()}

    @invariant()
    def live_means_healthy_closed_not_draining(self) -> None:
        for s in self.registry.specs():
            status = self.registry.status(s.name)
            assert status.live == (status.healthy and status.breaker is BreakerState.CLOSED
                                   and not status.draining)
            assert status.live == self.registry.is_live(s.name)
            assert self.registry.counters(s.name).probes == self.probes[s.name]
            if not status.healthy:
                assert status.loads == {}
        views = self.registry.views(no_state, no_targets)
        assert [v.worker for v in views] == [s.name for s in self.registry.specs()]
        assert all(v.healthy == self.registry.is_live(v.worker) for v in views)


TestRegistryMachine = RegistryMachine.TestCase
TestRegistryMachine.settings = hypothesis_settings(max_examples=100, stateful_step_count=40,
                                                   deadline=None)


def test_a_new_engine_process_behind_the_url_is_a_restart(registry, events) -> None:
    healthy(registry, spec())
    events.clear()
    registry.load_result("a", {0: RankLoad(0, 0)}, instance=100.0)
    registry.load_result("a", {0: RankLoad(0, 0)}, instance=100.0)
    registry.load_result("a", {0: RankLoad(0, 0)})  # an engine that does not say
    assert ("restarted", "a") not in events
    registry.load_result("a", {0: RankLoad(0, 0)}, instance=250.5)
    assert events[-1] == ("restarted", "a")
    assert "engine restarted" in registry.status("a").last_error


def test_back_in_says_when_a_worker_may_take_requests_again(registry, clock):
    """A 503's Retry-After: the soonest of an open breaker's trial (plus its timeout), a
    half-open trial's timeout, an unhealthy worker's next probe; nothing for draining or
    unknown workers."""
    for name in ("a", "b", "c"):
        registry.add(WorkerSpec(name, f"http://127.0.0.1:{9000 + ord(name)}", model="m"))
    assert registry.back_in(["zz"]) is None
    registry.probe_result("a", None)
    assert registry.back_in(["a"]) == 0.0  # live already
    for _ in range(SETTINGS.failures_to_open):
        registry.upstream_answer_failed("a", "boom")
    clock.now = 4.0
    assert registry.back_in(["a"]) == pytest.approx(10.0 - 4.0 + SETTINGS.timeout_s)
    assert registry.back_in(["a", "b"]) == SETTINGS.interval_s  # b: not probed yet
    clock.now = 10.0
    assert registry.back_in(["a"]) == SETTINGS.timeout_s  # half-open: the trial decides
    registry.probe_result("c", None)
    registry.drain("c", in_flight=1)
    assert registry.back_in(["c"]) is None
