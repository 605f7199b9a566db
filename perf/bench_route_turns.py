"""Warm turns of a long agent conversation: what the request path costs Cortex per turn.

One conversation with the built-in DeepSeek profile (its ``tokenizer.json`` and chat template):
a long English system prompt, then turns of a coding agent — an assistant answer (English and
code), then a user message holding a tool's output (JSON or source code) and a Chinese ask —
~2.3k new tokens a turn. The first turns grow it to ``--from-tokens`` (~28k); the measured
(warm) turns take it to ``--to-tokens`` (~47k): every turn resends the whole conversation.

Two parts, each run against the Cortex of ``--repo`` (a checkout with its extensions built;
default: this one), so that two checkouts compare in one run:

* ``in_process``: per warm turn, in this interpreter, what the request path does on the event
  loop: the chat template's render (``request_text.chat_prompt``), the tokenization
  (``encode_now``; new text over the offload threshold is counted apart: a worker thread
  encodes it in service) and the block keys. ``loop_held_us``: render + inline tokenization +
  keys, one request's hold of the event loop (nothing awaits between them). p50 / p99 / max.
* ``serve``: the same turns as chat requests through ``python -m cortex serve`` in front of a
  mock worker (``perf/mock_worker.py``, empty KV-event streams: Cortex routes on its KV path):
  ``route_ms_mean`` = ``cortex_route_seconds`` sum / count over the warm turns (parsed request
  → decision), and the client's round trip p50.

Usage: ``python -m perf.bench_route_turns [--repo PATH] [--quick]`` (JSON on stdout).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def conversation_turns(rng: random.Random, turns: int) -> tuple[str, list[list[dict]]]:
    """The system prompt and each turn's new messages (an answer, then a user message)."""
    from perf import agentic_text as at

    system = at.english(rng, 1500)
    out = []
    for turn in range(turns):
        answer = at.english(rng, 60) + "\n\n```python\n" + at.code(rng, 1800) + "\n```"
        tool = (at.json_output(rng, 30) if turn % 2 == 0 else at.code(rng, 4200))
        ask = at.chinese(rng, 120)
        out.append([{"role": "assistant", "content": answer},
                    {"role": "user", "content": f"工具输出：\n{tool}\n\n{ask}"}])
    return system, out


def bodies(args: argparse.Namespace, count_tokens) -> tuple[list[dict], int, list[int]]:
    """Every request body in order, how many of them warm the conversation up, and the
    rendered prompt's token count of each."""
    rng = random.Random(args.seed)
    system, turns = conversation_turns(rng, 64)
    messages: list[dict] = [{"role": "system", "content": system},
                            {"role": "user", "content": "请先阅读代码库。"}]
    out, sizes, warmup = [], [], None
    for new in turns:
        messages = [*messages, *new]
        tokens = count_tokens(messages)
        if warmup is None and tokens >= args.from_tokens:
            warmup = len(out)
        if tokens > args.to_tokens:
            break
        out.append({"model": MODEL, "max_tokens": 1, "messages": messages})
        sizes.append(tokens)
    return out, warmup or 0, sizes


def summary(samples: list[float]) -> dict[str, float]:
    """p50, p99 and max of ``samples`` (seconds) in microseconds."""
    from perf.benchkit import percentile

    return {name: round(percentile(samples, q) * 1e6, 1)
            for name, q in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))}


def in_process(requests: list[dict], warmup: int) -> dict[str, object]:
    from cortex.profile.model_profile import ProfileSpec, load_profile
    from cortex.profile.request_keys import request_block_keys
    from cortex.prompt.request_text import chat_prompt
    from cortex.tokenize import segment_cache

    profile = load_profile(ProfileSpec(MODEL, None, BLOCK, builtin="deepseek"))
    bpe = getattr(profile, "bpe", None)
    if bpe is not None:
        bpe.upgrade()  # as a running gateway does after its start
    tokenizer = profile.new_cached_tokenizer()
    threshold = getattr(tokenizer, "offload_min_chars", None) or getattr(
        segment_cache, "OFFLOAD_MIN_CHARS", 2048)
    render, tokenize, keys, held, offloaded = [], [], [], [], 0
    for index, body in enumerate(requests):
        t0 = time.perf_counter()
        prompt = chat_prompt(body, profile.chat_templates)
        t1 = time.perf_counter()
        ids = tokenizer.encode_now(prompt.text, prompt.add_special_tokens, threshold)
        t2 = time.perf_counter()
        inline = not isinstance(ids, segment_cache.Lookup)
        if not inline:  # a worker thread's job in service: not the loop's
            ids = tokenizer.finish(ids, tokenizer.encode_pieces(ids.cold))
        t3 = time.perf_counter()
        request_block_keys(ids, BLOCK, MODEL)
        t4 = time.perf_counter()
        if index < warmup:
            continue
        offloaded += not inline
        render.append(t1 - t0)
        tokenize.append(t3 - t1)
        keys.append(t4 - t3)
        held.append((t1 - t0) + ((t2 - t1) if inline else 0) + (t4 - t3))
    return {"bpe": getattr(bpe, "backend", "tokenizers"), "turns": len(render),
            "render_us": summary(render), "tokenize_us": summary(tokenize),
            "keys_us": summary(keys), "loop_held_us": summary(held), "offloaded": offloaded}


def _metrics(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return text


def serve(requests: list[dict], warmup: int, repo: Path) -> dict[str, object]:
    from perf import peers
    from tests import deepseek_profile as ds
    from tests.real_engine.vllm_server import metric_sum

    mock = peers.start_mock(MODEL, kv_events=True)
    cortex = None
    try:
        with tempfile.TemporaryDirectory(prefix="bench-turns-") as workdir:
            template = os.path.join(workdir, "chat.jinja")
            Path(template).write_text(ds.TEMPLATE)
            cortex = peers.start_cortex([mock], MODEL, ds.TOKENIZER_JSON, template, repo=repo)
            control = cortex.extra["control_port"]
            conn = http.client.HTTPConnection("127.0.0.1", cortex.port, timeout=60)
            round_trips = []
            before = None
            for index, body in enumerate(requests):
                if index == warmup:
                    before = _metrics(control)
                raw = json.dumps(body).encode()
                t0 = time.perf_counter()
                conn.request("POST", "/v1/chat/completions", raw,
                             {"content-type": "application/json"})
                response = conn.getresponse()
                response.read()
                if index >= warmup:
                    round_trips.append(time.perf_counter() - t0)
                assert response.status == 200, response.status
            after = _metrics(control)
            conn.close()
    finally:
        if cortex is not None:
            cortex.stop()
        mock.stop()
    assert before is not None
    count = (metric_sum(after, "cortex_route_seconds_count")
             - metric_sum(before, "cortex_route_seconds_count"))
    total = (metric_sum(after, "cortex_route_seconds_sum")
             - metric_sum(before, "cortex_route_seconds_sum"))
    return {"turns": int(count), "route_ms_mean": round(total / count * 1e3, 3),
            "round_trip_ms_p50": round(statistics.median(round_trips) * 1e3, 2)}


MODEL = "deepseek"
BLOCK = 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=HERE.parent,
                        help="the Cortex checkout to measure (its extensions built)")
    parser.add_argument("--from-tokens", type=int, default=28_000)
    parser.add_argument("--to-tokens", type=int, default=47_000)
    parser.add_argument("--parts", default="in_process,serve")
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument("--quick", action="store_true", help="smoke run (a short conversation)")
    args = parser.parse_args()
    if args.quick:
        args.from_tokens, args.to_tokens = 6_000, 12_000
    repo = args.repo.resolve()
    # The A/B mechanism, kept on purpose (the one sys.path edit in perf/): the measured
    # checkout's ``cortex`` (and ``tests``) first. ``perf`` stays this checkout's: ``python -m
    # perf.bench_route_turns`` imported the package before this line, so ``from perf import``
    # below finds this checkout's helpers whatever ``--repo`` holds.
    sys.path.insert(0, str(repo))
    from tokenizers import Tokenizer

    from cortex.profile.builtin import DEEPSEEK_CHAT_TEMPLATE
    from cortex.prompt.chat_template import ChatTemplate
    from tests import deepseek_profile as ds

    counter = Tokenizer.from_file(ds.TOKENIZER_JSON)
    template = ChatTemplate(DEEPSEEK_CHAT_TEMPLATE, ds.TOKENS)
    requests, warmup, sizes = bodies(args, lambda messages: len(counter.encode(
        template.render(messages), add_special_tokens=False).ids))
    from perf.benchkit import machine_info

    result: dict[str, object] = {
        "benchmark": "route_turns", "repo": str(repo), "quick": args.quick,
        "tokens_first_warm": sizes[warmup], "tokens_last": sizes[-1],
        "new_tokens_per_turn": round((sizes[-1] - sizes[warmup]) / max(1, len(sizes) - 1
                                                                        - warmup))}
    parts = args.parts.split(",")
    if "in_process" in parts:
        result["in_process"] = in_process(requests, warmup)
    if "serve" in parts:
        result["serve"] = serve(requests, warmup, repo)
    result["machine"] = machine_info()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
