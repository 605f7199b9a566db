"""The design's Phase-1 check over real sockets: two simulated engines (one vLLM, one SGLang
flavored) behind Cortex; requests sharing a prefix land on the engine holding it, with the hit
in the response headers; after that engine's cache is flushed (AllBlocksCleared) the hit is gone
from decisions and headers."""

from __future__ import annotations

import json

from tests.gateway_cluster import gateway_cluster

SYSTEM = {"role": "system", "content": "You are Cortex's test assistant. " * 30}


def chat(question: str) -> list[dict[str, str]]:
    return [SYSTEM, {"role": "user", "content": question}]


async def test_shared_prefix_lands_on_its_holder_until_flushed():
    async with gateway_cluster(("vllm-0.33", "sglang-0.5.23")) as cluster:
        first = await cluster.chat(chat("What is a radix tree?"))
        assert first.status == 200, first.body
        holder = first.header(b"x-cortex-assigned-worker").decode()
        assert first.header(b"x-cortex-match-mode") == b"load_aware"
        assert first.header(b"x-cortex-cache-hit-tokens") == b"0"
        assert json.loads(first.body)["choices"][0]["message"]["content"]
        await cluster.until(lambda: cluster.holders(chat("another")).get(holder, 0) > 0)

        hits = []
        for n in range(12):
            response = await cluster.chat(chat(f"Question number {n}?"))
            assert response.status == 200
            assert response.header(b"x-cortex-assigned-worker").decode() == holder
            assert response.header(b"x-cortex-match-mode") == b"exact_kv_events"
            predicted = int(response.header(b"x-cortex-cache-hit-tokens"))
            reported = json.loads(response.body)["usage"]["prompt_tokens_details"][
                "cached_tokens"]
            assert predicted > 0
            assert predicted == reported  # the ledger is exact: the engine agrees
            hits.append(predicted)
        assert len(set(hits)) == 1  # the shared system prompt's full blocks

        engine = next(e for e in cluster.engines if e.name == holder)
        for rank in range(engine.dp_size):
            engine.kv.clear(rank)  # the engine's cache reset: publishes AllBlocksCleared
        await cluster.until(lambda: not cluster.holders(chat("again")))
        after = await cluster.chat(chat("After the flush?"))
        assert after.status == 200
        assert after.header(b"x-cortex-cache-hit-tokens") == b"0"
        assert after.header(b"x-cortex-match-mode") == b"load_aware"
