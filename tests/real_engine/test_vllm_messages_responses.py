"""Anthropic Messages and OpenAI Responses through Cortex, against two real vLLM servers.

* Cortex's rendering of every request shape equals vLLM's: vLLM's own conversion (its code,
  run in the engine's venv: ``vllm_oracle``) fed to the engine's ``/tokenize`` gives the
  token ids Cortex computes — system blocks (a billing-header block among them), several
  turns, thinking blocks, reasoning items, developer messages (merged into the system turn for
  templates that do not name the role), ``output_config.effort`` / ``reasoning.effort``,
  ``chat_template_kwargs``, a continued assistant message, and with Qwen2.5's template tools,
  tool calls and tool results of both APIs (DeepSeek's tiny template refuses ``tool`` turns).
* Streamed and not, a first request is predicted exactly (``x-cortex-cache-hit-tokens`` equals
  the cached tokens the engine reports: Anthropic ``cache_read_input_tokens``, Responses
  ``input_tokens_details.cached_tokens``) and a repeat lands on the holder, predicted exactly.
* The official ``openai`` (Responses) and ``anthropic`` clients work unchanged through Cortex,
  streamed and not, with Cortex's decision headers on the answers; ``messages.count_tokens``
  through Cortex counts what Cortex renders.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import anthropic
import openai
import pytest
import trio

from tests.front_http_client import RawClient
from tests.real_engine.cortex_front import BLOCK, cortex_front

ORACLE = Path(__file__).with_name("vllm_oracle.py")
SYSTEM = "You are a terse assistant. Answer in one word. " * 6
WEATHER = {"name": "get_weather", "description": "Current weather of a city",
           "input_schema": {"type": "object", "properties": {
               "city": {"type": "string", "description": "City name, e.g. Zürich"}},
               "required": ["city"]}}
SEARCH = {"name": "search", "input_schema": {"properties": {"q": {"type": "string"}}}}


def messages_bodies(family: str) -> list[dict]:
    bodies = [
        {"system": SYSTEM, "messages": [{"role": "user", "content": "Name a colour."}]},
        {"system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1"},
                    {"type": "text", "text": SYSTEM}, {"type": "text", "text": "Be kind."}],
         "messages": [{"role": "user", "content": [{"type": "text", "text": "Name a colour."}]},
                      {"role": "assistant", "content": [
                          {"type": "thinking", "thinking": "Blue is short.", "signature": "s"},
                          {"type": "text", "text": "Blue."}, {"type": "text", "text": "Or red."}]},
                      {"role": "user", "content": "Another, in 中文 please."}]},
        {"messages": [{"role": "user", "content": "hi"}], "output_config": {"effort": "low"},
         "chat_template_kwargs": {"unused_flag": True}},
        {"messages": [{"role": "user", "content": "no thinking"}],
         "thinking": {"type": "disabled"}},
        {"system": SYSTEM, "messages": [{"role": "user", "content": "a"},
                                        {"role": "system", "content": "Reminder: be brief."},
                                        {"role": "user", "content": "b"}]},
    ]
    if family == "qwen-tiny":
        bodies += [
            {"system": SYSTEM, "tools": [WEATHER, SEARCH], "messages": [
                {"role": "user", "content": "Weather in Zürich?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                     "input": {"city": "Zürich"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "search", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "21 C, sunny"},
                    {"type": "tool_result", "tool_use_id": "toolu_2",
                     "content": [{"type": "text", "text": "[]"}, {"type": "text", "text": "ok"}]},
                    {"type": "text", "text": "Thanks"}]}]},
            {"tools": [SEARCH], "tool_choice": {"type": "auto"},
             "messages": [{"role": "user", "content": "tools listed, none to be called"}]},
        ]
    return [{"max_tokens": 2, **body} for body in bodies]


def responses_bodies(family: str) -> list[dict]:
    bodies = [
        {"instructions": SYSTEM, "input": "Name a colour."},
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": "Name one."},
                                                {"type": "input_text", "text": "Quickly."}]},
                   {"type": "reasoning", "id": "rs_1", "summary": [],
                    "content": [{"type": "reasoning_text", "text": "Short."}]},
                   {"type": "message", "role": "assistant", "id": "msg_1",
                    "status": "completed", "content": [
                        {"type": "output_text", "text": "Blue.", "annotations": []}]},
                   {"role": "user", "content": "Another, in 中文 please."}],
         "reasoning": {"effort": "low"}},
        {"instructions": SYSTEM, "input": [  # Codex-style: neither template names developer
            {"role": "developer", "content": "Prefer short answers."},
            {"role": "user", "content": "Name a colour."},
            {"type": "message", "role": "developer", "content": [
                {"type": "input_text", "text": "Reminder: one word."}]},
            {"role": "user", "content": "Another."}]},
        {"input": [{"role": "user", "content": "Count to three."},
                   {"type": "message", "role": "assistant", "id": "msg_2",
                    "status": "in_progress", "content": [
                        {"type": "output_text", "text": "One, two,", "annotations": []}]}],
         "chat_template_kwargs": {"unused_flag": True}},
    ]
    if family == "qwen-tiny":
        tools = [{"type": "function", "name": "get_weather",
                  "description": "Current weather of a city",
                  "parameters": WEATHER["input_schema"]},
                 {"type": "function", "name": "search", "parameters": None, "strict": False}]
        bodies += [
            {"instructions": SYSTEM, "tools": tools, "input": [
                {"role": "user", "content": "Weather in Zürich?"},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                 "arguments": json.dumps({"city": "Zürich"})},
                {"type": "function_call", "call_id": "call_2", "name": "search",
                 "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "21 C"},
                {"type": "function_call_output", "call_id": "call_2", "output": "[]"},
                {"role": "user", "content": "Thanks"}]},
            {"tools": tools, "tool_choice": "none", "input": "tools listed, none called"},
        ]
    return [{"max_output_tokens": 16, **body} for body in bodies]


def requests(family: str) -> list[tuple[str, dict]]:
    return ([("/v1/messages", body) for body in messages_bodies(family)]
            + [("/v1/responses", body) for body in responses_bodies(family)])


def vllm_renders(engine_python: Path, template: str, model: str,
                 sent: list[tuple[str, dict]]) -> list[dict]:
    """The ``/tokenize`` chat bodies vLLM's own conversion makes of ``sent``."""
    todo = [{"api": "messages" if path == "/v1/messages" else "responses",
             "body": {"model": model, **body}, "template": template} for path, body in sent]
    done = subprocess.run([str(engine_python), str(ORACLE)], input=json.dumps(todo),
                          capture_output=True, text=True, check=True, timeout=300)
    return [{"model": model, **body} for body in json.loads(done.stdout)]


async def test_cortex_renders_messages_and_responses_as_vllm(fresh, engines):
    name, servers, model_dir = fresh
    template = json.loads((Path(model_dir) / "tokenizer_config.json").read_text())[
        "chat_template"]
    sent = requests(name)
    theirs_bodies = await trio.to_thread.run_sync(vllm_renders, engines.python, template,
                                                  name, sent)
    async with cortex_front(servers, name, model_dir) as front:
        for (path, body), tokenize in zip(sent, theirs_bodies, strict=True):
            ours = front.prompt_ids(path, body)
            theirs = await trio.to_thread.run_sync(servers[0].tokenize, tokenize)
            assert ours == theirs, (name, path, body)


def usage(path: str, raw: bytes, stream: bool) -> tuple[int | None, int | None]:
    """(cached, prompt) tokens as the engine reports them, in the API's own shape."""
    docs = []
    if stream:
        docs = [json.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: {")]
    else:
        docs = [json.loads(raw)]
    for doc in docs:
        holder = doc.get("response") or doc.get("message") or doc
        found = (holder or {}).get("usage") or doc.get("usage")
        if not found:
            continue
        if path == "/v1/responses":
            details = found.get("input_tokens_details") or {}
            if details.get("cached_tokens") is not None:
                return details["cached_tokens"], found["input_tokens"]
        elif found.get("cache_read_input_tokens") is not None:
            cached = found["cache_read_input_tokens"]  # input_tokens: neither read nor created
            created = found.get("cache_creation_input_tokens") or 0
            return cached, found["input_tokens"] + cached + created
    return None, None


async def send(front, path: str, body: dict, stream: bool) -> tuple[int, dict, int | None,
                                                                   int | None, bytes]:
    client = await RawClient.connect(front.port)
    try:
        response = await client.request(
            b"POST", path.encode(), json.dumps({"model": front.model, **body,
                                                "stream": stream}).encode(),
            [(b"content-type", b"application/json")])
    finally:
        await client.aclose()
    headers = {name: (response.header(name) or b"").decode() for name in (
        b"x-cortex-cache-hit-tokens", b"x-cortex-assigned-worker", b"x-cortex-match-mode")}
    cached, prompt = (usage(path, response.body, stream) if response.status == 200
                      else (None, None))
    return response.status, headers, cached, prompt, response.body


@pytest.mark.parametrize("stream", [False, True])
async def test_repeats_land_on_the_holder_and_are_predicted_exactly(fresh, stream):
    name, servers, model_dir = fresh
    async with cortex_front(servers, name, model_dir) as front:
        for path, body in requests(name):
            status, first, cached, prompt, raw = await send(front, path, body, stream)
            assert status == 200, raw
            assert int(first[b"x-cortex-cache-hit-tokens"]) == cached, (path, body, first)
            assert prompt == len(front.prompt_ids(path, body))
            if prompt > BLOCK:
                assert await front.settled(path, body, first[b"x-cortex-assigned-worker"])
            status, again, cached, prompt, raw = await send(front, path, body, stream)
            assert status == 200, raw
            assert int(again[b"x-cortex-cache-hit-tokens"]) == cached, (path, body, again)
            assert cached == (prompt - 1) // BLOCK * BLOCK
            if cached:
                assert (again[b"x-cortex-assigned-worker"], again[b"x-cortex-match-mode"]) == (
                    first[b"x-cortex-assigned-worker"], "exact_kv_events")


QUESTION = "Which colour is the sky?"
CLIENT_BODIES = {  # what each client call below sends (for Cortex's view of its prompt)
    "/v1/responses": {"input": SYSTEM + QUESTION, "max_output_tokens": 16},
    "/v1/messages": {"max_tokens": 4, "system": SYSTEM,
                     "messages": [{"role": "user", "content": QUESTION}]},
}


def client_call(path: str, port: int, model: str) -> tuple[int, int | None, str]:
    """One official client call through Cortex, not streamed: (predicted, engine-reported
    cached tokens, worker)."""
    body = CLIENT_BODIES[path]
    if path == "/v1/responses":
        oai = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        raw = oai.responses.with_raw_response.create(model=model, **body)
        response = raw.parse()
        assert response.status in ("completed", "incomplete") and response.output
        reported = response.usage.input_tokens_details.cached_tokens
        oai.close()
    else:
        ant = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="unused")
        raw = ant.messages.with_raw_response.create(model=model, **body)
        message = raw.parse()
        assert message.type == "message" and message.content
        reported = message.usage.cache_read_input_tokens
        ant.close()
    return (int(raw.headers["x-cortex-cache-hit-tokens"]), reported,
            raw.headers["x-cortex-assigned-worker"])


def client_streams(port: int, model: str) -> int:
    """Both official clients' streaming calls through Cortex; the Messages prompt's length
    as the engine counts it (``messages.count_tokens``)."""
    oai = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
    events = list(oai.responses.create(model=model, stream=True,
                                       **CLIENT_BODIES["/v1/responses"]))
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert any(event.type == "response.output_text.delta" for event in events)
    ant = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="unused")
    with ant.messages.stream(model=model, **CLIENT_BODIES["/v1/messages"]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.stop_reason in ("end_turn", "max_tokens") and final.content
    assert text == "".join(block.text for block in final.content if block.type == "text")
    counted = ant.messages.count_tokens(model=model, system=SYSTEM,
                                        messages=CLIENT_BODIES["/v1/messages"]["messages"])
    oai.close()
    ant.close()
    return counted.input_tokens


async def test_the_official_clients_work_through_cortex(fresh):
    name, servers, model_dir = fresh
    async with cortex_front(servers, name, model_dir) as front:
        for path, body in CLIENT_BODIES.items():
            predicted, reported, worker = await trio.to_thread.run_sync(
                client_call, path, front.port, name)
            assert predicted == reported == 0, path
            assert await front.settled(path, body, worker)
            predicted, reported, again = await trio.to_thread.run_sync(
                client_call, path, front.port, name)
            assert predicted == reported > 0 and again == worker, path
        counted = await trio.to_thread.run_sync(client_streams, front.port, name)
        assert counted == len(front.prompt_ids("/v1/messages", CLIENT_BODIES["/v1/messages"]))
