"""Hostile JSON at every generation route of a simulated engine, both flavors: the engine never
fails on it (no exception out of its handler or its streamed body: the server would answer 500)
and refuses it with 400 in the real engine's error shape for that route.

Bodies: a valid body of the route (every field the simulator reads, nested ones included), then
one to three mutations at a random place in it — a value replaced by a type-confused one
(null, booleans, numbers, strings, lists, objects shaped like parts), a field deleted, a field
added (``previous_response_id`` and the other fields the routes know among the names) — or a
JSON value that is not a request at all. Every answer is 200 (consumed to its end when streamed),
404 where the engine answers that (a vLLM model it does not serve, an unknown
``previous_response_id``) or 400, each error in the shape the engine's source writes
(``cortex.sim.engine_errors``; checked here against an independent reading of the same
sources).

The engines run for real (KV publishers on loopback); Hypothesis drives the examples from a
worker thread, each request handed to the engines' trio loop (``trio.from_thread``). Real vLLM
0.32 answers 400 to the same kinds of bodies (checked by hand against the CPU build: every
type-confused field gets FastAPI's validation answer).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cortex.front.messages import HttpRequest, HttpResponse
from cortex.ledger.kv_events import EngineFamily
from cortex.sim.engine import SimEngine
from cortex.sim.serving import TimingConfig
from tests.sim_engine_profile import deepseek

FAST = TimingConfig(prefill_tokens_per_s=1e9, decode_s_per_token=0.0, max_running=64)
M = "deepseek"
MESSAGES_PATHS = ("/v1/messages", "/v1/messages/count_tokens")

CHAT = {
    "model": M, "max_tokens": 2, "max_completion_tokens": 2, "n": 1, "stream": False,
    "stream_options": {"include_usage": True}, "cache_salt": "salt", "top_logprobs": 0,
    "echo": False, "add_generation_prompt": True, "continue_final_message": False,
    "add_special_tokens": False, "reasoning_effort": "low", "documents": [{"text": "d"}],
    "chat_template_kwargs": {"enable_thinking": False},
    "tools": [{"type": "function", "function": {"name": "f", "description": "d",
                                                "parameters": {"type": "object"}}}],
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "developer", "content": [{"type": "text", "text": "Be kind."}]},
        {"role": "user", "name": "u", "content": [
            {"type": "text", "text": "What is"}, "2+2?",
            {"type": "image_url", "image_url": {"url": "http://x/i.png"}}]},
        {"role": "assistant", "content": None, "reasoning": "think",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "4"},
        {"role": "user", "content": [{"type": "input_text", "text": "ok"}]},
    ],
}
COMPLETION = {"model": M, "prompt": "Once upon a time", "max_tokens": 2, "n": 1,
              "stream": False, "echo": False, "logprobs": None, "cache_salt": "salt",
              "add_special_tokens": True, "prompt_logprobs": None}
COMPLETION_IDS = {"model": M, "prompt": [[5, 6, 7, 8]], "max_tokens": 2}
MESSAGES = {
    "model": M, "max_tokens": 2, "stream": False,
    "system": [{"type": "text", "text": "You are terse."}],
    "output_config": {"effort": "low"}, "thinking": {"type": "enabled"},
    "chat_template_kwargs": {"x": 1},
    "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Hi"},
                                     {"type": "image", "source": {"type": "url", "url": "u"}}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "s"},
            {"type": "text", "text": "Calling."},
            {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1",
             "content": [{"type": "text", "text": "4"}]},
            {"type": "text", "text": "thanks"}]},
        {"role": "system", "content": "inline system"},
    ],
}
RESPONSES = {
    "model": M, "max_output_tokens": 2, "stream": False, "instructions": "Be terse.",
    "reasoning": {"effort": "low"}, "chat_template_kwargs": {"x": 1},
    "tools": [{"type": "function", "name": "f", "description": "d",
               "parameters": {"type": "object"}}, {"type": "web_search"}],
    "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "reasoning", "id": "r1", "summary": [{"type": "summary_text", "text": "s"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Calling."}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "4"},
        {"role": "user", "content": "thanks", "status": "completed"},
    ],
}
GENERATE = {"text": "Once upon a time", "rid": "r", "stream": False, "return_logprob": False,
            "logprob_start_len": -1, "routed_dp_rank": 0, "lora_path": None,
            "sampling_params": {"max_new_tokens": 2}}
GENERATE_IDS = {"input_ids": [[5, 6, 7], [8, 9]], "sampling_params": {"max_new_tokens": 2}}

ROUTES: dict[EngineFamily, list[tuple[str, dict[str, Any]]]] = {
    EngineFamily.VLLM: [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION),
                        ("/v1/completions", COMPLETION_IDS), ("/v1/messages", MESSAGES),
                        ("/v1/messages/count_tokens", MESSAGES), ("/v1/responses", RESPONSES)],
}
ROUTES[EngineFamily.SGLANG] = [*ROUTES[EngineFamily.VLLM], ("/generate", GENERATE),
                               ("/generate", GENERATE_IDS)]

# names and values the routes read, so mutated objects look like parts, items and tools
KEYS = ["type", "text", "role", "content", "name", "id", "input", "arguments", "function",
        "thinking", "tool_calls", "tool_call_id", "call_id", "output", "summary", "source",
        "status", "parameters", "input_schema", "image_url", "url", "effort", "include_usage",
        "previous_response_id", "prompt", "messages", "max_tokens", "stream", "tools",
        "routed_dp_rank", "lora_path", "max_new_tokens", "cache_salt", "model", "n",
        "reasoning", "tool_use_id", "encrypted_content", "namespace", "defer_loading",
        "strict", "description", "bootstrap_room", "kv_transfer_params", "logprob_start_len"]
WORDS = ["text", "user", "assistant", "system", "developer", "tool", "function", "message",
         "image", "image_url", "tool_use", "tool_result", "thinking", "reasoning",
         "function_call", "function_call_output", "input_text", "output_text", "refusal",
         "in_progress", "incomplete", "disabled", "none", "auto", M, "", "x",
         "x-anthropic-billing-header: y\nz", "deepseek:lora"]

SCALARS = (st.none() | st.booleans() | st.sampled_from(WORDS) | st.text(max_size=6)
           | st.integers(-2, 40) | st.sampled_from([2**31, 2**63, 2**64, -2**63, (1 << 20) + 1])
           | st.floats(allow_nan=False, allow_infinity=False))
VALUES = st.recursive(
    SCALARS,
    lambda inner: (st.lists(inner, max_size=3)
                   | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=4), inner,
                                     max_size=3)),
    max_leaves=8)


def paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON value, the root first."""
    out = [at]
    if isinstance(value, dict):
        for key, item in value.items():
            out += paths(item, (*at, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += paths(item, (*at, index))
    return out


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any]) -> Any:
    body: Any = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.sampled_from(paths(body)))
        if not at:
            if draw(st.integers(0, 9)) == 0:
                body = draw(VALUES)  # not a request at all
            continue
        parent = body
        for step in at[:-1]:
            parent = parent[step]
        action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if action == "replace":
            parent[at[-1]] = draw(VALUES)
        elif action == "delete":
            del parent[at[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.sampled_from(KEYS))] = draw(VALUES)
        else:
            parent.insert(at[-1], draw(VALUES))
    return body


def requests(family: EngineFamily) -> st.SearchStrategy[tuple[str, bytes]]:
    return st.sampled_from(ROUTES[family]).flatmap(
        lambda route: mutated(route[1]).map(
            lambda body: (route[0], json.dumps(body).encode())))


def check_error(family: EngineFamily, path: str, status: int, body: Any) -> None:
    """``body`` is the error answer the real engine writes for ``status`` on ``path``: the
    shapes read from vLLM 0.32 and SGLang 0.5 (see ``cortex.sim.engine_errors``)."""
    serving_type = {400: "BadRequestError", 404: "NotFoundError"}[status]
    if family is EngineFamily.VLLM:
        if path in MESSAGES_PATHS and body.get("type") == "error":  # the route's own refusal
            assert set(body["error"]) == {"type", "message"}, body
            assert body["error"]["type"] == serving_type, body
            return
        assert set(body) == {"error"} and set(body["error"]) == {
            "message", "type", "param", "code"}, body
        error = body["error"]
        allowed = {serving_type, "Bad Request"} if status == 400 else {serving_type}
        assert error["type"] in allowed and error["code"] == status, body
        assert error["param"] is None and isinstance(error["message"], str), body
        return
    assert status == 400, body  # SGLang ignores model; previous_response_id: 400 or 404 only
    flat_keys = {"object", "message", "type", "param", "code"}
    if set(body) == flat_keys:  # validation (every route but /v1/responses), or serving
        assert body["object"] == "error" and body["code"] == 400 and body["param"] is None
        assert body["type"] in {"Bad Request", "BadRequestError"}, body
        assert path != "/v1/responses" or body["type"] == "BadRequestError", body
    elif path == "/generate":
        assert set(body) == {"error"} and set(body["error"]) == {"message"}, body
    elif path in MESSAGES_PATHS:
        assert body == {"type": "error", "error": {"type": "invalid_request_error",
                                                   "message": body["error"]["message"]}}
    else:
        assert path == "/v1/responses", body
        assert body == {"error": {"message": body["error"]["message"], "type": "Bad Request",
                                  "param": None, "code": 400}}


async def answer(engine: SimEngine, path: str, raw: bytes) -> tuple[int, Any]:
    """The engine's answer, a streamed body read to its end (its failure fails the test)."""
    with trio.fail_after(20):
        response: HttpResponse = await engine.handler(
            HttpRequest(b"POST", path.encode(), [(b"content-type", b"application/json")], raw))
        body = response.body
        if isinstance(body, bytes):
            return response.status, json.loads(body) if body else None
        chunks = [chunk async for chunk in body]
        return response.status, b"".join(chunks)


async def run_hostile(family: EngineFamily, flavor: str, examples: int) -> None:
    engine = SimEngine("e1", flavor, deepseek(), timing=FAST, dp_size=2, max_model_len=4096)
    statuses: dict[int, int] = {}

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(requests(family))
    def hostile(request: tuple[str, bytes]) -> None:
        path, raw = request
        status, body = trio.from_thread.run(answer, engine, path, raw)
        statuses[status] = statuses.get(status, 0) + 1
        assert status in (200, 400, 404), (status, body)
        if status != 200:
            check_error(family, path, status, body)

    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.kv.run)
            await trio.to_thread.run_sync(hostile)
            nursery.cancel_scope.cancel()
    assert statuses.get(200) and statuses.get(400), statuses  # both kinds were exercised
    assert all(not q.running and not q.waiting for q in engine.queues)


async def test_vllm_routes_never_fail_on_hostile_json():
    await run_hostile(EngineFamily.VLLM, "vllm-0.33", 300)


async def test_sglang_routes_never_fail_on_hostile_json():
    await run_hostile(EngineFamily.SGLANG, "sglang-0.5.23", 300)
