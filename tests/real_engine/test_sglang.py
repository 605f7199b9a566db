"""Cortex in front of real SGLang servers (0.5.15 on the CPU, page size 1: SGLang's default),
one per tokenizer family, shared by the tests of this module and started side by side.

* Cortex renders and tokenizes every chat shape as SGLang does (SGLang's own prompt ids of the
  request, ``return_prompt_token_ids``).
* Cortex keys 16-token blocks while SGLang publishes one event per token: every request shape
  Cortex routes for SGLang (``/generate`` with text and with ``input_ids``,
  ``/v1/chat/completions``, ``/v1/completions``, streamed and not), sent twice, is predicted
  exactly SGLang's reported ``cached_tokens`` rounded down to the block, on its first send
  (a prefix shared with the shapes before it) and on its repeat — never more.
* ``/flush_cache`` publishes ``AllBlocksCleared`` and the ledger empties; a small KV pool evicts
  (one ``BlockRemoved`` per radix node) and no prediction is ever above the report; a Cortex
  started after traffic replays SGLang's history (its replay endpoint) and predicts exactly;
  ``kill -9`` and restart of the engine leaves no false hit; a client that disconnects
  mid-stream aborts SGLang's request.
"""

from __future__ import annotations

import json
import logging

import pytest
import trio

from cortex.errors import BadRequest
from tests.real_engine.cortex_front import Front, Sent, cortex_front
from tests.real_engine.engine_server import FAMILIES, EngineEnv, start_all
from tests.real_engine.sglang_server import SglangOptions, SglangServer
from tests.real_engine.test_vllm_predictions import chats

BLOCK = 16  # Cortex's block: SGLang's one-token pages are folded into it
CHAT = "/v1/chat/completions"
PREFIX = "Shared context for every question in this test. " * 30  # ~300 tokens


@pytest.fixture(scope="module")
def sglang(sglang_engines: EngineEnv, engine_logs) -> dict[str, SglangServer]:
    servers = {family: SglangServer(f"sglang-{family}",
                                    SglangOptions(sglang_engines.model(family), family),
                                    sglang_engines, engine_logs) for family in FAMILIES}
    start_all(list(servers.values()))
    yield servers
    for server in servers.values():
        server.kill()  # (a SIGTERM takes SGLang ~10 s to honour)


def _model_dir(server: SglangServer) -> str:
    return str(server.options.model_dir)


async def _fresh(server: SglangServer) -> None:
    await trio.to_thread.run_sync(server.flush_cache)


def question(i: int, prefix: str = PREFIX) -> dict:
    return {"messages": [{"role": "system", "content": prefix},
                         {"role": "user", "content": f"Question number {i}?"}],
            "max_tokens": 2, "temperature": 0}


def shapes(family: str, text: str, ids: list[int]) -> list[tuple[str, dict, bool]]:
    """(path, body, streamed): every request shape Cortex routes for SGLang."""
    sampling = {"max_new_tokens": 2, "temperature": 0}
    chat = {"messages": [{"role": "system", "content": text},
                         {"role": "user", "content": "Say something."}],
            "max_tokens": 2, "temperature": 0}
    return [
        ("/generate", {"text": text, "sampling_params": sampling}, False),
        ("/generate", {"text": text + " streamed", "sampling_params": sampling}, True),
        ("/generate", {"input_ids": ids, "sampling_params": sampling}, False),
        (CHAT, chat, False),
        (CHAT, {**chat, "messages": [*chat["messages"][:1],
                                     {"role": "user", "content": "Stream it."}]}, True),
        ("/v1/completions", {"prompt": text + " plain", "max_tokens": 2}, False),
        ("/v1/completions", {"prompt": text + " plain, streamed", "max_tokens": 2}, True),
    ]


@pytest.mark.parametrize("family", FAMILIES)
async def test_cortex_renders_and_tokenizes_chats_as_sglang(sglang, family):
    server = sglang[family]
    async with cortex_front([server], family, _model_dir(server),
                            block_size=BLOCK) as front:
        for body in chats(family):
            status, answer = await trio.to_thread.run_sync(
                server.post, CHAT, {"model": family, **body, "max_tokens": 1,
                                    "return_prompt_token_ids": True})
            if status == 400:  # the template raises (DeepSeek's on a developer turn): so do we
                with pytest.raises(BadRequest):
                    front.prompt_ids(CHAT, body)
                continue
            assert status == 200, answer
            theirs = answer["choices"][0]["prompt_token_ids"]
            assert front.prompt_ids(CHAT, body) == theirs, body


@pytest.mark.parametrize("family", FAMILIES)
async def test_every_request_shape_is_predicted_to_the_block_below_sglangs_report(sglang, family):
    server = sglang[family]
    await _fresh(server)
    async with cortex_front([server], family, _model_dir(server),
                            block_size=BLOCK) as front:
        text = f"{family}: " + "A long shared instruction about the weather in Zürich. " * 12
        ids = front.prompt_ids("/v1/completions", {"prompt": "Numbers: 1 2 3 4 5 " * 20})
        sent: list[tuple[str, Sent, Sent]] = []
        for path, body, stream in shapes(family, text, ids):
            first = await front.send(path, body, stream=stream)
            assert first.status == 200, first.body
            assert await front.settled(path, body, server.name), (path, body)
            again = await front.send(path, body, stream=stream)
            sent.append((path, first, again))
        over = [(p, s) for p, a, b in sent for s in (a, b) if s.predicted > s.reported]
        assert not over, over
        # exact on repeats and on first sends alike (most share the text with the shapes
        # before them: a prefix SGLang holds from another request)
        wrong = [(p, s) for p, a, b in sent for s in (a, b)
                 if s.predicted != s.reported // BLOCK * BLOCK]
        assert not wrong, wrong
        assert all(b.predicted > 0 and b.mode == "exact_kv_events" for _, _, b in sent), sent
        assert sum(a.predicted > 0 for _, a, _ in sent) >= 3, sent  # shared prefixes hit


async def test_flush_eviction_replay_and_restart_never_give_a_false_hit(sglang, caplog):
    caplog.set_level(logging.INFO, logger="cortex")
    family = "deepseek-tiny"
    server = sglang[family]
    model_dir = _model_dir(server)
    await _fresh(server)
    sent: list[Sent] = []
    async with cortex_front([server], family, model_dir, block_size=BLOCK) as front:
        first = await front.send(CHAT, question(0))
        assert await front.settled(CHAT, question(0), server.name)
        await _fresh(server)  # AllBlocksCleared: the ledger empties
        await front.until(lambda: not front.held(CHAT, question(0)), 10.0)
        sent.append(await front.send(CHAT, question(0)))
        assert sent[-1].predicted == sent[-1].reported == 0
        # a pool of 8k tokens, ~330-token conversations: the 30th evicts the first ones
        for i in range(36):
            sent.append(await front.send(CHAT, question(i, prefix=f"Topic {i}. " + PREFIX)))
        for i in range(0, 36, 4):  # early ones (evicted) and late ones (held)
            sent.append(await front.send(CHAT, question(i, prefix=f"Topic {i}. " + PREFIX)))
        assert any(s.predicted > 0 for s in sent[-9:])
        counters = front.running.ingest_counters.values()
        assert sum(c.removed_blocks for c in counters) > 0  # SGLang evicted, Cortex followed
    async with cortex_front([server], family, model_dir, block_size=BLOCK) as again:
        # READY from SGLang's replayed history alone
        late = question(32, prefix="Topic 32. " + PREFIX)
        assert again.held(CHAT, late).get(server.name, 0) > 0
        replayed = await again.send(CHAT, late)
        assert replayed.predicted == replayed.reported // BLOCK * BLOCK > 0, replayed
        sent.append(replayed)
        counters = again.running.ingest_counters.values()
        assert sum(c.replays for c in counters) >= 1
        assert not sum(c.decode_errors + c.gaps_unrepaired for c in counters)

        def view(front: Front):
            return next(v for v in front.pool.views() if v.worker == server.name)

        await trio.to_thread.run_sync(server.kill)
        server.start()  # at once, as a supervisor would
        await again.until(lambda: not view(again).healthy, 60.0)
        await trio.to_thread.run_sync(server.wait_ready)
        await again.until(lambda: view(again).healthy, 60.0)
        for i in range(30, 36):  # the restarted engine's cache is empty
            sent.append(await again.send(CHAT, question(i, prefix=f"Topic {i}. " + PREFIX)))
    false_hits = [s for s in sent if s.status != 200 or s.predicted > s.reported]
    assert not false_hits, false_hits
    assert first.status == 200


async def test_a_vanishing_client_aborts_sglangs_request(sglang):
    family = "qwen-tiny"
    server = sglang[family]
    async with cortex_front([server], family, _model_dir(server),
                            block_size=BLOCK) as front:
        body = {"model": family, "prompt": "Count forever:", "max_tokens": 1900,
                "ignore_eos": True, "stream": True}
        client, _ = await front.open_stream("/v1/completions", body)

        def running() -> int:
            status, raw = server.get("/get_load")
            assert status == 200, raw
            return sum(rank.get("num_reqs", 0) for rank in json.loads(raw))

        assert await trio.to_thread.run_sync(running) == 1
        await client.aclose()
        with trio.fail_after(15):  # 1900 tokens take ~20 s here: an abort ends it long before
            while await trio.to_thread.run_sync(running):
                await trio.sleep(0.1)  # the engine's own count: nothing to wait on but it
