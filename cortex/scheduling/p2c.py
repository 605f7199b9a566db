"""``p2c``: the ledger cannot be fully trusted but some load is known — power of two choices.

Rules: applies when some open worker has a load figure (Cortex's own pending work, or a queue
or KV-cache usage its engine reports). Draws two distinct open workers with the injected RNG
(one when only one is open) and takes the one of lesser cost with nothing cached; ties follow
the request's tie order (``cost.tie_before``). Exactly one ``rng.sample`` call per decision, so
tests can predict picks.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from cortex.scheduling.cost import CostConfig, cheapest
from cortex.scheduling.decision import Decision, Mode
from cortex.scheduling.view import RequestFacts, WorkerView


def knows_load(view: WorkerView) -> bool:
    return view.reports_load or view.in_flight > 0 or view.queued_prefill_tokens > 0


class PowerOfTwo:
    name = "p2c"

    def __init__(self, rng: random.Random, cost: CostConfig | None = None) -> None:
        self.rng = rng
        self.cost = cost or CostConfig()

    def decide(
        self, request: RequestFacts, workers: Sequence[WorkerView], matched: Mapping[str, int]
    ) -> Decision | None:
        if not any(knows_load(view) for view in workers):
            return None
        if len(workers) == 1:
            drawn = list(workers)
        else:
            drawn = [workers[i] for i in self.rng.sample(range(len(workers)), 2)]
        found = cheapest(self.cost, request, drawn, {})
        assert found is not None
        view = found[0]
        names = " and ".join(d.worker for d in drawn)
        return Decision(view.worker, Mode.FALLBACK_P2C,
                        f"ledger not trusted everywhere; drew {names}, {view.worker} less loaded")
