"""``exact_kv``: a trusted ledger says some open worker holds the request's first blocks.

Rules:

* Applies when at least one open worker has a hit in ``matched`` (trusted ledgers only).
* Considers every open worker within the bounded-load cap (``cost.BoundedLoad``): the cheapest by
  cost (ties by the request's tie order, ``cost.tie_before``), and the one with the longest hit
  (ties to the cheaper, then by the tie order). The longest hit wins if it costs at most
  ``affinity_tolerance_s`` more than the cheapest plus the recompute charge
  (``recompute_weight`` × the tokens the cheapest would recompute ÷ its prefill rate, at most
  ``recompute_charge_max_s``; linear form: neither, the score already weighs the hit);
  otherwise the cheapest does — a cache holder buried in queued work loses to an idle worker.
* Herding guard: the cap and the cost read pending work counted at decision time, so a prefix
  every request shares (a system prompt cached on one worker) cannot pull a burst onto that
  worker: once it is a tolerance's worth of TTFT or a cap's worth of requests ahead, the burst
  moves on. A session's repeat turn (the longest hit, its own history) stays on its worker while
  that worker is under its watermarks, the cap, and the tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from cortex.scheduling.cost import (
    BoundedLoad,
    CostConfig,
    LoadSeconds,
    band_seed,
    cost,
    in_band,
    kv_overflow,
    tie_before,
    tie_seed,
)
from cortex.scheduling.decision import Decision, Mode
from cortex.scheduling.view import RequestFacts, WorkerView


class ExactKv:
    name = "exact_kv"

    def __init__(
        self, cost: CostConfig | None = None, bounds: BoundedLoad = BoundedLoad()
    ) -> None:
        self.cost = cost or CostConfig()
        self.bounds = bounds
        ttft = self.cost.form == "ttft"
        self.tolerance_s = self.cost.affinity_tolerance_s if ttft else 0.0
        self.recompute_weight = self.cost.recompute_weight if ttft else 0.0
        self.recompute_max_s = self.cost.recompute_charge_max_s
        self.band_s = self.cost.tie_band_s if ttft else 0.0
        self.loads = LoadSeconds(self.cost)

    def decide(
        self, request: RequestFacts, workers: Sequence[WorkerView], matched: Mapping[str, int]
    ) -> Decision | None:
        if not matched:
            return None
        cap = self.bounds.cap(workers)
        config, get = self.cost, matched.get
        token_count, block_size = request.token_count, request.block_size
        linear = config.form == "linear"
        loads = self.loads
        memo_get = loads.memo.get
        overflow_weight = config.kv_overflow_weight
        cheap: WorkerView | None = None
        cheap_cost, cheap_blocks, cheap_s_per_token = math.inf, 0, 0.0
        long: WorkerView | None = None
        long_cost, long_blocks = math.inf, 0
        any_hit = False
        seed = tie_seed(request)
        band = self.band_s
        costs: list[tuple[WorkerView, float, int]] = []
        longest = 0
        for view in workers:  # runs per decision: the cost's request-independent part memoized
            blocks = get(view.worker, 0)
            if blocks:
                any_hit = True
                if blocks > longest:
                    longest = blocks
            if view.in_flight + 1 > cap:
                continue
            if linear:
                value, s_per_token = cost(config, view, 0, blocks, token_count), 0.0
            else:
                entry = memo_get(id(view))
                if entry is None or entry[0] is not view:
                    entry = loads.prepare(view)
                uncached = token_count - blocks * block_size
                if uncached < 0:
                    uncached = 0
                s_per_token = entry[2]
                value = entry[1] + uncached * s_per_token
                if entry[3] < token_count:  # short of KV room: the KV-pressure charge
                    over = kv_overflow(token_count, uncached, entry[3])
                    if over > 0:
                        value += overflow_weight * over * s_per_token
            if band:
                costs.append((view, value, blocks))
            if value < cheap_cost or (value == cheap_cost and cheap is not None
                                      and tie_before(view.worker, cheap.worker, seed)):
                cheap, cheap_cost, cheap_blocks = view, value, blocks
                cheap_s_per_token = s_per_token
            if blocks and (blocks > long_blocks or blocks == long_blocks and (
                    value < long_cost or value == long_cost
                    and tie_before(view.worker, long.worker, seed))):
                long, long_cost, long_blocks = view, value, blocks
        if not any_hit:
            return None
        if cheap is None:  # unreachable: some worker is at or below the mean
            raise AssertionError("bounded-load cap excluded every worker")
        picked = None
        if band:  # where the request goes if the cheapest wins (cost.py, "The cost band")
            view, _, blocks = in_band(costs, cheap_cost + band, band_seed(request, longest))
            picked = (view.worker, blocks)
        return exact_verdict(
            request, self.tolerance_s, self.recompute_weight, cheap.worker, cheap_cost,
            cheap_blocks, cheap_s_per_token, None if long is None else long.worker, long_cost,
            long_blocks, self.recompute_max_s, picked)


def exact_verdict(
    request: RequestFacts,
    tolerance_s: float,
    recompute_weight: float,
    cheap: str,
    cheap_cost: float,
    cheap_blocks: int,
    cheap_s_per_token: float,
    long: str | None,
    long_cost: float,
    long_blocks: int,
    recompute_max_s: float = math.inf,
    band: tuple[str, int] | None = None,
) -> Decision:
    """The decision between the cheapest open worker and the one with the longest hit.

    ``band``: the cost band's pick (worker, its blocks): where the request goes when the
    cheapest wins (the longest hit is still weighed against the least cost itself).

    Shared by ``ExactKv.decide`` and the compiled fast path (``scheduling.fast``), which find
    the candidates the same way.
    """
    of, block_size = len(request.keys), request.block_size
    why = ""  # why the cheapest won over a longer hit
    if long is not None and long_blocks > cheap_blocks:
        extra = long_cost - cheap_cost
        recompute_s = min(recompute_weight * (
            request.uncached_tokens(cheap_blocks) - request.uncached_tokens(long_blocks)
        ) * cheap_s_per_token, recompute_max_s)
        if extra <= tolerance_s + recompute_s:
            return Decision(long, Mode.EXACT_KV_EVENTS,
                            f"longest hit: {long_blocks} of {of} blocks on {long}",
                            long_blocks * block_size)
        why = (f"; the longest hit ({long_blocks} on {long}) would cost {extra:.3f} s more "
               f"(allowed {tolerance_s + recompute_s:.3f} s)")
    if band is not None:
        worker, blocks = band
        return Decision(worker, Mode.EXACT_KV_EVENTS,
                        f"{blocks} of {of} blocks cached on {worker}, in the cost band of the "
                        f"least ({cheap}){why}", blocks * block_size)
    if why:
        return Decision(cheap, Mode.EXACT_KV_EVENTS,
                        f"{cheap_blocks} of {of} blocks cached on {cheap}{why}",
                        cheap_blocks * block_size)
    if not cheap_blocks:
        return Decision(cheap, Mode.EXACT_KV_EVENTS,
                        f"no hit on {cheap} but every holder is above the load cap", 0)
    return Decision(cheap, Mode.EXACT_KV_EVENTS,
                    f"{cheap_blocks} of {of} blocks cached on {cheap}, least cost",
                    cheap_blocks * block_size)
