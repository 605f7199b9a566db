"""Anthropic Messages and OpenAI Responses through Cortex, over simulated engines.

* A repeat of a Messages / Responses request lands on the worker holding its prefix, routed
  ``exact_kv_events``, and Cortex's predicted cached tokens equal what the engine reports in
  the API's own usage shape — streamed and not; the body arrives as the engine sent it.
* A request Cortex cannot render exactly (``previous_response_id``: the conversation is the
  engine's) routes by load, counted in ``cortex_unpredicted_total{reason="engine_state"}``,
  and the engine's own answer is relayed with the decision headers; one continuing a response
  Cortex relayed goes to the worker that stored it (the others do not have it).
* Through a vLLM prefill/decode pair: the prefill leg generates one token (``max_tokens`` /
  ``max_output_tokens`` 1) and hands its KV to decode, whose answer the client gets.
* A worker answering 503 is retried around before the first byte, counted, as for chat.
* In a pool with an SGLang worker (which converts these APIs its own way) they route by load,
  counted ``engine_rendering``, and are served.
* The official ``anthropic`` (``messages.create`` / ``.stream`` / ``.count_tokens``) and
  ``openai`` (Responses) clients work through Cortex, streamed and not.
"""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
import trio

from cortex.pd.plan import PdSettings
from cortex.prompt.request_text import messages_prompt, responses_prompt
from cortex.sim.pd import PdSimSettings
from tests.gateway_cluster import MODEL, SYSTEM_TEXT, gateway_cluster, model_profile

MESSAGES = {"model": MODEL, "max_tokens": 4, "system": SYSTEM_TEXT,
            "messages": [{"role": "user", "content": "Say something."}]}
RESPONSES = {"model": MODEL, "max_output_tokens": 4, "instructions": SYSTEM_TEXT,
             "input": [{"role": "user", "content": [{"type": "input_text",
                                                     "text": "Say something."}]}]}


def reported(path: str, raw: bytes) -> int:
    """The engine's cached tokens, from the last event (or body) that reports them."""
    docs = [json.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: {")]
    found = None
    for doc in docs or [json.loads(raw)]:
        holder = doc.get("response") or doc.get("message") or doc
        usage = (holder or {}).get("usage") or doc.get("usage")
        if usage:
            found = (usage["input_tokens_details"]["cached_tokens"] if path == "/v1/responses"
                     else usage["cache_read_input_tokens"])
    assert found is not None, raw
    return found


def prompt_ids(path: str, body: dict) -> list[int]:
    profile = model_profile()
    render = messages_prompt if path == "/v1/messages" else responses_prompt
    prompt = render(body, profile.chat_templates)
    assert prompt is not None and prompt.text is not None
    return profile.tokenizer.encode(prompt.text, add_special_tokens=False).ids


async def test_repeats_land_on_the_holder_predicted_exactly():
    async with gateway_cluster(("vllm-0.33", "vllm-0.33")) as cluster:
        for path, body in (("/v1/messages", MESSAGES), ("/v1/responses", RESPONSES)):
            for stream in (False, True):
                sent = {**body, "stream": stream}
                first = await cluster.request(path, sent)
                assert first.status == 200, first.body
                worker = first.header(b"x-cortex-assigned-worker")
                ids = prompt_ids(path, body)
                blocks = (len(ids) - 1) // cluster.config.models[0].block_size
                await cluster.until(lambda ids=ids, worker=worker: cluster.held(ids).get(
                    worker.decode(), 0) >= blocks)
                again = await cluster.request(path, sent)
                assert again.status == 200, again.body
                assert again.header(b"x-cortex-assigned-worker") == worker
                assert again.header(b"x-cortex-match-mode") == b"exact_kv_events"
                predicted = int(again.header(b"x-cortex-cache-hit-tokens"))
                assert predicted == reported(path, again.body) > 0
                if stream:
                    assert again.body.startswith(b"event: ")  # the engine's framing, as sent


async def test_what_cortex_cannot_render_routes_by_load_counted():
    async with gateway_cluster(("vllm-0.33", "vllm-0.33")) as cluster:
        answer = await cluster.request("/v1/responses",
                                       {**RESPONSES, "previous_response_id": "resp_1"})
        assert answer.status == 404  # the engine's own answer (no such response), relayed
        assert answer.header(b"x-cortex-match-mode") is not None
        assert int(answer.header(b"x-cortex-cache-hit-tokens")) == 0
        text = (await cluster.admin(b"GET", b"/metrics")).body.decode()
        assert f'cortex_unpredicted_total{{model="{MODEL}",reason="engine_state"}} 1' in text


async def test_a_continuation_goes_to_the_worker_that_stored_the_response():
    async with gateway_cluster(("vllm-0.33", "vllm-0.33", "vllm-0.33"),
                               timing_changes={"decode_s_per_token": 0.01}) as cluster:
        stored = {}  # response id -> the worker that answered it

        async def first(i: int) -> None:  # side by side: in-flight load spreads them
            # (each its own instructions: a prefix the six shared would pull them, in flight,
            # to the worker computing it)
            answer = await cluster.request("/v1/responses", {
                **RESPONSES, "instructions": f"{i} {SYSTEM_TEXT}", "input": f"Question {i}?",
                "max_output_tokens": 40, "stream": i % 2 == 1})
            assert answer.status == 200, answer.body
            text = answer.body.decode()
            stored[text[text.index('"id":"') + 6:].split('"', 1)[0]] = answer.header(
                b"x-cortex-assigned-worker")

        async with trio.open_nursery() as nursery:
            for i in range(6):
                nursery.start_soon(first, i)
        assert len(set(stored.values())) > 1  # answers spread: load alone would miss some
        for response_id, owner in stored.items():
            again = await cluster.request("/v1/responses", {
                **RESPONSES, "input": "and then?", "previous_response_id": response_id})
            assert again.status == 200, again.body
            assert again.header(b"x-cortex-assigned-worker") == owner


async def test_a_failing_worker_is_retried_around_before_the_first_byte():
    async with gateway_cluster(("vllm-0.33", "vllm-0.33")) as cluster:
        first = await cluster.request("/v1/messages", MESSAGES)
        owner = first.header(b"x-cortex-assigned-worker").decode()
        failing = next(engine for engine in cluster.engines if engine.name == owner)
        failing.faults.fail_status = 503  # the holder of the prefix now fails
        for path, body in (("/v1/messages", MESSAGES), ("/v1/responses", RESPONSES)):
            answer = await cluster.request(path, {**body, "stream": True})
            assert answer.status == 200, answer.body
            assert answer.header(b"x-cortex-assigned-worker").decode() != owner
            assert answer.header(b"x-cortex-attempts") == b"2"
        text = cluster.running.metrics.render().decode()
        assert f'cortex_upstream_errors_total{{worker="{owner}",phase="head",status="503"}} 2' \
            in text


@pytest.mark.parametrize("engine_model", ["fixed", "batching"])
async def test_through_a_vllm_prefill_decode_pair(engine_model):
    settings = PdSimSettings(waiting_timeout_s=5.0, bootstrap_timeout_s=5.0, kv_lease_s=5.0)
    async with gateway_cluster(("vllm-0.33", "vllm-0.33"), roles=("prefill", "decode"),
                               engine_model=engine_model,
                               pd_settings=settings, config_changes={
                                   "pd": PdSettings(bypass_max_uncached_tokens=0)}) as cluster:
        for path, body in (("/v1/messages", MESSAGES), ("/v1/responses", RESPONSES)):
            for stream in (False, True):
                answer = await cluster.request(path, {**body, "stream": stream})
                assert answer.status == 200, answer.body
                assert (answer.header(b"x-cortex-prefill-worker"),
                        answer.header(b"x-cortex-decode-worker")) == (b"e0", b"e1")
        prefill, decode = cluster.engines
        assert prefill.counters[0].requests == decode.counters[0].requests == 4
        assert prefill.counters[0].generation_tokens == 4  # one token per prefill leg


async def test_a_pool_with_another_engine_routes_these_apis_by_load():
    async with gateway_cluster(("vllm-0.33", "sglang-0.5.23")) as cluster:
        for path, body in (("/v1/messages", MESSAGES), ("/v1/responses", RESPONSES)):
            for _ in range(2):
                answer = await cluster.request(path, body)
                assert answer.status == 200, answer.body
                assert int(answer.header(b"x-cortex-cache-hit-tokens")) == 0
        text = (await cluster.admin(b"GET", b"/metrics")).body.decode()
        assert (f'cortex_unpredicted_total{{model="{MODEL}",reason="engine_rendering"}} 4'
                in text)


def use_clients(port: int) -> dict[str, object]:
    ant = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="unused",
                              max_retries=0, timeout=30)
    oai = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                        max_retries=0, timeout=30)
    body = {k: v for k, v in MESSAGES.items() if k != "model"}
    message = ant.messages.create(model=MODEL, **body)
    counted = ant.messages.count_tokens(model=MODEL, system=body["system"],
                                        messages=body["messages"])
    with ant.messages.stream(model=MODEL, **body) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    body = {k: v for k, v in RESPONSES.items() if k != "model"}
    raw = oai.responses.with_raw_response.create(model=MODEL, **body)
    events = list(oai.responses.create(model=MODEL, stream=True, **body))
    ant.close()
    oai.close()
    return {"message": message, "counted": counted, "streamed": streamed, "final": final, "headers": raw.headers,
            "response": raw.parse(), "events": events}


async def test_the_official_clients_work_through_cortex():
    async with gateway_cluster(("vllm-0.33", "vllm-0.33")) as cluster:
        seen = await trio.to_thread.run_sync(use_clients, cluster.port)
    message, final = seen["message"], seen["final"]
    assert message.content[0].text and message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 4
    assert seen["counted"].input_tokens == len(prompt_ids("/v1/messages", MESSAGES)) == (
        message.usage.input_tokens + message.usage.cache_read_input_tokens)
    assert seen["streamed"] == final.content[0].text and final.usage.cache_read_input_tokens
    response = seen["response"]
    assert response.output_text and response.usage.output_tokens == 4
    assert seen["headers"]["x-cortex-match-mode"] == "exact_kv_events"
    assert int(seen["headers"]["x-cortex-cache-hit-tokens"]) == (
        response.usage.input_tokens_details.cached_tokens)
    events = seen["events"]
    assert events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta")
