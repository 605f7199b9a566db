"""The vLLM batching model against the worked examples of
``shared/protocols/engine-scheduling.md`` (vLLM 0.32's scheduler and block pool)."""

from __future__ import annotations

import pytest

from cortex.errors import ConfigError
from cortex.ledger.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EngineFamily
from cortex.sim.batching.core import BatchingEngine, SimRequest, StepOutcome
from cortex.sim.batching.vllm import VllmBatchingEngine, VllmSchedulerConfig
from cortex.sim.engine_hashes import VllmChainHasher, make_chain_hasher
from cortex.sim.output_text import output_token_id
from cortex.sim.step_time import Chunk, StepProfile
from tests.kv_event_replay import EventModel

PROFILE = StepProfile(
    "test", step_s=0.001, prefill_token_s=1e-5, attention_pair_s=0.0, decode_seq_s=1e-4,
    decode_kv_token_s=0.0)


def _hasher() -> VllmChainHasher:
    hasher = make_chain_hasher(EngineFamily.VLLM, (0, 32))
    assert isinstance(hasher, VllmChainHasher)
    return hasher


def _engine(num_gpu_blocks: int, **settings: object) -> VllmBatchingEngine:
    config = VllmSchedulerConfig(num_gpu_blocks=num_gpu_blocks, **settings)  # type: ignore[arg-type]
    return VllmBatchingEngine(config, PROFILE, _hasher())


def _step(engine: VllmBatchingEngine, replay: EventModel | None = None) -> StepOutcome:
    outcome = engine.step()
    assert outcome is not None
    if replay is not None:
        for event in outcome.events:
            replay.apply(event)
        assert replay.truth() == engine.truth()
    return outcome


def _tokens(start: int, count: int) -> tuple[int, ...]:
    return tuple(range(start, start + count))


def test_the_model_implements_the_interface() -> None:
    engine: BatchingEngine = _engine(100)
    assert engine.step() is None and engine.idle_events() == []


def test_a_20k_prompt_is_chunked_by_the_leftover_budget() -> None:
    engine = _engine(2000)
    engine.add(SimRequest(1, _tokens(0, 20_000), output_tokens=2))
    chunks = []
    for _ in range(3):
        outcome = _step(engine)
        chunks.extend(outcome.work.chunks)
    assert chunks == [Chunk(8192, 0), Chunk(8192, 8192), Chunk(3616, 16_384)]
    assert outcome.first_tokens == [1]
    stored = [len(e.block_hashes) for e in outcome.events if isinstance(e, BlockStored)]
    assert stored == [226]  # blocks 1024..1249 become full when the last chunk is scheduled
    outcome = _step(engine)
    assert outcome.work.decodes == 1 and outcome.work.decode_context == 20_001
    assert outcome.tokens == [1] and outcome.finished == [1]
    assert engine.step() is None and engine.kv_usage == 0.0


def test_running_decodes_come_first_then_prefill_chunks_share_the_step() -> None:
    engine = _engine(100, max_num_batched_tokens=16, max_num_seqs=4, block_size=4)
    engine.add(SimRequest(1, _tokens(0, 4), output_tokens=6))
    assert _step(engine).first_tokens == [1]
    engine.add(SimRequest(2, _tokens(100, 40), output_tokens=1))
    outcome = _step(engine)
    assert outcome.tokens == [1] and outcome.scheduled == {2: 0}
    assert outcome.work.decodes == 1 and outcome.work.chunks == (Chunk(15, 0),)
    engine.add(SimRequest(3, _tokens(200, 4), output_tokens=1))  # waits: budget used up
    outcome = _step(engine)
    assert outcome.work.decodes == 1 and outcome.work.chunks == (Chunk(15, 15),)
    assert outcome.scheduled == {}
    outcome = _step(engine)  # request 2 finishes its prompt, request 3 takes what is left
    assert outcome.work.chunks == (Chunk(10, 30), Chunk(4, 0))
    assert outcome.first_tokens == [2, 3] and outcome.finished == [2, 3]


def test_last_token_rule_a_fully_cached_prompt_recomputes_its_last_block() -> None:
    engine = _engine(100)
    replay = EventModel()
    prompt = _tokens(0, 32)
    engine.add(SimRequest(1, prompt, output_tokens=1))
    assert _step(engine, replay).scheduled == {1: 0}
    engine.add(SimRequest(2, prompt, output_tokens=1))
    outcome = _step(engine, replay)
    assert outcome.scheduled == {2: 16} and outcome.work.chunks == (Chunk(16, 16),)
    (store,) = outcome.events
    assert isinstance(store, BlockStored) and len(store.block_hashes) == 1
    assert store.parent_hash is not None and store.token_ids == list(prompt[16:])
    engine.add(SimRequest(3, (*prompt, 7), output_tokens=1))
    outcome = _step(engine, replay)
    assert outcome.scheduled == {3: 32} and outcome.work.chunks == (Chunk(1, 32),)
    assert outcome.events == []
    engine.add(SimRequest(4, prompt, output_tokens=1, read_limit=0))  # prompt logprobs
    assert _step(engine, replay).scheduled == {4: 0}


def test_head_of_line_blocking_the_first_waiting_request_that_does_not_fit_stops_admission() -> None:
    engine = _engine(7, block_size=4)  # 6 usable blocks
    engine.add(SimRequest(1, _tokens(0, 12), output_tokens=4))  # 3 blocks
    _step(engine)
    engine.add(SimRequest(2, _tokens(100, 16), output_tokens=1))  # 4 blocks: does not fit
    engine.add(SimRequest(3, _tokens(200, 4), output_tokens=1))  # 1 block: would fit
    for _ in range(3):
        outcome = _step(engine)
        assert outcome.scheduled == {} and engine.waiting == 2
    assert outcome.finished == [1]
    outcome = _step(engine)
    assert outcome.scheduled == {2: 0, 3: 0}


def test_reserve_full_isl_gates_admission_on_the_whole_prompt() -> None:
    for reserve, admitted in ((True, {}), (False, {2: 0})):
        engine = _engine(7, block_size=4, max_num_batched_tokens=8, max_num_seqs=2,
                         reserve_full_isl=reserve)
        engine.add(SimRequest(1, _tokens(0, 12), output_tokens=8))
        _step(engine)
        _step(engine)
        engine.add(SimRequest(2, _tokens(100, 16), output_tokens=1))  # 4 blocks, 3 free
        assert _step(engine).scheduled == admitted


def test_preemption_takes_the_newest_running_request_and_admits_nothing_that_step() -> None:
    """Requests 1 and 2 share a 16-token prompt (block 4, 7 usable blocks). Request 2 hits 3
    blocks (last-token rule) and recomputes block 3 as a duplicate; both decode in lockstep, so
    block 4 is stored twice too. When request 1 needs a block and none is free, request 2
    (the newest) is preempted: its private blocks 4 then 3 are freed (tail first), request 1
    reuses block 4's copy, and request 2 — which would fit again, since its whole prefix is
    held by request 1 — is not admitted in that step. It is the next step, and its reported
    cached_tokens stay those of its first scheduling."""
    engine = _engine(8, block_size=4)
    replay = EventModel()
    prompt = _tokens(0, 16)
    engine.add(SimRequest(1, prompt, output_tokens=10))
    engine.add(SimRequest(2, prompt, output_tokens=10))
    outcome = _step(engine, replay)
    assert outcome.scheduled == {1: 0, 2: 12}
    assert outcome.work.chunks == (Chunk(16, 0), Chunk(4, 12))
    hashes = [h.value for h in _hasher()((*prompt, *map(output_token_id, range(4))), 4)]
    assert [e.block_hashes for e in outcome.events] == [hashes[:4], hashes[3:4]]
    for _ in range(3):
        assert _step(engine, replay).events == []
    outcome = _step(engine, replay)  # step 5: both fill block 4 with outputs 0..3
    assert [(e.block_hashes, e.parent_hash) for e in outcome.events] == [
        ([hashes[4]], hashes[3]), ([hashes[4]], hashes[3])]
    assert engine.kv_usage == 1.0

    outcome = _step(engine, replay)  # step 6: request 1 needs a 6th block
    assert outcome.preempted == [2] and outcome.tokens == [1]
    assert outcome.scheduled == {} and engine.waiting == 1 and engine.running == 1
    assert outcome.events == [BlockRemoved([hashes[4]], medium="GPU", group_idx=0)]
    assert engine.used_blocks == 6  # one free block: request 2 needs exactly one

    outcome = _step(engine, replay)  # step 7: request 2 re-hits 20 tokens held by request 1
    assert outcome.scheduled == {} and engine.running == 2
    assert outcome.tokens == [1, 2] and outcome.work.decodes == 2 and not outcome.work.chunks
    assert outcome.events == [BlockRemoved([hashes[3]], medium="GPU", group_idx=0)]

    produced = {1: 7, 2: 6}
    while (outcome := engine.step()) is not None:
        for event in outcome.events:
            replay.apply(event)
        assert replay.truth() == engine.truth()
        assert outcome.scheduled == {} and outcome.first_tokens == []
        for request_id in outcome.tokens:
            produced[request_id] += 1
    assert produced == {1: 10, 2: 10}


def test_a_request_preempted_by_itself_recomputes_prompt_and_outputs() -> None:
    engine = _engine(6, block_size=4)  # 5 usable blocks
    replay = EventModel()
    engine.add(SimRequest(1, _tokens(0, 8), output_tokens=4))
    engine.add(SimRequest(2, _tokens(100, 7), output_tokens=3))
    assert _step(engine, replay).scheduled == {1: 0, 2: 0}
    outcome = _step(engine, replay)  # 1 takes the last free block; 2 fills its block 1
    assert outcome.tokens == [1, 2]
    assert [len(e.block_hashes) for e in outcome.events if isinstance(e, BlockStored)] == [1]
    outcome = _step(engine, replay)  # 2 needs a block: none free, and 2 is running[-1]
    assert outcome.preempted == [2] and outcome.tokens == [1]
    outcome = _step(engine, replay)  # 2's whole sequence does not fit until 1 is done
    assert outcome.scheduled == {} and outcome.finished == [1] and engine.waiting == 1
    outcome = _step(engine, replay)  # 2 re-hits its 2 cached blocks, recomputes 1 token
    assert outcome.scheduled == {} and outcome.tokens == [2] and outcome.finished == [2]
    assert outcome.work.decodes == 1 and outcome.work.decode_context == 9
    assert outcome.events == []


def test_blocks_are_evicted_only_when_reused_in_order_of_release() -> None:
    """LRU means order of last release, each request's tail first, and a prefix hit takes
    blocks out of the queue until their holder frees them again."""
    engine = _engine(6, block_size=4)  # 5 usable blocks
    replay = EventModel()
    first, second = _tokens(0, 8), _tokens(100, 8)
    engine.add(SimRequest(1, first, output_tokens=1))
    engine.add(SimRequest(2, second, output_tokens=1))
    outcome = _step(engine, replay)
    assert outcome.finished == [1, 2]
    assert all(isinstance(e, BlockStored) for e in outcome.events)  # freeing evicts nothing
    assert engine.kv_usage == 0.0 and len(engine.truth()) == 4
    engine.add(SimRequest(3, (*first, 7), output_tokens=1))  # hits request 1's two blocks
    outcome = _step(engine, replay)
    assert outcome.scheduled == {3: 8} and outcome.events == []  # took the never-used block
    engine.add(SimRequest(4, _tokens(200, 20), output_tokens=1))  # needs all 5 blocks
    outcome = _step(engine, replay)
    h1 = [h.value for h in _hasher()(first, 4)]
    h2 = [h.value for h in _hasher()(second, 4)]
    removed = [e.block_hashes[0] for e in outcome.events if isinstance(e, BlockRemoved)]
    assert removed == [h2[1], h2[0], h1[1], h1[0]]
    assert isinstance(outcome.events[-1], BlockStored)
    assert len(outcome.events[-1].block_hashes) == 5


def test_cached_blocks_count_as_free_and_hits_in_the_free_queue_take_capacity() -> None:
    engine = _engine(6, block_size=4)  # 5 usable blocks
    prompt = _tokens(0, 8)
    engine.add(SimRequest(1, prompt, output_tokens=1))
    engine.add(SimRequest(3, _tokens(100, 3), output_tokens=10))
    _step(engine)
    assert engine.used_blocks == 1 and engine.kv_usage == pytest.approx(0.2)
    # 17 tokens = 5 blocks: 2 hit (both in the free queue, so both taken) + 3 new > 4 free
    engine.add(SimRequest(2, (*prompt, *_tokens(50, 9)), output_tokens=1))
    assert _step(engine).scheduled == {}
    other = _engine(6, block_size=4)
    other.add(SimRequest(1, prompt, output_tokens=1))
    other.add(SimRequest(3, _tokens(100, 3), output_tokens=10))
    _step(other)
    other.add(SimRequest(2, (*prompt, *_tokens(50, 8)), output_tokens=2))  # 4 blocks
    assert _step(other).scheduled == {2: 8} and other.used_blocks == 5


def test_abort_frees_blocks_wherever_the_request_is() -> None:
    engine = _engine(100, block_size=4, max_num_batched_tokens=8, max_num_seqs=2)
    engine.add(SimRequest(1, _tokens(0, 20), output_tokens=3))
    engine.add(SimRequest(2, _tokens(100, 4), output_tokens=3))
    _step(engine)  # 1 is mid-prefill, 2 waits
    assert engine.running == 1 and engine.waiting == 1 and engine.used_blocks == 2
    engine.abort(1)
    engine.abort(2)
    engine.abort(99)
    assert engine.running == engine.waiting == engine.used_blocks == 0
    assert len(engine.truth()) == 2 and engine.step() is None


def test_clear_succeeds_only_when_no_block_is_held() -> None:
    engine = _engine(100, block_size=4)
    engine.add(SimRequest(1, _tokens(0, 8), output_tokens=2))
    _step(engine)
    assert engine.clear() == [] and len(engine.truth()) == 2
    _step(engine)
    assert engine.clear() == [AllBlocksCleared()] and engine.truth() == set()
    engine.add(SimRequest(2, _tokens(0, 8), output_tokens=1))
    assert _step(engine).scheduled == {2: 0}


def test_reset_forgets_everything_silently() -> None:
    engine = _engine(100, block_size=4)
    engine.add(SimRequest(1, _tokens(0, 8), output_tokens=2))
    engine.add(SimRequest(2, _tokens(0, 8), output_tokens=2))
    _step(engine)
    engine.reset(_hasher())
    assert engine.truth() == set() and engine.running == engine.waiting == 0
    assert engine.step() is None


def test_max_num_seqs_caps_running_requests() -> None:
    engine = _engine(100, block_size=4, max_num_seqs=2, max_num_batched_tokens=64)
    for request_id in range(3):
        engine.add(SimRequest(request_id, _tokens(100 * request_id, 4), output_tokens=2))
    assert _step(engine).scheduled == {0: 0, 1: 0}
    assert _step(engine).finished == [0, 1]
    assert _step(engine).scheduled == {2: 0}


def test_long_prefill_threshold_caps_chunks_unless_one_request_is_alone() -> None:
    engine = _engine(100, block_size=4, long_prefill_token_threshold=6)
    engine.add(SimRequest(1, _tokens(0, 20), output_tokens=1))
    assert _step(engine).work.chunks == (Chunk(20, 0),)
    engine.add(SimRequest(2, _tokens(100, 20), output_tokens=1))
    engine.add(SimRequest(3, _tokens(200, 5), output_tokens=1))
    assert _step(engine).work.chunks == (Chunk(6, 0), Chunk(5, 0))


def test_watermark_keeps_blocks_free_while_something_runs() -> None:
    engine = _engine(10, block_size=4, watermark=0.3)  # 9 usable, 3 kept free
    engine.add(SimRequest(1, _tokens(0, 8), output_tokens=5))
    _step(engine)
    engine.add(SimRequest(2, _tokens(100, 20), output_tokens=1))  # 5 blocks + 3 > 7 free
    assert _step(engine).scheduled == {}
    alone = _engine(10, block_size=4, watermark=0.3)
    alone.add(SimRequest(1, _tokens(0, 30), output_tokens=1))  # 8 blocks + 3 > 9 free
    assert _step(alone).scheduled == {1: 0}


def test_prefix_caching_off_stores_and_hits_nothing() -> None:
    engine = _engine(100, block_size=4, enable_prefix_caching=False)
    for request_id in (1, 2):
        engine.add(SimRequest(request_id, _tokens(0, 12), output_tokens=1))
        outcome = _step(engine)
        assert outcome.scheduled == {request_id: 0} and outcome.events == []
    assert engine.truth() == set()


def test_lora_and_salt_namespaces_and_digests() -> None:
    engine = _engine(100, block_size=4)
    replay = EventModel()
    prompt = _tokens(0, 8)
    engine.add(SimRequest(1, prompt, output_tokens=1, lora_name="a", cache_salt="s"))
    outcome = _step(engine, replay)
    (store,) = outcome.events
    assert isinstance(store, BlockStored)
    assert (store.lora_name, store.lora_id, store.cache_salt) == ("a", 1, "s")
    assert store.medium == "GPU" and store.kv_cache_spec_kind == "full_attention"
    assert set(outcome.hash_digests) == set(store.block_hashes)
    engine.add(SimRequest(2, prompt, output_tokens=1, lora_name="a"))
    assert _step(engine, replay).scheduled == {2: 0}


def test_add_refuses_what_vllm_would_refuse() -> None:
    engine = _engine(5, block_size=4)  # 16 tokens of KV
    engine.add(SimRequest(1, _tokens(0, 10), output_tokens=7))  # 16 tokens in KV at most
    with pytest.raises(ValueError, match="already"):
        engine.add(SimRequest(1, _tokens(0, 4), output_tokens=1))
    with pytest.raises(ValueError, match="more than"):
        engine.add(SimRequest(2, _tokens(0, 10), output_tokens=8))
    with pytest.raises(ValueError):
        engine.add(SimRequest(3, (), output_tokens=1))


def test_config_is_checked_as_vllm_checks_it() -> None:
    assert VllmSchedulerConfig(num_gpu_blocks=10).max_num_batched_tokens == 8192
    with pytest.raises(ConfigError):
        VllmSchedulerConfig(num_gpu_blocks=10, max_num_batched_tokens=100, max_num_seqs=256)
    with pytest.raises(ConfigError):
        VllmSchedulerConfig(num_gpu_blocks=1)
    with pytest.raises(ConfigError):
        VllmSchedulerConfig(num_gpu_blocks=10, watermark=1.0)


def test_a_held_request_keeps_its_blocks_until_released_then_frees_them_tail_first() -> None:
    """PD prefill (``hold_kv``): 4 usable blocks of 4; the 12-token prompt's three blocks stay
    held after its one token, so a request needing two blocks waits; once released they are
    free but cached, and the first one reused is the tail."""
    engine = _engine(5, block_size=4)
    replay = EventModel()
    prompt = _tokens(0, 12)
    engine.add(SimRequest(1, prompt, output_tokens=1, hold_kv=True))
    outcome = _step(engine, replay)
    assert outcome.first_tokens == [1] and outcome.finished == [1]
    assert engine.running == engine.waiting == 0 and engine.used_blocks == 3
    assert engine.clear() == []  # blocks held: vLLM's reset fails
    with pytest.raises(ValueError, match="already"):
        engine.add(SimRequest(1, prompt, output_tokens=1))
    engine.add(SimRequest(2, _tokens(100, 8), output_tokens=1))
    assert engine.step() is None and engine.waiting == 1  # 1 block free, 2 needed
    engine.release(2)  # not held: nothing
    engine.release(1)
    engine.release(1)
    assert engine.used_blocks == 0 and len(engine.truth()) == 3
    outcome = _step(engine, replay)
    assert outcome.scheduled == {2: 0}
    removed = [e for e in outcome.events if isinstance(e, BlockRemoved)]
    assert [e.block_hashes for e in removed] == [[_hasher()(prompt, 4)[2].value]]
    assert (None, None, prompt[:8]) in engine.truth()


def test_abort_frees_a_held_request() -> None:
    engine = _engine(100, block_size=4)
    engine.add(SimRequest(1, _tokens(0, 10), output_tokens=2, hold_kv=True))
    _step(engine)
    _step(engine)  # its second token: finished, held
    assert engine.used_blocks == 3
    engine.abort(1)
    assert engine.used_blocks == 0 and engine.step() is None


def test_a_received_prompt_is_allocated_whole_and_decodes_from_its_first_step() -> None:
    """PD decode (``kv_received``): no prefill chunk; its last prompt token is the one token
    of its first step, counted as a decode, which samples its first output; the received
    full blocks are cached (stored) at admission; ``cached_tokens`` is what was held before."""
    engine = _engine(100, block_size=4, max_num_batched_tokens=8, max_num_seqs=4)
    replay = EventModel()
    prompt = _tokens(0, 10)
    received = SimRequest(1, prompt, output_tokens=3, kv_received=True)
    assert engine.local_hit(received) == 0
    engine.add(received)
    engine.add(SimRequest(2, _tokens(100, 20), output_tokens=1))
    outcome = _step(engine, replay)
    assert outcome.scheduled == {1: 0, 2: 0} and outcome.first_tokens == [1]
    assert outcome.work.chunks == (Chunk(7, 0),)  # the budget left after its one token
    assert (outcome.work.decodes, outcome.work.decode_context) == (1, 10)
    stored = [e for e in outcome.events if isinstance(e, BlockStored)]
    assert [list(e.token_ids) for e in stored] == [list(prompt[:8]), list(range(100, 104))]
    outcome = _step(engine, replay)
    assert outcome.tokens == [1] and outcome.work.decode_context == 11
    while engine.running or engine.waiting:
        _step(engine, replay)
    # the prompt is now this engine's: a second transfer of it brings one block only
    again = SimRequest(3, (*prompt, 7, 7, 7), output_tokens=1, kv_received=True)
    assert engine.local_hit(again) == 8
    engine.add(again)
    outcome = _step(engine, replay)
    assert outcome.scheduled == {3: 8} and outcome.work.chunks == ()
    assert outcome.first_tokens == [3] and outcome.finished == [3]
    stored = [e for e in outcome.events if isinstance(e, BlockStored)]
    assert [list(e.token_ids) for e in stored] == [[*prompt[8:], 7, 7]]


def test_a_preempted_received_request_recomputes_its_prompt() -> None:
    engine = _engine(5, block_size=4, max_num_batched_tokens=16, max_num_seqs=4)
    engine.add(SimRequest(1, _tokens(0, 7), output_tokens=6))
    engine.add(SimRequest(2, _tokens(100, 7), output_tokens=6, kv_received=True))
    first = _step(engine)
    assert first.work.chunks == (Chunk(7, 0),) and first.work.decodes == 1
    outcomes = []
    while (outcome := engine.step()) is not None:
        outcomes.append(outcome)
    preempted_at = next(i for i, o in enumerate(outcomes) if 2 in o.preempted)
    assert 1 not in {rid for o in outcomes for rid in o.preempted}
    # its KV is gone: it recomputes prompt and outputs (from what stayed cached)
    assert any(o.work.chunks for o in outcomes[preempted_at + 1:])
    produced = [rid for o in [first, *outcomes] for rid in (*o.first_tokens, *o.tokens)]
    assert produced.count(1) == produced.count(2) == 6
