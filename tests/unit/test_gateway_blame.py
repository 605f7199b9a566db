"""Whose failure it is (cortex.dispatch.blame): the worker's, or the request's own."""

from __future__ import annotations

import pytest

from cortex.dispatch.blame import RequestBlame, may_be_the_requests
from cortex.dispatch.legs import RetryableStatus
from cortex.dispatch.observer import RouteObserver
from cortex.errors import UpstreamError


@pytest.mark.parametrize(("status", "expected"), [
    (500, True), (501, True), (505, True), (599, True),
    (502, False), (503, False), (504, False), (429, False), (400, False), (200, False),
])
def test_only_a_5xx_other_than_unavailability_may_be_the_requests(status, expected):
    assert may_be_the_requests(status) is expected


class Recorder(RouteObserver):
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def upstream_failed(self, worker, error, retried, after_first_byte=False, *, blame=True):
        self.calls.append(("failed", worker, blame))

    def blamed(self, worker, error):
        self.calls.append(("blamed", worker))

    def poisoned(self, model, status):
        self.calls.append(("poisoned", model, status))


def test_a_worker_s_own_failure_is_blamed_at_once():
    observer = Recorder()
    blame = RequestBlame(observer, "m")
    blame.failed("a", RetryableStatus(503), retried=True)  # unavailable: a's own
    blame.failed("b", UpstreamError("refused"), retried=True)
    assert observer.calls == [("failed", "a", True), ("failed", "b", True)]
    assert not blame.relay_next
    blame.answered("c", 200)
    assert observer.calls[2:] == []


def test_served_elsewhere_blames_each_suspect_once():
    observer = Recorder()
    blame = RequestBlame(observer, "m")
    assert not blame.relay_next and not blame.poisoned(500)
    blame.failed("a", RetryableStatus(500), retried=True)
    assert blame.relay_next  # a second worker's 500 would be the verdict
    blame.failed("b", RetryableStatus(501), retried=True)
    blame.answered("c", 503)  # c's own failure, relayed: no verdict yet
    blame.answered("c", 200)
    blame.answered("c", 200)
    assert observer.calls == [("failed", "a", False), ("failed", "b", False),
                              ("blamed", "a"), ("blamed", "b")]
    assert not blame.relay_next


def test_a_second_engine_error_is_the_requests_own():
    observer = Recorder()
    blame = RequestBlame(observer, "m")
    blame.failed("a", RetryableStatus(500), retried=True)
    assert blame.poisoned(500) and blame.poisoned(507)
    assert not blame.poisoned(503)  # unavailable: that worker's own, not the request's
    assert not blame.poisoned(200)
    blame.answered("b", 500)
    assert observer.calls == [("failed", "a", False), ("poisoned", "m", 500)]
