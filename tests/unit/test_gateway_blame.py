"""Whose failure it is (cortex.gateway.blame): the worker's, or the request's own."""

from __future__ import annotations

import pytest

from cortex.gateway.blame import RequestBlame, may_be_the_requests


@pytest.mark.parametrize(("status", "expected"), [
    (500, True), (501, True), (505, True), (599, True),
    (502, False), (503, False), (504, False), (429, False), (400, False), (200, False),
])
def test_only_a_5xx_other_than_unavailability_may_be_the_requests(status, expected):
    assert may_be_the_requests(status) is expected


def test_served_elsewhere_blames_each_suspect_once():
    blame = RequestBlame()
    assert not blame.relay_next and not blame.poisoned(500)
    first, second = RuntimeError("a: 500"), RuntimeError("b: 501")
    blame.suspect("a", first)
    assert blame.relay_next  # a second worker's 500 would be the verdict
    blame.suspect("b", second)
    assert blame.served() == [("a", first), ("b", second)]
    assert blame.served() == [] and not blame.relay_next


def test_a_second_engine_error_is_the_requests_own():
    blame = RequestBlame()
    blame.suspect("a", RuntimeError("a: 500"))
    assert blame.poisoned(500) and blame.poisoned(507)
    assert not blame.poisoned(503)  # unavailable: that worker's own, not the request's
    assert not blame.poisoned(200)
