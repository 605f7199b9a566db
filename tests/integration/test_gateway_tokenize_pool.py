"""``server.tokenize_processes`` over real sockets: Cortex with one tokenizer process in front
of two simulated engines. A long new prompt (code and Chinese: no fast path) is tokenized in
the pool's process, and its ids are exact: the next turn's predicted hit equals what the
engine reports it served from its cache. A small request is tokenized inline (no job)."""

from __future__ import annotations

import json

from cortex.config.tree import ServerConfig
from tests.gateway_cluster import gateway_cluster

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
