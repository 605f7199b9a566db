"""The engines' tokenizer endpoints through Cortex, over simulated engines of both flavors.

* ``POST /tokenize`` (a prompt; chat messages, with and without the generation prompt: SGLang
  renders a chat as its chat endpoint does, with it whatever is asked) and
  ``/detokenize`` go to the model's workers in turn, and each answer is its engine's own shape
  (vLLM ``count, max_model_len, tokens, token_strs`` and ``prompt``; SGLang ``tokens, count,
  max_model_len`` and ``text``), its ids the ones Cortex itself computes for that prompt. They
  are not routing decisions (nothing in ``cortex_decisions_total``).
* SGLang's ``/v1/tokenize`` and ``/v1/detokenize`` go to SGLang workers only; a pool without
  one answers 404 saying so. ``GET /tokenize`` is 405, an unknown model 404.
* A worker answering 503 is retried around before the first byte and counted; when every
  worker fails, the last one's answer is relayed. A refused connection is retried on another
  worker; with no live worker left the answer is 503, counted in ``cortex_no_worker_total``.
* In a prefill/decode pool a tokenizer call is one exchange with one worker, never a PD pair.
"""

from __future__ import annotations

import json

from cortex.dispatch.endpoints import Endpoint, request_prompt
from cortex.profile.request_keys import prompt_token_ids
from cortex.sim.pd import PdSimSettings
from tests.front_http_client import RawClient
from tests.gateway_cluster import MODEL, SYSTEM_TEXT, Cluster, gateway_cluster, model_profile

TEXT = "Cortex sends each prompt where its prefix is cached. 网关按前缀路由。"
MESSAGES = [{"role": "system", "content": SYSTEM_TEXT}, {"role": "user", "content": "Hi"}]


def cortex_ids(cluster: Cluster, endpoint: Endpoint, body: dict,
               engine: str = "vllm") -> list[int]:
    """The prompt's ids as Cortex computes them for a generation request (a chat rendered as
    ``engine`` renders it)."""
    pool = cluster.running.pools[MODEL]
    prompt = request_prompt(endpoint, body, pool.profile.chat_templates, engine)
    assert prompt is not None
    return prompt_token_ids(prompt, pool.tokenizer).tolist()


async def by_worker(cluster: Cluster, path: str, body: dict, times: int = 2) -> dict[str, dict]:
    """Worker -> its answer, for ``times`` requests (workers are taken in turn)."""
    answers = {}
    for _ in range(times):
        answer = await cluster.request(path, {"model": MODEL, **body})
        assert answer.status == 200, answer.body
        answers[answer.header(b"x-cortex-assigned-worker").decode()] = json.loads(answer.body)
    return answers


async def test_each_engine_answers_in_its_own_shape_with_cortex_ids():
    async with gateway_cluster(("vllm-0.33", "sglang-0.5.23")) as cluster:
        tokenizer = model_profile().tokenizer
        ids = cortex_ids(cluster, Endpoint.COMPLETIONS, {"prompt": TEXT})
        answers = await by_worker(cluster, "/tokenize", {"prompt": TEXT,
                                                         "return_token_strs": True})
        vllm, sglang = answers["e0"], answers["e1"]
        assert vllm == {"count": len(ids), "max_model_len": vllm["max_model_len"],
                        "tokens": ids, "token_strs": [tokenizer.id_to_token(i) for i in ids]}
        assert list(vllm) == ["count", "max_model_len", "tokens", "token_strs"]
        assert sglang == {"tokens": ids, "count": len(ids),
                          "max_model_len": sglang["max_model_len"]}
        assert list(sglang) == ["tokens", "count", "max_model_len"]

        bare = await by_worker(cluster, "/tokenize", {"prompt": TEXT,
                                                      "add_special_tokens": False})
        assert bare["e0"]["tokens"] == bare["e1"]["tokens"] == cortex_ids(
            cluster, Endpoint.COMPLETIONS, {"prompt": TEXT, "add_special_tokens": False})
        for extra in ({}, {"add_generation_prompt": False}):
            chat = {"messages": MESSAGES, **extra}
            want = cortex_ids(cluster, Endpoint.CHAT, chat)
            answers = await by_worker(cluster, "/tokenize", chat)
            assert answers["e0"]["tokens"] == want, extra
            # SGLang renders a chat through its chat path: always the generation prompt
            assert answers["e1"]["tokens"] == cortex_ids(
                cluster, Endpoint.CHAT, {"messages": MESSAGES}, "sglang"), extra
        assert len(want) < len(cortex_ids(cluster, Endpoint.CHAT, {"messages": MESSAGES}))

        answers = await by_worker(cluster, "/detokenize", {"tokens": ids})
        assert answers == {"e0": {"prompt": tokenizer.decode(ids, skip_special_tokens=False)},
                           "e1": {"text": tokenizer.decode(ids, skip_special_tokens=True)}}
        assert TEXT in answers["e0"]["prompt"]

        for path, body in (("/v1/tokenize", {"prompt": [TEXT, "two"]}),
                           ("/v1/detokenize", {"tokens": [ids, ids[:3]]})):
            answers = await by_worker(cluster, path, body, times=3)
            assert list(answers) == ["e1"], path  # SGLang's routes only
        assert answers["e1"]["text"][0] == tokenizer.decode(ids)

        text = (await cluster.admin(b"GET", b"/metrics")).body.decode()
        assert "cortex_decisions_total{" not in text  # passed on, not routed


async def test_refusals_retries_and_no_live_worker():
    async with gateway_cluster(("vllm-0.33", "vllm-0.33")) as cluster:
        prompt = {"model": MODEL, "prompt": TEXT}
        answer = await cluster.request("/v1/tokenize", prompt)
        assert answer.status == 404
        assert b"served by sglang engines only" in answer.body, answer.body
        answer = await cluster.request("/tokenize", {**prompt, "model": "other"})
        assert answer.status == 404 and b"not served here" in answer.body
        client = await RawClient.connect(cluster.port)
        try:
            answer = await client.request(b"GET", b"/tokenize", b"", [])
        finally:
            await client.aclose()
        assert answer.status == 405 and answer.header(b"allow") == b"POST"

        e0, e1 = cluster.engines
        e0.faults.fail_status = 503
        retried = 0
        for _ in range(2):
            answer = await cluster.request("/tokenize", prompt)
            assert answer.status == 200, answer.body
            assert answer.header(b"x-cortex-assigned-worker") == b"e1"
            retried += answer.header(b"x-cortex-attempts") == b"2"
        assert retried >= 1
        text = cluster.running.metrics.render().decode()
        assert (f'cortex_upstream_errors_total{{worker="e0",phase="head",status="503"}} '
                f'{retried}') in text
        assert f'cortex_retries_total{{phase="head"}} {retried}' in text

        e1.faults.fail_status = 503  # every worker fails: the last answer is relayed
        answer = await cluster.request("/detokenize", {"model": MODEL, "tokens": [1, 2]})
        assert answer.status == 503 and b"simulated failure" in answer.body

        e0.faults.fail_status = e1.faults.fail_status = None
        cluster.stop_engine("e0")  # refused at once: retried on e1 (or e0 already not live)
        for _ in range(2):
            answer = await cluster.request("/tokenize", prompt)
            assert answer.status == 200, answer.body
            assert answer.header(b"x-cortex-assigned-worker") == b"e1"
        cluster.stop_engine("e1")
        pool = cluster.running.pools[MODEL]
        await cluster.until(lambda: not any(view.healthy for view in pool.views()))
        answer = await cluster.request("/tokenize", prompt)
        assert answer.status == 503, answer.body
        text = cluster.running.metrics.render().decode()
        assert f'cortex_no_worker_total{{model="{MODEL}"}} 1' in text


async def test_a_prefill_decode_pool_answers_from_one_worker():
    settings = PdSimSettings(waiting_timeout_s=5.0, bootstrap_timeout_s=5.0, kv_lease_s=5.0)
    async with gateway_cluster(("vllm-0.33", "vllm-0.33"), roles=("prefill", "decode"),
                               pd_settings=settings) as cluster:
        want = cortex_ids(cluster, Endpoint.CHAT, {"messages": MESSAGES})
        answers = await by_worker(cluster, "/tokenize", {"messages": MESSAGES})
        assert set(answers) == {"e0", "e1"}
        assert all(answer["tokens"] == want for answer in answers.values())
        assert all(engine.counters[0].requests == 0 for engine in cluster.engines)
