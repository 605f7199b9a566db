"""The simulated engine's HTTP handler, called directly (no sockets): routes, shapes, cache
hits, DP ranks, faults and aborts. The KV side runs for real (ZeroMQ publishers on loopback).

The engine's timing is trio's clock only (its steps, token times and faults sleep on it) and
no test here waits on the publishers' sockets (nothing subscribes), so where time is what a
test looks at (a delay, a hang, a time to first token, a request kept running by a slow
decode) it runs on trio's ``MockClock`` (``autojump_clock``): exact, and no real waiting."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from cortex.errors import BadRequest, NotFound
from cortex.front.messages import HttpRequest, HttpResponse
from cortex.sim.engine import SimEngine
from cortex.sim.http_faults import EngineCrashed
from cortex.sim.serving import TimingConfig
from tests import deepseek_profile as ds
from tests.sim_engine_profile import SYSTEM, chat, deepseek

FAST = TimingConfig(prefill_tokens_per_s=1e6, decode_s_per_token=0.0, max_running=8)


@asynccontextmanager
async def kv_running(engine: SimEngine) -> AsyncIterator[SimEngine]:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.kv.run)
            yield engine
            nursery.cancel_scope.cancel()


def make(flavor: str = "vllm-0.33", **kwargs: Any) -> SimEngine:
    kwargs.setdefault("timing", FAST)
    return SimEngine("e1", flavor, deepseek(), **kwargs)


def post(path: str, body: dict[str, Any], headers: list[tuple[bytes, bytes]] | None = None
         ) -> HttpRequest:
    return HttpRequest(b"POST", path.encode(), headers or [], json.dumps(body).encode())


def get(path: str) -> HttpRequest:
    return HttpRequest(b"GET", path.encode(), [])


def payload(response: HttpResponse) -> Any:
    assert isinstance(response.body, bytes)
    return json.loads(response.body)


async def sse_events(response: HttpResponse) -> list[Any]:
    """Every ``data:`` event of a streamed body (``[DONE]`` kept as the string)."""
    assert response.headers[0] == (b"content-type", b"text/event-stream; charset=utf-8")
    body = response.body
    assert not isinstance(body, bytes)
    events = []
    try:
        async for chunk in body:
            assert chunk.startswith(b"data: ") and chunk.endswith(b"\n\n")
            data = chunk[6:-2]
            events.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    finally:
        await body.aclose()  # type: ignore[attr-defined]
    return events


# ---------------------------------------------------------------- OpenAI routes


async def test_chat_json_reports_the_cache_hit_of_a_repeated_prompt():
    engine = make()
    async with kv_running(engine):
        first = payload(await engine.handler(post("/v1/chat/completions", chat(max_tokens=5))))
        again = payload(await engine.handler(post("/v1/chat/completions", chat(max_tokens=5))))
    assert first["object"] == "chat.completion"
    assert first["model"] == "deepseek"
    choice = first["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": " The quick brown fox jumps"}
    assert choice["finish_reason"] == "length"
    expected = ds.tokenizer().encode(
        ds.BOS + SYSTEM + "<｜User｜>What is 2+2?<｜Assistant｜>", add_special_tokens=False).ids
    usage = first["usage"]
    assert usage["prompt_tokens"] == len(expected)
    assert usage["completion_tokens"] == 5
    assert usage["total_tokens"] == len(expected) + 5
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == (len(expected) - 1) // 16 * 16 > 0  # vLLM recomputes the last token
    assert engine.counters[0].cached_tokens == cached
    assert (engine.queues[0].running, engine.queues[0].waiting) == (0, 0)


async def test_chat_sse_has_role_tokens_finish_usage_and_done():
    engine = make()
    body = chat(max_tokens=3, stream=True, stream_options={"include_usage": True})
    async with kv_running(engine):
        events = await sse_events(await engine.handler(post("/v1/chat/completions", body)))
    assert events[-1] == "[DONE]"
    role, *tokens, usage = events[:-1]
    assert role["object"] == "chat.completion.chunk"
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [t["choices"][0]["delta"]["content"] for t in tokens] == [" The", " quick", " brown"]
    assert [t["choices"][0]["finish_reason"] for t in tokens] == [None, None, "length"]
    assert len({e["id"] for e in events[:-1]}) == 1
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 3
    assert "prompt_tokens_details" in usage["usage"]


async def test_chat_sse_without_include_usage_has_no_usage_event():
    engine = make()
    async with kv_running(engine):
        events = await sse_events(await engine.handler(
            post("/v1/chat/completions", chat(max_tokens=2, stream=True))))
    assert len(events) == 1 + 2 + 1
    assert all("usage" not in e for e in events[:-1])


async def test_completions_with_token_ids_json_and_sse():
    engine = make()
    prompt = list(range(100, 164))  # 4 blocks
    async with kv_running(engine):
        first = payload(await engine.handler(
            post("/v1/completions", {"model": "deepseek", "prompt": prompt, "max_tokens": 2})))
        events = await sse_events(await engine.handler(post("/v1/completions", {
            "model": "deepseek", "prompt": prompt, "max_tokens": 2, "stream": True,
            "stream_options": {"include_usage": True}})))
    assert first["object"] == "text_completion"
    assert first["choices"][0]["text"] == " The quick"
    assert first["usage"]["prompt_tokens"] == 64
    assert [e["object"] for e in events[:-1]] == ["text_completion"] * 3
    assert [e["choices"][0]["text"] for e in events[:2]] == [" The", " quick"]
    assert events[2]["usage"]["prompt_tokens_details"]["cached_tokens"] == 48
    assert events[-1] == "[DONE]"


async def test_completions_text_is_one_full_encode_with_special_tokens():
    engine = make()
    text = "The quick brown fox jumps over the lazy dog. " * 5
    async with kv_running(engine):
        answer = payload(await engine.handler(
            post("/v1/completions", {"model": "deepseek", "prompt": text, "max_tokens": 1})))
    assert answer["usage"]["prompt_tokens"] == len(ds.tokenizer().encode(text).ids)


async def test_bad_requests_are_refused_in_vllms_error_shapes():
    engine = make()
    async with kv_running(engine):
        refused = [await engine.handler(post("/v1/completions", bad)) for bad in (
            {"model": "deepseek", "prompt": [[1, 2], [3, 4]]},
            {"model": "deepseek", "prompt": "x", "max_tokens": 0},
            {"model": "deepseek", "prompt": "x", "n": 2},
            {"model": "deepseek", "prompt": [-1]})]
        refused.append(await engine.handler(
            HttpRequest(b"POST", b"/v1/completions", [], b"{nope")))
        unknown = await engine.handler(post("/v1/completions", {"model": "other", "prompt": "x"}))
        with pytest.raises(NotFound):
            await engine.handler(get("/generate"))  # SGLang only: no such route
    for answer in refused:  # FastAPI's validation answer (vLLM's handler for it)
        assert answer.status == 400
        error = payload(answer)["error"]
        assert (error["type"], error["param"], error["code"]) == ("Bad Request", None, 400)
    assert unknown.status == 404  # vLLM: unknown model
    assert payload(unknown) == {"error": {"message": "The model `other` does not exist.",
                                          "type": "NotFoundError", "param": None, "code": 404}}
    assert engine.queues[0].running == 0


async def test_errors_take_each_routes_shape_in_each_flavor():
    bad_chat = {"model": "deepseek", "messages": [{"role": "user", "content": [
        {"type": [], "text": "x"}]}]}
    bad_messages = {"model": "deepseek", "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "text", "text": True}]}]}
    for flavor in ("vllm-0.33", "sglang-0.5.23"):
        engine = make(flavor)
        async with kv_running(engine):
            chat_answer = await engine.handler(post("/v1/chat/completions", bad_chat))
            messages_answer = await engine.handler(post("/v1/messages", bad_messages))
            responses_answer = await engine.handler(post("/v1/responses", {
                "model": "deepseek", "input": "x", "previous_response_id": ["x"]}))
            if flavor.startswith("sglang"):
                generate_answer = await engine.handler(post("/generate", {"text": 5}))
        answers = (chat_answer, messages_answer, responses_answer)
        assert [a.status for a in answers] == [400, 400, 400]
        if flavor.startswith("vllm"):  # one shape for every route's validation
            assert all(set(payload(a)["error"]) == {"message", "type", "param", "code"}
                       and payload(a)["error"]["type"] == "Bad Request" for a in answers)
        else:  # SGLang: flat, but nested on /v1/responses; /generate as its route writes
            assert payload(chat_answer)["object"] == "error"
            assert payload(messages_answer)["type"] == "Bad Request"
            assert payload(responses_answer)["error"]["type"] == "Bad Request"
            assert generate_answer.status == 400
            assert payload(generate_answer)["object"] == "error"


# ---------------------------------------------------------------- SGLang /generate


async def test_generate_text_and_input_ids_json_and_sse():
    engine = make("sglang-0.5.23")
    ids = list(range(500, 540))
    async with kv_running(engine):
        first = payload(await engine.handler(post("/generate", {
            "input_ids": ids, "sampling_params": {"max_new_tokens": 3}})))
        events = await sse_events(await engine.handler(post("/generate", {
            "input_ids": ids, "sampling_params": {"max_new_tokens": 3}, "stream": True})))
        text = payload(await engine.handler(post("/generate", {"text": "hello there"})))
    assert first["text"] == " The quick brown"
    assert first["output_ids"] == [1000, 1001, 1002]
    meta = first["meta_info"]
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"]) == (40, 3, 0)
    assert meta["finish_reason"] == {"type": "length", "length": 3}
    assert events[-1] == "[DONE]"
    assert [e["text"] for e in events[:-1]] == [" The", " The quick", " The quick brown"]
    assert [e["meta_info"]["finish_reason"] for e in events[:-1]][:2] == [None, None]
    assert events[0]["meta_info"]["cached_tokens"] == 32
    assert text["meta_info"]["prompt_tokens"] == len(ds.tokenizer().encode("hello there").ids)
    assert text["meta_info"]["completion_tokens"] == 16  # the default


# ---------------------------------------------------------------- DP ranks


async def test_vllm_rank_comes_from_the_header():
    engine = make(dp_size=2)
    body = {"model": "deepseek", "prompt": list(range(40)), "max_tokens": 1}
    async with kv_running(engine):
        await engine.handler(post("/v1/completions", body, [(b"x-data-parallel-rank", b"1")]))
        assert engine.kv.truth(0) == set() and len(engine.kv.truth(1)) == 2
        await engine.handler(post("/v1/completions", body, [(b"x-data-parallel-rank", b"x")]))
        assert len(engine.kv.truth(0)) == 2  # not an integer: ignored, rank 0
        refused = await engine.handler(
            post("/v1/completions", body, [(b"x-data-parallel-rank", b"2")]))
        assert refused.status == 400


async def test_sglang_rank_comes_from_routed_dp_rank():
    engine = make("sglang-0.5.23", dp_size=2)
    async with kv_running(engine):
        await engine.handler(post("/generate", {"input_ids": list(range(40)),
                                                "routed_dp_rank": 1}))
        assert engine.kv.truth(0) == set() and len(engine.kv.truth(1)) == 2
        refused = await engine.handler(post("/generate", {"input_ids": [1],
                                                          "routed_dp_rank": 5}))
        assert refused.status == 400


# ---------------------------------------------------------------- information routes


async def test_vllm_information_routes():
    engine = make(dp_size=2)
    async with kv_running(engine):
        await engine.handler(post("/v1/completions",
                                  {"prompt": list(range(64)), "max_tokens": 2}))
        models = payload(await engine.handler(get("/v1/models")))
        version = payload(await engine.handler(get("/version")))
        sources = payload(await engine.handler(get("/kv_event_sources")))
        health = await engine.handler(get("/health"))
        metrics = await engine.handler(get("/metrics"))
        endpoints = [engine.kv.endpoints(r) for r in range(2)]
    assert models["object"] == "list"
    assert [(m["id"], m["owned_by"]) for m in models["data"]] == [("deepseek", "vllm")]
    assert version == {"version": "0.33.0"}
    assert sorted(sources) == ["0", "1"]
    assert [sources[str(r)]["endpoint"] for r in range(2)] == [e.pub for e in endpoints]
    assert [sources[str(r)]["replay_endpoint"] for r in range(2)] == [e.replay for e in endpoints]
    assert health.status == 200 and health.body == b""
    assert isinstance(metrics.body, bytes)
    samples = {(s.name, s.labels.get("engine")): s
               for family in text_string_to_metric_families(metrics.body.decode())
               for s in family.samples}
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc"):
        for rank in "01":
            assert samples[(name, rank)].labels == {"engine": rank, "model_name": "deepseek"}
    assert samples[("vllm:num_requests_running", "0")].value == 0
    assert samples[("vllm:kv_cache_usage_perc", "0")].value == 0  # nothing runs
    assert samples[("vllm:prompt_tokens_total", "0")].value == 64
    assert samples[("vllm:generation_tokens_total", "0")].value == 2


async def test_sglang_information_routes():
    engine = make("sglang-0.5.23", dp_size=2, block_size=8)
    async with kv_running(engine):
        await engine.handler(post("/generate", {"input_ids": list(range(20))}))
        info = payload(await engine.handler(get("/server_info")))
        loads = payload(await engine.handler(get("/v1/loads")))
        one = payload(await engine.handler(get("/v1/loads?dp_rank=1")))
        models = payload(await engine.handler(get("/v1/models")))
        base = engine.kv.base_port
    assert (info["page_size"], info["dp_size"], info["served_model_name"]) == (8, 2, "deepseek")
    assert info["version"] == "0.5.23"
    events = info["kv_events"]
    assert events["endpoint_port_base"] == base
    assert events["replay_endpoint_port_base"] == engine.kv.replay_base_port
    assert (events["block_size"], events["dp_size"], events["publisher"]) == (8, 2, "zmq")
    assert [entry["dp_rank"] for entry in loads["loads"]] == [0, 1]
    rank0 = loads["loads"][0]
    assert (rank0["num_running_reqs"], rank0["num_waiting_reqs"]) == (0, 0)
    assert (rank0["num_used_tokens"], rank0["token_usage"]) == (0, 0)  # nothing runs
    assert rank0["num_cached_tokens"] == 16
    assert [entry["dp_rank"] for entry in one["loads"]] == [1]
    assert models["data"][0]["owned_by"] == "sglang"


@pytest.mark.parametrize("flavor", ["vllm-0.33", "sglang-0.5.23"])
async def test_load_endpoints_count_running_requests_and_their_tokens(autojump_clock, flavor):
    engine = make(flavor,
                  timing=TimingConfig(prefill_tokens_per_s=1e6, decode_s_per_token=10.0))
    total = 4096 * 16
    async with kv_running(engine), trio.open_nursery() as nursery:
        nursery.start_soon(engine.handler, post("/v1/completions", {
            "prompt": list(range(40)), "max_tokens": 3}))
        while not engine.running[0]:
            await trio.sleep(0.001)
        if flavor.startswith("vllm"):
            response = await engine.handler(get("/metrics"))
            assert isinstance(response.body, bytes)
            values = {s.name: s.value
                      for f in text_string_to_metric_families(response.body.decode())
                      for s in f.samples}
            running, waiting = (values["vllm:num_requests_running"],
                                values["vllm:num_requests_waiting"])
            used = values["vllm:kv_cache_usage_perc"] * total
        else:
            (load,) = payload(await engine.handler(get("/v1/loads")))["loads"]
            running, waiting = load["num_running_reqs"], load["num_waiting_reqs"]
            used = load["num_used_tokens"]
        nursery.cancel_scope.cancel()
    assert (running, waiting) == (1, 0)
    assert 40 <= round(used) <= 41  # the prompt, and the first token once it is out


async def test_flush_cache_clears_when_idle_and_refuses_while_busy(autojump_clock):
    engine = make("sglang-0.5.23",
                  timing=TimingConfig(prefill_tokens_per_s=1e6, decode_s_per_token=10.0))
    async with kv_running(engine):
        await engine.handler(post("/generate", {"input_ids": list(range(40)),
                                                "sampling_params": {"max_new_tokens": 1}}))
        assert engine.kv.truth(0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(engine.handler, post("/generate", {"input_ids": [1, 2, 3]}))
            while not engine.queues[0].running:
                await trio.sleep(0.001)
            refused = await engine.handler(post("/flush_cache", {}))
            nursery.cancel_scope.cancel()
        flushed = await engine.handler(post("/flush_cache", {}))
        assert engine.kv.truth(0) == set()
        assert engine.kv.stats(0).clears == 1
    assert refused.status == 400
    assert flushed.status == 200


# ---------------------------------------------------------------- faults


async def test_fail_status_and_unhealthy_and_fault_api():
    engine = make()
    body = {"prompt": [1, 2, 3], "max_tokens": 1}
    async with kv_running(engine):
        changed = payload(await engine.handler(post("/sim/faults", {"fail_status": 503,
                                                                     "unhealthy": True})))
        failed = await engine.handler(post("/v1/completions", body))
        health = await engine.handler(get("/health"))
        with pytest.raises(BadRequest) as info:
            await engine.handler(post("/sim/faults", {"fail_status": 99, "nope": 1}))
        engine.faults.update({"fail_status": None, "unhealthy": False})
        ok = await engine.handler(post("/v1/completions", body))
    assert changed["fail_status"] == 503 and changed["unhealthy"] is True
    assert failed.status == 503 and payload(failed)["error"]["code"] == 503
    assert health.status == 503
    assert "fail_status" in str(info.value) and "nope" in str(info.value)
    assert ok.status == 200


POISON = "POISON-7f3a"


def poison_bodies(flavor: str) -> list[tuple[str, dict[str, Any]]]:
    """One body per generation route, the marker somewhere inside the prompt."""
    text = f"Tell me about {POISON} please."
    bodies = [("/v1/chat/completions", chat(text, max_tokens=2)),
              ("/v1/chat/completions", chat(text, max_tokens=2, stream=True)),
              ("/v1/completions", {"model": "deepseek", "prompt": text, "max_tokens": 2}),
              ("/v1/messages", {"model": "deepseek", "max_tokens": 2,
                                "messages": [{"role": "user", "content": text}]}),
              ("/v1/responses", {"model": "deepseek", "input": text, "max_output_tokens": 2})]
    if flavor.startswith("sglang"):
        bodies += [("/generate", {"text": text, "sampling_params": {"max_new_tokens": 2}}),
                   ("/generate", {"text": [text, "other"]})]
    return bodies


@pytest.mark.parametrize("flavor", ["vllm-0.33", "sglang-0.5.23"])
async def test_poison_marker_fails_every_route_with_the_engines_internal_error(flavor):
    engine = make(flavor)
    async with kv_running(engine):
        changed = payload(await engine.handler(post("/sim/faults", {"poison_marker": POISON})))
        poisoned = [(path, await engine.handler(post(path, body)))
                    for path, body in poison_bodies(flavor)]
        ran = engine.counters[0].requests
        clean = [await engine.handler(post(path, json.loads(
            json.dumps(body).replace(POISON, "nothing")))) for path, body in poison_bodies(flavor)]
        with pytest.raises(BadRequest):
            engine.faults.update({"poison_marker": ""})
        with pytest.raises(BadRequest):
            engine.faults.update({"poison_marker": 5})
    assert changed["poison_marker"] == POISON
    assert [answer.status for _, answer in poisoned] == [500] * len(poisoned)
    assert [answer.status for answer in clean] == [200] * len(clean)
    assert engine.handler.poisoned == len(poisoned)
    assert ran == 0  # a poisoned request is refused before it queues
    for path, answer in poisoned:
        error = payload(answer)
        if flavor.startswith("vllm") and path == "/v1/messages":  # Anthropic's shape
            assert error["type"] == "error" and error["error"]["type"] == "InternalServerError"
        elif flavor.startswith("vllm"):
            assert error["error"]["type"] == "InternalServerError", error
            assert (error["error"]["code"], error["error"]["param"]) == (500, None)
        elif path == "/v1/messages":
            assert error["error"]["type"] == "internal_error"
        else:  # SGLang: flat ErrorResponse (/generate: from an HTTPException)
            assert error["object"] == "error" and error["code"] == 500, error
            assert error["type"] == ("500" if path == "/generate" else "InternalServerError")
        message = error["error"]["message"] if "error" in error else error["message"]
        assert POISON in message


async def test_slow_delays_the_answer(autojump_clock):
    engine = make()
    engine.faults.slow_s = 0.2
    async with kv_running(engine):
        began = trio.current_time()
        await engine.handler(post("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 1}))
        assert trio.current_time() - began >= 0.2


async def test_hang_never_answers_and_leaves_nothing_behind(autojump_clock):
    engine = make()
    engine.faults.hang = True
    async with kv_running(engine):
        with trio.move_on_after(0.2) as scope:
            await engine.handler(post("/v1/completions", {"prompt": [1, 2, 3]}))
    assert scope.cancelled_caught
    assert engine.queues[0].running == 0


async def test_die_after_chunks_breaks_the_stream_and_releases_the_request():
    engine = make()
    engine.faults.die_after_chunks = 2
    async with kv_running(engine):
        response = await engine.handler(post("/v1/completions", {
            "prompt": list(range(40)), "max_tokens": 5, "stream": True}))
        seen = []
        with pytest.raises(EngineCrashed):
            await sse_events_into(response, seen)
        assert len(seen) == 2
        assert engine.queues[0].running == 0
        assert engine.counters[0].aborted == 1


async def sse_events_into(response: HttpResponse, seen: list[bytes]) -> None:
    body = response.body
    assert not isinstance(body, bytes)
    try:
        async for chunk in body:
            seen.append(chunk)
    finally:
        await body.aclose()  # type: ignore[attr-defined]


# ---------------------------------------------------------------- queueing and aborts


async def test_cancelled_requests_leave_the_batch_and_the_queue(autojump_clock):
    slow = TimingConfig(prefill_tokens_per_s=1e6, decode_s_per_token=10.0, max_running=1)
    engine = make(timing=slow, capacity_blocks=3)
    async with kv_running(engine):
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(engine.handler, post("/v1/completions", {
                    "prompt": list(range(40)), "max_tokens": 3}))
            while engine.queues[0].waiting < 2:
                await trio.sleep(0.001)
            assert engine.queues[0].running == 1
            nursery.cancel_scope.cancel()
        assert (engine.queues[0].running, engine.queues[0].waiting) == (0, 0)
        assert engine.counters[0].aborted == 3
        # the running one's 2 blocks were released: a 3-block prompt can evict them all
        await engine.handler(post("/v1/completions", {"prompt": list(range(100, 148)),
                                                      "max_tokens": 1}))
        assert {len(tokens) for _, _, tokens in engine.kv.truth(0)} == {16, 32, 48}


async def test_cache_hit_lowers_time_to_first_token(autojump_clock):
    timing = TimingConfig(prefill_tokens_per_s=1000.0, decode_s_per_token=0.0)
    engine = make(timing=timing)
    prompt = list(range(1000, 1800))  # 800 tokens: 0.8 s cold

    async def ttft() -> float:
        began = trio.current_time()
        response = await engine.handler(post("/v1/completions", {
            "prompt": prompt, "max_tokens": 1, "stream": True}))
        body = response.body
        assert not isinstance(body, bytes)
        try:
            await body.__anext__()
            return trio.current_time() - began
        finally:
            await body.aclose()  # type: ignore[attr-defined]

    async with kv_running(engine):
        cold = await ttft()
        warm = await ttft()
    assert cold >= 0.8
    assert warm < cold / 2
