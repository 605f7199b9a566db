"""The cost band (``scheduler.cost.tie_band_s``, ``cost.py`` "The cost band"): replicas that see
slightly different loads — each has routed requests the others have not heard of yet — pick the
same worker for the same new prompt, where the least cost alone splits them; outside the band
the least cost still decides."""

from __future__ import annotations

import random
from array import array

from cortex.ledger.state import TargetState
from cortex.scheduling import (
    CostConfig,
    RequestFacts,
    Scheduler,
    WorkerView,
    events_chain,
)
from cortex.scheduling.cost import band_seed, tie_rank

BLOCK = 16
WORKERS = [f"w{i}" for i in range(8)]


def views(queued: dict[str, int]) -> list[WorkerView]:
    return [WorkerView(name, (i,), ledger_state=TargetState.READY,
                       queued_prefill_tokens=queued.get(name, 0))
            for i, name in enumerate(WORKERS)]


def decide(cost: CostConfig, request: RequestFacts, queued: dict[str, int],
           matched: dict[str, int] | None = None) -> str:
    return Scheduler(events_chain(random.Random(0), cost)).decide(
        request, views(queued), matched or {}).worker


def new_prompt(first: int) -> RequestFacts:
    return RequestFacts(array("Q", [first, first + 1, first + 2]), 3 * BLOCK, BLOCK)


def test_replicas_with_different_views_agree_within_the_band():
    base = {name: 100 * i for i, name in enumerate(WORKERS)}  # w0 cheapest, 10 ms apart
    split = agreed = 0
    for first in range(1, 201):
        request = new_prompt(first * 1000)
        # two replicas: each has sent 300 prefill tokens (30 ms) to its own pick, untold
        a = decide(CostConfig(), request, {**base, "w0": 300})
        b = decide(CostConfig(), request, base)
        split += a != b
        a = decide(CostConfig(tie_band_s=0.05), request, {**base, "w0": 300})
        b = decide(CostConfig(tie_band_s=0.05), request, base)
        agreed += a == b
    assert split == 200  # the least cost: w1 on one, w0 on the other, every time
    assert agreed >= 150  # the band: one worker, unless one view moves a worker across its edge


def test_the_band_picks_by_the_first_uncached_block_and_leaves_the_rest_to_cost():
    request = new_prompt(7)
    band = CostConfig(tie_band_s=0.05)
    inside = [name for i, name in enumerate(WORKERS) if i <= 4]  # 0..40 ms: within 50 ms
    expected = min(inside, key=lambda name: tie_rank(name, band_seed(request, 0)))
    queued = {name: 100 * i for i, name in enumerate(WORKERS)}
    assert decide(band, request, queued) == expected
    # a herd's next request: its first blocks cached on w7 (credited in flight), the rest new
    held = RequestFacts(array("Q", [7, 8, 9, 10]), 4 * BLOCK, BLOCK)
    assert band_seed(held, 2) == 9  # the first block no worker holds
    # far outside the band the least cost still wins: every other worker 1 s behind
    assert decide(band, request, {name: 10_000 for name in WORKERS[1:]}) == "w0"
