"""``load_aware``: every open worker's ledger is trusted and none holds the request's prefix.

Rules: applies only when no open worker has a hit and every open worker's ledger is READY (so
"no hit" is a fact, not a blind spot). Picks the least cost (the request is uncached
everywhere, so this is the least pending work), within the bounded-load cap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cortex.scheduling.cost import BoundedLoad, CostConfig, cheapest
from cortex.scheduling.decision import Decision, Mode
from cortex.scheduling.view import RequestFacts, WorkerView


class LoadAware:
    name = "load_aware"

    def __init__(
        self, cost: CostConfig | None = None, bounds: BoundedLoad = BoundedLoad()
    ) -> None:
        self.cost = cost or CostConfig()
        self.bounds = bounds

    def decide(
        self, request: RequestFacts, workers: Sequence[WorkerView], matched: Mapping[str, int]
    ) -> Decision | None:
        if any(view.worker in matched for view in workers):
            return None
        if not all(view.ledger_trusted for view in workers):
            return None
        found = cheapest(self.cost, request, workers, {},
                         self.bounds.cap(workers))
        if found is None:  # unreachable: some worker is at or below the mean
            found = cheapest(self.cost, request, workers, {})
            assert found is not None
        return load_aware_verdict(found[0].worker)


def load_aware_verdict(worker: str) -> Decision:
    """Shared by ``LoadAware.decide`` and the compiled fast path (``scheduling.fast``)."""
    return Decision(worker, Mode.LOAD_AWARE,
                    f"no worker holds the prefix; {worker} has the least pending work")
