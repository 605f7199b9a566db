"""Simulated prefill/decode engines over real sockets, driven by hand as a gateway would: the
right orchestration works, and each wrong one fails the way the real engines fail (400 for
missing fields, 500 when the KV cannot be had), leaving nothing waiting on either engine.
Every test runs on both engine timing models (``engine_model``: fixed, batching)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import pytest
import trio

from cortex.sim.engine import SimEngine
from cortex.sim.pd import PdSimSettings
from cortex.sim.serving import TimingConfig
from tests.front_http_client import RawClient, RawResponse
from tests.sim_engine_profile import chat, deepseek

FAST = TimingConfig(prefill_tokens_per_s=1e6, decode_s_per_token=0.0)
SHORT = PdSimSettings(waiting_timeout_s=0.5, bootstrap_timeout_s=0.5, kv_lease_s=0.5)
pytestmark = pytest.mark.parametrize("engine_model", ["fixed", "batching"])


@asynccontextmanager
async def pair(flavor: str, engine_model: str, settings: PdSimSettings = SHORT,
               **kwargs: Any) -> AsyncIterator[tuple[SimEngine, SimEngine]]:
    kwargs["engine_model"] = engine_model
    prefill = SimEngine("p0", flavor, deepseek(), timing=FAST, pd_role="prefill",
                        bootstrap_port=0, pd_settings=settings, **kwargs)
    decode = SimEngine("d0", flavor, deepseek(), timing=FAST, pd_role="decode",
                       pd_settings=settings, **kwargs)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(prefill.run)
            await nursery.start(decode.run)
            yield prefill, decode
            nursery.cancel_scope.cancel()


async def post(engine: SimEngine, path: str, body: dict[str, Any]) -> RawResponse:
    assert engine.url is not None
    client = await RawClient.connect(urlsplit(engine.url).port or 0)
    try:
        return await client.request(b"POST", path.encode(), json.dumps(body).encode(),
                                    [(b"content-type", b"application/json")])
    finally:
        await client.aclose()


def sglang_body(prefill: SimEngine, room: int, **extra: Any) -> dict[str, Any]:
    assert prefill.pd is not None
    return chat("Split me.", max_tokens=5, bootstrap_host="127.0.0.1",
                bootstrap_port=prefill.pd.bootstrap_port, bootstrap_room=room, **extra)


async def idle(*engines: SimEngine) -> None:
    """Wait (woken by the engines' PD state changes) until no PD exchange is left."""
    with trio.fail_after(10):
        while not all(e.pd is not None and e.pd.idle() and not e.busy() for e in engines):
            with trio.move_on_after(0.05):
                await engines[0].pd.wait_changed()  # type: ignore[union-attr]


def events(body: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in body.split(b"\n")
            if line.startswith(b"data: {")]


async def test_sglang_both_legs_at_once_stream_decodes_answer(engine_model):
    async with pair("sglang-0.5.23", engine_model) as (prefill, decode):
        body = sglang_body(prefill, 12345, stream=True,
                           stream_options={"include_usage": True})
        answers: dict[str, RawResponse] = {}

        async def leg(name: str, engine: SimEngine) -> None:
            answers[name] = await post(engine, "/v1/chat/completions", body)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(leg, "decode", decode)  # decode first: it waits for the room
            nursery.start_soon(leg, "prefill", prefill)
        assert answers["prefill"].status == answers["decode"].status == 200
        text = "".join(e["choices"][0]["delta"].get("content", "")
                       for e in events(answers["decode"].body) if e["choices"])
        assert text == " The quick brown fox jumps"
        assert len([e for e in events(answers["prefill"].body) if e["choices"]]) == 2  # role+1
        usage = events(answers["decode"].body)[-1]["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0  # no radix cache on decode
        assert decode.kv.used_blocks(0) == 0 and prefill.kv.used_blocks(0) > 0
        await idle(prefill, decode)


async def test_sglang_generate_batch_room_list_of_one(engine_model):
    async with pair("sglang-0.5.23", engine_model) as (prefill, decode):
        body = {"text": "Hello there, general.", "sampling_params": {"max_new_tokens": 3},
                "bootstrap_host": "127.0.0.1", "bootstrap_port": prefill.pd.bootstrap_port,
                "bootstrap_room": [7]}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, prefill, "/generate", body)
            answer = await post(decode, "/generate", body)
        assert answer.status == 200
        assert json.loads(answer.body)["text"] == " The quick brown"
        body["bootstrap_room"] = [7, 8]  # two rooms for one prompt
        assert (await post(decode, "/generate", body)).status == 400
        await idle(prefill, decode)


async def test_sglang_batch_one_room_per_item(engine_model):
    async with pair("sglang-0.5.23", engine_model) as (prefill, decode):
        body = {"text": ["First prompt.", "Second, longer prompt."],
                "sampling_params": {"max_new_tokens": 2}, "bootstrap_host": "127.0.0.1",
                "bootstrap_port": prefill.pd.bootstrap_port, "bootstrap_room": [21, 22]}
        for rooms in ([21, 22], 30):  # a list, or one room r meaning r, r + 1
            body["bootstrap_room"] = rooms
            answers = {}

            async def leg(engine: SimEngine) -> None:
                answers[engine.name] = await post(engine, "/generate", body)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(leg, prefill)
                nursery.start_soon(leg, decode)
            assert answers["d0"].status == answers["p0"].status == 200, answers["d0"].body
            items = json.loads(answers["d0"].body)
            assert [item["text"] for item in items] == [" The quick", " The quick"]
            assert items[0]["meta_info"]["prompt_tokens"] < items[1]["meta_info"]["prompt_tokens"]
            assert [i["meta_info"]["completion_tokens"]
                    for i in json.loads(answers["p0"].body)] == [1, 1]
        await idle(prefill, decode)
        body["bootstrap_room"] = [21]
        assert (await post(decode, "/generate", body)).status == 400


async def test_sglang_missing_bootstrap_fields_are_refused(engine_model):
    async with pair("sglang-0.5.23", engine_model) as (prefill, decode):
        for engine in (prefill, decode):
            answer = await post(engine, "/v1/chat/completions", chat(max_tokens=2))
            assert answer.status == 400, answer.body
            assert b"bootstrap" in answer.body
        await idle(prefill, decode)


async def test_sglang_decode_fails_when_the_room_never_appears(engine_model):
    async with pair("sglang-0.5.23", engine_model) as (prefill, decode):
        started = trio.current_time()
        answer = await post(decode, "/v1/chat/completions", sglang_body(prefill, 99))
        assert answer.status == 500
        assert trio.current_time() - started >= SHORT.waiting_timeout_s
        await idle(prefill, decode)


async def test_sglang_decode_fails_at_once_when_the_prefill_is_unreachable(engine_model):
    async with pair("sglang-0.5.23", engine_model) as (prefill, decode):
        body = sglang_body(prefill, 5)
        body["bootstrap_port"] = 1  # nobody listens for bootstraps there
        answer = await post(decode, "/v1/chat/completions", body)
        assert answer.status == 500
        assert b"unreachable" in answer.body
        await idle(prefill, decode)


async def test_sglang_prefill_alone_times_out_and_frees_its_blocks(engine_model):
    async with pair("sglang-0.5.23", engine_model) as (prefill, decode):
        answer = await post(prefill, "/v1/chat/completions", sglang_body(prefill, 3))
        assert answer.status == 500
        assert b"no decode engine fetched" in answer.body
        await idle(prefill, decode)


async def test_sglang_decode_with_another_prompt_fails(engine_model):
    async with pair("sglang-0.5.23", engine_model) as (prefill, decode):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, prefill, "/v1/chat/completions", sglang_body(prefill, 4))
            wrong = sglang_body(prefill, 4)
            wrong["messages"][-1]["content"] = "Another question."
            answer = await post(decode, "/v1/chat/completions", wrong)
        assert answer.status == 500
        assert b"another prompt" in answer.body


async def test_sglang_decode_cancelled_while_waiting_leaves_nothing(engine_model):
    async with pair("sglang-0.5.23", engine_model, PdSimSettings()) as (prefill, decode):
        with trio.move_on_after(0.3):
            await post(decode, "/v1/chat/completions", sglang_body(prefill, 11))
        await idle(prefill, decode)


# ---------------------------------------------------------------------------------- vLLM

def vllm_prefill_body(**extra: Any) -> dict[str, Any]:
    return chat("Split me.", max_tokens=1, stream=False, kv_transfer_params={
        "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
        "remote_block_ids": None, "remote_host": None, "remote_port": None}, **extra)


async def test_vllm_transfer_params_carry_the_kv_to_decode(engine_model):
    async with pair("vllm-0.33", engine_model) as (prefill, decode):
        first = await post(prefill, "/v1/chat/completions", vllm_prefill_body())
        assert first.status == 200
        answer = json.loads(first.body)
        params = answer["kv_transfer_params"]
        assert params["do_remote_prefill"] is True
        assert params["remote_port"] == prefill.pd.bootstrap_port
        assert answer["usage"]["completion_tokens"] == 1
        assert prefill.pd.pinned == 1  # blocks kept for the decode
        if engine_model == "batching":  # ... in the model: they count against its pool
            assert prefill.load(0).kv_usage > 0 and prefill.load(0).running == 0
        body = chat("Split me.", max_tokens=4, stream=True, kv_transfer_params=params)
        second = await post(decode, "/v1/chat/completions", body)
        assert second.status == 200
        assert second.body.endswith(b"data: [DONE]\n\n")
        assert decode.kv.used_blocks(0) > 0  # the received blocks are cached on decode
        again = await post(decode, "/v1/chat/completions", body)  # read once only
        assert again.status == 500
        await idle(prefill, decode)
        assert prefill.load(0).kv_usage == 0.0  # the pin was released once decode read it
        # a later request with the same prefix hits decode's cache
        alone = json.loads((await post(decode, "/v1/chat/completions",
                                       chat("Split me.", max_tokens=2))).body)
        assert alone["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


async def test_vllm_decode_refuses_incomplete_or_expired_params(engine_model):
    async with pair("vllm-0.33", engine_model) as (prefill, decode):
        params = json.loads((await post(prefill, "/v1/chat/completions",
                                        vllm_prefill_body())).body)["kv_transfer_params"]
        partial = {k: v for k, v in params.items() if k != "remote_request_id"}
        answer = await post(decode, "/v1/chat/completions",
                            chat("Split me.", kv_transfer_params=partial))
        assert answer.status == 400
        await idle(prefill, decode)  # the lease ran out: the blocks are unpinned
        answer = await post(decode, "/v1/chat/completions",
                            chat("Split me.", kv_transfer_params=params))
        assert answer.status == 500
        assert b"unknown or expired" in answer.body


async def test_vllm_decode_without_params_computes_the_prefill(engine_model):
    async with pair("vllm-0.33", engine_model) as (prefill, decode):
        answer = await post(decode, "/v1/chat/completions", chat("Alone.", max_tokens=3))
        assert answer.status == 200
        assert json.loads(answer.body)["choices"][0]["message"]["content"] == (
            " The quick brown")
        await idle(prefill, decode)


async def test_server_info_names_the_role(engine_model):
    async with pair("sglang-0.5.23", engine_model) as (prefill, decode):
        for engine, mode in ((prefill, "prefill"), (decode, "decode")):
            client = await RawClient.connect(urlsplit(engine.url or "").port or 0)
            info = json.loads((await client.request(b"GET", b"/server_info")).body)
            await client.aclose()
            assert info["disaggregation_mode"] == mode
        assert info["disaggregation_bootstrap_port"] == 8998  # decode: SGLang's default
