"""Whose failure it is: the worker's, or the request's own.

One client's bad input must never take workers out of service: an engine whose handler raises
on some content answers 500 to that content on every worker, and if each such answer counted
toward the worker's breaker, three of them would open every breaker (issue 33).

Rules (per request, before its first byte reached the client):

* A failure without an answer (refused or broken connection, a timeout) and a 502/503/504 head
  (the engine or something in front of it is unavailable) are the worker's: they count toward
  its breaker at once, and the request goes to another worker within the retry budget.
* A 429 is load, never a failure (``cortex.gateway.metrics_observer``).
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

from dataclasses import dataclass, field

_UNAVAILABLE = frozenset({502, 503, 504})


def may_be_the_requests(status: int) -> bool:
    """A worker's failing status that may follow the request's content rather than the
    worker: a 5xx other than 502/503/504."""
    return 500 <= status <= 599 and status not in _UNAVAILABLE


@dataclass(slots=True)
class RequestBlame:
    """What one request's failed attempts say so far (``may_be_the_requests`` answers)."""

    suspects: list[tuple[str, Exception]] = field(default_factory=list)

    def suspect(self, worker: str, error: Exception) -> None:
        """``worker`` answered a status that may be the request's own (not counted yet)."""
        self.suspects.append((worker, error))

    @property
    def relay_next(self) -> bool:
        """Whether the next worker's ``may_be_the_requests`` answer is the verdict: relayed to
        the client as it came (the failure followed the request), instead of retried."""
        return bool(self.suspects)

    def poisoned(self, status: int) -> bool:
        """Whether an answer with ``status`` relayed after suspects makes the request the
        failure's owner (then nobody is blamed)."""
        return bool(self.suspects) and may_be_the_requests(status)

    def served(self) -> list[tuple[str, Exception]]:
        """The request was served by another worker: the suspects, whose failures were their
        own; forgotten here (each is blamed once)."""
        blamed, self.suspects = self.suspects, []
        return blamed
