"""A vLLM-flavoured simulated engine on the continuous-batching model, over real sockets.

Where time is what is tested the engine runs on trio's ``MockClock`` (``autojump_clock``) with
step profiles whose durations are round numbers, so times to first token are asserted exactly;
KV events are received over real ZeroMQ on the real clock, checked by lower bounds only (a
busy machine makes things later, never earlier).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import h11
import pytest
import trio
import zmq
from prometheus_client.parser import text_string_to_metric_families

from cortex.errors import ConfigError
from cortex.events import zmq_trio
from cortex.events.decoder import decode_payload
from cortex.events.frames import parse_live_frames
from cortex.ledger.kv_events import BlockStored, EngineFamily
from cortex.sim.batching.factory import BatchingSettings
from cortex.sim.engine import SimEngine
from cortex.sim.step_time import StepProfile
from tests.integration.test_sim_engine import Client, call, sse_data
from tests.sim_engine_profile import chat, deepseek

# 10 ms a step, 1 ms a prompt token, nothing else: step times are easy sums
PREFILL_MS = StepProfile("test-prefill", step_s=0.01, prefill_token_s=0.001,
                         attention_pair_s=0.0, decode_seq_s=0.0, decode_kv_token_s=0.0)


@asynccontextmanager
async def running(settings: BatchingSettings = BatchingSettings(), *,
                  flavor: str = "vllm-0.33", **kwargs: Any) -> AsyncIterator[SimEngine]:
    engine = SimEngine("e1", flavor, deepseek(), engine_model="batching",
                       batching=settings, **kwargs)
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            yield engine
            nursery.cancel_scope.cancel()


def metric(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} not in /metrics")


@pytest.mark.parametrize("flavor", ["vllm-0.33", "sglang-0.5.23"])
async def test_serves_chat_and_completions_streamed_and_not(flavor):
    async with running(BatchingSettings(speedup=10.0), flavor=flavor) as engine:
        assert engine.url is not None
        first = await call(engine.url, "POST", "/v1/chat/completions", chat(max_tokens=3))
        again = await call(engine.url, "POST", "/v1/chat/completions",
                           chat(max_tokens=3, stream=True,
                                stream_options={"include_usage": True}))
        completion = await call(engine.url, "POST", "/v1/completions",
                                {"prompt": list(range(100, 164)), "max_tokens": 2})
        streamed = await call(engine.url, "POST", "/v1/completions",
                              {"prompt": list(range(100, 164)), "max_tokens": 2,
                               "stream": True})
        metrics = (await call(engine.url, "GET", "/metrics"))[1].decode() \
            if flavor.startswith("vllm") else None
        assert engine.steppers[0].steps > 0
        assert engine.load(0).running == engine.load(0).waiting == 0
    assert first[0] == again[0] == completion[0] == streamed[0] == 200
    body = json.loads(first[1])
    assert body["choices"][0]["message"]["content"] == " The quick brown"
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    events = sse_data(again[1])
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-2]) == \
        " The quick brown"
    usage = events[-2]["usage"]
    # the repeated prompt hits every full block but the one holding its last token
    assert usage["prompt_tokens_details"]["cached_tokens"] == \
        (usage["prompt_tokens"] - 1) // 16 * 16 > 0
    assert events[-1] == "[DONE]"
    assert json.loads(completion[1])["choices"][0]["text"] == " The quick"
    assert [e["choices"][0]["text"] for e in sse_data(streamed[1])[:2]] == [" The", " quick"]
    if metrics is not None:  # (vLLM's Prometheus page; SGLang reports load on /v1/loads)
        assert metric(metrics, "vllm:generation_tokens_total") == 10
        assert metric(metrics, "vllm:num_preemptions_total") == 0


async def first_token_at(url: str, prompt: list[int], out: dict[str, float], key: str) -> None:
    client = await Client.open(url)
    try:
        response = await client.send("POST", "/v1/completions",
                                     {"prompt": prompt, "max_tokens": 2, "stream": True})
        assert response.status_code == 200
        chunk = await client.next_chunk()
        assert chunk is not None and chunk.startswith(b"data: ")
        out[key] = trio.current_time()
        await client.body()
    finally:
        await client.aclose()


@pytest.mark.parametrize("speedup", [1.0, 4.0])
async def test_two_long_prompts_share_steps_under_the_token_budget(autojump_clock, speedup):
    """Budget 1024, two 1500-token prompts at once. Step 1: the first's 1024 tokens. Step 2:
    its last 476 and the second's first 548 (the budget left). Step 3: its decode and the
    second's last 952. The second's first token comes after three steps, not the two it
    needs alone: the first's prefill took budget from it."""
    settings = BatchingSettings(max_num_batched_tokens=1024, max_num_seqs=8,
                                profile=PREFILL_MS, speedup=speedup)
    async with running(settings) as engine:
        assert engine.url is not None
        start = trio.current_time()
        firsts: dict[str, float] = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first_token_at, engine.url, list(range(1000, 2500)), firsts, "a")
            nursery.start_soon(first_token_at, engine.url, list(range(3000, 4500)), firsts, "b")
        alone: dict[str, float] = {}
        lone_start = trio.current_time()
        await first_token_at(engine.url, list(range(5000, 6500)), alone, "c")
    ttfts = sorted((t - start) * speedup for t in firsts.values())
    assert ttfts == pytest.approx([1.034 + 1.034, 1.034 + 1.034 + 0.962])
    assert (alone["c"] - lone_start) * speedup == pytest.approx(1.034 + 0.486)


@pytest.mark.parametrize("speedup", [1.0, 4.0])
async def test_a_request_reaches_the_scheduler_after_the_profiles_request_s(autojump_clock,
                                                                            speedup):
    """``request_s`` (the real engine's API server time) delays a request's arrival at the
    scheduler: two 64-token prompts sent at once reach it together 0.05 s later and share one
    step (0.01 s + 2 x 0.064 s), so both first tokens come at 0.188 s."""
    profile = dataclasses.replace(PREFILL_MS, request_s=0.05)
    async with running(BatchingSettings(profile=profile, speedup=speedup)) as engine:
        assert engine.url is not None
        start = trio.current_time()
        firsts: dict[str, float] = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first_token_at, engine.url, list(range(1000, 1064)), firsts, "a")
            nursery.start_soon(first_token_at, engine.url, list(range(2000, 2064)), firsts, "b")
    assert [(t - start) * speedup for t in firsts.values()] == \
        pytest.approx([0.05 + 0.01 + 0.128] * 2)


async def test_the_shells_own_time_does_not_stretch_a_busy_engines_steps(autojump_clock):
    """Each ``step()`` costs the shell 3 ms of the clock (its own work; on the real clock also
    a sleep's late wake-up): a 64-token prompt and 20 tokens out take a prefill step (0.074 s)
    and 19 decode steps (0.010 s each) on the engine's timeline, plus the shell's first 3 ms
    (the first step starts after its own work) and its last (the step() that finds nothing
    left runs before the answer's end goes out); timed from each step's start, 20 x 3 ms more."""
    async with running(BatchingSettings(profile=PREFILL_MS)) as engine:
        assert engine.url is not None
        model = engine.steppers[0].model
        step = model.step

        def slow_step():  # the shell's work between two steps, as the clock sees it
            autojump_clock.jump(0.003)
            return step()

        model.step = slow_step
        start = trio.current_time()
        status, _ = await call(engine.url, "POST", "/v1/completions",
                               {"prompt": list(range(1000, 1064)), "max_tokens": 20})
        elapsed = trio.current_time() - start
    assert status == 200
    assert elapsed == pytest.approx(0.074 + 19 * 0.010 + 2 * 0.003, abs=1e-6)


async def test_kv_events_go_out_at_the_end_of_the_step_that_computed_the_blocks():
    """A 64-token prompt under a 32-token budget: two steps of 0.3 s, each storing the two
    blocks it computed, each published at its end (real ZeroMQ, real clock)."""
    slow = StepProfile("slow-steps", step_s=0.3, prefill_token_s=0.0, attention_pair_s=0.0,
                       decode_seq_s=0.0, decode_kv_token_s=0.0)
    settings = BatchingSettings(max_num_batched_tokens=32, max_num_seqs=4, profile=slow)
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.linger = 0
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    prompt = list(range(200, 264))
    try:
        async with running(settings) as engine:
            assert engine.url is not None
            sub.connect(engine.kv.endpoints(0).pub)
            await engine.kv.publisher(0).wait_subscribed()
            sent = trio.current_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(call, engine.url, "POST", "/v1/completions",
                                   {"prompt": prompt, "max_tokens": 1})
                received = []
                for _ in range(2):
                    frames = await zmq_trio.recv_multipart(sub)
                    received.append((trio.current_time() - sent, frames))
    finally:
        sub.close(linger=0)
    (first_at, first), (second_at, second) = received
    assert first_at >= 0.3 and second_at >= 0.6
    stored = []
    for frames in (first, second):
        (event,) = decode_payload(parse_live_frames(frames).payload, EngineFamily.VLLM).events
        assert isinstance(event, BlockStored)
        stored.append(list(event.token_ids))
    assert stored == [prompt[:32], prompt[32:]]


async def test_a_client_that_leaves_aborts_its_request_and_frees_its_blocks(autojump_clock):
    async with running(BatchingSettings(profile=PREFILL_MS)) as engine:
        assert engine.url is not None
        client = await Client.open(engine.url)
        response = await client.send("POST", "/v1/completions", {
            "prompt": list(range(100, 140)), "max_tokens": 10_000, "stream": True})
        assert response.status_code == 200
        assert (await client.next_chunk() or b"").startswith(b"data: ")
        assert engine.load(0).running == 1 and engine.load(0).kv_usage > 0
        await client.aclose()
        await engine.steppers[0].wait_idle()  # idle only once the request left the model
        load = engine.load(0)
        assert (load.running, load.waiting, load.kv_usage) == (0, 0, 0.0)
        assert engine.counters[0].aborted == 1
        assert 0 < engine.counters[0].generation_tokens < 10_000


async def test_preemption_under_a_tiny_pool_shows_in_metrics(autojump_clock):
    """12 blocks of 16; two requests of 64 prompt and 60 output tokens need 8 blocks each at
    the end: both are admitted, and the newest is preempted when decode runs out of blocks,
    then recomputed; both still produce all their tokens."""
    async with running(BatchingSettings(profile=PREFILL_MS), capacity_blocks=12) as engine:
        assert engine.url is not None
        answers: list[tuple[int, bytes]] = []

        async def ask(first: int) -> None:
            answers.append(await call(engine.url, "POST", "/v1/completions",
                                      {"prompt": list(range(first, first + 64)),
                                       "max_tokens": 60}))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, 1000)
            nursery.start_soon(ask, 2000)
        status, raw = await call(engine.url, "GET", "/metrics")
        assert engine.counters[0].preemptions >= 1
    assert [a[0] for a in answers] == [200, 200]
    assert all(json.loads(a[1])["usage"]["completion_tokens"] == 60 for a in answers)
    text = raw.decode()
    assert status == 200
    assert metric(text, "vllm:num_preemptions_total") >= 1
    assert metric(text, "vllm:num_requests_running") == 0
    assert metric(text, "vllm:kv_cache_usage_perc") == 0.0


async def test_a_restart_fails_the_requests_in_flight_and_empties_the_model(autojump_clock):
    async with running(BatchingSettings(profile=PREFILL_MS)) as engine:
        assert engine.url is not None
        client = await Client.open(engine.url)
        try:
            response = await client.send("POST", "/v1/completions", {
                "prompt": list(range(100, 164)), "max_tokens": 1000, "stream": True})
            assert response.status_code == 200
            assert await client.next_chunk() is not None
            assert engine.kv.truth(0)
            engine.kv.restart(0)
            assert engine.kv.truth(0) == set() and engine.load(0).running == 0
            with pytest.raises(h11.RemoteProtocolError):  # broken before the final chunk
                while await client.next_chunk() is not None:
                    pass
        finally:
            await client.aclose()
        after = await call(engine.url, "POST", "/v1/completions",
                           {"prompt": list(range(100, 164)), "max_tokens": 2})
    assert after[0] == 200
    assert json.loads(after[1])["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


async def test_a_prompt_longer_than_the_pool_is_refused():
    async with running(capacity_blocks=4) as engine:
        assert engine.url is not None
        status, _ = await call(engine.url, "POST", "/v1/completions",
                               {"prompt": list(range(100, 200)), "max_tokens": 2})
    assert status == 400


def test_batching_refuses_an_unknown_engine_model():
    SimEngine("e1", "vllm-0.33", None, engine_model="batching", pd_role="prefill")  # PD: fine
    with pytest.raises(ConfigError, match="engine_model"):
        SimEngine("e1", "vllm-0.33", None, engine_model="other")
