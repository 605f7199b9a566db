"""Benchmark of request tokenization: a ~4k-token multi-turn chat through the chat template,
the segment-cached tokenizer and the block keys, with the real 128k-vocab DeepSeek tokenizer.

Figures (microseconds, p50 over ``--iterations``):

* ``warm_new_turn``: tokenize + key the chat when every earlier turn was seen and only the last
  user message (~60 tokens, different each iteration) is new — the multi-turn case. New pieces
  go through fastokens (``exact_bpe``, as a loaded profile does after its start check);
  ``..._tokenizers`` is the same through ``tokenizers``, interleaved in the same run.
  ``..._with_render`` adds rendering the chat template from the messages.
* ``warm_all_seen``: the same chat sent again (every piece a hit).
* ``cold``: a fresh cache each time (fastokens) against one plain ``Tokenizer.encode`` of the
  same text, interleaved in the same run; ``cold_vs_plain_ratio`` = p50(cold) / p50(plain).
  ``cold_tokenizers``: a fresh cache encoding through ``tokenizers``.
* ``new_message``: one new ~55-token user message (the piece a warm chat pays for), encoded by
  fastokens (``ExactBpe.ids``) and by ``Tokenizer.encode``, interleaved.
* ``block_keys_4k``: keys of the prompt's full 16-token blocks from ``array('I')`` ids.
* ``split_16kb``: ``Segmenter.split`` of a one-message ~16 KB chat, prose and markup (``<``
  everywhere), against the same segmenter scanning with ``finditer`` only, interleaved
  (``ratio`` = p50 / the finditer-only p50).
* ``loop_stall``: under trio, how late a 0.2 ms timer fires at worst (and p99) while another
  task tokenizes cold ~4k-token prompts back to back, inline (on the trio thread) or through
  ``cortex.profile.trio_tokenize`` (cold pieces in a worker thread), with the time per prompt;
  ``inline_tokenizers``: inline through ``tokenizers``.

Usage: ``python -m perf.bench_tokenize`` or ``--quick`` (smoke run); prints JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time

import trio
import trio.lowlevel

from cortex.profile import trio_tokenize
from cortex.profile.request_keys import request_block_keys
from cortex.tokenize import segments
from cortex.tokenize.segment_cache import SegmentCachedTokenizer
from cortex.tokenize.segments import Segmenter
from perf.benchkit import machine_info, percentile
from tests import deepseek_profile as ds

BLOCK = 16
TICK_S = 0.0002
MODEL = "deepseek"
WORDS = ["the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "they", "you", "were", "her", "all", "she", "there", "would", "their", "we", "him", "been", "has", "when", "who", "will", "more", "no", "if", "out", "so", "said", "what", "up", "its", "about", "into", "than", "them", "can", "only", "other", "new", "some", "could", "time", "these", "two", "may", "then", "do", "first", "any", "my", "now", "such", "like", "our", "over", "man", "me", "even", "most", "cache", "token", "router", "engine", "prefix", "latency", "worker", "block", "request", "model", "prompt", "kernel", "memory", "function", "return", "value", "error", "config", "server", "client", "stream", "batch", "queue", "schedule", "throughput"]
PUNCT = [".", ",", "?", "!", ":", ";", "\n", "\n\n", " (", ")", " 42", " 2025", " `x`"]


def sentence(rng: random.Random, words: int) -> str:
    out = []
    for _ in range(words):
        out.append(rng.choice(WORDS))
        if rng.random() < 0.12:
            out[-1] += rng.choice(PUNCT)
    return " ".join(out).capitalize() + "."


def chat(rng: random.Random, turns: int, words_per_message: int) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": sentence(rng, 80)}]
    for _ in range(turns):
        msgs.append({"role": "user", "content": sentence(rng, words_per_message)})
        msgs.append({"role": "assistant", "content": sentence(rng, words_per_message)})
    return msgs


def us_p50(samples: list[float]) -> float:
    """p50 (``benchkit.percentile``) of samples in seconds, in microseconds."""
    return round(percentile(samples, 0.5) * 1e6, 1)


def loop_stall(
    texts: list[str], bpe, segmenter, offload: bool) -> dict[str, float]:
    """Longest event-loop stall (ms) while ``texts`` are tokenized cold, one after another."""
    gaps: list[float] = []

    async def ticker(done: trio.Event) -> None:
        last = time.perf_counter()
        while True:  # at least one tick: fast prompts may all be done before the first
            await trio.sleep(TICK_S)  # a mostly idle loop with a timer, as a gateway's is
            now = time.perf_counter()
            gaps.append(now - last - TICK_S)
            last = now
            if done.is_set():
                break

    async def run() -> float:
        done = trio.Event()
        cache = SegmentCachedTokenizer(bpe, segmenter)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker, done)
            await trio.lowlevel.checkpoint()
            t0 = time.perf_counter()
            for text in texts:
                if offload:
                    await trio_tokenize.encode_array(cache, text)
                else:
                    cache.encode_array(text)
                    await trio.lowlevel.checkpoint()
            elapsed = time.perf_counter() - t0
            done.set()
        return elapsed

    elapsed = trio.run(run)
    gaps.sort()
    return {"max_stall_ms": round(gaps[-1] * 1e3, 2),
            "p99_stall_ms": round(gaps[len(gaps) * 99 // 100] * 1e3, 3),
            "per_prompt_ms": round(elapsed / len(texts) * 1e3, 2)}


def split_figures(render, segmenter: Segmenter, iterations: int) -> dict[str, object]:
    """``Segmenter.split`` of a one-message chat of ~16 KB, prose and markup (``<`` everywhere),
    against the same segmenter scanning with ``finditer`` only, interleaved."""
    saved = segments.FIND_FIRSTS
    segments.FIND_FIRSTS = (1, 0)  # no pass qualifies: finditer throughout
    try:
        reference = Segmenter.from_tokenizer_json(ds.tokenizer_json_bytes())
    finally:
        segments.FIND_FIRSTS = saved
    texts = {
        "prose": render([{"role": "user", "content": sentence(random.Random(3), 2800)}]),
        "markup": render([{"role": "user", "content": "<div class='row'><b>cell</b></div>\n" * 450}]),
    }
    out: dict[str, object] = {}
    for name, text in texts.items():
        mine: list[float] = []
        theirs: list[float] = []
        for _ in range(iterations):
            for split, samples in ((segmenter.split, mine), (reference.split, theirs)):
                t0 = time.perf_counter()
                split(text)
                samples.append(time.perf_counter() - t0)
        out[name] = {"chars": len(text), "us_p50": us_p50(mine),
                     "finditer_only_us_p50": us_p50(theirs),
                     "ratio": round(statistics.median(mine) / statistics.median(theirs), 3)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small, fast smoke run")
    parser.add_argument("--iterations", type=int, default=400)
    args = parser.parse_args()
    iterations = 30 if args.quick else args.iterations

    rng = random.Random(7)
    tokenizer = ds.tokenizer()
    bpe = ds.fast_bpe()
    segmenter = Segmenter.from_tokenizer_json(ds.tokenizer_json_bytes())
    template = ds.chat_template()

    def render(messages: list[dict[str, str]]) -> str:
        return template.render(messages, add_generation_prompt=True)

    history = chat(rng, turns=4, words_per_message=420)
    base_text = render(history + [{"role": "user", "content": sentence(rng, 45)}])
    base_tokens = len(tokenizer.encode(base_text, add_special_tokens=False).ids)

    # Warm: earlier turns seen, a new final user message every iteration.
    cached = SegmentCachedTokenizer(bpe, segmenter)
    cached.encode_array(render(history))
    cached_reference = SegmentCachedTokenizer(tokenizer, segmenter)
    cached_reference.encode_array(render(history))
    news = [history + [{"role": "user", "content": sentence(rng, 45)}] for _ in range(iterations)]
    texts = [render(m) for m in news]
    gc.disable()
    warm, warm_reference, warm_render, all_seen = [], [], [], []
    for messages, text in zip(news, texts):
        t0 = time.perf_counter()
        request_block_keys(cached.encode_array(text), BLOCK, MODEL)
        warm.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        request_block_keys(cached_reference.encode_array(text), BLOCK, MODEL)
        warm_reference.append(time.perf_counter() - t0)

    # One new user message alone: fastokens vs Tokenizer.encode.
    messages_only = [m[-1]["content"] for m in news]
    message_tokens = statistics.mean(
        len(tokenizer.encode(m, add_special_tokens=False).ids) for m in messages_only
    )
    msg_fast, msg_plain = [], []
    for message in messages_only:
        t0 = time.perf_counter()
        bpe.ids(message)
        msg_fast.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        tokenizer.encode(message, add_special_tokens=False)
        msg_plain.append(time.perf_counter() - t0)
    for messages in news:  # second pass: the new turns were seen by now; render timed too
        t0 = time.perf_counter()
        request_block_keys(cached.encode_array(render(messages)), BLOCK, MODEL)
        warm_render.append(time.perf_counter() - t0)
    for text in texts:
        t0 = time.perf_counter()
        request_block_keys(cached.encode_array(text), BLOCK, MODEL)
        all_seen.append(time.perf_counter() - t0)
    # warm with render but a new turn: render cost measured on its own and added per sample
    render_only = []
    for messages in news:
        t0 = time.perf_counter()
        render(messages)
        render_only.append(time.perf_counter() - t0)

    # Cold vs one plain full encode of the same text, interleaved.
    cold_iters = max(5, iterations // 10)
    cold, cold_reference, plain = [], [], []
    for i in range(cold_iters):
        text = texts[i]
        t0 = time.perf_counter()
        tokenizer.encode(text, add_special_tokens=False)
        plain.append(time.perf_counter() - t0)
        fresh = SegmentCachedTokenizer(bpe, segmenter)
        t0 = time.perf_counter()
        fresh.encode_array(text)
        cold.append(time.perf_counter() - t0)
        fresh = SegmentCachedTokenizer(tokenizer, segmenter)
        t0 = time.perf_counter()
        fresh.encode_array(text)
        cold_reference.append(time.perf_counter() - t0)

    ids = cached.encode_array(base_text)
    keys = []
    for _ in range(iterations * 10):
        t0 = time.perf_counter()
        request_block_keys(ids, BLOCK, MODEL)
        keys.append(time.perf_counter() - t0)
    gc.enable()
    split_16kb = split_figures(render, segmenter, iterations)
    stall_texts = [render(chat(random.Random(100 + i), turns=4, words_per_message=420))
                   for i in range(3 if args.quick else 10)]
    stall = {
        "inline": loop_stall(stall_texts, bpe, segmenter, offload=False),
        "offloaded": loop_stall(stall_texts, bpe, segmenter, offload=True),
        "inline_tokenizers": loop_stall(stall_texts, tokenizer, segmenter, offload=False),
    }

    result = {
        "benchmark": "tokenize",
        "quick": args.quick,
        "prompt_tokens": base_tokens,
        "prompt_chars": len(base_text),
        "pieces": len(segmenter.split(base_text)),
        "iterations": iterations,
        "warm_new_turn_us_p50": us_p50(warm),
        "warm_new_turn_tokenizers_us_p50": us_p50(warm_reference),
        "warm_new_turn_with_render_us_p50": round(us_p50(warm) + us_p50(render_only), 1),
        "render_only_us_p50": us_p50(render_only),
        "warm_all_seen_with_render_us_p50": us_p50(warm_render),
        "warm_all_seen_us_p50": us_p50(all_seen),
        "cold_us_p50": us_p50(cold),
        "cold_tokenizers_us_p50": us_p50(cold_reference),
        "plain_encode_us_p50": us_p50(plain),
        "cold_vs_plain_ratio": round(statistics.median(cold) / statistics.median(plain), 3),

        "plain_encode_us_per_token": round(statistics.median(plain) * 1e6 / base_tokens, 3),
        "block_keys_4k_us_p50": us_p50(keys),
        "split_16kb": split_16kb,
        "new_message": {
            "tokens_mean": round(message_tokens, 1),
            "fastokens_us_p50": us_p50(msg_fast),
            "encode_us_p50": us_p50(msg_plain),
            "fastokens_vs_encode_ratio": round(
                statistics.median(msg_fast) / statistics.median(msg_plain), 3
            ),
        },
        "loop_stall": stall,
        "cache": {"pieces": cached.cached_pieces, "bytes": cached.cached_bytes,
                  "hits": cached.hits, "misses": cached.misses},
        "machine": machine_info(),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
