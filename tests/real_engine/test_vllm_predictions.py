"""Cortex's predictions against two real vLLM servers (CPU build), for both tokenizer families.

* Cortex's profile, read from the model directory the engine loads (no ``bos_token``, no
  ``chat_template`` configured), tokenizes every request shape exactly as vLLM's own
  ``/tokenize`` does: chats with a system prompt, several turns, assistant turns, tools and
  tool calls and tool results (Qwen2.5's template), ``chat_template_kwargs``, a developer
  message (neither template names the role: vLLM merges it into the system turn),
  ``reasoning_effort``, completions text
  and ids. (The first real-vLLM run showed a chat one token short: no BOS.)
* Through Cortex, chat and completions, streamed (``include_usage``) and not: a repeat lands
  on the holder and ``x-cortex-cache-hit-tokens`` equals the ``cached_tokens`` vLLM reports;
  a block-aligned prompt is predicted one block short, as vLLM serves it.
"""

from __future__ import annotations

import json

import pytest
import trio

from tests.real_engine.cortex_front import BLOCK, cortex_front

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Zürich"},
        "unit": {"type": "string", "enum": ["C", "F"]}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {  # no description: vLLM renders it as null
    "name": "search", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
SYSTEM = "You are a terse assistant. Answer in one word. " * 6


def chats(family: str) -> list[dict]:
    """Chat bodies of every shape the template handles (tools only where it renders them)."""
    bodies = [
        {"messages": [{"role": "user", "content": "hi"}]},
        {"messages": [{"role": "system", "content": SYSTEM},
                      {"role": "user", "content": "Name a colour."}]},
        {"messages": [{"role": "system", "content": SYSTEM},
                      {"role": "user", "content": "Name a colour."},
                      {"role": "assistant", "content": "Blue."},
                      {"role": "user", "content": "Another, in 中文 please."}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "part one"},
                                                   {"type": "text", "text": "part two"}]}]},
        {"messages": [{"role": "user", "content": "go on"}], "add_generation_prompt": False},
        {"messages": [{"role": "user", "content": "x"}],
         "chat_template_kwargs": {"unused_flag": True}},
        {"messages": [{"role": "system", "content": SYSTEM},  # developer: merged as system
                      {"role": "developer", "content": "Prefer short answers."},
                      {"role": "user", "content": "Name a colour."}],
         "reasoning_effort": "low"},
    ]
    if family == "qwen-tiny":
        call = {"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Zürich", "unit": "C"})}}
        bodies += [
            {"messages": [{"role": "user", "content": "Weather in Zürich?"}],
             "tools": [WEATHER, SEARCH]},
            {"messages": [{"role": "system", "content": SYSTEM},
                          {"role": "user", "content": "Weather in Zürich?"},
                          {"role": "assistant", "content": None, "tool_calls": [call]},
                          {"role": "tool", "tool_call_id": "call_1", "content": "21 C, sunny"},
                          {"role": "tool", "tool_call_id": "call_2", "content": "[]"},
                          {"role": "user", "content": "Thanks"}],
             "tools": [WEATHER]},
            {"messages": [{"role": "user", "content": "tools listed, none to be called"}],
             "tools": [SEARCH], "tool_choice": "none"},
        ]
    return bodies


COMPLETIONS = [
    {"prompt": "The quick brown fox jumps over the lazy dog. " * 3},
    {"prompt": "code:\n\tdef f(x):\n\t\treturn x ** 2  # 平方\n"},
    {"prompt": [11, 22, 33, 44, 55]},
    {"prompt": "no special tokens please", "add_special_tokens": False},
]


async def test_cortex_tokenizes_every_request_shape_as_vllm(fresh):
    name, servers, model_dir = fresh
    async with cortex_front(servers, name, model_dir) as front:
        engine = servers[0]
        for body in chats(name):
            ours = front.prompt_ids("/v1/chat/completions", body)
            theirs = await trio.to_thread.run_sync(engine.tokenize, {"model": name, **body})
            assert ours == theirs, (name, body)
        for body in COMPLETIONS:
            ours = front.prompt_ids("/v1/completions", body)
            request = {"model": name, "prompt": body["prompt"],
                       "add_special_tokens": body.get("add_special_tokens", True)}
            if isinstance(body["prompt"], list):
                theirs = body["prompt"]
            else:
                theirs = await trio.to_thread.run_sync(engine.tokenize, request)
            assert ours == theirs, (name, body)


@pytest.mark.parametrize("stream", [False, True])
async def test_repeats_land_on_the_holder_and_are_predicted_exactly(fresh, stream):
    name, servers, model_dir = fresh
    async with cortex_front(servers, name, model_dir) as front:
        requests = [("/v1/chat/completions", body) for body in chats(name)]
        requests += [("/v1/completions", body) for body in COMPLETIONS]
        for path, body in requests:
            body = {**body, "max_tokens": 2, "temperature": 0}
            first = await front.send(path, body, stream=stream)
            assert first.status == 200, first.body
            assert first.exact, (body, first)
            if first.prompt_tokens > BLOCK:  # something to cache: wait for its events
                assert await front.settled(path, body, first.worker)
            again = await front.send(path, body, stream=stream)
            assert again.exact, (body, again)
            assert again.reported == (again.prompt_tokens - 1) // BLOCK * BLOCK
            if again.reported:
                assert (again.worker, again.mode) == (first.worker, "exact_kv_events")


async def test_a_block_aligned_prompt_is_served_one_block_short(fresh):
    name, servers, model_dir = fresh
    async with cortex_front(servers, name, model_dir) as front:
        for length in (18 * BLOCK - 1, 18 * BLOCK, 18 * BLOCK + 1):
            body = {"prompt": [1000 + (7 * i) % 5000 for i in range(length)], "max_tokens": 1}
            first = await front.send("/v1/completions", body)
            assert await front.settled("/v1/completions", body, first.worker)
            again = await front.send("/v1/completions", body)
            assert again.predicted == again.reported == (length - 1) // BLOCK * BLOCK, again


def long_lines(seed: int, count: int) -> str:
    """Lines of code, English, Chinese, JSON, empty lines and lines of blanks only (where a cut
    after every newline would be wrong: ``\\n  \\t\\n`` is one pre-token)."""
    import random

    rng = random.Random(seed)
    kinds = ["    return cache.get(key)  # 命中", "def route(prompt):", "缓存命中率在长上下文中很重要。",
             '{"path": "a/b.py", "line": 42}', "", "  \t", "The router sends it to worker 2.",
             "\u3000全角空格开头", "🙂 emoji first", "e\u0301 combining", "}", "\tindented\ttab",
             " ", "   "]
    return "\n".join(rng.choice(kinds) + (f" {rng.randint(0, 999)}" if rng.random() < 0.5 else "")
                     for _ in range(count))


async def test_a_long_message_that_grows_is_tokenized_as_vllm(fresh):
    # long pieces are cached as chunks cut at line starts (cortex.tokenize.line_cuts): the
    # second turn's message extends the first's, so its earlier chunks come from the cache
    name, servers, model_dir = fresh
    base = long_lines(1, 1500)
    async with cortex_front(servers, name, model_dir) as front:
        engine = servers[0]
        for content in (base, base + "\n" + long_lines(2, 60)):
            for path, body in (  # (with every newline a cut, both fail: checked)
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": content}]}),
                ("/v1/completions", {"prompt": content}),
            ):
                ours = front.prompt_ids(path, body)
                request = ({"model": name, **body} if "messages" in body else
                           {"model": name, "prompt": content, "add_special_tokens": True})
                theirs = await trio.to_thread.run_sync(engine.tokenize, request)
                assert ours == theirs, (name, path, len(content))
        assert front.pool.tokenizer.hits > 0
