"""Floods, then Cortex's memory: does RSS come back once a flood is over?

Cortex runs as its own process (``python -m cortex serve``) in front of one simulated vLLM
engine (real HTTP, real ZeroMQ KV events with replay) that runs in this process. After a
warm-up (``--warmup`` chat requests) RSS is sampled (``before``); then each flood, and RSS
again once Cortex has taken all of it in and ``--settle-s`` seconds passed:

* ``events``: ``--batches`` small KV-event batches from the engine's publisher, as fast as it
  sends: each stores one new block and removes the block stored ``--live`` batches earlier
  (an engine churning its cache), then the last ``--live`` are removed, so the ledger ends
  where it started. Done when Cortex's ``cortex_events_batches_applied_total`` (plus gaps it
  had to repair) accounts for every batch.
* ``bodies``: ``--big-bodies`` chat requests of ``--big-body-mib`` MiB each (one user message
  of plain text), one after another; each answered before the next (a 413 for a body over
  ``server.limits.max_body_bytes``, else a load-routed answer: the prompt is over
  ``models.max_prompt_chars``).

Figures (JSON on stdout): RSS (MiB) before, after each flood, and the ratio to ``before``;
each flood's size, duration and Cortex's CPU seconds for it. The target (issue 22 §6): after any flood, RSS
within 10% of its pre-flood value.

Cortex runs with ``--server-memory-trim-s`` (``--memory-trim-s``, 2 s here so that the
settle time covers one; 0 shows the process without it).

Usage: ``python -m perf.flood_rss [--batches 300000] [--big-bodies 10] [--memory-trim-s S]
[--quick]``
(``--quick``: 20,000 batches, 2 bodies of 4 MiB).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
import time

import trio
import trio.lowlevel

from cortex.ledger.kv_events import BlockRemoved, BlockStored
from cortex.sim.engine import SimEngine
from cortex.sim.wire import encode_batch
from perf.benchkit import machine_info
from perf.soak import TIMING, cpu_seconds, rss_bytes, start_cortex, stop_cortex, wait_ready
from tests.front_http_client import RawClient, chat_request
from tests.gateway_cluster import BLOCK, MODEL, model_profile

MIB = 1 << 20
COUNTED = re.compile(rb"^cortex_events_(gaps|gaps_repaired|gaps_unrepaired|replays|restarts)"
                     rb"_total\{[^}]*\} (\S+)$", re.MULTILINE)
APPLIED = re.compile(rb"^cortex_events_(batches_applied|gaps_repaired)_total\{[^}]*\} (\S+)$",
                     re.MULTILINE)


async def scrape(control: int) -> bytes:
    client = await RawClient.connect(control)
    try:
        return (await client.request(b"GET", b"/metrics")).body
    finally:
        await client.aclose()


async def chat(port: int, text: str) -> int:
    body = json.dumps({"model": MODEL, "max_tokens": 4,
                       "messages": [{"role": "user", "content": text}]}).encode()
    client = await RawClient.connect(port)
    try:
        await client.send(chat_request(body))
        return (await client.read_response()).status
    finally:
        await client.aclose()


async def settled_rss(pid: int, settle_s: float) -> int:
    await trio.sleep(settle_s)
    return rss_bytes(pid)


def anon_mappings(pid: int) -> dict[int, tuple[int, int]]:
    """Anonymous mappings: start address -> (size, resident bytes)."""
    found: dict[int, tuple[int, int]] = {}
    start = size = 0
    anonymous = False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" in head[3]:
                low, high = (int(x, 16) for x in head[0].split("-"))
                start, size, anonymous = low, high - low, len(head) == 5
            elif head[0] == "Rss:" and anonymous:
                found[start] = (size, int(head[1]) * 1024)
    return found


def grown_mappings(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]],
                   top: int = 8) -> list[str]:
    """The anonymous mappings whose resident size grew most (new ones included)."""
    growth = sorted(((rss - before.get(start, (0, 0))[1], start, size)
                     for start, (size, rss) in after.items()), reverse=True)[:top]
    return [f"{start:#x} size {size / MIB:.2f} MiB: +{grew / MIB:.2f} MiB resident"
            + ("" if start in before else " (new)") for grew, start, size in growth if grew > 0]


def rss_by_kind(pid: int) -> dict[str, float]:
    """Resident MiB by mapping kind (``/proc/<pid>/smaps``): ``pymalloc`` = anonymous 1-MiB
    mappings (CPython 3.11's arenas), ``heap`` = glibc's main heap, ``anon`` = other anonymous
    mappings (glibc's per-thread arenas, large ``mmap`` blocks, thread stacks), ``files`` =
    file-backed (code, shared libraries)."""
    kinds = dict.fromkeys(("pymalloc", "heap", "anon", "files"), 0)
    kind = "anon"
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's header
                start, end = (int(x, 16) for x in head[0].split("-"))
                name = head[5] if len(head) > 5 else ""
                kind = ("heap" if name == "[heap]" else "files" if name.startswith("/")
                        else "pymalloc" if not name and end - start == MIB else "anon")
            elif head[0] == "Rss:":
                kinds[kind] += int(head[1]) * 1024
    return {k: round(v / MIB, 1) for k, v in kinds.items()}


async def event_flood(engine: SimEngine, control: int, batches: int, live: int) -> dict:
    publisher = engine.kv.publisher(0)
    base = random.Random("flood").getrandbits(48) << 12
    tokens = list(range(BLOCK))
    started = time.perf_counter()

    def batch(events: list) -> None:
        publisher.publish(encode_batch(engine.wire, time.time(), events, None))

    for i in range(batches):
        events: list = [BlockStored([base + i], None, tokens, BLOCK)]
        if i >= live:
            events.append(BlockRemoved([base + i - live]))
        batch(events)
        if i % 1000 == 999:
            await trio.lowlevel.checkpoint()  # the sender task runs
    for i in range(max(batches - live, 0), batches):
        batch([BlockRemoved([base + i])])
    published = batches + min(live, batches)
    # every batch applied (or covered by a repaired gap): poll Cortex's counters
    while True:
        metrics = await scrape(control)
        applied = sum(float(value) for _, value in APPLIED.findall(metrics))
        if applied >= published:
            break
        await trio.sleep(0.5)
    counted = {name.decode(): int(float(value)) for name, value in COUNTED.findall(metrics)}
    return {"batches": published, "seconds": round(time.perf_counter() - started, 1),
            "cortex_counted": counted}


async def body_flood(port: int, count: int, mib: float) -> dict:
    text = ("lorem ipsum dolor sit amet " * int(mib * MIB / 27 + 1))[: int(mib * MIB)]
    statuses: dict[int, int] = {}
    started = time.perf_counter()
    for _ in range(count):
        status = await chat(port, text)
        statuses[status] = statuses.get(status, 0) + 1
    return {"requests": count, "mib_each": mib, "statuses": statuses,
            "seconds": round(time.perf_counter() - started, 1)}


async def flood(args: argparse.Namespace) -> dict:
    tmpdir = tempfile.TemporaryDirectory(prefix="cortex-flood-")
    result: dict = {}
    async with trio.open_nursery() as nursery:
        engine = SimEngine("e0", "vllm-0.33", model_profile(), block_size=BLOCK,
                           capacity_blocks=4096, timing=TIMING,
                           rng=random.Random("flood/e0"))
        await nursery.start(engine.run)
        process, port, control = start_cortex(
            [engine], tmpdir.name, None, ("--server-memory-trim-s", str(args.memory_trim_s),
                                          # the sim tokenizes a 10-MiB prompt on its event
                                          # loop for seconds: not a dead worker
                                          "--health-timeout-s", "60", *args.cortex_arg))
        try:
            await wait_ready(process, control, tmpdir.name)
            for i in range(args.warmup):
                await chat(port, f"warm-up question {i}: " + "tell me more. " * 50)
            before = await settled_rss(process.pid, args.settle_s)
            result["rss_mib"] = {"before": round(before / MIB, 1)}
            result["rss_by_kind_mib"] = {"before": rss_by_kind(process.pid)}
            mappings_before = anon_mappings(process.pid)
            cpu = cpu_seconds(process.pid)
            result["events"] = await event_flood(engine, control, args.batches, args.live)
            result["events"]["cortex_cpu_s"] = round(cpu_seconds(process.pid) - cpu, 1)
            after_events = await settled_rss(process.pid, args.settle_s)
            result["rss_by_kind_mib"]["after_events"] = rss_by_kind(process.pid)
            result["threads"] = len(os.listdir(f"/proc/{process.pid}/task"))
            result["grown_after_events"] = grown_mappings(mappings_before,
                                                          anon_mappings(process.pid))
            cpu = cpu_seconds(process.pid)
            result["bodies"] = await body_flood(port, args.big_bodies, args.big_body_mib)
            result["bodies"]["cortex_cpu_s"] = round(cpu_seconds(process.pid) - cpu, 1)
            after_bodies = await settled_rss(process.pid, args.settle_s)
            result["rss_by_kind_mib"]["after_bodies"] = rss_by_kind(process.pid)
            result["rss_mib"].update(
                after_events=round(after_events / MIB, 1),
                after_bodies=round(after_bodies / MIB, 1),
                ratio_after_events=round(after_events / before, 3),
                ratio_after_bodies=round(after_bodies / before, 3))
        finally:
            stop_cortex(process)
            tmpdir.cleanup()
        nursery.cancel_scope.cancel()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=300_000)
    parser.add_argument("--live", type=int, default=1_000)
    parser.add_argument("--big-bodies", type=int, default=10)
    parser.add_argument("--big-body-mib", type=float, default=10.0)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--memory-trim-s", type=float, default=2.0,
                        help="Cortex's server.memory_trim_s (0: never give memory back)")
    parser.add_argument("--settle-s", type=float, default=5.0,
                        help="seconds after a flood before RSS is read (> --memory-trim-s)")
    parser.add_argument("--cortex-arg", action="append", default=[], metavar="ARG",
                        help="one more `cortex serve` argument (repeat: --cortex-arg=--flag "
                             "--cortex-arg=value)")
    parser.add_argument("--quick", action="store_true", help="20,000 batches, 2 bodies of 4 MiB")
    args = parser.parse_args()
    if args.quick:
        args.batches, args.big_bodies, args.big_body_mib, args.warmup = 20_000, 2, 4.0, 20
    started = time.time()
    try:
        result = trio.run(flood, args)
    except RuntimeError as error:
        print(f"flood_rss: {error}", file=sys.stderr)
        return 1
    result["machine"] = {**machine_info(), "loadavg": os.getloadavg()}
    result["started_unix"] = round(started)
    result["command"] = " ".join(["python", "-m", "perf.flood_rss", *sys.argv[1:]])
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
