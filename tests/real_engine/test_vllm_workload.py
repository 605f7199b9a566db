"""A multi-turn workload through Cortex in front of two real vLLM servers: predictions against
what the engines report, with a cache that holds everything and with one small enough to evict.

The workload is a slice of the Mooncake conversation trace (``perf/trace_text.py``: each trace
block one chat message of real words, 32 tokens here, so sessions share whole-message
prefixes), sent in trace order, one request at a time, each once its predecessor's KV events
reached Cortex (the engine's report and Cortex's prediction then speak of the same cache).

* Without eviction, ``x-cortex-cache-hit-tokens`` equals vLLM's ``cached_tokens`` for every
  request (exactly 100%), for both tokenizer families.
* With 96 blocks per engine (about three prompts' worth), blocks are evicted all the time and
  at least 99% of the predictions are exact; none is larger than the report (no false hit).
"""

from __future__ import annotations

import pytest

from perf import trace_text as tt
from tests.conftest import shared_dir
from tests.real_engine.cortex_front import BLOCK, Front, Sent, cortex_front
from tests.real_engine.farm import ServerSet

REQUESTS = 200
MAX_BLOCKS = 40  # trace blocks per request (~1,300 tokens, under the servers' 2,048)
CHAT = "/v1/chat/completions"


def workload(tokenizer_json: str) -> list[dict]:
    """The first ``REQUESTS`` records of the conversation trace (at most ``MAX_BLOCKS``
    blocks each) as chat bodies."""
    text = tt.TraceText(tt.single_token_words(tokenizer_json), block_tokens=BLOCK)
    path = shared_dir() / "data" / "traces" / "conversation_trace.jsonl"
    records = [r for r in tt.read_trace(str(path), 0, REQUESTS * 2)
               if len(r.hash_ids) <= MAX_BLOCKS][:REQUESTS]
    assert len(records) == REQUESTS
    return [{"messages": text.messages(record), "max_tokens": 1, "temperature": 0}
            for record in records]


async def replay(front: Front, bodies: list[dict]) -> list[Sent]:
    sent = []
    for body in bodies:
        answer = await front.send(CHAT, body)
        assert answer.status == 200, answer.body
        sent.append(answer)
        await front.settled(CHAT, body, answer.worker, timeout_s=5.0)
    return sent


def summary(sent: list[Sent]) -> str:
    exact = sum(s.exact for s in sent)
    hits = sum(s.reported or 0 for s in sent)
    prompt = sum(s.prompt_tokens or 0 for s in sent)
    return f"{exact}/{len(sent)} exact, engine hit {hits}/{prompt} prompt tokens"


@pytest.mark.parametrize("family", ["deepseek-tiny", "qwen-tiny"])
async def test_every_prediction_is_exact_without_eviction(farm, engines, family):
    servers = farm.servers(ServerSet(family))
    for server in servers:
        server.reset_prefix_cache()
    model_dir = str(engines.model(family))
    async with cortex_front(servers, family, model_dir) as front:
        sent = await replay(front, workload(str(engines.model(family) / "tokenizer.json")))
    print(f"\n{family}, no eviction: {summary(sent)}")
    wrong = [s for s in sent if not s.exact]
    assert not wrong, (summary(sent), wrong[:3])
    assert sum(s.reported for s in sent) > 0.1 * sum(s.prompt_tokens for s in sent), summary(sent)
    assert all(s.mode == "exact_kv_events" for s in sent if s.reported)


async def test_with_eviction_99_percent_exact_and_never_a_false_hit(farm, engines):
    family = "deepseek-tiny"
    servers = farm.servers(ServerSet(family, num_blocks=96))
    for server in servers:
        server.reset_prefix_cache()
    model_dir = str(engines.model(family))
    async with cortex_front(servers, family, model_dir) as front:
        sent = await replay(front, workload(str(engines.model(family) / "tokenizer.json")))
        counters = front.running.ingest_counters.values()
        removed = sum(c.removed_blocks for c in counters)
    assert removed > 1000 and not sum(c.gaps + c.decode_errors for c in counters)
    print(f"\n{family}, 96 blocks per engine: {summary(sent)}, {removed} blocks evicted")
    over = [s for s in sent if s.predicted > s.reported]
    assert not over, (summary(sent), over[:3])
    assert sum(s.exact for s in sent) >= 0.99 * len(sent), summary(sent)
