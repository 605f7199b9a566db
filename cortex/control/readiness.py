"""Whether Cortex can route safely right now: ready, ready-degraded, or not ready.

Rules (``assess``):

* Not ready (503): no worker registered, or no worker that can take a request (every worker
  unhealthy). A load balancer should send traffic elsewhere.
* Ready-degraded (200, ``"degraded": true``): requests can be served, but not as well as
  possible — some healthy worker's ledger is not READY (syncing, stale, partial: it is routed
  by load, without exact KV credit), some worker is unhealthy, or the caller names another
  reason (e.g. a model whose exact routing is off). The reasons say which, one short line each.
* Ready (200): every worker healthy and every ledger READY (or the engine publishes no
  events, ``ledger_state is None``: nothing to sync).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cortex.scheduling.view import WorkerView


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    degraded: bool = False
    reasons: tuple[str, ...] = ()

    @property
    def http_status(self) -> int:
        return 200 if self.ready else 503

    def with_reasons(self, reasons: Sequence[str]) -> Readiness:
        """This verdict with more reasons: degraded by them when ready, else unchanged."""
        if not reasons or not self.ready:
            return self
        return Readiness(True, True, (*self.reasons, *reasons))

    def as_json(self) -> dict[str, object]:
        status = "not_ready" if not self.ready else "degraded" if self.degraded else "ready"
        return {"status": status, "ready": self.ready, "degraded": self.degraded,
                "reasons": list(self.reasons)}


def assess(workers: Sequence[WorkerView], extra_reasons: Iterable[str] = ()) -> Readiness:
    if not workers:
        return Readiness(False, reasons=("no workers registered",))
    healthy = [view for view in workers if view.healthy]
    if not healthy:
        return Readiness(False, reasons=("no healthy worker",))
    reasons = [f"worker {view.worker}: unhealthy" for view in workers if not view.healthy]
    reasons += [f"worker {view.worker}: ledger {view.ledger_state.value}"
                for view in healthy
                if view.ledger_state is not None and not view.ledger_trusted]
    reasons += extra_reasons
    return Readiness(True, bool(reasons), tuple(reasons))
