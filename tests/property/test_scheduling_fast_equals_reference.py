"""The compiled fast path decides exactly as the Python reference chain does.

Random pools (health, roles, ledger states, DP ranks, loads, engine figures, rates), random
ledger answers and requests, several decisions in a row while some views change between them
(the table re-reads only changed views) — every decision, and every "no worker" error, equal.
"""

from __future__ import annotations

import random
from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from cortex.errors import NoWorkerAvailable
from cortex.ledger.state import TargetState
from cortex.scheduling import (
    BoundedLoad,
    CostConfig,
    RequestFacts,
    Role,
    Scheduler,
    Watermarks,
    WorkerView,
    events_chain,
    worker_matches,
)
from cortex.scheduling.cost import tie_before, tie_seed
from cortex.scheduling.fast import FastScheduler

BLOCK = 16
MARKS = Watermarks(max_in_flight=8, max_queued_prefill_tokens=4000, max_engine_queue=4,
                   max_kv_usage_fraction=0.9)

figures = st.fixed_dictionaries({
    "healthy": st.booleans() | st.just(True),
    "ledger_state": st.sampled_from([None, *TargetState, TargetState.READY]),
    "role": st.sampled_from(list(Role)),
    "in_flight": st.integers(0, 10),
    "queued_prefill_tokens": st.integers(0, 5000),
    "engine_queue": st.none() | st.integers(0, 5),
    "kv_usage": st.none() | st.floats(0, 1),
    "prefill_tokens_per_s": st.none() | st.sampled_from([500.0, 1000.0, 3333.3, 1e4]),
    # a pool from smaller than one prompt to larger than the queued work: the KV-pressure term
    "kv_tokens": st.none() | st.integers(0, 6000),
})
# Idle, trusted, open workers cost the same: ties, which the request's tie order decides.
idle = st.fixed_dictionaries({"ledger_state": st.just(TargetState.READY)})


def pool_of(names: list[str], ranks: list[int], rows: list[dict]) -> tuple[WorkerView, ...]:
    views, target = [], 0
    for name, dp, row in zip(names, ranks, rows):
        views.append(WorkerView(name, tuple(range(target, target + dp)), **row))
        target += dp
    return tuple(views)


@st.composite
def scenarios(draw):
    size = draw(st.integers(1, 9))
    names = draw(st.lists(st.text("abcw", min_size=1, max_size=3), min_size=size,
                          max_size=size, unique=True))
    ranks = draw(st.lists(st.integers(1, 3), min_size=size, max_size=size))
    targets = sum(ranks)
    rounds = []
    rows = draw(st.lists(figures | idle, min_size=size, max_size=size))
    for _ in range(draw(st.integers(1, 4))):
        changed = draw(st.dictionaries(st.integers(0, size - 1), figures | idle, max_size=size))
        rows = [changed.get(i, row) for i, row in enumerate(rows)]
        hits = draw(st.dictionaries(st.integers(0, targets - 1), st.integers(1, 12)))
        blocks = draw(st.integers(0, 12))
        keys = array("Q", [*range(blocks - 1), draw(st.integers(0, 2**64 - 1))][:blocks])
        tokens = blocks * BLOCK + draw(st.integers(0, BLOCK - 1))
        role = draw(st.sampled_from(list(Role)))
        rounds.append((rows, hits, keys, tokens, role))
    return names, ranks, rounds


def outcome(decide):
    try:
        return decide()
    except NoWorkerAvailable as error:
        return ("error", str(error))


@settings(max_examples=400, deadline=None)
@given(scenario=scenarios(), seed=st.integers(0, 2**32 - 1),
       cost=st.sampled_from([CostConfig(), CostConfig(affinity_tolerance_s=0.0),
                             CostConfig(affinity_tolerance_s=10.0),
                             CostConfig(recompute_weight=0.0), CostConfig(recompute_weight=3.0),
                             CostConfig(form="linear"),
                             CostConfig(step_s=0.006, step_token_budget=512,
                                        decode_s_per_in_flight=1e-4),
                             CostConfig(step_s=0.1, step_token_budget=16,
                                        engine_queue_s_per_request=0.02),
                             CostConfig(kv_overflow_weight=0.0),
                             CostConfig(kv_overflow_weight=3.5, step_s=0.006,
                                        step_token_budget=512),
                             CostConfig(tie_band_s=0.05), CostConfig(tie_band_s=2.0),
                             CostConfig(tie_band_s=0.3, step_s=0.006, step_token_budget=512),
                             CostConfig(tie_band_s=0.3, form="linear")]),
       bounds=st.sampled_from([BoundedLoad(), BoundedLoad(None), BoundedLoad(1.0, 0),
                               BoundedLoad(2.0, 1)]))
def test_fast_path_decides_as_the_reference_chain(scenario, seed, cost, bounds):
    names, ranks, rounds = scenario
    reference = Scheduler(events_chain(random.Random(seed), cost, bounds), MARKS)
    fast = FastScheduler(random.Random(seed), cost, MARKS, bounds)
    for rows, hits, keys, tokens, role in rounds:
        views = pool_of(names, ranks, rows)
        request = RequestFacts(keys, tokens, BLOCK)
        expected = outcome(lambda: reference.decide(
            request, views, worker_matches(hits, views), role))
        assert outcome(lambda: fast.decide(request, views, dict(hits), role)) == expected


def test_unchanged_views_are_not_reread_but_a_new_view_is():
    views = tuple(WorkerView(f"w{i}", (i,), ledger_state=TargetState.READY) for i in range(3))
    fast = FastScheduler(random.Random(0))
    request = RequestFacts(array("Q", range(4)), 64, BLOCK)
    assert fast.decide(request, views, {1: 4}).worker == "w1"
    busier = (views[0], WorkerView("w1", (1,), ledger_state=TargetState.READY,
                                   queued_prefill_tokens=1_000_000), views[2])
    # w1 is now far behind: the cheapest worker wins over the hit (tolerance 0.25 s); w0 and
    # w2 tie, the request's tie order decides
    first = "w0" if tie_before("w0", "w2", tie_seed(request)) else "w2"
    assert fast.decide(request, busier, {1: 4}).worker == first
    renamed = (WorkerView("x", (0,), ledger_state=TargetState.READY), *views[1:])
    assert fast.decide(request, renamed, {0: 2}).worker == "x"


def test_the_recompute_charge_uses_the_cheaper_workers_own_rate():
    """w1 is cheaper but slow (500 tokens/s): recomputing the 8 blocks w0 holds would cost it
    0.256 s, which at weight 10 keeps the request on w0 although w0 costs 0.4 s more (0.656 s
    of queue against w1's 0.256 s; tolerance 0.25 s; at the default rate the charge would be
    0.013 s)."""
    cost = CostConfig(recompute_weight=10.0)
    views = (WorkerView("w0", (0,), ledger_state=TargetState.READY,
                        queued_prefill_tokens=3280, prefill_tokens_per_s=5000.0),
             WorkerView("w1", (1,), ledger_state=TargetState.READY, prefill_tokens_per_s=500.0))
    request = RequestFacts(array("Q", range(12)), 12 * BLOCK, BLOCK)
    reference = Scheduler(events_chain(random.Random(0), cost), MARKS)
    expected = reference.decide(request, views, worker_matches({0: 12, 1: 4}, views))
    assert expected.worker == "w0"
    assert FastScheduler(random.Random(0), cost, watermarks=MARKS).decide(
        request, views, {0: 12, 1: 4}) == expected
