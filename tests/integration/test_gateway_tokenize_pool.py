"""``server.tokenize_processes`` over real sockets: Cortex with one tokenizer process in front
of two simulated engines. A long new prompt (code and Chinese: no fast path) is tokenized in
the pool's process, and its ids are exact: the next turn's predicted hit equals what the
engine reports it served from its cache. A small request is tokenized inline (no job)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import trio

from cortex.config.tree import ServerConfig
from tests import deepseek_profile as ds
from tests.gateway_cluster import gateway_cluster, template_path
from tests.integration.test_cli_serve_sim import read_line, request, until_serving

MODEL = "deepseek"

CODE = "def route(self, ids):\n    return self.ledger.match(ids)  # 最长前缀\n" * 60
CHINESE = "网关按前缀把请求送到缓存所在的引擎。" * 80


async def test_long_new_text_goes_through_the_pool_and_routes_exactly():
    server = ServerConfig(host="127.0.0.1", port=0, tokenize_processes=1)
    async with gateway_cluster(config_changes={"server": server}) as cluster:
        pool = cluster.running.gateway.tokenize_pool
        assert pool is not None and pool.models == {"deepseek"}
        turn = [{"role": "system", "content": CODE}, {"role": "user", "content": CHINESE}]
        first = await cluster.chat(turn)
        assert first.status == 200, first.body
        assert pool.jobs == 1 and pool.fallbacks == 0
        holder = first.header(b"x-cortex-assigned-worker").decode()
        await cluster.until(lambda: cluster.holders(turn).get(holder, 0) > 0)

        turn += [{"role": "assistant", "content": "好的。"},
                 {"role": "user", "content": "And the next block?"}]
        second = await cluster.chat(turn)
        assert second.status == 200
        assert pool.jobs == 1  # only short new text: tokenized inline
        assert second.header(b"x-cortex-assigned-worker").decode() == holder
        assert second.header(b"x-cortex-match-mode") == b"exact_kv_events"
        predicted = int(second.header(b"x-cortex-cache-hit-tokens"))
        reported = json.loads(second.body)["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert predicted > 1000 and predicted == reported

        exposition = cluster.running.metrics.render().decode()
        assert "cortex_tokenize_pool_processes 1\n" in exposition
        assert "cortex_tokenize_pool_jobs_total 1\n" in exposition
        assert "cortex_tokenize_pool_fallbacks_total 0\n" in exposition


def children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found.update(int(child) for child in f.read().split())
    return found


def cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_cortex_serve_with_two_tokenizer_processes_serves_and_stops_with_them():
    """As processes: ``cortex serve --server-tokenize-processes 2`` starts both before it
    serves, a long new prompt goes to one, and a SIGTERM to the whole process group (the
    pool's processes ignore it) drains Cortex, which exits 0 and leaves none behind."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    sim = await trio.lowlevel.open_process(
        [sys.executable, "-m", "cortex", "sim", "--engine", "sglang", "--count", "1",
         "--port", "0", "--block-size", "16", "--model", MODEL, "--tokenizer",
         ds.TOKENIZER_JSON, "--chat-template", template_path(), "--bos-token", ds.BOS,
         "--eos-token", ds.EOS], stdout=subprocess.PIPE, env=env)
    serve = None
    try:
        with trio.fail_after(90):
            name, _profile, url, _events, rank0, replay0 = (
                await read_line(sim, bytearray())).split()[:6]
            serve = await trio.lowlevel.open_process(
                [sys.executable, "-m", "cortex", "serve", "--server-host", "127.0.0.1",
                 "--server-port", "0", "--control-port", "0", "--health-interval-s", "0.2",
                 "--server-tokenize-processes", "2",
                 "--model", f"{MODEL},tokenizer={ds.TOKENIZER_JSON},block_size=16,"
                 f"chat_template={template_path()},bos_token={ds.BOS},eos_token={ds.EOS}",
                 "--worker", f"{url},name={name},engine=sglang,model={MODEL},"
                 f"events={rank0.split('=', 1)[1]},replay={replay0.split('=', 1)[1]}"],
                stdout=subprocess.PIPE, env=env, start_new_session=True)
            port = await until_serving(serve)
            pool = {pid for pid in children(serve.pid) if b"spawn_main" in cmdline(pid)}
            assert len(pool) >= 2  # the two tokenizer processes (and multiprocessing's tracker)
            status, headers, _ = await request(port, {"model": MODEL, "max_tokens": 2,
                                                      "messages": [{"role": "user",
                                                                    "content": CHINESE}]})
            assert status == 200 and headers[b"x-cortex-match-mode"] == b"load_aware"

            os.killpg(serve.pid, signal.SIGTERM)
            assert await serve.wait() == 0
            assert not [pid for pid in pool if alive(pid)]
    finally:
        for process in (serve, sim):
            if process is not None and process.returncode is None:
                process.kill()
                await process.wait()
