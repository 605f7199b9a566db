"""Cost of a ledger snapshot (``GET /admin/ledger/snapshot``) and of loading it (warm start).

One target holding ``--entries`` entries (conversations of ``--tail-blocks`` 16-token blocks
under 8 shared 32-block system prompts, stored as 32-block events like the ingestion path),
then: ``export_ms`` (``LedgerBook.export_target``: the synchronous part, which holds the trio
thread), ``snapshot_ms`` (+ ``take_snapshot`` and msgpack ``encode``: the whole handler),
``bytes``, ``decode_ms`` and ``import_ms`` (``LedgerBook.import_target`` into an empty book).
Each figure is the best of ``--repeat`` runs.

Usage: ``python -m perf.bench_snapshot --entries 1000000``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from array import array

from cortex.ledger.book import LedgerBook
from cortex.ledger.kv_events import BlockStored, EngineFamily, EventBatch
from cortex.ledger.snapshot import (
    ExportedTarget,
    StreamId,
    decode,
    encode,
    take_snapshot,
)
from perf.benchkit import machine_info

BLOCK = 16
EVENT = 32


def build(entries: int, tail_blocks: int) -> LedgerBook:
    rng = random.Random(7)
    book = LedgerBook(max_entries=None)
    target = book.register("w0", 0, EngineFamily.VLLM, "bench-model")
    systems = []
    for s in range(8):
        hashes = array("Q", rng.randbytes(8 * EVENT))
        tokens = array("I", rng.randbytes(4 * EVENT * BLOCK))
        book.apply(target, EventBatch(0.0, (BlockStored(hashes, None, tokens, BLOCK),), 0))
        systems.append(hashes[-1])
    conversation = 0
    while book.entries < entries:
        parent = systems[conversation % 8]
        tail = random.Random(conversation)
        hashes = array("Q", tail.randbytes(8 * tail_blocks))
        tokens = array("I", tail.randbytes(4 * tail_blocks * BLOCK))
        for start in range(0, tail_blocks, EVENT):
            stop = min(tail_blocks, start + EVENT)
            event = BlockStored(hashes[start:stop], parent, tokens[start * BLOCK:stop * BLOCK],
                                BLOCK)
            book.apply(target, EventBatch(0.0, (event,), 0))
            parent = hashes[stop - 1]
        conversation += 1
    return book


def best_ms(fn, repeat: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return round(best * 1e3, 1), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--tail-blocks", type=int, default=224)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    book = build(args.entries, args.tail_blocks)
    stream = StreamId("http://10.0.0.1:8000", 0, "vllm", "bench-model", "tcp://10.0.0.1:5557")
    export_ms, _images = best_ms(lambda: book.export_target(0), args.repeat)

    def handler() -> bytes:
        exported = ExportedTarget(stream, "w0", "ready", (123, b"d" * 16), book.export_target(0))
        return encode(take_snapshot([exported]))

    snapshot_ms, body = best_ms(handler, args.repeat)
    decode_ms, snapshot = best_ms(lambda: decode(body), args.repeat)
    image = snapshot.targets[0].images()

    def load() -> int:
        fresh = LedgerBook(max_entries=None)
        target = fresh.register("w0", 0, EngineFamily.VLLM, "bench-model")
        return fresh.import_target(target, image)

    import_ms, added = best_ms(load, args.repeat)
    assert added == book.entries
    print(json.dumps({
        "machine": machine_info(), "loadavg": os.getloadavg(), "entries": book.entries,
        "nodes": book.nodes, "export_ms": export_ms, "snapshot_ms": snapshot_ms,
        "bytes": len(body), "decode_ms": decode_ms, "import_ms": import_ms,
    }, indent=2))


if __name__ == "__main__":
    main()
