"""The request path's pure steps, each timed alone in a loop (no sockets, no trio).

The same bodies as ``perf/bench_gateway.py`` (``Bodies``: a fixed system prompt and a new user
message each time; ``small`` ~100 prompt tokens, ``large`` ~4k), the DeepSeek profile it
serves, and a ``ModelPool`` of two workers as it routes them: no KV events (the benchmark's
mock workers with ``--no-kv-events``: ``fallback`` decisions) or READY ledgers (``ready``: the
compiled path, what the benchmark's mocks give by default).

Figures, microseconds, p50 over ``--iterations`` new requests after a warm-up (word and segment
caches warm, as in service):

* ``parse``: the body's JSON (``parse_body``); ``prompt``: the chat template rendered
  (``request_prompt``); ``tokenize``: the prompt's ids, as the request path takes them (the
  compiled ``encode_now``: split at added tokens, cached pieces taken, the new message encoded,
  remembered, assembled; before session 11 this was three steps, ``lookup`` / ``encode`` /
  ``finish``); ``keys``: the full blocks' keys.
* ``decide_fallback`` / ``decide_ready``: ``ModelPool.decide`` and its in-flight hold entered,
  prefill done, released.

These are the costs in a warm loop; the running server pays 1-2x more for the larger steps and
up to 3-4x for the smallest: cold caches after the HTTP legs (``perf/RESULTS.md``, issue 4,
session 5). ``--evict-mb N`` writes N MB between requests (outside the timed steps), so each
request starts with the CPU caches full of other data, as in service: with 4 MB the steps sum
to about what marks inside the running server measured at c=1 (session 10).

Usage: ``python -m perf.bench_request_steps [--quick] [--iterations N] [--evict-mb N]``
(JSON on stdout).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

from cortex.dispatch.endpoints import Endpoint, parse_body, request_prompt
from cortex.dispatch.model_pool import ModelPool, WorkerFigures
from cortex.ledger.book import LedgerBook
from cortex.ledger.kv_events import EngineFamily
from cortex.ledger.state import TargetState
from cortex.profile.model_profile import ProfileSpec, load_profile
from cortex.profile.profile_set import ProfileSet
from cortex.profile.request_keys import request_block_keys
from cortex.tokenize.segment_cache import Lookup
from cortex.workers.spec import WorkerSpec
from perf.bench_gateway import MODEL, Bodies
from perf.benchkit import machine_info
from tests import deepseek_profile as ds

BLOCK = 16


def pool_of(profiles: ProfileSet, events: bool) -> ModelPool:
    book = LedgerBook()
    pool = ModelPool(MODEL, book, profiles=profiles, rng=random.Random(1))
    for index, name in enumerate(("w0", "w1")):
        spec = WorkerSpec(name, f"http://127.0.0.1:{index + 1}", engine="sglang", model=MODEL,
                          events=f"tcp://127.0.0.1:{5000 + index}" if events else None)
        targets: tuple[int, ...] = ()
        if events:
            targets = (book.register(name, 0, EngineFamily.SGLANG, MODEL),)
            book.set_state(targets[0], TargetState.READY)
        pool.set_worker(spec, targets)
        pool.set_figures(name, WorkerFigures(healthy=True))
    return pool


def steps(bodies: Bodies, profile, pools: dict[str, ModelPool], iterations: int,
          warmup: int, evict: bytearray) -> dict[str, float]:
    tokenizer = profile.new_cached_tokenizer()
    samples: dict[str, list[int]] = {}
    clock = time.perf_counter_ns
    for index in range(warmup + iterations):
        raw = bodies.next()
        if evict:
            evict[::64] = evict[64::64] + evict[:64:64]  # a write to every cache line
        marks = [clock()]
        body = parse_body(raw)
        marks.append(clock())
        prompt = request_prompt(Endpoint.CHAT, body, profile.chat_templates)
        marks.append(clock())
        ids = tokenizer.encode_now(prompt.text, prompt.add_special_tokens,
                                   tokenizer.offload_min_chars)
        if isinstance(ids, Lookup):  # a long new text (warm-up): a worker thread's job in service
            ids = tokenizer.finish(ids, tokenizer.encode_pieces(ids.cold))
        marks.append(clock())
        request_block_keys(ids, BLOCK, MODEL)
        marks.append(clock())
        for pool in pools.values():
            route = pool.decide(ids, prompt)
            with route.hold:
                route.hold.prefill_done()
            marks.append(clock())
        if index < warmup:
            continue
        names = ["parse", "prompt", "tokenize", "keys",
                 *(f"decide_{name}" for name in pools)]
        for name, start, end in zip(names, marks, marks[1:]):
            samples.setdefault(name, []).append(end - start)
    return {name: round(statistics.median(values) / 1000, 2) for name, values in samples.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--iterations", type=int, default=5000)
    parser.add_argument("--evict-mb", type=int, default=0,
                        help="MB written between requests to flush the CPU caches (0: none)")
    args = parser.parse_args()
    iterations = 200 if args.quick else args.iterations
    evict = bytearray(args.evict_mb << 20)
    # the profile reads its template when it loads: the directory can go right after
    with tempfile.TemporaryDirectory(prefix="bench-steps-") as workdir:
        template = os.path.join(workdir, "chat_template.jinja")
        with open(template, "w") as f:
            f.write(ds.TEMPLATE)
        profile = load_profile(ProfileSpec(MODEL, ds.TOKENIZER_JSON, BLOCK, template))
    profile.bpe.upgrade()  # fastokens where its start check holds, as a running gateway does
    profiles = ProfileSet({MODEL: profile}, {})
    pools = {"fallback": pool_of(profiles, events=False), "ready": pool_of(profiles, events=True)}
    result = {
        "benchmark": "request_steps",
        "iterations": iterations,
        "evict_mb": args.evict_mb,
        "small_us_p50": steps(Bodies(25, seed=1), profile, pools, iterations, 500, evict),
        "large_us_p50": steps(Bodies(3000, seed=2), profile, pools, iterations // 4, 100, evict),
        "machine": machine_info(),
    }
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
