"""vLLM's ``/tokenize`` and ``/detokenize`` through Cortex, against two real vLLM servers.

* For a prompt (with and without special tokens, with ``return_token_strs``) and for every
  chat shape of ``test_vllm_predictions`` (tools and tool calls with Qwen2.5's template, no
  generation prompt, a continued final message), Cortex's answer is byte for byte the answer
  of the server it went to (``count``, ``max_model_len``, ``tokens``, ``token_strs``), both
  servers in turn; a chat's ids are also the ones Cortex computes for that chat; and
  ``/detokenize`` of the ids answers as the server does.
* ``vllm bench serve``'s own prompt alignment (``_align_prompts_to_server_tokenizer``, run in
  the engine's venv) works through Cortex — the client that found ``/tokenize`` missing — and
  re-aligns prompts exactly as against the server itself.
"""

from __future__ import annotations

import json
import os
import subprocess

import trio

from tests.front_http_client import RawClient
from tests.real_engine.cortex_front import cortex_front
from tests.real_engine.farm import ServerSet
from tests.real_engine.test_vllm_predictions import chats

TEXT = "Cortex sends each prompt where its prefix is cached. 网关按前缀路由。"
BENCH = r"""
import asyncio, contextlib, io, json, sys
from vllm.benchmarks.datasets import SampleRequest
from vllm.benchmarks.serve import _align_prompts_to_server_tokenizer
model, urls = sys.argv[1], sys.argv[2:]
requests = [SampleRequest(prompt=p, prompt_len=n) for p, n in json.load(sys.stdin)]
out = []
for url in urls:
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        aligned = asyncio.run(_align_prompts_to_server_tokenizer(url, model, requests))
    out.append({"said": said.getvalue(), "prompts": [r.prompt for r in aligned]})
print(json.dumps(out))
"""


def bodies(family: str) -> list[dict]:
    return [{"prompt": TEXT}, {"prompt": TEXT, "add_special_tokens": False},
            {"prompt": TEXT, "return_token_strs": True}, *chats(family),
            {"messages": [{"role": "user", "content": "Count to three."},
                          {"role": "assistant", "content": "One, two,"}],
             "add_generation_prompt": False, "continue_final_message": True,
             "return_token_strs": True}]


async def post(port: int, path: str, body: dict) -> tuple[int, str | None, dict]:
    client = await RawClient.connect(port)
    try:
        answer = await client.request(b"POST", path.encode(), json.dumps(body).encode(),
                                      [(b"content-type", b"application/json")])
    finally:
        await client.aclose()
    worker = answer.header(b"x-cortex-assigned-worker")
    return answer.status, None if worker is None else worker.decode(), json.loads(answer.body)


async def test_cortex_answers_as_the_server(fresh):
    name, servers, model_dir = fresh
    by_name = {server.name: server for server in servers}
    async with cortex_front(servers, name, model_dir) as front:
        for body in bodies(name):
            body = {"model": name, **body}
            seen = set()
            for _ in range(2):
                status, worker, ours = await post(front.port, "/tokenize", body)
                assert status == 200, ours
                seen.add(worker)
                server = by_name[worker]
                theirs = await trio.to_thread.run_sync(server.post, "/tokenize", body)
                assert (status, ours) == theirs, (name, body)
                ids = ours["tokens"]
                detok = {"model": name, "tokens": ids}
                status, worker, ours = await post(front.port, "/detokenize", detok)
                seen.add(worker)
                assert (status, ours) == await trio.to_thread.run_sync(
                    by_name[worker].post, "/detokenize", detok), (name, body)
            assert seen == set(by_name)  # workers in turn
            if "messages" in body and not body.get("continue_final_message"):
                assert ids == front.prompt_ids("/v1/chat/completions", body), (name, body)


def align(python: str, model: str, urls: list[str], requests: list[tuple[str, int]]) -> list:
    done = subprocess.run([python, "-c", BENCH, model, *urls], input=json.dumps(requests),
                          capture_output=True, text=True, check=True, timeout=300,
                          env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
    return json.loads(done.stdout.strip().splitlines()[-1])


async def test_vllm_bench_serve_aligns_prompts_through_cortex(farm, engines):
    name = "deepseek-tiny"
    servers = farm.servers(ServerSet(name))
    requests = [(TEXT, 5), (TEXT * 3, 12), ("short", 100)]  # lengths the server disagrees with
    async with cortex_front(servers, name, str(engines.model(name))) as front:
        through, direct = await trio.to_thread.run_sync(
            align, str(engines.python), name,
            [f"http://127.0.0.1:{front.port}", servers[0].url], requests)
    assert "unavailable" not in through["said"] and "re-aligning" in through["said"], through
    assert through["prompts"] == direct["prompts"]
    assert through["prompts"][0] != TEXT and through["prompts"][2] == "short"
