"""The SGLang batching model on worked examples of engine-scheduling.md §7-§9: batch
alternation, chunked prefill, pages, insert-after-forward, retraction, event cadence."""

from __future__ import annotations

import pytest

from cortex.errors import ConfigError
from cortex.ledger.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, Event
from cortex.sim.batching.core import BatchingEngine, SimRequest, StepOutcome, TruthEntry
from cortex.sim.batching.sglang import (
    SglangBatchingConfig,
    SglangBatchingEngine,
)
from cortex.sim.engine_hashes import SglangChainHasher
from cortex.sim.output_text import output_token_id
from cortex.sim.sglang_events import SglangEventQueue
from cortex.sim.step_time import Chunk, StepProfile, StepWork

PROFILE = StepProfile("test", step_s=0.01, prefill_token_s=0.001, attention_pair_s=0.0,
                      decode_seq_s=0.002, decode_kv_token_s=0.0)
HASHER = SglangChainHasher()


def _engine(max_total_tokens: int = 1000, **knobs: object) -> SglangBatchingEngine:
    config = SglangBatchingConfig(max_total_tokens=max_total_tokens, **knobs)  # type: ignore[arg-type]
    return SglangBatchingEngine(config, PROFILE, HASHER)


def _req(rid: int, tokens: tuple[int, ...], outputs: int, **fields: object) -> SimRequest:
    return SimRequest(rid, tokens, outputs, **fields)  # type: ignore[arg-type]


def _step(engine: SglangBatchingEngine) -> StepOutcome:
    outcome = engine.step()
    assert outcome is not None
    assert engine.audit() == []
    return outcome


def _drain(engine: SglangBatchingEngine, limit: int = 10_000) -> list[StepOutcome]:
    outcomes = []
    while (outcome := engine.step()) is not None:
        assert engine.audit() == []
        outcomes.append(outcome)
        assert len(outcomes) < limit
    return outcomes


def _hashes(tokens: tuple[int, ...], page: int = 1) -> list[int]:
    return [h.value for h in HASHER(tokens, page)]


def _seq(prompt: tuple[int, ...], outputs: int) -> tuple[int, ...]:
    return prompt + tuple(output_token_id(i) for i in range(outputs))


def _truth_of(path: tuple[int, ...], page: int = 1) -> set[TruthEntry]:
    return {(None, None, path[:end]) for end in range(page, len(path) + 1, page)}


P10 = tuple(range(100, 110))


def test_it_is_a_batching_engine() -> None:
    engine: BatchingEngine = _engine()
    assert engine.waiting == 0 and engine.running == 0 and engine.kv_usage == 0.0
    assert engine.step() is None


def test_prefill_batches_and_decode_batches_alternate_prefill_first() -> None:
    engine = _engine()
    engine.add(_req(1, P10, 5))
    first = _step(engine)
    assert first.work == StepWork(chunks=(Chunk(10, 0),))
    assert first.scheduled == {1: 0} and first.first_tokens == [1] and first.tokens == []
    assert first.seconds == pytest.approx(0.01 + 0.001 * 10)
    assert first.events == [BlockStored(_hashes(P10), None, list(P10), 1, medium="GPU")]
    second = _step(engine)
    assert second.work == StepWork(decodes=1, decode_context=11) and second.tokens == [1]
    assert second.seconds == pytest.approx(0.01 + 0.002)

    engine.add(_req(2, tuple(range(200, 208)), 3))
    third = _step(engine)  # the new prompt's prefill; request 1 does not decode this step
    assert third.work == StepWork(chunks=(Chunk(8, 0),)) and third.tokens == []
    assert third.first_tokens == [2]
    fourth = _step(engine)
    assert fourth.work.decodes == 2 and fourth.tokens == [1, 2]
    assert engine.running == 2 and engine.waiting == 0


def test_a_chunked_request_is_resumed_first_and_its_chunks_are_stored_a_pass_later() -> None:
    engine = _engine(chunked_prefill_size=8)
    long = tuple(range(20))
    short = (500, 501, 502)
    engine.add(_req(1, long, 2))
    engine.add(_req(2, short, 2))
    one = _step(engine)
    assert one.work.chunks == (Chunk(8, 0),) and one.scheduled == {1: 0}
    assert one.first_tokens == [] and one.events == []  # the chunk enters the tree next pass
    assert engine.running == 1 and engine.waiting == 1
    two = _step(engine)
    assert two.work.chunks == (Chunk(8, 8),) and two.scheduled == {}
    assert two.events == [BlockStored(_hashes(long)[:8], None, list(long[:8]), 1, medium="GPU")]
    three = _step(engine)  # the chunked request's rest first, then the queue in the budget left
    assert three.work.chunks == (Chunk(4, 16), Chunk(3, 0))
    assert three.scheduled == {2: 0} and three.first_tokens == [1, 2]
    hashes = _hashes(long)
    assert three.events == [
        # the second chunk (stashed) and the prompt's end (at prefill end) continue one chain
        BlockStored(hashes[8:], hashes[7], list(long[8:]), 1, medium="GPU"),
        BlockStored(_hashes(short), None, list(short), 1, medium="GPU"),
    ]


def test_only_one_request_is_chunked_at_a_time() -> None:
    engine = _engine(chunked_prefill_size=8)
    engine.add(_req(1, tuple(range(12)), 1))
    engine.add(_req(2, tuple(range(50, 70)), 1))
    one = _step(engine)
    assert one.work.chunks == (Chunk(8, 0),)
    two = _step(engine)  # 1's last 4, then 2 cut to the 4 left: 2 is now the chunked one
    assert two.work.chunks == (Chunk(4, 8), Chunk(4, 0)) and two.finished == [1]
    three = _step(engine)
    assert three.work.chunks == (Chunk(8, 4),)
    four = _step(engine)
    assert four.work.chunks == (Chunk(8, 12),) and four.finished == [2]


def test_pages_align_matches_chunks_and_stores() -> None:
    page = 4
    engine = _engine(400, page_size=page, chunked_prefill_size=10)
    prompt = tuple(range(20))
    engine.add(_req(1, prompt, 3))
    outcomes = _drain(engine)
    assert [o.work.chunks for o in outcomes[:3]] == [
        (Chunk(8, 0),), (Chunk(8, 8),), (Chunk(4, 16),)]  # 10 floored to whole pages
    stored = [e for o in outcomes for e in o.events if isinstance(e, BlockStored)]
    stored += [e for e in engine.idle_events() if isinstance(e, BlockStored)]
    assert all(e.block_size == page and len(e.token_ids) == page * len(e.block_hashes)
               for e in stored)
    # finished with 3 outputs: KV of prompt + 2 outputs = 22 tokens, 20 in whole pages
    assert engine.truth() == _truth_of(prompt, page)

    for rid, tokens, hit in (
        (2, prompt[:10], 8),  # cap 9, floored to 8
        (3, prompt[:12], 8),  # a fully cached 12: cap 11 -> 8 (the last token is recomputed)
        (4, prompt[:13], 12),
        (5, prompt[:3], 0),  # less than a page
    ):
        engine.add(_req(rid, tokens, 1))
        outcome = _step(engine)
        assert outcome.scheduled == {rid: hit}
        assert outcome.work.chunks == (Chunk(len(tokens) - hit, hit),)


def test_outputs_enter_the_tree_only_when_the_request_finishes() -> None:
    engine = _engine()
    engine.add(_req(1, P10, 4))
    _step(engine)
    _step(engine)
    _step(engine)  # two decodes: their tokens are not inserted while the request runs
    assert engine.truth() == _truth_of(P10)
    last = _step(engine)
    assert last.finished == [1] and last.tokens == [1]
    assert engine.idle_events() == [BlockStored(
        _hashes(_seq(P10, 3))[10:], _hashes(P10)[-1], list(_seq(P10, 3)[10:]), 1, medium="GPU")]
    assert engine.truth() == _truth_of(_seq(P10, 3))  # KV of prompt + 3 of the 4 outputs


def test_a_prompt_enters_the_tree_after_its_forward_so_its_twin_in_the_batch_misses() -> None:
    engine = _engine()
    engine.add(_req(1, P10, 2))
    engine.add(_req(2, P10, 2))
    both = _step(engine)
    assert both.scheduled == {1: 0, 2: 0}
    assert both.work.chunks == (Chunk(10, 0), Chunk(10, 0))
    assert both.events == [BlockStored(_hashes(P10), None, list(P10), 1, medium="GPU")]
    engine.add(_req(3, P10, 2))
    later = _step(engine)
    assert later.scheduled == {3: 9} and later.work.chunks == (Chunk(1, 9),)


def test_namespaces_and_read_limit() -> None:
    engine = _engine()
    engine.add(_req(1, P10, 1))
    engine.add(_req(2, P10, 1, lora_name="ad"))
    engine.add(_req(3, P10, 1, cache_salt="s"))
    _drain(engine)
    engine.add(_req(4, P10, 1, lora_name="ad"))
    engine.add(_req(5, P10, 1, read_limit=4))
    engine.add(_req(6, P10, 1, cache_salt="other"))
    assert _step(engine).scheduled == {4: 9, 5: 4, 6: 0}
    assert {entry[:2] for entry in engine.truth()} == {
        (None, None), ("ad", None), (None, "s"), (None, "other")}


def _retraction_engine() -> SglangBatchingEngine:
    # a low conservativeness reserves little for running decodes, so the pool over-admits
    return _engine(64, schedule_conservativeness=0.1)


def test_retraction_takes_the_fewest_outputs_then_the_longest_prompt() -> None:
    engine = _retraction_engine()
    a, b = tuple(range(10, 16)), tuple(range(20, 24))  # a's prompt is the longer
    engine.add(_req(1, a, 30))
    _step(engine)
    engine.add(_req(2, b, 30))
    _step(engine)  # both have one output: a tie, broken by the longer prompt (a)
    outcomes = []
    while not any(o.preempted for o in outcomes):
        outcomes.append(_step(engine))
    retracting = outcomes[-1]
    assert retracting.preempted == [1] and retracting.tokens == [2]
    assert retracting.work.decodes == 1
    assert engine.waiting == 1 and engine.running == 1
    assert engine.new_token_ratio == 1.0  # (outputs + 20 x 1) / (30 + 1), at most 1
    # a's decode tokens were not cached; its prompt (inserted at prefill) still is
    assert {t for t in engine.truth() if t[2][:1] == a[:1]} == _truth_of(a)


def test_retraction_prefers_keeping_the_request_with_more_outputs() -> None:
    engine = _retraction_engine()
    a, b = tuple(range(10, 16)), tuple(range(20, 24))
    engine.add(_req(1, a, 50))
    for _ in range(4):
        _step(engine)  # a: prefill and 3 decodes
    engine.add(_req(2, b, 30))
    outcomes: list[StepOutcome] = []
    while not any(o.preempted for o in outcomes):
        outcomes.append(_step(engine))
    assert outcomes[-1].preempted == [2]  # fewer outputs, though its prompt is shorter


def test_a_retracted_request_is_recomputed_and_still_produces_every_token() -> None:
    engine = _retraction_engine()
    a, b = tuple(range(10, 16)), tuple(range(20, 24))
    engine.add(_req(1, a, 30))
    outcomes = [_step(engine)]
    engine.add(_req(2, b, 30))
    outcomes.append(_step(engine))
    engine.add(_req(3, tuple(range(40, 44)), 1))  # waits behind both
    outcomes += _drain(engine)
    tokens = {rid: 0 for rid in (1, 2, 3)}
    for outcome in outcomes:
        for rid in outcome.first_tokens + outcome.tokens:
            tokens[rid] += 1
    assert tokens == {1: 30, 2: 30, 3: 1}
    assert sorted(rid for o in outcomes for rid in o.finished) == [1, 2, 3]
    retracted_at = next(i for i, o in enumerate(outcomes) if o.preempted)
    assert [o.scheduled for o in outcomes if 1 in o.scheduled] == [{1: 0}]  # reported once
    readmitted = next(o for o in outcomes[retracted_at + 1:] if o.work.chunks
                      and o.work.chunks[0].context == len(a))
    # recomputed: prompt + its outputs so far, the prompt hit in the tree
    assert readmitted.work.chunks[0].tokens == 28 and readmitted.tokens == [1]
    assert engine.running == 0 and engine.kv_usage == 0.0


def test_events_wait_for_the_fortieth_decode_batch_or_idle() -> None:
    engine = _engine(80)
    filler = tuple(range(300, 350))
    engine.add(_req(9, filler, 1))  # finishes at prefill: 50 cached, unlocked tokens
    assert _step(engine).events == [
        BlockStored(_hashes(filler), None, list(filler), 1, medium="GPU")]
    prompt = (1, 2, 3, 4)
    engine.add(_req(1, prompt, 50))
    assert _step(engine).events == [
        BlockStored(_hashes(prompt), None, list(prompt), 1, medium="GPU")]
    decodes = _drain(engine)
    assert len(decodes) == 49 and all(o.work.decodes == 1 for o in decodes)
    # decode 27 needs a slot the pool no longer has: the filler is evicted, and its removal
    # waits for decode batch 40
    assert engine.truth() == _truth_of(_seq(prompt, 49))
    published = [(i + 1, o.events) for i, o in enumerate(decodes) if o.events]
    assert published == [(40, [BlockRemoved(_hashes(filler), medium="GPU")])]
    assert engine.idle_events() == [BlockStored(
        _hashes(_seq(prompt, 49))[4:], _hashes(prompt)[-1], list(_seq(prompt, 49)[4:]), 1,
        medium="GPU")]
    assert engine.idle_events() == []


def test_new_token_ratio_decays_per_decode_and_resets_when_idle() -> None:
    engine = _engine(schedule_conservativeness=0.5)
    assert engine.new_token_ratio == pytest.approx(0.35)
    engine.add(_req(1, P10, 4))
    _drain(engine)  # a prefill, three decodes, then idle
    assert engine.new_token_ratio == pytest.approx(0.35)
    engine.add(_req(2, P10, 4))
    for _ in range(4):
        _step(engine)
    assert engine.new_token_ratio == pytest.approx(0.35 - 3 * (0.35 - 0.35 * 0.14) / 600)


def test_the_running_cap_and_the_prefill_token_budget_bound_a_batch() -> None:
    engine = _engine(max_running_requests=2)
    for rid in (1, 2, 3):
        engine.add(_req(rid, (rid, rid + 1), 2))
    assert _step(engine).scheduled == {1: 0, 2: 0}
    assert _step(engine).work.decodes == 2  # the cap is reached: no prefill is tried
    assert _step(engine).scheduled == {3: 0}  # 1 and 2 finished

    unchunked = _engine(chunked_prefill_size=-1, max_prefill_tokens=10)
    for rid in (1, 2):
        unchunked.add(_req(rid, tuple(range(rid * 100, rid * 100 + 12)), 1))
    assert _step(unchunked).work.chunks == (Chunk(12, 0),)  # the first may exceed the budget
    assert _step(unchunked).scheduled == {2: 0}


def test_lpm_admits_the_longest_cached_prefix_first_and_fcfs_does_not() -> None:
    for policy, order in (("lpm", [3, 2]), ("fcfs", [2, 3])):
        engine = _engine(schedule_policy=policy, max_running_requests=1)
        engine.add(_req(1, P10, 1))
        _step(engine)
        engine.add(_req(2, (7, 8, 9), 1))
        engine.add(_req(3, P10 + (5,), 1))
        assert [rid for o in _drain(engine) for rid in o.scheduled] == order


def test_a_request_held_back_for_memory_waits_until_one_leaves() -> None:
    engine = _engine(64)
    engine.add(_req(1, (1, 2, 3, 4), 30))
    engine.add(_req(2, (5, 6, 7, 8), 30))  # 4 + 30 + 1 left 29 < 35: no room, batch full
    assert _step(engine).scheduled == {1: 0}
    outcomes = _drain(engine)
    admitted = next(i for i, o in enumerate(outcomes) if o.scheduled)
    assert outcomes[admitted - 1].finished == [1]


def test_a_full_batch_admits_again_one_pass_after_a_decode_finishes_a_request() -> None:
    engine = _engine(100)
    engine.add(_req(1, (1, 2, 3, 4), 5))
    engine.add(_req(2, (5, 6, 7, 8), 40))
    engine.add(_req(3, (9, 10, 11, 12), 60))  # 65 > 100 - 10 - 45 left: batch full
    assert _step(engine).scheduled == {1: 0, 2: 0}
    for _ in range(3):
        assert _step(engine).work.decodes == 2
    assert _step(engine).finished == [1]
    # the next decode filters 1 out of the batch and only then clears batch_is_full, though 3
    # would fit already
    after = _step(engine)
    assert after.work.decodes == 1 and after.scheduled == {}
    assert _step(engine).scheduled == {3: 0}


def test_abort_frees_a_request_wherever_it_is() -> None:
    engine = _engine(chunked_prefill_size=8)
    engine.add(_req(1, tuple(range(20)), 5))
    engine.add(_req(2, P10, 5))
    _step(engine)  # 1 is mid-prefill (8 computed), 2 waits
    engine.abort(2)
    engine.abort(1)
    assert engine.audit() == [] and engine.waiting == 0 and engine.running == 0
    assert engine.used_tokens == 8 and engine.kv_usage == 0.0  # its chunk, cached unlocked
    assert engine.truth() == _truth_of(tuple(range(8)))
    assert engine.step() is None

    engine.add(_req(3, P10, 5))
    for _ in range(3):
        _step(engine)  # two chunks, a decode
    engine.abort(3)  # running: its prompt and first output (whose KV exists) stay cached
    engine.abort(3)  # unknown by now: nothing
    assert engine.truth() >= _truth_of(_seq(P10, 1))
    assert engine.step() is None and engine.audit() == []


def test_clear_is_refused_while_busy_and_reset_is_silent() -> None:
    engine = _engine()
    engine.add(_req(1, P10, 3))
    _step(engine)
    assert engine.clear() == []
    _drain(engine)
    events = engine.clear()
    assert isinstance(events[-1], AllBlocksCleared) and len(events) == 2  # and the last store
    assert engine.truth() == set() and engine.used_tokens == 0

    engine.add(_req(2, P10, 3))
    _step(engine)
    engine.reset()
    assert engine.truth() == set() and engine.idle_events() == [] and engine.step() is None
    assert engine.waiting == engine.running == 0 and engine.used_tokens == 0


def test_add_refuses_what_the_pool_can_never_hold() -> None:
    engine = _engine(64)
    with pytest.raises(ValueError, match="never admits"):
        engine.add(_req(1, tuple(range(40)), 23))
    engine.add(_req(1, tuple(range(40)), 22))
    with pytest.raises(ValueError, match="already"):
        engine.add(_req(1, (1,), 1))
    with pytest.raises(ValueError):
        engine.add(_req(2, (), 1))


def test_config_defaults_and_validation() -> None:
    config = SglangBatchingConfig(max_total_tokens=500_000)
    assert (config.chunked_prefill_size, config.max_prefill_tokens, config.page_size,
            config.schedule_policy, config.decode_log_interval) == (8192, 16384, 1, "fcfs", 40)
    assert config.running_cap == 4096  # 500k / 32k x 512 = 7812, clamped to 4096
    assert SglangBatchingConfig(max_total_tokens=50_000).running_cap == 2048
    assert SglangBatchingConfig(max_total_tokens=1000).running_cap == 500  # half the pool
    assert SglangBatchingConfig(max_total_tokens=1000, max_running_requests=8).running_cap == 8
    assert SglangBatchingConfig(max_total_tokens=1001, page_size=4).capacity_tokens == 1000
    with pytest.raises(ConfigError) as error:
        SglangBatchingConfig(max_total_tokens=1, page_size=0, chunked_prefill_size=0,
                             schedule_policy="lpf", decode_log_interval=0)  # type: ignore[arg-type]
    assert len(error.value.problems) == 5


def test_the_event_queue_merges_continuing_stores_and_consecutive_removals() -> None:
    queue = SglangEventQueue()
    queue.record_store([1, 2], None, [10, 11], 1, None, None)
    queue.record_store([3], 2, [12], 1, None, None)  # continues the tail: merged
    queue.record_store([4], 2, [13], 1, None, None)  # a sibling: its own event
    queue.record_store([5], 4, [14], 1, "ad", None)  # another namespace: its own event
    queue.record_remove([3])
    queue.record_remove([4, 5])
    queue.record_all_cleared()
    events: list[Event] = queue.take()
    assert events == [
        BlockStored([1, 2, 3], None, [10, 11, 12], 1, medium="GPU"),
        BlockStored([4], 2, [13], 1, medium="GPU"),
        BlockStored([5], 4, [14], 1, medium="GPU", lora_name="ad"),
        BlockRemoved([3, 4, 5], medium="GPU"),
        AllBlocksCleared(),
    ]
    assert queue.take() == [] and len(queue) == 0


def test_a_held_request_stays_locked_in_the_tree_until_released() -> None:
    """PD prefill (``hold_kv``): the prompt enters the tree after its forward (stored with the
    prefill batch) and stays locked, counting against the pool, until ``release``."""
    engine = _engine(40)
    engine.add(_req(1, P10, 1, hold_kv=True))
    outcome = _step(engine)
    assert outcome.first_tokens == [1] and outcome.finished == [1]
    assert outcome.events == [BlockStored(_hashes(P10), None, list(P10), 1, medium="GPU")]
    assert engine.running == engine.waiting == 0
    assert engine.used_tokens == 10 and engine.kv_usage == pytest.approx(10 / 40)
    assert engine.clear() == [] and engine.step() is None
    # 25 + 4 + a page does not fit the 30 tokens left beside the locked 10: it waits
    engine.add(_req(2, tuple(range(300, 325)), 4))
    assert engine.step() is None and engine.waiting == 1
    engine.release(2)  # not held: nothing
    engine.release(1)
    engine.release(1)
    assert engine.audit() == [] and engine.kv_usage == 0.0 and engine.truth() == _truth_of(P10)
    assert _step(engine).scheduled == {2: 0}


def test_abort_frees_held_and_received_requests() -> None:
    engine = _engine(100)
    engine.add(_req(1, P10, 1, hold_kv=True))
    _step(engine)
    engine.add(_req(2, tuple(range(200, 290)), 5, kv_received=True))  # cannot be admitted
    assert engine.step() is None and engine.waiting == 1
    engine.abort(2)
    engine.abort(1)
    assert engine.audit() == [] and engine.waiting == 0 and engine.kv_usage == 0.0


def test_a_received_prompt_gets_its_pages_and_decodes_without_the_tree() -> None:
    """PD decode (``kv_received``): admitted straight into the running batch with pages for its
    prompt, first token from the next decode batch; no radix cache on decode: no match even of
    a cached prompt, no insert, no events, ``cached_tokens`` 0."""
    engine = _engine(100)
    engine.add(_req(1, P10, 2))
    _drain(engine)
    assert engine.truth() == _truth_of(_seq(P10, 1))  # (the last output has no KV)
    stored = engine.truth()
    engine.idle_events()  # request 1's last store
    received = _req(2, P10, 3, kv_received=True)
    assert engine.local_hit(received) == 0
    engine.add(received)
    outcome = _step(engine)
    assert outcome.scheduled == {2: 0} and outcome.first_tokens == [2]
    assert outcome.work == StepWork(decodes=1, decode_context=11)
    assert engine.used_tokens == len(_seq(P10, 1)) + 11  # its pages are its own
    outcomes = _drain(engine)
    assert [o.tokens for o in outcomes] == [[2], [2]] and outcomes[-1].finished == [2]
    assert engine.truth() == stored and engine.idle_events() == []
    assert all(not o.events for o in [outcome, *outcomes])
    with pytest.raises(ValueError):
        engine.local_hit(_req(3, P10, 1))


def test_received_requests_are_admitted_in_order_while_memory_allows() -> None:
    """The adder's test, reserves included: in one pass A (20 + 5 + a page < 40) joins and
    reserves 21 + 5, so B (10 + 5 + a page) is not below the 14 left and waits (head of line);
    a pass later A's reserve is its 4 outputs to go x new_token_ratio: B joins."""
    engine = _engine(40)
    engine.add(_req(1, tuple(range(20)), 5, kv_received=True))
    engine.add(_req(2, tuple(range(100, 110)), 5, kv_received=True))
    engine.add(_req(3, (200,), 1, kv_received=True))  # 3 tokens would fit: queued after B
    outcome = _step(engine)
    assert outcome.scheduled == {1: 0} and engine.waiting == 2 and engine.running == 1
    outcome = _step(engine)
    assert outcome.scheduled == {2: 0} and outcome.first_tokens == [2]
    outcomes = [outcome, *_drain(engine)]
    produced = [rid for o in outcomes for rid in (*o.first_tokens, *o.tokens)]
    assert produced.count(1) == 4 and produced.count(2) == 5 and produced.count(3) == 1
    assert engine.kv_usage == 0.0 and engine.truth() == set()


def test_a_retracted_received_request_is_recomputed_outside_the_tree() -> None:
    """Two received requests of 12 + 12 under a low reserve join a pass apart; together they
    outgrow the 40-token pool: the one with fewer outputs is retracted and recomputed."""
    engine = _engine(40, schedule_conservativeness=0.02)
    engine.add(_req(1, tuple(range(12)), 12, kv_received=True))
    engine.add(_req(2, tuple(range(100, 112)), 12, kv_received=True))
    outcomes = _drain(engine)
    assert [o.scheduled for o in outcomes[:2]] == [{1: 0}, {2: 0}]
    assert any(o.preempted for o in outcomes)
    assert any(o.work.chunks for o in outcomes)  # the recompute is a prefill
    produced = [rid for o in outcomes for rid in (*o.first_tokens, *o.tokens)]
    assert produced.count(1) == produced.count(2) == 12
    assert engine.truth() == set() and engine.kv_usage == 0.0
