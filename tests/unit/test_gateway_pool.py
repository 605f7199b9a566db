"""ModelPool: trust per worker, DP rank choice, exclusion of failed workers, passthrough, and
exact routing switched off by a worker that disagrees with the profile."""

from __future__ import annotations

import random

import pytest

from cortex.dispatch.model_pool import ModelPool, WorkerFigures
from cortex.dispatch.settings import PoolSettings
from cortex.dispatch.worker_report import WorkerReport
from cortex.errors import NoWorkerAvailable
from cortex.ledger.book import LedgerBook
from cortex.ledger.kv_events import BlockStored, EngineFamily, EventBatch
from cortex.ledger.state import TargetState
from cortex.profile.profile_set import ProfileSet
from cortex.prompt.request_text import RequestPrompt
from cortex.scheduling import Decision, Mode
from cortex.scheduling.cost import CostConfig
from cortex.workers.spec import WorkerSpec
from tests.gateway_cluster import BLOCK, MODEL, model_profile

PROMPT = RequestPrompt("", None, False, None, None)
TOKENS = list(range(1000, 1000 + 4 * BLOCK))


def pool_with(book: LedgerBook, *, passthrough: bool = False, profiles=None) -> ModelPool:
    profiles = profiles or ProfileSet({MODEL: model_profile()}, {})
    return ModelPool(MODEL, book, profiles=profiles, passthrough=passthrough,
                     rng=random.Random(1))


def add(pool: ModelPool, book: LedgerBook, name: str, dp: int = 1, port: int = 1,
        weight: float = 1.0) -> tuple:
    spec = WorkerSpec(name, f"http://127.0.0.1:{port}", engine="vllm", model=MODEL, dp_size=dp,
                      events=f"tcp://127.0.0.1:{5000 + port}", weight=weight)
    targets = tuple(book.register(name, r, EngineFamily.VLLM, MODEL) for r in range(dp))
    for target in targets:
        book.set_state(target, TargetState.READY)
    pool.set_worker(spec, targets)
    pool.set_figures(name, WorkerFigures(healthy=True))
    return targets


def store(book: LedgerBook, target: int, blocks: int) -> None:
    tokens = TOKENS[: blocks * BLOCK]
    book.apply(target, EventBatch(0.0, (BlockStored(list(range(1, blocks + 1)), None, tokens,
                                                    BLOCK),), None))


def test_the_rank_holding_the_prefix_is_named():
    book = LedgerBook()
    pool = pool_with(book)
    add(pool, book, "a", port=1)
    targets = add(pool, book, "b", dp=3, port=2)
    store(book, targets[2], 3)
    route = pool.decide(TOKENS, PROMPT)
    assert (route.worker.name, route.rank) == ("b", 2)
    assert route.decision.mode is Mode.EXACT_KV_EVENTS
    assert route.decision.predicted_cached_tokens == 3 * BLOCK


def test_a_state_change_is_seen_after_refresh_and_excluded_workers_are_skipped():
    book = LedgerBook()
    pool = pool_with(book)
    a = add(pool, book, "a", port=1)
    add(pool, book, "b", port=2)
    store(book, a[0], 2)
    assert pool.decide(TOKENS, PROMPT).worker.name == "a"
    assert pool.decide(TOKENS, PROMPT, exclude={"a"}).worker.name == "b"
    book.set_state(a[0], TargetState.STALE)
    pool.refresh("a")
    route = pool.decide(TOKENS, PROMPT)
    assert route.decision.mode is not Mode.EXACT_KV_EVENTS
    with pytest.raises(NoWorkerAvailable):
        pool.decide(TOKENS, PROMPT, exclude={"a", "b"})


def test_a_disagreeing_worker_turns_exact_routing_off_until_it_agrees():
    book = LedgerBook()
    pool = pool_with(book)
    a = add(pool, book, "a", port=1)
    store(book, a[0], 2)
    assert pool.note_report("a", MODEL, BLOCK) is None
    assert pool.decide(TOKENS, PROMPT).decision.mode is Mode.EXACT_KV_EVENTS
    assert "page size" in pool.note_report("a", MODEL, 32)
    assert "page size" in pool.exact_off
    assert pool.views()[0].ledger_state is None
    assert pool.decide(TOKENS, PROMPT).decision.mode is not Mode.EXACT_KV_EVENTS
    assert pool.note_report("a", MODEL, BLOCK) is None
    assert pool.decide(TOKENS, PROMPT).decision.mode is Mode.EXACT_KV_EVENTS


def test_an_sglang_worker_at_page_size_one_agrees_when_its_pages_are_folded():
    book = LedgerBook()
    pool = pool_with(book)
    add(pool, book, "a", port=1)
    assert "page size" in pool.note_report("a", MODEL, 1)  # vLLM: blocks must be BLOCK
    assert "page size" in pool.note_report("a", MODEL, 1, sglang=True)  # nothing folds yet
    book.fold_pages(MODEL, BLOCK)
    assert pool.note_report("a", MODEL, 1, sglang=True) is None
    assert "page size" in pool.note_report("a", MODEL, 1)
    assert "page size" in pool.note_report("a", MODEL, 8, sglang=True)  # only 1 is folded


def test_a_pool_renders_chats_as_sglang_only_when_every_worker_is_sglang():
    book = LedgerBook()
    pool = pool_with(book)
    assert pool.chat_engine == "vllm"
    sglang = WorkerSpec("s", "http://127.0.0.1:9", engine="sglang", model=MODEL,
                        events="tcp://127.0.0.1:5009")
    pool.set_worker(sglang, (book.register("s", 0, EngineFamily.SGLANG, MODEL),))
    assert pool.chat_engine == "sglang"
    add(pool, book, "a", port=1)
    assert pool.chat_engine == "vllm"  # mixed: vLLM's rendering (its SGLang workers may miss)
    pool.remove_worker("a")
    assert pool.chat_engine == "sglang"


def test_passthrough_goes_round_robin_without_looking_at_the_ledger():
    book = LedgerBook()
    pool = pool_with(book, passthrough=True)
    a = add(pool, book, "a", port=1)
    add(pool, book, "b", port=2)
    store(book, a[0], 4)
    picks = [pool.decide(TOKENS, PROMPT).worker.name for _ in range(4)]
    assert sorted(picks) == ["a", "a", "b", "b"]
    assert all(pool.decide(TOKENS, PROMPT).decision.predicted_cached_tokens == 0
               for _ in range(2))


def test_holds_count_in_flight_until_released():
    book = LedgerBook()
    pool = pool_with(book)
    add(pool, book, "a", port=1)
    route = pool.decide(TOKENS, PROMPT)
    with route.hold:
        assert pool.pending.in_flight("a") == 1
        assert pool.views()[0].queued_prefill_tokens == len(TOKENS)
    assert pool.pending.in_flight("a") == 0


def test_a_workers_weight_is_its_relative_prefill_capacity():
    """Weight 3 against 1: queued work costs a third of the seconds on the heavier worker, so
    with every request still held it gets three of every four requests (few enough that the
    bounded-load cap, which counts requests whatever the weight, stays out of the way)."""
    book = LedgerBook()
    pool = pool_with(book)
    add(pool, book, "light", port=1)
    add(pool, book, "heavy", port=2, weight=3.0)
    rates = {view.worker: view.prefill_tokens_per_s for view in pool.views()}
    assert rates == {"light": None, "heavy": 3 * pool.default_prefill_tokens_per_s}
    picks = {"light": 0, "heavy": 0}
    holds = []
    for i in range(8):
        route = pool.decide([i + 1, *TOKENS[1:]], PROMPT)  # a new prefix each time: no hit
        route.hold.__enter__()
        holds.append(route.hold)
        picks[route.worker.name] += 1
    assert picks == {"light": 2, "heavy": 6}
    measured = WorkerFigures(healthy=True, prefill_tokens_per_s=123.0)
    pool.set_figures("heavy", measured)  # a measured rate is the truth, weight or not
    assert {v.worker: v.prefill_tokens_per_s for v in pool.views()}["heavy"] == 123.0


def test_comparison_policies_ignore_the_ledger():
    book = LedgerBook()
    profiles = ProfileSet({MODEL: model_profile()}, {})
    for policy in ("round_robin", "p2c", "consistent_hash"):
        pool = ModelPool(MODEL, book, profiles=profiles, policy=policy, rng=random.Random(1))
        a = add(pool, book, f"a-{policy}", port=1)
        add(pool, book, f"b-{policy}", port=2)
        store(book, a[0], 4)
        decisions = [pool.decide(TOKENS, PROMPT).decision for _ in range(4)]
        assert all(d.predicted_cached_tokens == 0 for d in decisions)
        assert all(d.mode is not Mode.EXACT_KV_EVENTS for d in decisions)


class Recorder:
    """A compared policy: remembers what it was given, picks the worker named ``pick``."""

    name = "recorder"

    def __init__(self, pick: str) -> None:
        self.pick = pick
        self.given: list[dict[str, int]] = []

    def decide(self, request, workers, matched):
        self.given.append(dict(matched))
        return Decision(self.pick, Mode.LOAD_AWARE, "told to", 0)


def test_a_compared_policy_object_is_given_the_ledgers_matches():
    """``use_policy(object)``: the reference routers of the benchmarks see what "cortex" sees;
    a named comparison policy afterwards sees no ledger again."""
    book = LedgerBook()
    pool = pool_with(book)
    a = add(pool, book, "a", port=1)
    add(pool, book, "b", dp=2, port=2)
    store(book, a[0], 3)
    recorder = Recorder("b")
    pool.use_policy(recorder)
    assert pool.policy == "recorder"
    route = pool.decide(TOKENS, PROMPT)
    assert recorder.given == [{"a": 3}]
    assert route.worker.name == "b" and route.rank is None  # b holds nothing: engine's choice
    pool.use_policy("round_robin")
    assert pool.decide(TOKENS, PROMPT).decision.mode is Mode.FALLBACK_ROUND_ROBIN
    assert len(recorder.given) == 1
    with pytest.raises(ValueError):
        pool.use_policy("nonesuch")  # type: ignore[arg-type]


def test_a_passthrough_pool_stays_round_robin():
    book = LedgerBook()
    pool = pool_with(book, passthrough=True)
    add(pool, book, "a", port=1)
    pool.use_policy(Recorder("a"))
    assert pool.policy == "round_robin"
    assert pool.decide(TOKENS, PROMPT).decision.mode is Mode.FALLBACK_ROUND_ROBIN


def test_a_partial_ledger_is_routed_on_only_when_configured():
    book = LedgerBook()
    profiles = ProfileSet({MODEL: model_profile()}, {})
    for route_on_partial, mode in ((False, Mode.FALLBACK_ROUND_ROBIN),
                                  (True, Mode.EXACT_KV_EVENTS)):
        pool = ModelPool(MODEL, book, profiles=profiles, rng=random.Random(1),
                         settings=PoolSettings(route_on_partial=route_on_partial))
        a = add(pool, book, f"a{route_on_partial}", port=1)
        store(book, a[0], 2)
        book.set_state(a[0], TargetState.PARTIAL)
        pool.refresh(f"a{route_on_partial}")
        assert pool.ledger_state(f"a{route_on_partial}") is TargetState.PARTIAL
        assert pool.decide(TOKENS, PROMPT).decision.mode is mode


def test_one_untrusted_dp_rank_leaves_the_others_routed_exactly():
    """Issue 22 §12: a PARTIAL rank used to turn exact routing off for every rank."""
    book = LedgerBook()
    pool = pool_with(book)
    targets = add(pool, book, "b", dp=3, port=2)
    store(book, targets[0], 2)  # on a rank about to go PARTIAL: never credited then
    store(book, targets[1], 3)
    book.set_state(targets[0], TargetState.PARTIAL, "history lost")
    pool.refresh("b")
    assert pool.views()[0].ledger_state is TargetState.READY
    assert pool.ledger_state("b") is TargetState.PARTIAL  # what readiness reports
    route = pool.decide(TOKENS, PROMPT)
    assert (route.rank, route.decision.predicted_cached_tokens) == (1, 3 * BLOCK)
    book.set_state(targets[1], TargetState.STALE, "gap")
    pool.refresh("b")
    route = pool.decide(TOKENS, PROMPT)  # only rank 2 trusted: no hit, the engine chooses
    assert (route.rank, route.decision.predicted_cached_tokens) == (None, 0)
    book.set_state(targets[2], TargetState.SYNCING, "replaying")
    pool.refresh("b")  # no rank trusted: the worker is as untrusted as its worst rank
    assert pool.views()[0].ledger_state is TargetState.PARTIAL
    for target in targets:
        book.set_state(target, TargetState.READY)
    pool.refresh("b")
    assert pool.decide(TOKENS, PROMPT).decision.predicted_cached_tokens == 3 * BLOCK


def test_a_prefix_in_flight_is_credited_until_its_request_ends():
    """The second request of a burst, decided before any event of the first: it goes where the
    first is computing its prefix; it is predicted that prefix only once the first has its
    first token (before, the first may not even have reached the engine), and once the first
    has ended the credit is gone (the ledger's events would hold the blocks by then)."""
    book = LedgerBook()
    pool = pool_with(book)
    add(pool, book, "a", port=1)
    add(pool, book, "b", port=2)
    first = pool.decide(TOKENS, PROMPT)
    assert first.decision.predicted_cached_tokens == 0
    with first.hold:
        second = pool.decide(TOKENS[: 3 * BLOCK + 5], PROMPT)
        assert second.worker.name == first.worker.name
        assert second.decision.predicted_cached_tokens == 0
        first.hold.prefill_done()
        third = pool.decide(TOKENS[: 3 * BLOCK + 5], PROMPT)
        assert third.worker.name == first.worker.name
        assert third.decision.predicted_cached_tokens == 3 * BLOCK
        assert third.decision.mode is Mode.EXACT_KV_EVENTS
    assert pool.decide(TOKENS, PROMPT).decision.predicted_cached_tokens == 0


def test_compared_policies_get_no_in_flight_credit():
    book = LedgerBook()
    pool = pool_with(book)
    add(pool, book, "a", port=1)
    add(pool, book, "b", port=2)
    first = pool.decide(TOKENS, PROMPT)
    pool.use_policy("round_robin")
    with first.hold:
        assert len(pool.pending.prefixes) == 1
        second = pool.decide(TOKENS, PROMPT)
        assert second.decision.predicted_cached_tokens == 0


def sglang_pool(book: LedgerBook, cost: CostConfig | None = None) -> ModelPool:
    pool = ModelPool(MODEL, book, profiles=ProfileSet({MODEL: model_profile()}, {}),
                     rng=random.Random(1), settings=PoolSettings(cost=cost))
    for name, port in (("a", 1), ("b", 2)):
        spec = WorkerSpec(name, f"http://127.0.0.1:{port}", engine="sglang", model=MODEL,
                          events=f"tcp://127.0.0.1:{5000 + port}")
        target = book.register(name, 0, EngineFamily.SGLANG, MODEL)
        book.set_state(target, TargetState.READY)
        pool.set_worker(spec, (target,))
        pool.set_figures(name, WorkerFigures(healthy=True))
    return pool


def test_an_sglang_prefix_in_flight_is_predicted_only_once_certain():
    """Whatever the step budget (SGLang shares nothing within a prefill batch; a budget full of
    prompts queued ahead would not tell which batch a request lands in if it is overtaken on
    its way): a second request decided before the first's first token is routed to it, counts
    as that much less prefill there, and is predicted only the ledger's blocks."""
    pool = sglang_pool(LedgerBook(), CostConfig(step_token_budget=2 * BLOCK, step_s=0.01))
    first = pool.decide(TOKENS, PROMPT)
    name = first.worker.name
    with first.hold:
        queued = pool.pending.queued_prefill_tokens(name)
        second = pool.decide(TOKENS, PROMPT)
        assert second.worker.name == name
        assert second.decision.predicted_cached_tokens == 0
        with second.hold:
            assert pool.pending.queued_prefill_tokens(name) == 2 * queued - 3 * BLOCK
        first.hold.prefill_done()
        third = pool.decide(TOKENS, PROMPT)
        assert third.worker.name == name
        assert third.decision.predicted_cached_tokens == 3 * BLOCK


def test_the_kv_pool_a_worker_reports_is_in_its_view():
    """The cost's KV-pressure term reads the pool from the worker's own report."""
    book = LedgerBook()
    pool = pool_with(book)
    add(pool, book, "a", port=1)
    assert pool.views()[0].kv_tokens is None
    pool.set_report("a", WorkerReport((MODEL,), BLOCK, kv_tokens=5008))
    assert pool.views()[0].kv_tokens == 5008
