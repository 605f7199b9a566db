"""The fixed fallback order, and the one entry point the request path calls.

Rules:

* Eligible workers are healthy and serve the wanted role; open workers are eligible ones below
  every watermark (``watermark.Watermarks``). No eligible worker, or none open, raises
  ``NoWorkerAvailable`` (HTTP 503) with the reason.
* Policies are asked in order; the first that returns a ``Decision`` decides. The order is fixed
  by the chain builders: ``events_chain`` = exact_kv → load_aware → p2c → round_robin, for
  engines publishing KV events; ``no_events_chain`` = consistent_hash → round_robin.
* ``matched`` comes from the caller (``matches.worker_matches`` over ``LedgerBook.match``), so
  the scheduler stays pure; hits of workers that are not open are ignored.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

from cortex.errors import NoWorkerAvailable
from cortex.scheduling.consistent_hash import ConsistentHash
from cortex.scheduling.cost import BoundedLoad, CostConfig
from cortex.scheduling.decision import Decision
from cortex.scheduling.exact_kv import ExactKv
from cortex.scheduling.load_aware import LoadAware
from cortex.scheduling.p2c import PowerOfTwo
from cortex.scheduling.policy import Policy
from cortex.scheduling.round_robin import RoundRobin
from cortex.scheduling.view import RequestFacts, Role, WorkerView
from cortex.scheduling.watermark import Watermarks


def events_chain(
    rng: random.Random, cost: CostConfig | None = None, bounds: BoundedLoad = BoundedLoad()
) -> tuple[Policy, ...]:
    cost = cost or CostConfig()
    return (ExactKv(cost, bounds), LoadAware(cost, bounds), PowerOfTwo(rng, cost), RoundRobin())


def no_events_chain() -> tuple[Policy, ...]:
    return (ConsistentHash(), RoundRobin())


class Scheduler:
    def __init__(self, policies: Sequence[Policy], watermarks: Watermarks | None = None) -> None:
        if not policies:
            raise ValueError("a scheduler needs at least one policy")
        self.policies = tuple(policies)
        self.watermarks = watermarks or Watermarks()
        marks, inf = self.watermarks, math.inf
        self._limits = tuple(inf if limit is None else limit for limit in (
            marks.max_in_flight, marks.max_queued_prefill_tokens, marks.max_engine_queue,
            marks.max_kv_usage_fraction))

    def decide(
        self,
        request: RequestFacts,
        workers: Sequence[WorkerView],
        matched: Mapping[str, int],
        role: Role = Role.BOTH,
        first_policy: int = 0,
    ) -> Decision:
        """The first decision of ``policies[first_policy:]`` over the open workers (a caller
        that has proven the earlier policies decline may skip them)."""
        marks = self.watermarks
        max_in_flight, max_queued, max_engine_queue, max_kv = self._limits
        both = Role.BOTH
        open_workers = []
        eligible = 0
        last_block = ""
        for view in workers:  # the watermark checks inlined: this loop runs per decision
            if not view.healthy or (view.role is not both and view.role is not role):
                continue
            eligible += 1
            engine_queue, kv_usage = view.engine_queue, view.kv_usage
            if (view.in_flight >= max_in_flight or view.queued_prefill_tokens >= max_queued
                    or (engine_queue is not None and engine_queue >= max_engine_queue)
                    or (kv_usage is not None and kv_usage >= max_kv)):
                last_block = f"{view.worker}: {marks.above(view)}"
            else:
                open_workers.append(view)
        if not open_workers:
            if not eligible:
                raise NoWorkerAvailable(f"no healthy worker serves role {role.value}")
            raise NoWorkerAvailable(f"all {eligible} workers above a watermark ({last_block})",
                                    saturated=True)
        if matched and len(open_workers) != len(workers):
            open_ids = {view.worker for view in open_workers}
            matched = {w: blocks for w, blocks in matched.items() if w in open_ids}
        for policy in self.policies[first_policy:]:
            decision = policy.decide(request, open_workers, matched)
            if decision is not None:
                return decision
        raise NoWorkerAvailable(f"no policy of {[p.name for p in self.policies]} could decide")
