"""The events chain's scheduler with its common cases compiled (``cortex._fast.score``).

``FastScheduler.decide(request, views, target_blocks, role)`` returns exactly what
``Scheduler(events_chain(rng, cost, bounds), watermarks).decide(request, views,
worker_matches(target_blocks, views), role)`` returns — the reference — but finds the
``exact_kv`` and ``load_aware`` candidates in C over columns synced from the views. Everything
else (no open worker, p2c, round robin, the linear cost form) goes to the reference chain, which
consumes the RNG exactly as it would have; when the compiled pass found that neither
``exact_kv`` nor ``load_aware`` applies, the chain starts at ``p2c``.

``views`` must be a tuple (``PendingWork.views()`` returns the same tuple object while nothing
changed, which makes syncing free).
"""

from __future__ import annotations

import random

from cortex._fast.score import DecisionTable
from cortex.ledger.state import TargetState
from cortex.scheduling.chain import Scheduler, events_chain
from cortex.scheduling.cost import BoundedLoad, CostConfig, tie_seed
from cortex.scheduling.decision import Decision
from cortex.scheduling.exact_kv import exact_verdict
from cortex.scheduling.load_aware import load_aware_verdict
from cortex.scheduling.matches import worker_matches
from cortex.scheduling.view import RequestFacts, Role, WorkerView
from cortex.scheduling.watermark import Watermarks


class FastScheduler:
    def __init__(
        self,
        rng: random.Random,
        cost: CostConfig | None = None,
        watermarks: Watermarks | None = None,
        bounds: BoundedLoad = BoundedLoad(),
    ) -> None:
        self.cost = cost or CostConfig()
        self.reference = Scheduler(events_chain(rng, self.cost, bounds), watermarks)
        # where the reference chain goes on once exact_kv and load_aware are ruled out
        self.after_load_aware = [p.name for p in self.reference.policies].index("p2c")
        self.compiled = self.cost.form == "ttft"
        self.tolerance_s = self.cost.affinity_tolerance_s
        self.recompute_weight = self.cost.recompute_weight
        self.recompute_max_s = self.cost.recompute_charge_max_s
        self.table = DecisionTable(
            ready_state=TargetState.READY,
            roles=(Role.BOTH, Role.PREFILL, Role.DECODE),
            default_rate=self.cost.default_prefill_tokens_per_s,
            decode_s=self.cost.decode_s_per_in_flight,
            engine_queue_s=self.cost.engine_queue_s_per_request,
            limits=self.reference._limits,
            factor=bounds.factor,
            slack=bounds.slack,
            step_s=self.cost.step_s,
            step_budget=self.cost.step_token_budget,
            overflow_weight=self.cost.kv_overflow_weight,
            band=self.cost.tie_band_s,
        )

    def decide(
        self,
        request: RequestFacts,
        views: tuple[WorkerView, ...],
        target_blocks: dict[int, int],
        role: Role = Role.BOTH,
    ) -> Decision:
        if self.compiled:
            found = self.table.pick(views, target_blocks, request.token_count,
                                    request.block_size, role, tie_seed(request), request.keys)
            verdict = found[0]
            if verdict == "exact":
                return exact_verdict(request, self.tolerance_s, self.recompute_weight,
                                     *found[1:8], self.recompute_max_s, found[8])
            if verdict == "load_aware":
                return load_aware_verdict(found[1])
            if verdict == "chain":  # no trusted hit on an open worker, not every ledger READY:
                # exact_kv and load_aware decline; p2c and round robin read no matches
                return self.reference.decide(request, views, {}, role, self.after_load_aware)
        return self.reference.decide(request, views, worker_matches(target_blocks, views), role)
