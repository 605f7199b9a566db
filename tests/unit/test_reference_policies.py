"""The peers' reference routers (perf/reference_policies.py): each one's documented scoring on
hand-made views and ledger matches."""

from __future__ import annotations

import random
from array import array

import pytest

from cortex.ledger.state import TargetState
from cortex.scheduling import Mode, RequestFacts, WorkerView
from perf.reference_policies import REFERENCE_POLICIES, DynamoKvRouter, LlmdPrecisePrefix

BLOCK = 16


def request(keys: list[int], tail: int = 0) -> RequestFacts:
    """A prompt of ``len(keys)`` full blocks and ``tail`` tokens more."""
    return RequestFacts(array("Q", keys), len(keys) * BLOCK + tail, BLOCK)


def view(name: str, *, in_flight: int = 0, queued: int = 0, queue: int | None = None,
         kv: float | None = None) -> WorkerView:
    return WorkerView(name, (1,), True, TargetState.READY, in_flight=in_flight,
                      queued_prefill_tokens=queued, engine_queue=queue, kv_usage=kv)


def test_both_are_registered_under_the_replays_router_names():
    assert set(REFERENCE_POLICIES) == {"dynamo-ref", "llmd-ref"}
    for name, factory in REFERENCE_POLICIES.items():
        assert factory(random.Random(0)).name == name


# -- Dynamo ------------------------------------------------------------------------------------

def test_dynamo_cost_is_prefill_blocks_plus_decode_blocks():
    """cost = weight × (queued prefill + uncached prompt) / block + (active + new) blocks."""
    policy = DynamoKvRouter(random.Random(0))
    eight = request(list(range(1, 9)))  # 8 blocks
    w1 = view("w1", queued=2 * BLOCK)  # 2 cached: (2 + 6) prefill blocks + 8 decode
    w2 = view("w2")  # 5 cached: 3 + 8
    w3 = view("w3", queued=10 * BLOCK)  # all 8 cached: 10 + 0, + 8
    matched = {"w1": 2, "w2": 5, "w3": 8}
    assert [policy.cost(eight, v, matched[v.worker]) for v in (w1, w2, w3)] == [16, 11, 18]
    decision = policy.decide(eight, [w1, w2, w3], matched)
    assert decision.worker == "w2"
    assert decision.mode is Mode.EXACT_KV_EVENTS
    assert decision.predicted_cached_tokens == 5 * BLOCK


def test_dynamo_prefill_blocks_are_fractional_and_weighted():
    policy = DynamoKvRouter(random.Random(0), overlap_score_weight=2.0)
    three_and_a_bit = request([1, 2, 3], tail=4)  # 52 tokens: 4 blocks with the tail
    assert policy.cost(three_and_a_bit, view("a", queued=8), 1) == 2.0 * (8 + 36) / BLOCK + 4


def test_dynamo_without_overlap_weight_is_pure_load_balance_ties_at_random():
    policy = DynamoKvRouter(random.Random(3), overlap_score_weight=0.0)
    picks = set()
    for _ in range(40):
        workers = [view("a"), view("b")]  # never in flight: the records are forgotten
        picks.add(policy.decide(request([1, 2]), workers, {"a": 2}).worker)
    assert picks == {"a", "b"}


def test_dynamo_counts_active_blocks_once_per_worker_and_only_new_ones():
    """assume_kv_reuse: a block shared by two active requests on a worker counts once, and a
    request adds only its blocks not already active there (its partial tail always)."""
    policy = DynamoKvRouter(random.Random(0))
    first = request([1, 2, 3, 4])
    assert policy.decide(first, [view("a")], {}).worker == "a"
    assert policy.active_blocks("a") == 4
    second = request([1, 2, 3, 9], tail=5)  # 5 blocks, 3 shared with the first
    assert policy.cost(second, view("a", in_flight=1), 0) == 69 / BLOCK + 4 + 5 - 3
    assert policy.cost(second, view("b"), 0) == 69 / BLOCK + 5
    policy.decide(second, [view("a", in_flight=1)], {})
    assert policy.active_blocks("a") == 6  # 1-4, 9 and the tail


def test_dynamo_forgets_the_oldest_requests_once_a_worker_has_fewer_in_flight():
    policy = DynamoKvRouter(random.Random(0))
    policy.decide(request([1, 2, 3, 4]), [view("a")], {})
    policy.decide(request([7, 8]), [view("a", in_flight=1)], {})
    assert policy.active_blocks("a") == 6
    # one finished: the first routed is taken to be it, its blocks are freed
    policy.decide(request([5]), [view("a", in_flight=1), view("b", queued=10 * BLOCK)], {})
    assert policy.active_blocks("a") == 2 + 1
    policy.decide(request([5]), [view("a", in_flight=0), view("b", queued=10 * BLOCK)], {})
    assert policy.active_blocks("a") == 1


def test_dynamo_trades_cached_blocks_for_load():
    """A worker holding the prefix loses once its queued prefill outweighs the hit."""
    policy = DynamoKvRouter(random.Random(0))
    prompt = request(list(range(1, 11)))  # 10 blocks
    holder, idle = view("holder", queued=9 * BLOCK), view("idle")
    assert policy.decide(prompt, [holder, idle], {"holder": 10}).worker == "holder"  # 9 < 10
    holder = view("holder", queued=11 * BLOCK)
    decision = policy.decide(prompt, [holder, idle], {"holder": 10})
    assert decision.worker == "idle"
    assert decision.mode is Mode.LOAD_AWARE and decision.predicted_cached_tokens == 0


# -- llm-d -------------------------------------------------------------------------------------

def test_llmd_prefix_score_is_min_max_over_the_pods_holding_blocks():
    policy = LlmdPrecisePrefix(random.Random(0))
    workers = [view("a"), view("b"), view("c")]
    prompt = request(list(range(1, 13)))
    assert policy.prefix_scores(prompt, workers, {"a": 10, "b": 2}) == [1.0, 0.0, 0.0]
    assert policy.prefix_scores(prompt, workers, {"a": 10, "b": 6, "c": 2}) == [1.0, 0.5, 0.0]
    assert policy.prefix_scores(prompt, workers, {"b": 3}) == [0.0, 1.0, 0.0]
    assert policy.prefix_scores(prompt, workers, {"a": 3, "c": 3}) == [1.0, 0.0, 1.0]
    assert policy.prefix_scores(prompt, workers, {}) == [0.0, 0.0, 0.0]


def test_llmd_prefix_score_as_the_guides_fraction():
    policy = LlmdPrecisePrefix(random.Random(0), prefix_form="fraction")
    prompt = request(list(range(1, 9)))
    assert policy.prefix_scores(prompt, [view("a"), view("b")], {"a": 2}) == [0.25, 0.0]
    with pytest.raises(ValueError):
        LlmdPrecisePrefix(random.Random(0), prefix_form="ratio")  # type: ignore[arg-type]


def test_llmd_queue_score_is_min_max_normalised_and_kv_score_is_one_minus_usage():
    workers = [view("a", queue=0, kv=0.25), view("b", queue=2, kv=None), view("c", queue=4,
                                                                            kv=1.0)]
    assert LlmdPrecisePrefix.queue_scores(workers) == [1.0, 0.5, 0.0]
    assert LlmdPrecisePrefix.kv_scores(workers) == [0.75, 1.0, 0.0]
    same = [view("a", queue=3), view("b", queue=3)]
    assert LlmdPrecisePrefix.queue_scores(same) == [1.0, 1.0]
    assert LlmdPrecisePrefix.queue_scores([view("a"), view("b", queue=2)]) == [1.0, 0.0]


def test_llmd_picks_the_highest_weighted_sum():
    """2 × prefix + 1 × kv + 1 × queue (the guide's weights)."""
    policy = LlmdPrecisePrefix(random.Random(0))
    prompt = request(list(range(1, 9)))
    holder = view("holder", queue=4, kv=0.9)  # 2 + 0.1 + 0
    idle = view("idle", queue=0, kv=0.0)  # 0 + 1 + 1
    assert policy.scores(prompt, [holder, idle], {"holder": 8}) == pytest.approx([2.1, 2.0])
    decision = policy.decide(prompt, [holder, idle], {"holder": 8})
    assert decision.worker == "holder"
    assert decision.mode is Mode.EXACT_KV_EVENTS
    assert decision.predicted_cached_tokens == 8 * BLOCK
    # the guide's earlier 3 / 2 / 2: the same hit no longer outweighs a full queue and cache
    earlier = LlmdPrecisePrefix(random.Random(0), prefix_weight=3.0, kv_weight=2.0,
                                queue_weight=2.0)
    holder = view("holder", queue=4, kv=1.0)  # 3 + 0 + 0 < 0 + 2 + 2
    assert earlier.decide(prompt, [holder, idle], {"holder": 8}).worker == "idle"


def test_llmd_breaks_ties_at_random():
    policy = LlmdPrecisePrefix(random.Random(5))
    picks = {policy.decide(request([1]), [view("a"), view("b"), view("c")], {}).worker
             for _ in range(60)}
    assert picks == {"a", "b", "c"}
