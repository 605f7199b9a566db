"""The tokenize pool (``server.tokenize_processes``) against real vLLM servers, both tokenizer
families: long new text — code with non-ASCII comments, Chinese, tool output, a growing chat —
are tokenized in Cortex's tokenizer process (loaded from the model directory the engines load),
and the ledger's predictions equal the ``cached_tokens`` vLLM reports, turn after turn."""

from __future__ import annotations

import pytest

from cortex.config.tree import ServerConfig
from tests.real_engine.cortex_front import BLOCK, cortex_front
from tests.real_engine.farm import ServerSet

# each turn's new text is 2,048 characters or more (offloaded), the chat under the tiny models'
# 2,048-token context: ~880 tokens, then ~1,800. Every line differs: the segment cache cuts long
# pieces at line starts and encodes a repeated chunk once, so repeated lines would add up to
# less than 2,048 new characters.
CODE = "".join(f"def route(self, ids):  # 最长前缀{i:02}\n    return self.ledger.match(ids)\n"
               for i in range(32))
CHINESE = "网关按前缀把请求送到缓存所在的引擎，工具的输出也一样。" * 10
TOOL = "".join(f'{{"path": "src/gateway/路由.py", "lines": [{i:02}, 40], "ok": true}}\n'
               for i in range(34))


@pytest.mark.parametrize("family", ["deepseek-tiny", "qwen-tiny"])
async def test_pool_tokenized_turns_are_predicted_exactly(family, farm, engines):
    servers = farm.servers(ServerSet(family))
    for server in servers:
        server.reset_prefix_cache()
    pool_config = ServerConfig(host="127.0.0.1", port=0, tokenize_processes=1)
    async with cortex_front(servers, family, str(engines.model(family)),
                            server=pool_config) as front:
        pool = front.running.gateway.tokenize_pool
        assert pool is not None and pool.models == {family}
        messages = [{"role": "system", "content": CODE}]
        for turn, text in enumerate((CHINESE, TOOL)):
            messages.append({"role": "user", "content": f"{turn}: {text}"})
            body = {"messages": messages, "max_tokens": 2, "temperature": 0}
            first = await front.send("/v1/chat/completions", body)
            assert first.status == 200, first.body
            assert first.exact, (turn, first)
            assert await front.settled("/v1/chat/completions", body, first.worker)
            again = await front.send("/v1/chat/completions", body)
            assert again.exact and again.mode == "exact_kv_events", (turn, again)
            assert again.reported == (again.prompt_tokens - 1) // BLOCK * BLOCK
            messages.append({"role": "assistant", "content": "好。"})
        assert pool.jobs == 2 and pool.fallbacks == 0  # each turn's new text, once
