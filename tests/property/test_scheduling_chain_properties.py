"""Properties of the scheduler chain over random pools: it picks an open worker or says why not,
the mode matches the policy preconditions, and the predicted cache is the picked worker's hit."""

from __future__ import annotations

import random
from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from cortex.errors import NoWorkerAvailable
from cortex.ledger.state import TargetState
from cortex.scheduling import (
    Mode,
    RequestFacts,
    Role,
    Scheduler,
    Watermarks,
    WorkerView,
    events_chain,
    no_events_chain,
    worker_matches,
)

BLOCK = 16
MARKS = Watermarks(max_in_flight=8, max_queued_prefill_tokens=4000, max_engine_queue=4,
                   max_kv_usage_fraction=0.9)

views = st.builds(
    WorkerView,
    worker=st.just(""),
    healthy=st.booleans(),
    ledger_state=st.sampled_from([None, *TargetState]),
    role=st.sampled_from(list(Role)),
    in_flight=st.integers(0, 10),
    queued_prefill_tokens=st.integers(0, 5000),
    engine_queue=st.none() | st.integers(0, 5),
    kv_usage=st.none() | st.floats(0, 1),
    prefill_tokens_per_s=st.none() | st.floats(100, 1e5),
)


def named(pool: list[WorkerView]) -> list[WorkerView]:
    return [WorkerView(f"w{i}", (i,), *(getattr(v, f) for f in (
        "healthy", "ledger_state", "role", "in_flight", "queued_prefill_tokens", "engine_queue",
        "kv_usage", "prefill_tokens_per_s"))) for i, v in enumerate(pool)]


def is_open(view: WorkerView, role: Role) -> bool:
    return view.healthy and view.role.serves(role) and MARKS.above(view) is None


@settings(max_examples=300, deadline=None)
@given(pool=st.lists(views, max_size=10), hits=st.dictionaries(st.integers(0, 9),
       st.integers(1, 12)), blocks=st.integers(0, 12), role=st.sampled_from(list(Role)),
       seed=st.integers(0, 2**32 - 1), events=st.booleans())
def test_chain_picks_an_open_worker_with_a_consistent_mode(pool, hits, blocks, role, seed,
                                                           events):
    pool = named(pool)
    request = RequestFacts(array("Q", range(blocks)), blocks * BLOCK + 3, BLOCK)
    matched = worker_matches({t: min(b, blocks) for t, b in hits.items() if blocks}, pool)
    chain = events_chain(random.Random(seed)) if events else no_events_chain()
    scheduler = Scheduler(chain, MARKS)
    open_ids = {v.worker for v in pool if is_open(v, role)}
    try:
        decision = scheduler.decide(request, pool, matched, role)
    except NoWorkerAvailable:
        assert not open_ids
        return
    assert decision.worker in open_ids
    open_hits = {w for w in matched if w in open_ids}
    if decision.mode is Mode.EXACT_KV_EVENTS:
        assert open_hits
        assert decision.predicted_cached_tokens == matched.get(decision.worker, 0) * BLOCK
    else:
        assert decision.predicted_cached_tokens == 0
        if events:
            assert not open_hits
    if decision.mode is Mode.LOAD_AWARE:
        assert all(v.ledger_trusted for v in pool if v.worker in open_ids)
    if not events:
        assert decision.mode in (Mode.CONSISTENT_HASH, Mode.FALLBACK_ROUND_ROBIN)
        assert (decision.mode is Mode.FALLBACK_ROUND_ROBIN) == (blocks == 0)
