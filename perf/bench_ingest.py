"""Ingestion throughput: ZeroMQ frames → decoded batch → applied ledger, on one core.

Workload (the issue's): vLLM map encoding (profile ``vllm-0.33``), 16-token blocks, one
BlockStored of 32 blocks per batch; a quarter of the batches start a new chain at the root, the
rest continue the chain of an earlier batch of the same target (parent = its last hash); token
ids uniform in [0, 128000); batches spread over 8 targets. Optionally a share of batches are
evictions (BlockRemoved of earlier stored hashes, vLLM style: one event per block).

Reported separately: frame parsing + payload decoding, ledger apply of pre-decoded batches, and
the whole path. The frames are built up front with the simulator's wire encoder, so only
Cortex's work is timed. ``over_zeromq`` then runs the real subscriber task (``run_source``:
SUB socket, sequencer, sync, decode, ledger) on tcp loopback, fed by a publisher in another
process (the machine's other core) that sends the same frames as fast as it can, and
``zeromq_transport_only`` times a bare SUB receiving those messages (the transport's floor).
Run: ``.venv/bin/python -m perf.bench_ingest [--quick]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import platform
import random
import time
from functools import partial

import trio
import zmq

from cortex.events.counters import IngestCounters
from cortex.events.decoder import decode_payload
from cortex.events.frames import parse_live_frames
from cortex.events.source import EventSource, IngestSettings
from cortex.events.subscriber import run_source
from cortex.ledger.book import LedgerBook
from cortex.ledger.kv_events import BlockRemoved, BlockStored, EngineFamily
from cortex.sim.wire import encode_batch, live_frames, profile_named
from perf.benchkit import machine_info

BLOCK = 16
BLOCKS_PER_BATCH = 32
TARGETS = 8


def build_frames(
    n_batches: int, evict_share: float, seed: int
) -> tuple[list[tuple[int, list[bytes]]], int]:
    """(target, frames) per batch, and the number of blocks stored in total."""
    rng = random.Random(seed)
    profile = profile_named("vllm-0.33")
    tails: list[list[int]] = [[] for _ in range(TARGETS)]  # last hash of each chain per target
    held: list[list[int]] = [[] for _ in range(TARGETS)]
    seqs = [0] * TARGETS
    next_hash = 1
    out = []
    stored = 0
    for i in range(n_batches):
        target = i % TARGETS
        if held[target] and rng.random() < evict_share:
            victims = [held[target].pop(rng.randrange(len(held[target]))) for _ in range(8)
                       if held[target]]
            events = [BlockRemoved(block_hashes=[h], medium="GPU", group_idx=0) for h in victims]
        else:
            parent = None
            if tails[target] and rng.random() >= 0.25:
                parent = rng.choice(tails[target])
            hashes = list(range(next_hash, next_hash + BLOCKS_PER_BATCH))
            next_hash += BLOCKS_PER_BATCH
            tokens = [rng.randrange(128000) for _ in range(BLOCK * BLOCKS_PER_BATCH)]
            events = [
                BlockStored(
                    block_hashes=hashes, parent_hash=parent, token_ids=tokens, block_size=BLOCK,
                    medium="GPU", group_idx=0, kv_cache_spec_kind="full_attention",
                )
            ]
            tails[target].append(hashes[-1])
            held[target].extend(hashes)
            stored += BLOCKS_PER_BATCH
        payload = encode_batch(profile, 1767225600.0 + i, events, 0)
        out.append((target, live_frames(b"kv", seqs[target], payload)))
        seqs[target] += 1
    return out, stored


def new_book() -> tuple[LedgerBook, list[int]]:
    book = LedgerBook()
    ids = [book.register(f"w{t}", 0, EngineFamily.VLLM, "bench-model") for t in range(TARGETS)]
    return book, ids


def timed(fn) -> float:
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    finally:
        gc.enable()


def run(n_batches: int, evict_share: float, repeats: int) -> dict:
    frames, stored = build_frames(n_batches, evict_share, seed=7)
    family = EngineFamily.VLLM
    decoded = [(t, decode_payload(parse_live_frames(f).payload, family)) for t, f in frames]

    def decode_all():
        for _, f in frames:
            decode_payload(parse_live_frames(f).payload, family)

    def apply_all():
        book, ids = new_book()
        for t, batch in decoded:
            book.apply(ids[t], batch)

    def end_to_end():
        book, ids = new_book()
        for t, f in frames:
            msg = parse_live_frames(f)
            book.apply(ids[t], decode_payload(msg.payload, family))
        end_to_end.book = book

    best = {}
    for name, fn in (("decode", decode_all), ("apply", apply_all), ("end_to_end", end_to_end)):
        best[name] = min(timed(fn) for _ in range(repeats))
    book = end_to_end.book
    return {
        "batches": n_batches,
        "blocks_stored": stored,
        "evict_share": evict_share,
        "ledger_entries_after": book.entries,
        "decode_blocks_per_s": round(stored / best["decode"]),
        "apply_blocks_per_s": round(stored / best["apply"]),
        "end_to_end_blocks_per_s": round(stored / best["end_to_end"]),
        "end_to_end_us_per_batch": round(best["end_to_end"] / n_batches * 1e6, 2),
    }


def run_subscriber_shell(n_batches: int) -> dict:
    """The subscriber task's per-message work (framing, sequencer, sync machine, decode,
    ledger, counters) fed the frames directly, without a socket."""
    from cortex.events.subscriber import _SourceIngest  # the shell's internals, on purpose

    frames, stored = build_frames(n_batches, 0.0, seed=11)
    numbered = [[f[0], seq.to_bytes(8, "big"), f[2]] for seq, (_, f) in enumerate(frames)]
    book, ids = new_book()
    source = EventSource("w0", 0, EngineFamily.VLLM, "bench-model", "tcp://127.0.0.1:1")
    ingest = _SourceIngest(
        source, ids[0], book, zmq.Context.instance(), IngestSettings(), IngestCounters()
    )
    elapsed = {}

    async def main() -> None:
        await ingest.execute(ingest.sync.start())
        gc.collect()
        start = time.perf_counter()
        for message in numbered:
            await ingest.on_frames(message)
        elapsed["s"] = time.perf_counter() - start

    trio.run(main)
    assert ingest.counters.batches_applied == n_batches and ingest.counters.gaps == 0
    return {
        "batches": n_batches,
        "blocks_per_s": round(stored / elapsed["s"]),
        "us_per_batch": round(elapsed["s"] / n_batches * 1e6, 2),
    }


def _publish(endpoint_queue, n_batches: int, seed: int) -> None:
    """Child process: bind an XPUB, wait for the subscription, send every frame, linger."""
    frames, _ = build_frames(n_batches, 0.0, seed)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.sndhwm = 0  # unlimited: the benchmark measures Cortex, not drops
    pub.bind("tcp://127.0.0.1:*")
    endpoint_queue.put(pub.getsockopt(zmq.LAST_ENDPOINT).decode())
    pub.recv()  # the subscription
    for seq, (_, f) in enumerate(frames):
        pub.send_multipart([f[0], seq.to_bytes(8, "big"), f[2]])
    pub.close(linger=-1)
    ctx.term()


def run_transport_only(n_batches: int) -> dict:
    """The floor under ``over_zeromq``: a bare SUB receiving the same messages, nothing else."""
    endpoints = multiprocessing.Queue()
    child = multiprocessing.Process(target=_publish, args=(endpoints, n_batches, 11))
    child.start()
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.rcvhwm = 0
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoints.get(timeout=60))
    sub.recv_multipart()
    start = time.perf_counter()
    for _ in range(n_batches - 1):
        sub.recv_multipart()
    elapsed = time.perf_counter() - start
    sub.close(linger=0)
    ctx.term()
    child.join(timeout=60)
    return {"messages": n_batches, "us_per_message": round(elapsed / (n_batches - 1) * 1e6, 2)}


def run_over_zeromq(n_batches: int) -> dict:
    """The real subscriber task fed over tcp loopback by a publisher process."""
    _, stored = build_frames(n_batches, 0.0, seed=11)
    endpoints = multiprocessing.Queue()
    child = multiprocessing.Process(target=_publish, args=(endpoints, n_batches, 11))
    child.start()
    endpoint = endpoints.get(timeout=60)
    book, ids = new_book()
    counters = IngestCounters()
    source = EventSource("w0", 0, EngineFamily.VLLM, "bench-model", endpoint)
    marks = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(
                partial(run_source, source, ids[0], book, counters=counters)
            )
            while counters.messages == 0:
                await trio.sleep(0.0005)
            marks["first"] = time.perf_counter()
            marks["applied_before"] = counters.batches_applied
            while counters.batches_applied + counters.decode_errors < n_batches:
                await trio.sleep(0.001)
            marks["last"] = time.perf_counter()
            nursery.cancel_scope.cancel()

    trio.run(main)
    child.join(timeout=60)
    elapsed = marks["last"] - marks["first"]
    timed_batches = n_batches - marks["applied_before"]
    return {
        "batches": n_batches,
        "blocks_stored": stored,
        "gaps": counters.gaps,
        "state": book.state(ids[0]).value,
        "blocks_per_s": round(timed_batches * BLOCKS_PER_BATCH / elapsed),
        "note": "single target; publisher in another process; batches applied after the first "
        "message was seen, over the time until the last was applied",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--batches", type=int, default=40_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    n = 1_000 if args.quick else args.batches
    results = {
        "benchmark": "ingest",
        "machine": machine_info(),
        "python": platform.python_version(),
        "workload": f"vllm-0.33 map, {BLOCK}-token blocks, {BLOCKS_PER_BATCH} blocks/batch, "
        f"{TARGETS} targets",
        "stores_only": run(n, 0.0, 1 if args.quick else args.repeats),
        "with_evictions_20pct": run(n, 0.2, 1 if args.quick else args.repeats),
        "subscriber_shell_no_socket": run_subscriber_shell(n),
        "over_zeromq": run_over_zeromq(n),
        "zeromq_transport_only": run_transport_only(n),
    }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
