"""Mooncake trace records as real chat requests: every hash id expands to the same text.

A Mooncake record carries no text, only ``hash_ids`` (one per 512-token prefix-chained block)
and lengths. To replay it through a real tokenizer path, each hash id becomes one chat message
whose text is drawn from a word list by an RNG seeded with the id, so:

* the same id always gives the same text (deterministic across processes and runs);
* every word is one token with its leading space (``" word"`` is a single vocabulary entry of
  the DeepSeek tokenizer, and a run of such words tokenizes to exactly one id per word), so a
  block of ``block_tokens`` tokens is ``block_tokens - 1`` words plus the one special token the
  chat template writes before each message;
* each block is its own message: the template puts a special token between messages, a hard
  tokenizer boundary, so equal id prefixes give equal token prefixes, and Cortex's segment
  cache only pays for blocks it has not seen (as in a real multi-turn chat).

Invariant (tested): two records sharing their first k hash ids render to prompts whose token
ids share at least ``1 + k * block_tokens`` leading tokens (BOS, then k whole messages).

``block_tokens`` (default 512, the trace's own block) can be lowered to replay the same reuse
structure with fewer tokens per block (cheaper to tokenize on a small machine); the last block
of a record keeps its share of the record's ``input_length`` at the same scale.

Pure: no I/O except reading the trace file in ``read_trace``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache

TRACE_BLOCK = 512  # tokens per hash id in the Mooncake traces
ROLE = "user"


@dataclass(frozen=True, slots=True)
class TraceRecord:
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def parse_record(line: str) -> TraceRecord:
    raw = json.loads(line)
    return TraceRecord(int(raw["timestamp"]), int(raw["input_length"]),
                       int(raw["output_length"]), tuple(int(h) for h in raw["hash_ids"]))


def read_trace(path: str, start: int = 0, count: int | None = None) -> list[TraceRecord]:
    """Records ``start .. start + count`` of a Mooncake JSONL file (all from ``start``)."""
    records: list[TraceRecord] = []
    with open(path, encoding="utf-8") as f:
        for index, line in enumerate(f):
            if index < start or not line.strip():
                continue
            if count is not None and len(records) >= count:
                break
            records.append(parse_record(line))
    return records


@cache
def single_token_words(tokenizer_json: str) -> tuple[str, ...]:
    """Lowercase ASCII words that are one token with a leading space, in a fixed order.

    Kept to a few thousand so the tokenizer's word cache holds them all."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(tokenizer_json)
    candidates = sorted(
        piece[1:] for piece in tokenizer.get_vocab()
        if piece.startswith("Ġ") and 4 <= len(piece) - 1 <= 8
        and piece[1:].isascii() and piece[1:].isalpha() and piece[1:].islower())
    words = [w for w in candidates[::4] if len(tokenizer.encode(" " + w,
                                                                add_special_tokens=False).ids) == 1]
    return tuple(words[:4000])


class TraceText:
    """Hash ids -> message texts -> chat messages, for one word list and block size."""

    def __init__(self, words: tuple[str, ...], block_tokens: int = TRACE_BLOCK) -> None:
        if block_tokens < 2:
            raise ValueError("block_tokens must be >= 2 (one special token + words)")
        if len(words) < 2:
            raise ValueError("need a word list")
        self.words = words
        self.block_tokens = block_tokens
        self._texts: dict[tuple[int, int], str] = {}

    def block_words(self, hash_id: int, words: int) -> str:
        """The first ``words`` words of hash id ``hash_id``'s text (each with its space)."""
        key = (hash_id, words)
        text = self._texts.get(key)
        if text is None:
            rng = random.Random(hash_id * 1_000_003 + 17)
            pool = self.words
            full = [pool[rng.randrange(len(pool))] for _ in range(self.block_tokens - 1)]
            text = "".join(" " + w for w in full[:words])
            if len(self._texts) > 200_000:
                self._texts.clear()
            self._texts[key] = text
        return text

    def last_block_tokens(self, record: TraceRecord) -> int:
        """Tokens of the record's last block at this scale (>= 2: marker + one word)."""
        n = len(record.hash_ids)
        tail = record.input_length - TRACE_BLOCK * (n - 1)
        tail = min(max(tail, 1), TRACE_BLOCK)
        return max(2, round(tail * self.block_tokens / TRACE_BLOCK))

    def messages(self, record: TraceRecord) -> list[dict[str, str]]:
        """One chat message per hash id; the last one cut to the record's tail length."""
        full_words = self.block_tokens - 1
        out = [{"role": ROLE, "content": self.block_words(h, full_words)}
               for h in record.hash_ids[:-1]]
        if record.hash_ids:
            words = self.last_block_tokens(record) - 1
            out.append({"role": ROLE, "content": self.block_words(record.hash_ids[-1], words)})
        return out

    def prompt_tokens(self, record: TraceRecord) -> int:
        """Prompt tokens once rendered: BOS + blocks + the generation marker."""
        n = len(record.hash_ids)
        return 1 + (n - 1) * self.block_tokens + self.last_block_tokens(record) + 1


def shared_prefix_records(groups: int, prompts_per_group: int, system_tokens: int,
                          question_tokens: int, output_tokens: int, rate_per_s: float,
                          seed: int = 0) -> Iterator[TraceRecord]:
    """SGLang's generated-shared-prefix workload in Mooncake form: each request is its group's
    system prompt (``ceil(system_tokens / 512)`` shared blocks) then a unique question block;
    requests of all groups interleave at random, Poisson arrivals at ``rate_per_s``."""
    rng = random.Random(seed)
    system_blocks = max(1, -(-system_tokens // TRACE_BLOCK))
    next_id = groups * system_blocks
    order = [g for g in range(groups) for _ in range(prompts_per_group)]
    rng.shuffle(order)
    t = 0.0
    for group in order:
        system = tuple(range(group * system_blocks, (group + 1) * system_blocks))
        question = tuple(range(next_id, next_id + max(1, -(-question_tokens // TRACE_BLOCK))))
        next_id += len(question)
        length = system_blocks * TRACE_BLOCK + question_tokens
        yield TraceRecord(int(t * 1000), length, output_tokens, system + question)
        t += rng.expovariate(rate_per_s)


def herd_records(herds: int, per_herd: int, prefix_tokens: int, question_tokens: int,
                 output_tokens: int, herd_rate_per_s: float, seed: int = 0,
                 spread_ms: int = 5) -> Iterator[TraceRecord]:
    """A thundering herd, again and again: each herd is ``per_herd`` requests for one prompt
    prefix nobody has seen (``ceil(prefix_tokens / 512)`` new blocks) then a unique question
    block each, all arriving within ``spread_ms`` of the herd's start; herds start at Poisson
    times, ``herd_rate_per_s``. What a fan-out agent step, a batch job or a new system prompt
    deployed to every client does: the first of a herd finds nothing cached anywhere, and
    every router decides the rest before any engine has stored a block of it."""
    rng = random.Random(seed)
    prefix_blocks = max(1, -(-prefix_tokens // TRACE_BLOCK))
    question_blocks = max(1, -(-question_tokens // TRACE_BLOCK))
    next_id = 0
    start = 0.0
    records = []
    for _ in range(herds):
        prefix = tuple(range(next_id, next_id + prefix_blocks))
        next_id += prefix_blocks
        for _ in range(per_herd):
            question = tuple(range(next_id, next_id + question_blocks))
            next_id += question_blocks
            at_ms = int(start * 1000) + rng.randrange(spread_ms + 1)
            records.append(TraceRecord(at_ms, prefix_blocks * TRACE_BLOCK + question_tokens,
                                       output_tokens, prefix + question))
        start += rng.expovariate(herd_rate_per_s)
    records.sort(key=lambda r: r.timestamp_ms)
    yield from records
