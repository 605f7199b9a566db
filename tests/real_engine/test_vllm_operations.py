"""Cortex operating two real vLLM servers: routing under concurrency, its own restart, a killed
engine, a vanishing client, the engines' load figures, and the self-report check.

* Eight concurrent requests repeating a cached prefix all land on its holder.
* A Cortex started after traffic replays each engine's history and predicts exactly at once.
* ``kill -9`` of an engine (restarted right away, and again after Cortex noticed): no request
  is ever predicted more cached tokens than the engine then reports; the dead worker is
  logged, its ledger dropped, and replayed from 0 once it is back.
* A client that disconnects mid-stream aborts the engine's request (vLLM's running count falls
  to 0 long before the answer could have been complete).
* The engines' own gauges (running, waiting, KV-cache usage) reach Cortex's scheduler view, and
  so does its KV pool (``num_gpu_blocks`` of ``vllm:cache_config_info``, less the null block):
  the cost's KV-pressure term reads it.
* The self-report check refuses a wrong block size, a wrong model name and an engine with
  prefix caching off, each with its reason in ``/health/ready`` and the log.
* ``POST /reset_prefix_cache`` empties the engine at once but publishes ``AllBlocksCleared``
  only at its next scheduler step: until a request runs, the ledger still holds the old
  entries (the window is measured and documented in the README).
"""

from __future__ import annotations

import functools
import logging
import re

import trio

from cortex.config.tree import ModelConfig
from cortex.ledger.state import TargetState
from tests.front_http_client import RawClient
from tests.real_engine.cortex_front import BLOCK, cortex_front
from tests.real_engine.farm import ServerSet

FAMILY = "deepseek-tiny"
CHAT = "/v1/chat/completions"
PREFIX = "Shared context for every question in this test. " * 40  # ~400 tokens


def question(i: int, prefix: str = PREFIX) -> dict:
    return {"messages": [{"role": "system", "content": prefix},
                         {"role": "user", "content": f"Question number {i}?"}],
            "max_tokens": 2, "temperature": 0}


def fresh_pair(farm) -> list:
    servers = farm.servers(ServerSet(FAMILY))
    for server in servers:
        server.reset_prefix_cache()
    return servers


async def test_concurrent_repeats_of_a_cached_prefix_land_on_its_holder(farm, engines):
    servers = fresh_pair(farm)
    async with cortex_front(servers, FAMILY, str(engines.model(FAMILY))) as front:
        first = await front.send(CHAT, question(0))
        assert await front.settled(CHAT, question(0), first.worker)
        results = []

        async def ask(i: int) -> None:
            results.append(await front.send(CHAT, question(i)))

        async with trio.open_nursery() as nursery:
            for i in range(1, 9):
                nursery.start_soon(ask, i)
        assert [r.worker for r in results] == [first.worker] * 8
        assert all(r.mode == "exact_kv_events" and r.predicted > 0 for r in results)
        assert all(r.predicted <= r.reported for r in results), results


async def test_a_restarted_cortex_replays_history_and_predicts_exactly(farm, engines):
    servers = fresh_pair(farm)
    model_dir = str(engines.model(FAMILY))
    async with cortex_front(servers, FAMILY, model_dir) as front:
        workers = {}
        for i in range(6):
            body = question(i, prefix=f"Conversation {i % 3}. " + PREFIX)
            sent = await front.send(CHAT, body)
            assert await front.settled(CHAT, body, sent.worker)
            workers[i] = sent.worker
    async with cortex_front(servers, FAMILY, model_dir) as again:
        # READY from the engines' replayed history alone: nothing was sent to this Cortex yet
        for i in range(6):
            body = question(i, prefix=f"Conversation {i % 3}. " + PREFIX)
            assert again.held(CHAT, body).get(workers[i], 0) > 0
        for i in range(6, 9):
            sent = await again.send(CHAT, question(i, prefix=f"Conversation {i % 3}. " + PREFIX))
            assert sent.exact and sent.predicted > 0, sent
        counters = again.running.ingest_counters.values()
        assert sum(c.replays for c in counters) >= 2
        assert not sum(c.decode_errors + c.gaps_unrepaired for c in counters)


async def test_a_killed_engine_never_yields_a_false_hit(farm, engines, caplog):
    caplog.set_level(logging.INFO, logger="cortex")
    servers = fresh_pair(farm)
    victim = servers[0]
    async with cortex_front(servers, FAMILY, str(engines.model(FAMILY))) as front:
        sent = []
        for i in range(4):  # history on both engines
            body = question(i, prefix=f"Topic {i}. " + PREFIX)
            answer = await front.send(CHAT, body)
            await front.settled(CHAT, body, answer.worker)
            sent.append(answer)

        async def traffic(rounds: int) -> None:
            for i in range(rounds):
                answer = await front.send(CHAT, question(i, prefix=f"Topic {i % 4}. " + PREFIX))
                assert answer.status == 200, answer.body
                sent.append(answer)

        def victim_view():
            return next(v for v in front.pool.views() if v.worker == victim.name)

        await trio.to_thread.run_sync(victim.kill)
        victim.start()  # at once: a supervisor restarting the container
        await traffic(8)
        await front.until(lambda: not victim_view().healthy, 20.0)
        await trio.to_thread.run_sync(victim.wait_ready)
        await front.until(lambda: victim_view().healthy
                          and victim_view().ledger_state is TargetState.READY, 60.0)
        await traffic(8)  # the restarted engine's cache is empty: predictions must know it
    false_hits = [s for s in sent if s.predicted > (s.reported or 0)]
    assert not false_hits, false_hits
    text = caplog.text
    assert f"worker {victim.name} is not live" in text
    assert f"worker {victim.name} rank 0 ledger syncing: worker down" in text
    assert f"worker {victim.name} is live" in text
    assert f"worker {victim.name} rank 0 ledger ready" in text


async def test_a_cache_reset_reaches_the_ledger_at_the_engines_next_step(farm, engines):
    servers = fresh_pair(farm)
    async with cortex_front(servers, FAMILY, str(engines.model(FAMILY))) as front:
        first = await front.send(CHAT, question(0))
        assert await front.settled(CHAT, question(0), first.worker)
        engine = next(s for s in servers if s.name == first.worker)
        await trio.to_thread.run_sync(functools.partial(engine.reset_prefix_cache, step=False))
        with trio.move_on_after(1.0):  # no traffic: the event does not come
            await front.until(lambda: not front.held(CHAT, question(0)), 10.0)
            raise AssertionError("vLLM published the cleared cache without a step")
        assert front.held(CHAT, question(0))[first.worker] > 0  # the window: a stale ledger
        started = trio.current_time()
        await trio.to_thread.run_sync(engine.step)
        await front.until(lambda: not front.held(CHAT, question(0)), 5.0)
        assert trio.current_time() - started < 5.0


async def test_a_vanishing_client_aborts_the_engines_request(farm, engines):
    servers = fresh_pair(farm)
    async with cortex_front(servers, FAMILY, str(engines.model(FAMILY))) as front:
        body = {"model": FAMILY, "prompt": "Count forever:", "max_tokens": 1900,
                "ignore_eos": True, "stream": True}
        client, worker = await front.open_stream("/v1/completions", body)
        engine = next(s for s in servers if s.name == worker)
        generated_before = await trio.to_thread.run_sync(engine.metric,
                                                         "vllm:generation_tokens_total")
        assert await trio.to_thread.run_sync(engine.metric, "vllm:num_requests_running") == 1
        await client.aclose()
        with trio.fail_after(15):
            while await trio.to_thread.run_sync(engine.metric, "vllm:num_requests_running"):
                await trio.sleep(0.1)  # the engine's own gauge: nothing to wait on but it
        generated = await trio.to_thread.run_sync(engine.metric,
                                                  "vllm:generation_tokens_total")
        assert generated - generated_before < 1900 - 100, "the request ran to its end"


async def test_engine_gauges_reach_the_scheduler(farm, engines):
    servers = fresh_pair(farm)
    async with cortex_front(servers, FAMILY, str(engines.model(FAMILY))) as front:
        engine = servers[1]
        long = {"model": FAMILY, "prompt": "Go on:", "max_tokens": 1900, "ignore_eos": True}

        def view():
            return next(v for v in front.pool.views() if v.worker == engine.name)

        status, metrics = engine.get("/metrics")
        blocks = re.search(r'vllm:cache_config_info\{[^}]*num_gpu_blocks="(\d+)"', metrics.decode())
        assert status == 200 and blocks is not None and int(blocks.group(1)) > 1
        await front.until(lambda: view().kv_tokens is not None, 20.0)  # its report read
        assert view().kv_tokens == (int(blocks.group(1)) - 1) * BLOCK

        post = functools.partial(trio.to_thread.run_sync, engine.post, "/v1/completions", long,
                                 abandon_on_cancel=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post)
            await front.until(lambda: (front.running.registry.status(engine.name).loads
                                       .get(0) is not None and front.running.registry
                                       .status(engine.name).loads[0].running == 1), 20.0)
            assert view().kv_usage is not None and view().kv_usage > 0
            assert view().engine_queue == 0
            nursery.cancel_scope.cancel()


async def test_the_self_report_check_refuses_what_would_never_hit(farm, engines, caplog):
    caplog.set_level(logging.WARNING, logger="cortex")
    model_dir = str(engines.model(FAMILY))
    pair = farm.servers(ServerSet(FAMILY))

    def reason(front) -> str | None:
        return front.pool.exact_off

    wrong_block = (ModelConfig(name=FAMILY, tokenizer=model_dir, block_size=BLOCK // 2),)
    async with cortex_front(pair, FAMILY, model_dir, ready=False, models=wrong_block) as front:
        await front.until(lambda: reason(front) is not None)
        assert "page size 32 != profile block size 16" in reason(front)
    async with cortex_front(pair, "not-served-here", model_dir, ready=False) as front:
        await front.until(lambda: reason(front) is not None)
        assert "serves 'deepseek-tiny', profile is for 'not-served-here'" in reason(front)

    no_cache = farm.servers(ServerSet(FAMILY, count=1, prefix_caching=False))
    async with cortex_front([pair[0], *no_cache], FAMILY, model_dir, ready=False) as front:
        await front.until(lambda: reason(front) is not None)
        assert "prefix caching off" in reason(front)
        client = await RawClient.connect(front.running.control_port)
        ready = await client.request(b"GET", b"/health/ready")
        await client.aclose()
        assert b"prefix caching off" in ready.body
    assert "prefix caching off" in caplog.text and "exact routing off" in caplog.text
