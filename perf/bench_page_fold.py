"""SGLang's default page size of 1 into the ledger: per-token events folded into 16-token blocks,
against a ledger of block size 1 and against a 16-token engine (issue 37 §1).

Workload: prompts of ``--tokens`` (32k) tokens, hashed as SGLang does (SHA-256 chain, the
simulator's ``sglang_page_chain``), published as SGLang 0.5.15 publishes them — one
``BlockStored`` per page (``mem_cache/events.py``: one event of one hash per page), in batches of
``--chunk`` pages (one chunked-prefill step each) — encoded with the simulator's wire encoder
(``sglang-0.5.19``: array events) so that only Cortex's work is timed. Three ledgers:

* ``page1_block1``: Cortex keyed at block size 1 (what it needed before folding);
* ``page1_fold16``: the same events folded into 16-token blocks (``LedgerBook.fold_pages``);
* ``page16_block16``: an SGLang engine with ``--page-size 16`` (one event per 16-token page).

Sections: ``ingest`` — decode + apply of one prompt's batches (median of ``--repeats`` fresh
books; pages/s and tokens/s; the decode alone, µs a page); ``memory`` — ``--workers`` workers each caching ``--prompts``
prompts that share a ``--shared``-token prefix: ledger bytes (trees + fold index) per cached
token; ``match`` — keys of one cached prompt and the ledger match (µs, median).

Run: ``.venv/bin/python -m perf.bench_page_fold [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from cortex.events.decoder import decode_payload
from cortex.ledger.book import LedgerBook
from cortex.ledger.kv_events import BlockStored, EngineFamily
from cortex.ledger.state import TargetState
from cortex.profile.request_keys import request_block_keys
from cortex.sim.engine_hashes import sglang_page_chain
from cortex.sim.wire import encode_batch, profile_named
from perf.benchkit import machine_info

MODEL = "m"
SETUPS = {  # name: (engine page size, Cortex block size, fold)
    "page1_block1": (1, 1, False),
    "page1_fold16": (1, 16, True),
    "page16_block16": (16, 16, False),
}
PROFILE = profile_named("sglang-0.5.19")


def prompt_payloads(tokens: list[int], page: int, chunk: int) -> list[bytes]:
    """One prompt's batches as SGLang publishes them: one BlockStored per page."""
    hashes, _ = sglang_page_chain(tokens, page, None)
    unsigned = [h & ((1 << 64) - 1) for h in hashes]
    events = []
    parent = None
    for index, block_hash in enumerate(unsigned):
        events.append(BlockStored([block_hash], parent, tokens[index * page:(index + 1) * page],
                                  page, medium="GPU"))
        parent = block_hash
    return [encode_batch(PROFILE, 1.0, events[i:i + chunk // page], None)
            for i in range(0, len(events), max(1, chunk // page))]


def new_book(block: int, fold: bool, workers: int = 1) -> tuple[LedgerBook, list[int]]:
    book = LedgerBook()
    if fold:
        book.fold_pages(MODEL, block)
    targets = [book.register(f"w{i}", 0, EngineFamily.SGLANG, MODEL) for i in range(workers)]
    for target in targets:
        book.set_state(target, TargetState.READY)
    return book, targets


def ingest(tokens: list[int], chunk: int, repeats: int) -> dict[str, dict[str, float]]:
    out = {}
    for name, (page, block, fold) in SETUPS.items():
        payloads = prompt_payloads(tokens, page, chunk)
        samples = []
        for _ in range(repeats):
            book, (target,) = new_book(block, fold)
            start = time.perf_counter()
            for payload in payloads:
                book.apply(target, decode_payload(payload, EngineFamily.SGLANG))
            samples.append(time.perf_counter() - start)
        seconds = statistics.median(samples)
        decode = []
        for _ in range(repeats):
            start = time.perf_counter()
            for payload in payloads:
                decode_payload(payload, EngineFamily.SGLANG)
            decode.append(time.perf_counter() - start)
        out[name] = {"decode_us_per_page": round(statistics.median(decode) * 1e6
                                                 / (len(tokens) / page), 3),
                     "ms_per_prompt": round(seconds * 1e3, 2),
                     "pages_per_s": round(len(tokens) / page / seconds),
                     "tokens_per_s": round(len(tokens) / seconds)}
    return out


def memory(rng: random.Random, length: int, shared: int, workers: int, prompts: int,
           chunk: int) -> dict[str, dict[str, float]]:
    common = [rng.randrange(100_000) for _ in range(shared)]
    texts = [common + [rng.randrange(100_000) for _ in range(length - shared)]
             for _ in range(workers * prompts)]
    cached = workers * prompts * length  # tokens each worker holds, summed over workers
    out = {}
    for name, (page, block, fold) in SETUPS.items():
        book, targets = new_book(block, fold, workers)
        for index, tokens in enumerate(texts):
            for payload in prompt_payloads(tokens, page, chunk):
                book.apply(targets[index % workers], decode_payload(payload, EngineFamily.SGLANG))
        folds = sum(f.memory_bytes for f in book.folds.values())
        entries = sum(f.entries for f in book.folds.values())
        out[name] = {"bytes_per_cached_token": round((book.memory_bytes + folds) / cached, 1),
                     "tree_bytes": book.memory_bytes, "fold_index_bytes": folds,
                     "fold_index_entries": entries, "ledger_entries": book.entries}
    return out


def match(tokens: list[int], chunk: int, repeats: int) -> dict[str, dict[str, float]]:
    out = {}
    for name, (page, block, fold) in SETUPS.items():
        book, (target,) = new_book(block, fold)
        for payload in prompt_payloads(tokens, page, chunk):
            book.apply(target, decode_payload(payload, EngineFamily.SGLANG))
        keys_s, match_s = [], []
        found = {}
        for _ in range(repeats):
            start = time.perf_counter()
            keys = request_block_keys(tokens, block, MODEL)
            middle = time.perf_counter()
            found = book.match(EngineFamily.SGLANG, MODEL, block, keys)
            keys_s.append(middle - start)
            match_s.append(time.perf_counter() - middle)
        out[name] = {"keys_us": round(statistics.median(keys_s) * 1e6, 1),
                     "match_us": round(statistics.median(match_s) * 1e6, 1),
                     "matched_tokens": found.get(target, 0) * block}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--tokens", type=int, default=32_768)
    parser.add_argument("--chunk", type=int, default=8192, help="pages per batch x page size")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8, help="per worker")
    parser.add_argument("--prompt-tokens", type=int, default=8192)
    parser.add_argument("--shared", type=int, default=2048)
    args = parser.parse_args()
    if args.quick:
        args.tokens, args.repeats, args.prompts, args.prompt_tokens = 4096, 2, 2, 1024
        args.shared = 256
    rng = random.Random(7)
    tokens = [rng.randrange(100_000) for _ in range(args.tokens)]
    report = {
        "machine": machine_info(),
        "args": vars(args),
        "ingest": ingest(tokens, args.chunk, args.repeats),
        "memory": memory(rng, args.prompt_tokens, args.shared, args.workers, args.prompts,
                         args.chunk),
        "match": match(tokens, args.chunk, max(args.repeats, 20)),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
