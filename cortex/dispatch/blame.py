"""Whose failure it is: the worker's, or the request's own.

One client's bad input must never take workers out of service: an engine whose handler raises
on some content answers 500 to that content on every worker, and if each such answer counted
toward the worker's breaker, three of them would open every breaker (issue 33).

Rules (per request, before its first byte reached the client):

* A failure without an answer (refused or broken connection, a timeout) and a 502/503/504 head
  (the engine or something in front of it is unavailable) are the worker's: they count toward
  its breaker at once, and the request goes to another worker within the retry budget.
* A 429 is load, never a failure (``cortex.metrics.route_metrics``).
* Any other 5xx head (``may_be_the_requests``; a 500 above all) may be the request's own. Its
  worker becomes a *suspect*, not counted yet, and the request goes to another worker:

  - served there (any status that is not a failure): every suspect's failure was its worker's
    own, and is counted toward its breaker then (``RequestBlame.served``);
  - another worker answers such a status too: the failure followed the request from worker to
    worker, so it is the request's (a *poison* request). That answer is relayed to the client
    as the engine gave it, nothing more is retried, no worker is blamed, and it is counted;
  - the request ends any other way (no other worker could take it, the budget was spent, the
    client left): no verdict, nobody blamed.

* With no other worker to try, such an answer is relayed at once and blames nobody: with one
  worker the breaker could tell nothing apart, and a worker that fails every request still
  fails its probes, connects or timeouts, which are its own.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cortex.dispatch.observer import RouteObserver

log = logging.getLogger("cortex.gateway")

_UNAVAILABLE = frozenset({502, 503, 504})


def may_be_the_requests(status: int) -> bool:
    """A worker's failing status that may follow the request's content rather than the
    worker: a 5xx other than 502/503/504."""
    return 500 <= status <= 599 and status not in _UNAVAILABLE


class RequestBlame:
    """One request's failed attempts and the verdict on them, reported to ``observer``: each
    failure as it happens (``upstream_failed``, blamed at once or not), then ``blamed`` or
    ``poisoned`` once the request's answer says whose the suspects' failures were."""

    __slots__ = ("model", "observer", "suspects")

    def __init__(self, observer: RouteObserver, model: str) -> None:
        self.observer = observer
        self.model = model
        self.suspects: list[tuple[str, Exception]] = []

    def failed(self, worker: str, error: Exception, *, retried: bool) -> None:
        """An attempt on ``worker`` failed before the first byte: the worker's failure, or a
        suspect when the worker answered a status that may be the request's own (its
        ``status``, as ``RetryableStatus`` carries it)."""
        status = getattr(error, "status", None)
        suspect = status is not None and may_be_the_requests(status)
        if suspect:
            self.suspects.append((worker, error))
        self.observer.upstream_failed(worker, error, retried=retried, blame=not suspect)

    @property
    def relay_next(self) -> bool:
        """Whether the next worker's ``may_be_the_requests`` answer is the verdict: relayed to
        the client as it came (the failure followed the request), instead of retried."""
        return bool(self.suspects)

    def poisoned(self, status: int) -> bool:
        """Whether an answer with ``status`` after suspects makes the failure the request's."""
        return bool(self.suspects) and may_be_the_requests(status)

    def answered(self, worker: str, status: int) -> None:
        """The request's answer, relayed to the client, came from ``worker`` with ``status``:
        the verdict on the suspects (nothing when there are none, or when the answer is
        itself a failure of ``worker``'s own)."""
        if not self.suspects:
            return
        if self.poisoned(status):
            names = ", ".join(name for name, _ in self.suspects)
            log.warning("request failed with %d on %s and on %s: the request's own failure "
                        "(relayed, no worker blamed)", status, names, worker)
            self.suspects = []
            self.observer.poisoned(self.model, status)
        elif not (status == 429 or 500 <= status <= 599):  # served: their own failures
            blamed, self.suspects = self.suspects, []
            for name, error in blamed:
                self.observer.blamed(name, error)
