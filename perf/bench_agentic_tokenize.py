"""Benchmark of agentic tokenization: 32k-token contexts in English, Chinese and code, with both
tokenizer families of the real-engine work (DeepSeek-V3's 128k vocabulary, builtin template;
Qwen2.5's, ``engines/build_models.py``'s ``qwen-tiny`` with its ChatML tool template).

Sections (times are tokenize + block keys, ``encode_array`` then ``request_block_keys``, as the
request path does; microseconds unless named ``_ms``):

* ``warm_turn``: a ~32k-token agentic context (long system prompt, 24 tool definitions — in
  Qwen's ``<tools>`` block, in DeepSeek's system prompt as JSON text since its template has no
  tools — then turns of English/Chinese asks, answers with code, JSON tool results) whose
  every piece was seen, plus one new ~2k-token user message of each kind (``english``,
  ``chinese``, ``code``), different every iteration: p50/p99. ``new_tokens`` is the new
  message's token count; ``encode_new_us_p50`` one plain ``Tokenizer.encode`` of another such
  message alone (interleaved; another, or the BPE's own word cache would hold its words), ``render_us_p50`` the chat template's render of the whole chat (not in
  the tokenize figure).
* ``growing``: one message that grows between turns (a tool output appended to, a streamed
  answer continued): a ~30k-token message seen, then the same message with ~2k more tokens
  appended: p50/p99 of the second request, against ``encode_new_us_p50`` (~2k tokens alone through
  ``Tokenizer.encode``) and ``encode_whole_us_p50`` (a whole ~30k-token message).
* ``cold_32k``: the whole context through a fresh cache (fresh word cache too), median of
  ``--iterations`` / 20 contexts (at least 5).
* ``inline``: what the request path (``encode_now``) holds the loop for when a new message of
  each kind (``english``, ``chinese``, ``code``, ``json``) is just under the offload threshold
  (``offload_min_chars`` characters, each non-ASCII piece's counted ``NON_ASCII_CHAR_COST``
  times): p50/p99 and how many were offloaded (should be 0).
* ``sessions``: many concurrent agent sessions sharing long system/tool prompts (``--agents``
  distinct ones), each growing turn by turn (a user ask, an answer with code, a tool result),
  the sessions' turns interleaved at random; the same trace through caches of each
  ``--capacities-mb``: token hit rate (tokens not encoded — cached pieces and the ids a
  remembered prompt gives, ``reused_rate`` the latter — over all tokens), the largest
  ``cached_bytes`` seen (the byte bound holds), the working set (what an unbounded cache held).
  ``ideal_hit_rate``: the unbounded cache's rate (only new text misses).

The plain ``Tokenizer.encode`` figures are taken apart from the samples (after them): run
between two samples, its ~5 ms of another library's memory traffic and its worker threads made
each sample 2-4x slower than the same code in the gateway, where ``tokenizers`` is not called
once fastokens runs.

Usage: ``python -m perf.bench_agentic_tokenize`` (or ``--quick``); prints JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import time

from cortex.profile.model_profile import ModelProfile, ProfileSpec, load_profile
from cortex.profile.request_keys import request_block_keys
from cortex.tokenize.segment_cache import NON_ASCII_CHAR_COST, Lookup
from perf import agentic_text as at
from perf.benchkit import machine_info, percentile

HERE = os.path.dirname(os.path.abspath(__file__))

BLOCK = 16
QWEN_DIR = os.path.join(os.path.dirname(HERE), ".engines", "models", "qwen-tiny")


def profiles(names: list[str]) -> dict[str, ModelProfile]:
    specs = {"deepseek": ProfileSpec("deepseek", None, BLOCK, builtin="deepseek"),
             "qwen": ProfileSpec("qwen", QWEN_DIR, BLOCK)}
    return {name: load_profile(specs[name]) for name in names}


class Family:
    """One tokenizer family: how its chats render (tools natively or in the system prompt)."""

    def __init__(self, name: str, profile: ModelProfile) -> None:
        self.name = name
        self.profile = profile
        self.native_tools = name == "qwen"
        assert profile.chat_templates is not None

    def render(self, messages: list[dict[str, object]], tools: list[dict[str, object]]) -> str:
        templates = self.profile.chat_templates
        assert templates is not None
        if self.native_tools:
            template = templates.pick(tools)
            assert template is not None
            return template.render(messages, tools=tools)
        first = dict(messages[0])
        first["content"] = (f"{first['content']}\n\n# Tools\n\n"
                            + "\n".join(json.dumps(t) for t in tools))
        template = templates.pick(None)
        assert template is not None
        return template.render([first, *messages[1:]])

    def tokens(self, text: str) -> int:
        return len(self.profile.tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_plain_s(self, text: str) -> float:
        t0 = time.perf_counter()
        self.profile.tokenizer.encode(text, add_special_tokens=False)
        return time.perf_counter() - t0


def timed_keys(cache, text: str, model: str) -> float:
    t0 = time.perf_counter()
    request_block_keys(cache.encode_array(text), BLOCK, model)
    return time.perf_counter() - t0


def summary(samples: list[float]) -> dict[str, float]:
    return {"us_p50": round(percentile(samples, 0.5) * 1e6, 1),
            "us_p99": round(percentile(samples, 0.99) * 1e6, 1)}


def context(fam: Family, rng: random.Random, target_tokens: int):
    """An agentic chat of about ``target_tokens`` tokens (grown until it is)."""
    chars = target_tokens * 3
    while True:
        messages, tools = at.agentic_chat(random.Random(rng.random()), chars)
        text = fam.render(messages, tools)
        n = fam.tokens(text)
        if n >= target_tokens * 0.97:
            return messages, tools, text, n
        chars = int(chars * target_tokens / n) + 1000


def warm_turn(fam: Family, iterations: int, context_tokens: int, new_tokens: int) -> dict:
    rng = random.Random(11)
    messages, tools, text, n = context(fam, rng, context_tokens)
    cache = fam.profile.new_cached_tokenizer()
    cache.encode_array(text)
    out: dict[str, object] = {"context_tokens": n}
    for kind in at.KINDS:
        news = [at.message_of(kind, rng, new_tokens) for _ in range(iterations)]
        # the plain encode gets messages of its own: the tokenizer's BPE word cache would
        # otherwise hold the words the segment cache's encode just met
        others = [at.message_of(kind, rng, new_tokens) for _ in range(iterations)]
        chats = [[*messages, {"role": "user", "content": new}] for new in news]
        texts = [fam.render(chat, tools) for chat in chats]
        t0 = time.perf_counter()
        for chat in chats[:20]:
            fam.render(chat, tools)
        render_s = (time.perf_counter() - t0) / min(20, len(chats))
        gc.disable()
        samples = [timed_keys(cache, full, fam.profile.model) for full in texts]
        plain = [fam.encode_plain_s(other) for other in others]  # apart: see the docstring
        gc.enable()
        new_counts = [fam.tokens(new) for new in news[:20]]
        out[kind] = {**summary(samples), "new_tokens": round(statistics.mean(new_counts)),
                     "encode_new_us_p50": round(percentile(plain, 0.5) * 1e6, 1),
                     "render_us_p50": round(render_s * 1e6, 1)}
    return out


def growing(fam: Family, iterations: int, message_tokens: int, grow_tokens: int) -> dict:
    rng = random.Random(12)
    system = [{"role": "system", "content": at.english(rng, 1500)}]
    tools = at.tools(rng, 24)
    out: dict[str, object] = {}
    for kind in at.KINDS:
        samples, plain_new, plain_whole = [], [], []
        cache = fam.profile.new_cached_tokenizer()
        for _ in range(iterations):
            base = at.message_of(kind, rng, message_tokens)
            more = at.message_of(kind, rng, grow_tokens)
            before = fam.render([*system, {"role": "user", "content": base}], tools)
            after = fam.render([*system, {"role": "user", "content": base + "\n" + more}], tools)
            cache.encode_array(before)
            gc.disable()
            samples.append(timed_keys(cache, after, fam.profile.model))
            gc.enable()
        for _ in range(iterations):  # apart from the samples: see the docstring
            other = at.message_of(kind, rng, grow_tokens)  # unseen words, as ``more`` was
            plain_new.append(fam.encode_plain_s(other))
            plain_whole.append(fam.encode_plain_s(at.message_of(kind, rng, message_tokens)))
        out[kind] = {**summary(samples), "message_tokens": fam.tokens(base + "\n" + more),
                     "encode_new_us_p50": round(percentile(plain_new, 0.5) * 1e6, 1),
                     "encode_whole_us_p50": round(percentile(plain_whole, 0.5) * 1e6, 1)}
    return out


def cold(fam: Family, iterations: int, context_tokens: int) -> dict:
    rng = random.Random(13)
    samples, plain = [], []
    for _ in range(iterations):
        _, _, text, n = context(fam, rng, context_tokens)
        cache = fam.profile.new_cached_tokenizer()
        samples.append(timed_keys(cache, text, fam.profile.model))
        plain.append(fam.encode_plain_s(text))
    return {"tokens": n, "cold_ms_p50": round(statistics.median(samples) * 1e3, 2),
            "plain_encode_ms_p50": round(statistics.median(plain) * 1e3, 2)}


def session_trace(fam: Family, sessions: int, agents: int, turns: int, seed: int):
    """Every request text of ``sessions`` sessions of ``turns`` turns, interleaved at random
    (each session's turns in order), generated as it goes (the same for the same seed)."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(agents):
        system = [{"role": "system", "content": at.english(rng, 1500)}]
        prompts.append((system, at.tools(rng, 24)))
    chats = []
    for s in range(sessions):
        system, tools = prompts[s % agents]
        chats.append((list(system), tools))
    order = [s for s in range(sessions) for _ in range(turns)]
    rng.shuffle(order)
    done = [0] * sessions
    for s in order:  # a turn: the previous answer and tool result, then a new ask
        messages, tools = chats[s]
        if done[s]:
            messages.append({"role": "assistant", "content": at.english(rng, 40) + "\n\n"
                             + at.code(rng, 900)})
            messages.append({"role": "user", "content": "Tool result:\n"
                             + at.json_output(rng, 6)})
        ask = at.english(rng, 80) if rng.random() < 0.7 else at.chinese(rng, 60)
        yield fam.render([*messages, {"role": "user", "content": ask}], tools)
        messages.append({"role": "user", "content": ask})
        done[s] += 1


def sessions_hit_rate(fam: Family, sessions: int, agents: int, turns: int,
                      capacities_mb: list[int]) -> dict:
    out: dict[str, object] = {"sessions": sessions, "agents": agents, "turns": turns,
                              "requests": sessions * turns}
    rows = {}
    for mb in [*capacities_mb, 0]:
        cache = fam.profile.new_cached_tokenizer(capacity_bytes=(mb << 20) if mb else 1 << 40)
        high = chars = 0
        elapsed = 0.0
        for text in session_trace(fam, sessions, agents, turns, seed=14):
            chars += len(text)
            t0 = time.perf_counter()
            cache.encode_array(text)
            elapsed += time.perf_counter() - t0
            high = max(high, cache.cached_bytes)
        reused = getattr(cache, "reused_tokens", 0)  # a remembered prompt's ids, taken whole
        total = cache.hit_tokens + cache.miss_tokens + reused
        out["chars_mean"] = round(chars / (sessions * turns))
        row = {"hit_rate": round((cache.hit_tokens + reused) / total, 4),
               "reused_rate": round(reused / total, 4),
               "max_cached_mb": round(high / 2**20, 2),
               "pieces": cache.cached_pieces,
               "ms_per_request": round(elapsed * 1e3 / (sessions * turns), 3)}
        rows["unbounded" if mb == 0 else f"{mb}MB"] = row
    out["by_capacity"] = rows
    out["working_set_mb"] = rows["unbounded"]["max_cached_mb"]
    out["ideal_hit_rate"] = rows["unbounded"]["hit_rate"]
    return out


def inline(fam: Family, iterations: int, context_tokens: int) -> dict:
    """How long the request path's inline encode holds the loop for new text just under the
    offload threshold, per kind: a warm context plus one new user message whose weighted size
    (a non-ASCII message's characters counted ``NON_ASCII_CHAR_COST`` times) is 95% of
    the tokenizer's ``offload_min_chars`` (``OFFLOAD_MIN_CHARS`` of the BPE in use)."""
    rng = random.Random(13)
    messages, tools, text, _ = context(fam, rng, context_tokens)
    cache = fam.profile.new_cached_tokenizer()
    cache.encode_array(text)
    threshold = cache.offload_min_chars
    out: dict[str, object] = {"offload_min_chars": threshold}
    for kind in (*at.KINDS, "json"):
        samples, chars, offloaded = [], [], 0
        for _ in range(iterations):
            new = at.message_of(kind, rng, 2000)
            weight = NON_ASCII_CHAR_COST if not new.isascii() else 1
            new = new[:int(threshold / weight * 0.95)]
            full = fam.render([*messages, {"role": "user", "content": new}], tools)
            t0 = time.perf_counter()
            found = cache.encode_now(full, False, threshold)
            samples.append(time.perf_counter() - t0)
            offloaded += isinstance(found, Lookup)
            chars.append(len(new))
        out[kind] = {**summary(samples), "new_chars": round(statistics.mean(chars)),
                     "offloaded": offloaded}
    return out


def _rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small, fast smoke run")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--bpe", choices=("fastokens", "tokenizers"), default="fastokens",
                        help="what encodes new text: fastokens (after its start check, as a "
                        "running gateway does) or tokenizers (before it, or where it fails)")
    parser.add_argument("--families", default="deepseek,qwen")
    parser.add_argument("--sections", default="warm_turn,growing,cold,inline,sessions")
    parser.add_argument("--context-tokens", type=int, default=32_000)
    parser.add_argument("--new-tokens", type=int, default=2_000)
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--capacities-mb", default="4,16,64,256")
    args = parser.parse_args()
    if args.quick:
        args.iterations, args.sessions, args.turns = 8, 40, 3
    sections = set(args.sections.split(","))
    result: dict[str, object] = {"benchmark": "agentic_tokenize", "quick": args.quick,
                                 "iterations": args.iterations}
    families = args.families.split(",")
    if "qwen" in families and not os.path.exists(os.path.join(QWEN_DIR, "tokenizer.json")):
        families.remove("qwen")  # built by `make engines`
        result["qwen"] = {"skipped": f"no tokenizer in {QWEN_DIR}: run `make engines`"}
    for name, profile in profiles(families).items():
        fam = Family(name, profile)
        rss_before, started = _rss_mib(), time.perf_counter()
        why_not = None if args.bpe == "tokenizers" else profile.bpe.upgrade()
        row: dict[str, object] = {"bpe": profile.bpe.backend, "why_not_fastokens": why_not,
                                  # fastokens' load + start check, and the memory it holds
                                  "bpe_upgrade_s": round(time.perf_counter() - started, 2),
                                  "bpe_rss_mib": round(_rss_mib() - rss_before)}
        gc.freeze()  # as `cortex serve` does after its start: a collection skips the profile
        if "warm_turn" in sections:
            row["warm_turn"] = warm_turn(fam, args.iterations, args.context_tokens,
                                         args.new_tokens)
        if "growing" in sections:
            row["growing"] = growing(fam, max(5, args.iterations // 5),
                                     args.context_tokens - 2000, args.new_tokens)
        if "cold" in sections:
            row["cold_32k"] = cold(fam, 2 if args.quick else max(5, args.iterations // 20),
                                   args.context_tokens)
        if "inline" in sections:
            row["inline"] = inline(fam, args.iterations, args.context_tokens)
        if "sessions" in sections:
            row["sessions"] = sessions_hit_rate(
                fam, args.sessions, args.agents, args.turns,
                [int(x) for x in args.capacities_mb.split(",")])
        result[name] = row
    result["machine"] = machine_info()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
