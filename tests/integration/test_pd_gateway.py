"""Issue 6 acceptance: Cortex in front of simulated PD clusters of both flavors, real sockets.

The simulated prefill and decode engines behave like the real ones on the wire
(``cortex.sim.pd``): an SGLang decode engine without its room's KV fails the request, a vLLM
decode engine fails on unknown ``kv_transfer_params``, so a wrong orchestration fails here.
Every test runs on both engine timing models (``engine_model``): the fixed one and the
continuous-batching one (whose prefill legs hold their blocks in the model and whose decode
legs join it with their prompt's KV received).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from cortex.pd.plan import PdSettings
from cortex.sim.engine import SimEngine
from cortex.sim.pd import PdSimSettings
from tests.front_http_client import RawClient, chat_request, read_broken_stream
from tests.gateway_cluster import MODEL, SYSTEM_TEXT, Cluster, gateway_cluster

FLAVORS = {"sglang": "sglang-0.5.23", "vllm": "vllm-0.33"}
ENGINE_MODELS = ("fixed", "batching")
pytestmark = pytest.mark.parametrize("engine_model", ENGINE_MODELS)
SHORT = PdSimSettings(waiting_timeout_s=5.0, bootstrap_timeout_s=5.0, kv_lease_s=5.0)
NO_BYPASS = PdSettings(bypass_max_uncached_tokens=0)


def messages(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_TEXT}, {"role": "user", "content": question}]


def chat_body(question: str, **extra: Any) -> bytes:
    return json.dumps({"model": MODEL, "max_tokens": 6, "messages": messages(question),
                       **extra}).encode()


def streamed_text(body: bytes) -> str:
    text = ""
    for line in body.split(b"\n"):
        if line.startswith(b"data: {"):
            for choice in json.loads(line[6:])["choices"]:
                text += choice.get("delta", {}).get("content") or ""
    return text


def engine(cluster: Cluster, name: str) -> SimEngine:
    return next(e for e in cluster.engines if e.name == name)


async def all_clean(cluster: Cluster, timeout_s: float = 10.0) -> None:
    """Until no engine holds a room, a pinned transfer, a waiting decode or a running request,
    and the gateway counts nothing in flight."""
    pool = cluster.running.pools[MODEL]

    def clean() -> bool:
        return all((e.pd is None or e.pd.idle()) and not e.busy()
                   and not pool.pending.in_flight(e.name) for e in cluster.engines)

    with trio.fail_after(timeout_s):
        while not clean():
            await trio.sleep(0.01)


def pd_cluster(flavor: str, roles: tuple[str, ...], engine_model: str = "fixed",
               **kwargs: Any) -> Any:
    """A PD cluster on ``engine_model``; vLLM's bypass is off unless asked for (a shared system
    prompt cached on decode would otherwise skip the prefill leg of every later request)."""
    kwargs.setdefault("pd_settings", SHORT)
    kwargs.setdefault("config_changes", {"pd": NO_BYPASS})
    return gateway_cluster((FLAVORS[flavor],) * len(roles), roles=roles,
                           engine_model=engine_model, **kwargs)


@pytest.mark.parametrize("flavor", sorted(FLAVORS))
async def test_streamed_and_whole_answers_through_the_pd_pair(flavor, engine_model):
    async with pd_cluster(flavor, ("prefill", "decode"), engine_model) as cluster:
        client = await RawClient.connect(cluster.port)
        response = await client.request(b"POST", b"/v1/chat/completions", chat_body(
            "Stream through two engines.", stream=True, stream_options={"include_usage": True}),
            [(b"content-type", b"application/json")])
        assert response.status == 200, response.body
        assert response.header(b"x-cortex-prefill-worker") == b"e0"
        assert response.header(b"x-cortex-decode-worker") == b"e1"
        assert response.header(b"x-cortex-pd") == flavor.encode()
        assert response.header(b"content-type").startswith(b"text/event-stream")
        assert streamed_text(response.body) == " The quick brown fox jumps over"
        assert response.body.endswith(b"data: [DONE]\n\n")

        whole = await client.request(b"POST", b"/v1/chat/completions",
                                     chat_body("And in one piece?"))
        assert whole.status == 200, whole.body
        answer = json.loads(whole.body)
        assert answer["choices"][0]["message"]["content"] == " The quick brown fox jumps over"
        assert whole.header(b"x-cortex-decode-worker") == b"e1"
        await client.aclose()
        prefill, decode = cluster.engines
        assert bool(prefill.steppers) == bool(decode.steppers) == (engine_model == "batching")
        assert prefill.counters[0].requests == decode.counters[0].requests == 2
        assert prefill.counters[0].generation_tokens == 2  # one token per prefill leg
        assert cluster.running.gateway.pd.counters.served == 2  # type: ignore[attr-defined]
        await all_clean(cluster)
        # the prefill legs' KV was held for the decode legs, then let go
        assert prefill.load(0).kv_usage == decode.load(0).kv_usage == 0.0


def metric(text: str, line_start: str) -> float:
    """The value of the one exposition line starting with ``line_start``; 0 if none."""
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(line_start)]
    assert len(values) <= 1, values
    return values[0] if values else 0.0


@pytest.mark.parametrize("flavor", sorted(FLAVORS))
async def test_pd_decisions_and_the_prefill_engines_cached_tokens_are_measured(
        flavor, engine_model):
    """Metrics see PD traffic as they see single-worker traffic: one decision per request and
    the prefill engine's cached-token report against the prediction for the prefill pick."""
    async with pd_cluster(flavor, ("prefill", "decode"), engine_model) as cluster:
        client = await RawClient.connect(cluster.port)
        predicted = 0
        for question in ("First of two.", "Second of two."):
            response = await client.request(b"POST", b"/v1/chat/completions",
                                            chat_body(question))
            assert response.status == 200, response.body
            predicted += int(response.header(b"x-cortex-cache-hit-tokens"))
            # the prefill engine's KV events reach the ledger after its answer: wait for them
            # so the second request is routed against the prefix the first one left there
            await cluster.until(lambda: cluster.holders(messages("x")).get("e0", 0) > 0)
        await client.aclose()
        assert predicted > 0  # the second request's system prompt sits on the prefill engine
        text = cluster.running.metrics.render().decode()
        model = f'{{model="{MODEL}"}}'
        assert metric(text, f"cortex_cached_tokens_predicted_total{model}") == predicted
        assert metric(text, f"cortex_cached_tokens_reported_total{model}") == predicted
        assert metric(text, f"cortex_cached_tokens_exact_total{model}") == 2
        decisions = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                        if line.startswith(f'cortex_decisions_total{{model="{MODEL}"'))
        assert decisions == 2


@pytest.mark.parametrize("flavor", sorted(FLAVORS))
async def test_prefill_killed_before_decode_starts_is_retried_on_another_prefill(
        flavor, engine_model):
    async with pd_cluster(flavor, ("prefill", "prefill", "decode"), engine_model) as cluster:
        warm = await cluster.chat(messages("Who prefills this prefix?"))
        assert warm.status == 200, warm.body
        holder = warm.header(b"x-cortex-prefill-worker").decode()
        await cluster.until(lambda: cluster.holders(messages("x")).get(holder, 0) > 0)
        cluster.stop_engine(holder)  # the prefix's holder dies: connection refused
        for question in ("Still there?", "And now?"):
            response = await cluster.chat(messages(question))
            assert response.status == 200, response.body
            assert response.header(b"x-cortex-prefill-worker").decode() != holder
            assert json.loads(response.body)["choices"][0]["message"]["content"] == (
                " The quick brown fox")
        alive = [e for e in cluster.engines if e.name != holder]
        with trio.fail_after(10):
            while not all((e.pd is None or e.pd.idle()) and not e.busy() for e in alive):
                await trio.sleep(0.01)


@pytest.mark.parametrize("flavor", sorted(FLAVORS))
async def test_decode_killed_before_its_answer_is_retried_on_another_decode(flavor, engine_model):
    async with pd_cluster(flavor, ("prefill", "decode", "decode"), engine_model) as cluster:
        cluster.stop_engine("e1")
        for question in ("Which decode?", "And this one?", "Once more?"):
            response = await cluster.chat(messages(question))
            assert response.status == 200, response.body
            assert response.header(b"x-cortex-decode-worker") == b"e2"
            assert json.loads(response.body)["choices"][0]["message"]["content"] == (
                " The quick brown fox")
        alive = [engine(cluster, "e0"), engine(cluster, "e2")]
        with trio.fail_after(10):
            while not all(e.pd.idle() and not e.busy() for e in alive):  # type: ignore[union-attr]
                await trio.sleep(0.01)


@pytest.mark.parametrize("flavor", sorted(FLAVORS))
async def test_only_prefill_killed_falls_back_to_a_both_worker(flavor, engine_model):
    async with pd_cluster(flavor, ("prefill", "decode", "both"), engine_model) as cluster:
        cluster.stop_engine("e0")
        response = await cluster.chat(messages("Who answers now?"))
        assert response.status == 200, response.body
        assert response.header(b"x-cortex-assigned-worker") == b"e2"
        assert json.loads(response.body)["choices"][0]["message"]["content"] == (
            " The quick brown fox")
        decode = engine(cluster, "e1")
        with trio.fail_after(10):
            while not decode.pd.idle() or decode.busy():  # type: ignore[union-attr]
                await trio.sleep(0.01)


@pytest.mark.parametrize("flavor", sorted(FLAVORS))
async def test_decode_dying_mid_stream_ends_the_stream_and_cleans_both_legs(flavor, engine_model):
    async with pd_cluster(flavor, ("prefill", "decode"), engine_model) as cluster:
        engine(cluster, "e1").faults.update({"die_after_chunks": 2})
        client = await RawClient.connect(cluster.port)
        await client.send(chat_request(chat_body("Die halfway.", stream=True, max_tokens=20)))
        with trio.fail_after(10):
            status, headers, _ = await client.read_head()
            assert status == 200
            assert dict(headers)[b"x-cortex-decode-worker"] == b"e1"
            chunks = await read_broken_stream(client)
        assert b"[DONE]" not in b"".join(chunks)
        await client.aclose()
        await all_clean(cluster)
        assert engine(cluster, "e1").counters[0].aborted == 1


@pytest.mark.parametrize("flavor", sorted(FLAVORS))
async def test_client_leaving_mid_stream_aborts_the_decode_leg(flavor, engine_model):
    slow = {"decode_s_per_token": 0.05}
    async with pd_cluster(flavor, ("prefill", "decode"), engine_model,
                          timing_changes=slow) as cluster:
        client = await RawClient.connect(cluster.port)
        await client.send(chat_request(chat_body("A long answer.", stream=True,
                                                  max_tokens=10_000)))
        with trio.fail_after(10):
            status, _, _ = await client.read_head()
            assert status == 200
            assert await client.read_chunk()
        assert engine(cluster, "e1").load(0).running == 1
        await client.aclose()
        await all_clean(cluster)
        assert engine(cluster, "e1").counters[0].aborted == 1


@pytest.mark.parametrize("flavor", sorted(FLAVORS))
async def test_client_leaving_during_prefill_aborts_both_legs(flavor, engine_model):
    async with pd_cluster(flavor, ("prefill", "decode"), engine_model,
                          pd_settings=PdSimSettings()) as cluster:
        prefill = engine(cluster, "e0")
        prefill.faults.update({"slow_s": 30.0})  # prefill still busy when the client leaves
        client = await RawClient.connect(cluster.port)
        await client.send(chat_request(chat_body("Never mind.", stream=True)))
        pool = cluster.running.pools[MODEL]
        with trio.fail_after(10):  # the prefill leg is in flight (SGLang: decode's too)
            while not pool.pending.in_flight("e0"):
                await trio.sleep(0.01)
        if flavor == "sglang":
            with trio.fail_after(10):  # decode waits for the room on the prefill's bootstrap
                while not engine(cluster, "e1").pd.waiting:  # type: ignore[union-attr]
                    await trio.sleep(0.01)
        await client.abort()  # a real disconnect: a half-close would still be answered
        await all_clean(cluster)  # SGLang's default 300 s wait would otherwise hold decode


async def test_vllm_bypass_when_decode_holds_the_prefix(engine_model):
    async with pd_cluster("vllm", ("prefill", "decode"), engine_model,
                          config_changes={"pd": PdSettings()}) as cluster:
        question = messages("Cache this on decode.")
        first = await cluster.chat(question)
        assert first.status == 200, first.body
        assert first.header(b"x-cortex-decode-worker") == b"e1"
        # decode published the blocks it received: the ledger credits it with the prefix
        await cluster.until(lambda: cluster.holders(question).get("e1", 0) > 0)
        prefill = engine(cluster, "e0")
        before = prefill.counters[0].requests
        second = await cluster.chat(question)
        assert second.status == 200, second.body
        assert second.header(b"x-cortex-assigned-worker") == b"e1"
        assert second.header(b"x-cortex-prefill-worker") is None
        assert prefill.counters[0].requests == before  # no prefill leg
        answer = json.loads(second.body)
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        assert cluster.running.gateway.pd.counters.bypassed == 1  # type: ignore[attr-defined]
        await all_clean(cluster)


@pytest.mark.parametrize("stream", [False, True])
async def test_sglang_prefill_input_logprobs_reach_the_client(stream, engine_model):
    async with pd_cluster("sglang", ("prefill", "decode"), engine_model) as cluster:
        body = json.dumps({"model": MODEL, "text": SYSTEM_TEXT + "Logprobs, please.",
                           "sampling_params": {"max_new_tokens": 3}, "return_logprob": True,
                           "stream": stream}).encode()
        client = await RawClient.connect(cluster.port)
        response = await client.request(b"POST", b"/generate", body,
                                        [(b"content-type", b"application/json")])
        await client.aclose()
        assert response.status == 200, response.body
        assert response.header(b"x-cortex-prefill-worker") == b"e0"
        if stream:
            payloads = [json.loads(line[6:]) for line in response.body.split(b"\n")
                        if line.startswith(b"data: {")]
            assert len(payloads) == 3
        else:
            payloads = [json.loads(response.body)]
        for payload in payloads:  # decode's own list is empty: all of it is prefill's
            meta = payload["meta_info"]
            assert len(meta["input_token_logprobs"]) == meta["prompt_tokens"] > 200
            assert meta["input_token_logprobs"][0][0] is None
        assert payloads[-1]["text"] == " The quick brown"
        await all_clean(cluster)


async def test_sglang_batch_gets_one_room_per_item_through_cortex(engine_model):
    async with pd_cluster("sglang", ("prefill", "decode"), engine_model) as cluster:
        body = json.dumps({"model": MODEL, "text": ["One prompt.", "Another prompt here."],
                           "sampling_params": {"max_new_tokens": 2}}).encode()
        client = await RawClient.connect(cluster.port)
        response = await client.request(b"POST", b"/generate", body,
                                        [(b"content-type", b"application/json")])
        await client.aclose()
        assert response.status == 200, response.body
        assert response.header(b"x-cortex-decode-worker") == b"e1"
        assert [item["text"] for item in json.loads(response.body)] == [" The quick"] * 2
        await all_clean(cluster)
