"""What prefill/decode disaggregation buys, on the continuous-batching engines (both flavours),
over real sockets on trio's ``MockClock``.

A request streams a long answer; meanwhile a 3000-token prompt arrives. On an aggregated engine
the long prompt's prefill shares the engine's steps with the stream's decodes (vLLM: chunks of
the leftover budget in the same mixed steps; SGLang: prefill batches that run before any decode
batch), so the stream's inter-token gaps stretch from one decode step to a prefill chunk's time
or more. Through a prefill and a decode engine the long prompt is prefilled on the prefill
engine and arrives at the decode engine with its KV: the stream's gaps stay one decode step.

The step profile makes that exact: 10 ms a step, 1 ms a prompt token, decodes free, a 512-token
budget (SGLang: chunked prefill size), so a decode-only step is 10 ms and a step with a prefill
chunk at least 0.5 s.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from cortex.sim.batching.factory import BatchingSettings
from cortex.sim.engine import SimEngine
from cortex.sim.pd import PdSimSettings
from cortex.sim.step_time import StepProfile
from tests.integration.test_pd_sim_engines import post
from tests.integration.test_sim_engine import Client
from tests.sim_engine_profile import deepseek

PROFILE = StepProfile("test-interference", step_s=0.01, prefill_token_s=0.001,
                      attention_pair_s=0.0, decode_seq_s=0.0, decode_kv_token_s=0.0)
SETTINGS = BatchingSettings(max_num_batched_tokens=512, max_num_seqs=8, profile=PROFILE)
PATIENT = PdSimSettings(waiting_timeout_s=60.0, bootstrap_timeout_s=60.0, kv_lease_s=60.0)
STREAM_PROMPT = list(range(1000, 1064))
STREAM_TOKENS = 600  # 6 s of 10 ms decode steps: it outlasts the long prompt's prefill
LONG_PROMPT = list(range(5000, 8000))
FLAVORS = ["vllm-0.33", "sglang-0.5.23"]


@asynccontextmanager
async def engines(*specs: tuple[str, str, str | None]) -> AsyncIterator[list[SimEngine]]:
    """Engines (name, flavour, PD role) on the batching model, started."""
    built = [SimEngine(name, flavor, deepseek(), engine_model="batching", batching=SETTINGS,
                       pd_role=role, bootstrap_port=0 if role == "prefill" else None,
                       pd_settings=PATIENT)
             for name, flavor, role in specs]
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            for engine in built:
                await nursery.start(engine.run)
            yield built
            nursery.cancel_scope.cancel()


async def stream_times(url: str, body: dict[str, Any], times: list[float],
                       started: trio.Event | None = None) -> None:
    """POST a streamed completion; the time each token event arrives goes to ``times``;
    ``started`` is set once five have."""
    client = await Client.open(url)
    try:
        response = await client.send("POST", "/v1/completions", {**body, "stream": True})
        assert response.status_code == 200
        while (chunk := await client.next_chunk()) is not None:
            now = trio.current_time()
            times.extend([now] * chunk.count(b'data: {"'))
            if started is not None and len(times) >= 5:
                started.set()
    finally:
        await client.aclose()


def gaps(times: list[float]) -> list[float]:
    return [later - earlier for earlier, later in itertools.pairwise(times)]


class PdPair:
    """Drives a prefill and a decode engine as a gateway would, for one flavour."""

    def __init__(self, prefill: SimEngine, decode: SimEngine) -> None:
        self.prefill, self.decode = prefill, decode
        self.sglang = prefill.family.value == "sglang"
        self.rooms = iter(range(100, 200))

    async def run(self, prompt: list[int], max_tokens: int, times: list[float],
                  started: trio.Event | None = None) -> None:
        assert self.prefill.url is not None and self.decode.url is not None
        body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens}
        if self.sglang:
            assert self.prefill.pd is not None
            body.update(bootstrap_host="127.0.0.1", bootstrap_port=self.prefill.pd.bootstrap_port,
                        bootstrap_room=next(self.rooms))
            async with trio.open_nursery() as nursery:  # both legs at once
                nursery.start_soon(post, self.prefill, "/v1/completions", body)
                await stream_times(self.decode.url, body, times, started)
            return
        first = await post(self.prefill, "/v1/completions", {
            "prompt": prompt, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}})
        assert first.status == 200, first.body
        params = json.loads(first.body)["kv_transfer_params"]
        await stream_times(self.decode.url, {**body, "kv_transfer_params": params}, times,
                           started)


@pytest.mark.parametrize("flavor", FLAVORS)
async def test_a_long_prompt_stretches_an_aggregated_engines_gaps(autojump_clock, flavor):
    async with engines(("a0", flavor, None)) as (engine,):
        assert engine.url is not None
        stream: list[float] = []
        long: list[float] = []
        started = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream_times, engine.url,
                               {"prompt": STREAM_PROMPT, "max_tokens": STREAM_TOKENS}, stream,
                               started)
            await started.wait()
            nursery.start_soon(stream_times, engine.url,
                               {"prompt": LONG_PROMPT, "max_tokens": 2}, long)
    assert len(stream) == STREAM_TOKENS and len(long) == 2
    assert stream[0] < long[0] < stream[-1]  # the long prompt arrived mid-stream
    assert min(gaps(stream)) == pytest.approx(0.01)
    assert max(gaps(stream)) >= 0.5  # a decode waited for (or shared) a 512-token chunk


@pytest.mark.parametrize("flavor", FLAVORS)
async def test_a_decode_engine_keeps_its_gaps_while_a_long_prompt_arrives(autojump_clock,
                                                                          flavor):
    async with engines(("p0", flavor, "prefill"), ("d0", flavor, "decode")) as (
            prefill, decode):
        pair = PdPair(prefill, decode)
        stream: list[float] = []
        long: list[float] = []
        started = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pair.run, STREAM_PROMPT, STREAM_TOKENS, stream, started)
            await started.wait()
            nursery.start_soon(pair.run, LONG_PROMPT, 2, long)
        assert prefill.steppers[0].steps > 3  # the long prompt's chunks ran there
        assert prefill.pd is not None
        with trio.fail_after(5):  # the held KV is let go once the decode leg read it
            while prefill.load(0).kv_usage > 0:
                await prefill.pd.wait_changed()
        assert not decode.busy()
    assert len(stream) == STREAM_TOKENS and len(long) == 2
    assert stream[0] < long[0] < stream[-1]  # the long prompt joined the decode mid-stream
    assert max(gaps(stream)) == pytest.approx(0.01)  # every gap one decode-only step
