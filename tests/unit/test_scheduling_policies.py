"""Scheduler conformance: every policy on healthy/unhealthy/stale workers, watermarks, ties and
empty pools, with exact picks (RNG injected)."""

from __future__ import annotations

import math
import random
from array import array

import pytest

from cortex.errors import ConfigError, NoWorkerAvailable
from cortex.ledger.state import TargetState
from cortex.scheduling import (
    CostConfig,
    Decision,
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
from cortex.scheduling.consistent_hash import ConsistentHash
from cortex.scheduling.cost import BoundedLoad, cheapest, cost, kv_room, tie_before, tie_seed
from cortex.scheduling.exact_kv import ExactKv
from cortex.scheduling.load_aware import LoadAware
from cortex.scheduling.p2c import PowerOfTwo
from cortex.scheduling.round_robin import RoundRobin

READY, STALE, SYNCING, PARTIAL = (TargetState.READY, TargetState.STALE, TargetState.SYNCING,
                                  TargetState.PARTIAL)
BLOCK = 16


def request(blocks: int = 8, extra_tokens: int = 0) -> RequestFacts:
    keys = array("Q", range(1000, 1000 + blocks))
    return RequestFacts(keys, blocks * BLOCK + extra_tokens, BLOCK)


def worker(name: str, **kw) -> WorkerView:
    kw.setdefault("ledger_state", READY)
    kw.setdefault("targets", (int(name[1:]),))
    return WorkerView(name, **kw)


def pool(n: int, **kw) -> list[WorkerView]:
    return [worker(f"w{i}", **kw) for i in range(n)]


def first_in_tie_order(r: RequestFacts, *names: str) -> str:
    first = names[0]
    for name in names[1:]:
        if tie_before(name, first, tie_seed(r)):
            first = name
    return first


def events_scheduler(seed: int = 0, **kw) -> Scheduler:
    return Scheduler(events_chain(random.Random(seed)), Watermarks(**kw))


# ------------------------------------------------------------------ chain: the fallback order


def test_exact_kv_when_a_trusted_worker_holds_the_prefix():
    d = events_scheduler().decide(request(8), pool(4), {"w2": 6})
    assert d == Decision("w2", Mode.EXACT_KV_EVENTS, d.reason, 6 * BLOCK)
    assert "6 of 8 blocks cached on w2" in d.reason


def test_longest_hit_wins_on_equal_load():
    d = events_scheduler().decide(request(8), pool(4), {"w1": 2, "w3": 7, "w0": 7})
    tied = first_in_tie_order(request(8), "w0", "w3")
    assert (d.worker, d.predicted_cached_tokens) == (tied, 7 * BLOCK)


def test_load_aware_when_every_ledger_trusted_and_no_hit():
    workers = [worker("w0", queued_prefill_tokens=500), worker("w1", queued_prefill_tokens=100),
               worker("w2", queued_prefill_tokens=300)]
    d = events_scheduler().decide(request(), workers, {})
    assert (d.worker, d.mode, d.predicted_cached_tokens) == ("w1", Mode.LOAD_AWARE, 0)


def test_p2c_when_a_ledger_is_not_trusted_and_load_partly_known():
    workers = [worker("w0", ledger_state=STALE, in_flight=3), worker("w1", in_flight=1),
               worker("w2", ledger_state=None), worker("w3", engine_queue=0)]
    drawn = random.Random(7).sample(range(4), 2)
    d = events_scheduler(seed=7).decide(request(), workers, {})
    assert d.mode is Mode.FALLBACK_P2C
    expected = min((workers[i] for i in drawn), key=lambda v: (v.in_flight, v.worker)).worker
    assert d.worker == expected


def test_round_robin_when_only_liveness_is_known():
    workers = pool(3, ledger_state=None)
    scheduler = events_scheduler()
    picks = [scheduler.decide(request(), workers, {}) for _ in range(5)]
    assert [d.worker for d in picks] == ["w0", "w1", "w2", "w0", "w1"]
    assert {d.mode for d in picks} == {Mode.FALLBACK_ROUND_ROBIN}


def test_untrusted_hits_are_ignored_by_the_adapter():
    workers = [worker("w0", ledger_state=STALE), worker("w1", ledger_state=SYNCING),
               worker("w2", ledger_state=PARTIAL), worker("w3")]
    assert worker_matches({0: 5, 1: 5, 2: 5, 3: 2}, workers) == {"w3": 2}


def test_adapter_takes_a_workers_best_dp_rank_and_skips_unknown_targets():
    workers = [worker("w0", targets=(10, 11, 12)), worker("w1", targets=(20,))]
    assert worker_matches({11: 4, 12: 6, 99: 8}, workers) == {"w0": 6}
    assert worker_matches({}, workers) == {}


# ------------------------------------------------------------------ health, roles, empty pools


def test_empty_pool_raises_no_worker_available():
    with pytest.raises(NoWorkerAvailable) as raised:
        events_scheduler().decide(request(), [], {})
    assert raised.value.http_status == 503


def test_unhealthy_workers_are_never_picked_even_with_the_best_cache():
    workers = [worker("w0", healthy=False), worker("w1")]
    d = events_scheduler().decide(request(8), workers, {"w0": 8})
    assert d.worker == "w1"
    assert d.mode is Mode.LOAD_AWARE  # w0's hit is not an open worker's hit


def test_all_unhealthy_raises():
    with pytest.raises(NoWorkerAvailable, match="no healthy worker"):
        events_scheduler().decide(request(), pool(3, healthy=False), {})


def test_role_filter():
    workers = [worker("w0", role=Role.DECODE), worker("w1", role=Role.PREFILL),
               worker("w2", role=Role.BOTH)]
    s = events_scheduler()
    assert s.decide(request(), workers, {"w0": 8, "w2": 1}, role=Role.PREFILL).worker == "w2"
    assert s.decide(request(), workers, {"w0": 8}, role=Role.PREFILL).worker == "w1"
    assert s.decide(request(), workers[:2], {}, role=Role.DECODE).worker == "w0"
    assert s.decide(request(), workers, {}, role=Role.BOTH).worker == "w2"
    with pytest.raises(NoWorkerAvailable):
        s.decide(request(), workers[:1], {}, role=Role.PREFILL)


# ------------------------------------------------------------------ watermarks


@pytest.mark.parametrize("field,value", [("in_flight", 4), ("queued_prefill_tokens", 1000),
                                         ("engine_queue", 9), ("kv_usage", 0.97)])
def test_worker_above_a_watermark_is_skipped_even_with_the_best_cache(field, value):
    marks = {"max_in_flight": 4, "max_queued_prefill_tokens": 1000, "max_engine_queue": 9,
                 "max_kv_usage_fraction": 0.95}
    workers = [worker("w0", **{field: value}), worker("w1", engine_queue=0, kv_usage=0.1)]
    d = events_scheduler(**marks).decide(request(8), workers, {"w0": 8, "w1": 1})
    assert d.worker == "w1"
    assert d.mode is Mode.EXACT_KV_EVENTS


def test_all_above_watermark_raises_with_the_reason():
    with pytest.raises(NoWorkerAvailable, match="KV cache 99% used"):
        events_scheduler().decide(request(), pool(2, kv_usage=0.99), {})


def test_unknown_engine_figures_are_never_above():
    assert Watermarks().above(worker("w0", engine_queue=None, kv_usage=None)) is None
    assert Watermarks(max_in_flight=None).above(worker("w0", in_flight=10**6)) is None


def test_watermark_config_is_checked():
    with pytest.raises(ConfigError) as raised:
        Watermarks(max_in_flight=0, max_kv_usage_fraction=-1)
    assert len(raised.value.problems) == 2


# ------------------------------------------------------------------ cost


def test_ttft_cost_counts_queued_and_own_tokens_over_the_rate_and_decode_load():
    config = CostConfig(decode_s_per_in_flight=0.01, engine_queue_s_per_request=0.1)
    view = worker("w0", queued_prefill_tokens=3000, in_flight=2, prefill_tokens_per_s=1000.0)
    assert cost(config, view, 1000, 0) == pytest.approx(4.0 + 0.02)
    assert cost(config, worker("w0", engine_queue=3), 0, 0) == pytest.approx(0.3)
    slow = worker("w0", queued_prefill_tokens=10_000)
    assert cost(config, slow, 0, 0) == pytest.approx(1.0)  # default rate 10k tokens/s


def test_step_form_counts_the_engines_steps():
    """A batching engine with a 1,000-token step budget, 10 ms per step, 1 ms per decoding
    request per step, 100k prompt tokens/s within a step: 4 requests decoding leave 996 tokens
    of room, so 3,000 queued + 1,000 own tokens take 4,000 / 996 steps of 14 ms plus 40 ms of
    token compute, after the 14 ms step in progress."""
    config = CostConfig(step_token_budget=1000, step_s=0.01, decode_s_per_in_flight=0.001,
                        default_prefill_tokens_per_s=100_000.0)
    view = worker("w0", queued_prefill_tokens=3000, in_flight=4)
    assert cost(config, view, 1000, 0) == pytest.approx(0.014 + 4000 * (1e-5 + 0.014 / 996))
    # the decode batch slows every chunk of a long prompt, not only its first
    idle, busy = worker("w0"), worker("w0", in_flight=200)
    short = cost(config, busy, 100, 0) - cost(config, idle, 100, 0)
    long = cost(config, busy, 20_000, 0) - cost(config, idle, 20_000, 0)
    assert long > 10 * short
    # decodes never leave less than a quarter of the budget to prompts
    crowded = worker("w0", in_flight=5000)
    assert cost(config, crowded, 1000, 0) == pytest.approx(
        5.01 + 1000 * (1e-5 + 5.01 / 250))


def test_kv_pressure_charges_the_cached_tokens_the_pool_has_no_room_for():
    """A 10,000-token pool 70% used, 1,000 tokens of Cortex's prompts not yet at their first
    token: room for 2,000. A 2,500-token prompt with 2,400 cached there is charged its 500
    extra tokens at the worker's seconds per token (its hit may be evicted before it runs);
    with only 200 cached, those 200; with nothing cached, nothing (a wait, not a recompute)."""
    config = CostConfig(default_prefill_tokens_per_s=1000.0)
    view = worker("w0", kv_tokens=10_000, kv_usage=0.7, queued_prefill_tokens=1000)
    assert kv_room(config, view) == pytest.approx(2000)
    assert cost(config, view, 100, 150, 2500) == pytest.approx((1000 + 100 + 500) / 1000)
    assert cost(config, view, 2300, 12, 2500) == pytest.approx((1000 + 2300 + 200) / 1000)
    assert cost(config, view, 2500, 0, 2500) == pytest.approx((1000 + 2500) / 1000)
    assert cost(config, view, 100, 150, 1900) == pytest.approx((1000 + 100) / 1000)
    off = CostConfig(default_prefill_tokens_per_s=1000.0, kv_overflow_weight=0.0)
    assert cost(off, view, 100, 150, 2500) == pytest.approx(1.1)
    unknown = worker("w0", queued_prefill_tokens=1000)  # the engine never said its pool
    assert kv_room(config, unknown) == math.inf
    assert kv_room(config, worker("w0", kv_tokens=500)) == 500  # usage unknown: counted 0


def test_a_holder_whose_pool_is_full_loses_to_one_with_room():
    """The holder's running requests fill its pool: its cached blocks would be evicted before
    the request runs, so the worker with room (and a shorter hit) takes it."""
    config = CostConfig(default_prefill_tokens_per_s=10_000.0, affinity_tolerance_s=0.0)
    full = worker("w0", kv_tokens=4 * BLOCK * 8, kv_usage=0.95)
    roomy = worker("w1", kv_tokens=4 * BLOCK * 8, kv_usage=0.1)
    assert ExactKv(config).decide(request(8), [full, roomy], {"w0": 8, "w1": 4}).worker == "w1"
    assert ExactKv(CostConfig(default_prefill_tokens_per_s=10_000.0, affinity_tolerance_s=0.0,
                              kv_overflow_weight=0.0)).decide(
        request(8), [full, roomy], {"w0": 8, "w1": 4}).worker == "w0"


def test_linear_cost_is_the_seeds_score_negated():
    config = CostConfig(form="linear", alpha_per_cached_block=2, beta_per_in_flight=3,
                        gamma_per_queued_token=0.5)
    view = worker("w0", in_flight=1, queued_prefill_tokens=4)
    assert cost(config, view, 0, 5) == -(2 * 5 - 3 * 1 - 0.5 * 4)


def test_linear_form_through_the_chain():
    config = CostConfig(form="linear", alpha_per_cached_block=1, beta_per_in_flight=10,
                        gamma_per_queued_token=0)
    s = Scheduler(events_chain(random.Random(0), config))
    workers = [worker("w0", in_flight=1), worker("w1")]
    assert s.decide(request(8), workers, {"w0": 8}).worker == "w1"  # 8 - 10 < 0 - 0
    assert s.decide(request(8), [worker("w0"), worker("w1")], {"w0": 8}).worker == "w0"


def test_cost_config_is_checked():
    with pytest.raises(ConfigError) as raised:
        CostConfig(form="quadratic", default_prefill_tokens_per_s=0, decode_s_per_in_flight=-1)
    assert len(raised.value.problems) == 3


def test_a_buried_cache_holder_loses_to_an_idle_worker():
    workers = [worker("w0", queued_prefill_tokens=100_000), worker("w1")]
    d = events_scheduler().decide(request(8), workers, {"w0": 8})
    assert d.worker == "w1"
    assert d.mode is Mode.EXACT_KV_EVENTS
    assert d.predicted_cached_tokens == 0
    assert "would cost 9.987 s more" in d.reason


def test_longest_hit_wins_within_the_affinity_tolerance():
    config = CostConfig(decode_s_per_in_flight=0, affinity_tolerance_s=0.1, recompute_weight=0)
    # w0 holds 8 blocks (128 tokens) but has 1000 tokens queued: 0.1 s vs w1 holding 4 blocks
    # with nothing queued: 0.0064 s; extra 0.0936 s <= 0.1 → the longer history stays.
    workers = [worker("w0", queued_prefill_tokens=1000), worker("w1")]
    d = ExactKv(config).decide(request(8), workers, {"w0": 8, "w1": 4})
    assert (d.worker, d.predicted_cached_tokens) == ("w0", 8 * BLOCK)
    assert d.reason.startswith("longest hit")
    workers = [worker("w0", queued_prefill_tokens=1100), worker("w1")]
    d = ExactKv(config).decide(request(8), workers, {"w0": 8, "w1": 4})
    assert (d.worker, d.predicted_cached_tokens) == ("w1", 4 * BLOCK)


def test_moving_away_from_the_longest_hit_is_charged_the_recompute_again():
    """w1 would recompute the 4 blocks (64 tokens, 0.0064 s) w0 holds: with weight 1 the
    longest hit may cost 0.1 + 0.0064 s more than w1, with weight 2 0.1 + 0.0128 s."""
    def pick(queued: int, weight: float) -> str:
        config = CostConfig(decode_s_per_in_flight=0, affinity_tolerance_s=0.1,
                            recompute_weight=weight)
        workers = [worker("w0", queued_prefill_tokens=queued), worker("w1")]
        return ExactKv(config).decide(request(8), workers, {"w0": 8, "w1": 4}).worker

    assert pick(1100, 0) == "w1"  # extra 0.1036 s > 0.1
    assert pick(1100, 1) == "w0"  # 0.1036 <= 0.1064
    assert pick(1150, 1) == "w1"  # 0.1086 > 0.1064
    assert pick(1150, 2) == "w0"  # 0.1086 <= 0.1128
    def pick_default(queued: int) -> Decision:
        return ExactKv(CostConfig(decode_s_per_in_flight=0, affinity_tolerance_s=0.1)).decide(
            request(8), [worker("w0", queued_prefill_tokens=queued), worker("w1")],
            {"w0": 8, "w1": 4})

    # the default weight, 0: the tolerance alone
    assert pick_default(1000).worker == "w0"  # extra 0.0936 s <= 0.1
    d = pick_default(1100)  # extra 0.1036 s > 0.1
    assert d.worker == "w1" and "(allowed 0.100 s)" in d.reason


def test_holders_all_above_the_load_cap_send_the_request_elsewhere():
    workers = [worker("w0", in_flight=9), worker("w1"), worker("w2")]
    d = ExactKv().decide(request(8), workers, {"w0": 8})
    assert (d.worker, d.predicted_cached_tokens) == ("w1", 0)
    assert "above the load cap" in d.reason


def test_ties_follow_the_requests_tie_order_whatever_the_list_order():
    r = request()
    for workers in (pool(5), list(reversed(pool(5)))):
        assert cheapest(CostConfig(), r, workers, {})[0].worker == first_in_tie_order(
            r, *(f"w{i}" for i in range(5)))


def test_ties_at_idle_spread_new_prefixes_over_the_workers():
    """Idle workers all cost the same: new prefixes (different last block keys) must not all
    land on one worker, as they did when ties went to the smallest id."""
    picks: dict[str, int] = {}
    for last_key in range(2000):
        r = RequestFacts(array("Q", [7, 1_000_003 * last_key]), 2 * BLOCK, BLOCK)
        picked = events_scheduler().decide(r, pool(8), {}).worker
        picks[picked] = picks.get(picked, 0) + 1
    assert len(picks) == 8 and max(picks.values()) / (2000 / 8) < 1.2, picks
    same = RequestFacts(array("Q", [7, 42]), 2 * BLOCK, BLOCK)
    assert len({events_scheduler().decide(same, pool(8), {}).worker for _ in range(5)}) == 1


def test_full_hit_predicts_whole_blocks_and_uncached_never_negative():
    r = request(4, extra_tokens=5)
    d = events_scheduler().decide(r, pool(2), {"w1": 4})
    assert d.predicted_cached_tokens == 4 * BLOCK
    assert r.uncached_tokens(4) == 5 and r.uncached_tokens(9) == 0


# ------------------------------------------------------------------ bounded load (herding)


def test_load_cap_is_factor_times_mean_or_mean_plus_slack():
    assert BoundedLoad(1.25, 4).cap(pool(4, in_flight=25)) == 32  # ceil(1.25 × 25.25)
    assert BoundedLoad(1.25, 4).cap(pool(4)) == 0.25 + 4
    assert BoundedLoad(None, 4).cap(pool(4)) == float("inf")


def test_exact_kv_passes_over_a_holder_above_the_load_cap():
    workers = [worker("w0", in_flight=10), *pool(4)[1:]]
    d = ExactKv(CostConfig(decode_s_per_in_flight=0)).decide(request(8), workers, {"w0": 8})
    assert d.worker == first_in_tie_order(request(8), "w1", "w2", "w3")
    unbounded = ExactKv(CostConfig(decode_s_per_in_flight=0), BoundedLoad(factor=None))
    assert unbounded.decide(request(8), workers, {"w0": 8}).worker == "w0"


# ------------------------------------------------------------------ each policy on its own


def test_policies_decline_outside_their_precondition():
    workers = pool(2, ledger_state=None)
    assert ExactKv().decide(request(), workers, {}) is None
    assert LoadAware().decide(request(), workers, {}) is None  # ledgers not trusted
    assert LoadAware().decide(request(), pool(2), {"w0": 1}) is None  # a hit: exact_kv's case
    assert PowerOfTwo(random.Random(0)).decide(request(), workers, {}) is None  # nothing known
    assert ConsistentHash().decide(RequestFacts(array("Q"), 5, BLOCK), workers, {}) is None


def test_p2c_with_one_worker_does_not_draw():
    class NoDraws(random.Random):
        def sample(self, *a, **k):
            raise AssertionError("drew")

    d = PowerOfTwo(NoDraws()).decide(request(), [worker("w0", in_flight=1)], {})
    assert d.worker == "w0"


def test_p2c_picks_are_exact_for_a_seeded_rng():
    workers = [worker(f"w{i}", in_flight=i, ledger_state=None) for i in range(6)]
    policy, rng = PowerOfTwo(random.Random(42)), random.Random(42)
    for _ in range(20):
        i, j = rng.sample(range(6), 2)
        assert policy.decide(request(), workers, {}).worker == f"w{min(i, j)}"


def test_round_robin_cursor_wraps_over_a_changing_pool():
    rr = RoundRobin(start=4)
    assert rr.decide(request(), pool(3), {}).worker == "w1"
    assert rr.decide(request(), pool(2), {}).worker == "w1"


# ------------------------------------------------------------------ consistent hash


def test_consistent_hash_is_stable_and_uses_the_prefix_key():
    policy = ConsistentHash(prefix_blocks=2)
    workers = pool(8, ledger_state=None)
    first = policy.decide(request(8), workers, {})
    assert first.mode is Mode.CONSISTENT_HASH
    same_prefix = RequestFacts(array("Q", [1000, 1001, 7, 7]), 64, BLOCK)
    assert policy.decide(same_prefix, workers, {}).worker == first.worker
    assert policy.decide(request(8), list(reversed(workers)), {}).worker == first.worker


def test_consistent_hash_moves_only_the_keys_of_a_leaving_worker():
    policy = ConsistentHash(prefix_blocks=1)
    workers = pool(8, ledger_state=None)
    keys = [RequestFacts(array("Q", [k * 0x9E3779B97F4A7C15 % 2**64]), BLOCK, BLOCK)
            for k in range(1, 400)]
    before = [policy.decide(r, workers, {}).worker for r in keys]
    after = [policy.decide(r, workers[1:], {}).worker for r in keys]
    assert any(b == "w0" for b in before)
    assert all(a == b for a, b in zip(after, before) if b != "w0")
    assert len(set(before)) == 8


def test_consistent_hash_spills_clockwise_above_the_bounded_load():
    policy = ConsistentHash(prefix_blocks=1, load_factor=1.25)
    workers = pool(4, ledger_state=None)
    home = policy.decide(request(1), workers, {}).worker
    loaded = [WorkerView(v.worker, in_flight=8 if v.worker == home else 0) for v in workers]
    d = policy.decide(request(1), loaded, {})
    assert d.worker != home
    assert "spilled" in d.reason


def test_no_events_chain_routes_by_ring_then_round_robin_for_tiny_prompts():
    s = Scheduler(no_events_chain())
    workers = pool(3, ledger_state=None)
    assert s.decide(request(4), workers, {}).mode is Mode.CONSISTENT_HASH
    tiny = RequestFacts(array("Q"), 3, BLOCK)
    assert s.decide(tiny, workers, {}).mode is Mode.FALLBACK_ROUND_ROBIN


def test_consistent_hash_parameters_are_checked():
    with pytest.raises(ValueError):
        ConsistentHash(load_factor=0.5)


def test_the_recompute_charge_holds_a_request_back_at_most_its_bound():
    """w1 would recompute 8 blocks at 100 tokens/s (1.28 s; x 10 = 12.8 s): the charge is
    bounded by ``recompute_charge_max_s``, so the holder may cost at most 0.1 + 1.0 s more."""
    def pick(queued: int, bound: float) -> Decision:
        config = CostConfig(decode_s_per_in_flight=0, affinity_tolerance_s=0.1,
                            default_prefill_tokens_per_s=100, recompute_charge_max_s=bound,
                            recompute_weight=10)
        workers = [worker("w0", queued_prefill_tokens=queued), worker("w1")]
        return ExactKv(config).decide(request(8), workers, {"w0": 8})

    assert pick(230, 1.0).worker == "w0"  # 2.30 - 1.28 = 1.02 s more: within 1.1
    d = pick(250, 1.0)  # 1.22 s more
    assert d.worker == "w1" and "(allowed 1.100 s)" in d.reason, d.reason
    assert pick(250, 20.0).worker == "w0"  # unbounded: 12.9 s allowed
    with pytest.raises(ConfigError):
        CostConfig(recompute_charge_max_s=-1)
