"""Chaos storm (issue 7 §3): sustained load through Cortex over four simulated engines (two
vLLM, two SGLang) while a seeded script kills and restarts engines, hangs them, fails and slows
their responses (503, 500, 429), breaks streams mid-way, marks them unhealthy, restarts their KV
side, drops, duplicates and reorders event batches and stalls event streams; some clients leave
mid-stream, some half-close after sending (and must still get their whole answer).

Pass criteria, asserted after the storm:

* every request either succeeded or got a clear error (JSON 4xx/5xx, or a stream cut after its
  head); none hung past its deadline, none was answered with garbage or not at all;
* none was lost: no 502/503/504 while some worker stayed available for the request's whole life
  (the script keeps at most two of the four in an outage);
* after a quiet period every target is READY and its ledger equals its engine's cache (no false
  hits, no misses);
* Cortex's pending-work accounting is back to zero, and the memory it holds (tracemalloc of
  allocations made under Cortex's code during the storm, the sims excluded) is bounded.

The figures are printed (``pytest -s``). ``CORTEX_CHAOS_STORM_S`` and ``CORTEX_CHAOS_SEED``
lengthen or vary the run (CI: 12 s, seed 7).
"""

from __future__ import annotations

import gc
import json
import os
import random
import tracemalloc
from functools import partial
from pathlib import Path

import trio

import cortex
from tests.chaos.cluster import ChaosCluster, chaos_cluster
from tests.chaos.load import Availability, Tally, chat_body, client_loop, one_request
from tests.chaos.script import OUTAGES, ChaosScript

STORM_S = float(os.environ.get("CORTEX_CHAOS_STORM_S", "12"))
SEED = int(os.environ.get("CORTEX_CHAOS_SEED", "7"))
CLIENTS = 20
DEADLINE_S = 30.0  # per request; Cortex's own bound is 4 attempts x (connect 2 s + head 3 s)
CORTEX_DIR = Path(cortex.__file__).resolve().parent
# Bounded caches: the segment, render and prompt-reuse caches of 1 MiB each by their own
# accounting, the ledger of 4x256 blocks and the sequencers' windows; tracemalloc sees more
# (rendered texts and parsed bodies kept alive beyond those budgets: 7.4-9.1 MB in
# 2026-12-07's runs, the commit before issue 38 too). 8 MiB was set before the render and
# prompt-reuse caches existed.
HELD_BYTES_BOUND = 12 << 20


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def cortex_held_bytes(snapshot: tracemalloc.Snapshot) -> int:
    """Bytes still allocated, traced since the baseline, whose allocating line is in Cortex's
    code (the simulated engines' excluded). One frame per trace: deeper stacks slow this
    process down several times over, which would change the storm itself."""
    kept = snapshot.filter_traces([
        tracemalloc.Filter(True, f"{CORTEX_DIR}/*"),
        tracemalloc.Filter(False, f"{CORTEX_DIR}/sim/*"),
    ])
    return sum(stat.size for stat in kept.statistics("filename"))


async def clean_batch_everywhere(cluster: ChaosCluster, rng: random.Random) -> None:
    """One request straight to every engine: a batch dropped at the end of the storm is only
    noticed when a later batch arrives."""
    for serial, name in enumerate(sorted(cluster.slots)):
        url = cluster.engine(name).url
        assert url is not None
        outcome = await one_request(int(url.rsplit(":", 1)[1]),
                                    chat_body(rng, 10_000_000 + serial, stream=False),
                                    stream=False, deadline_s=10)
        assert outcome.kind == "ok", outcome


def gateway_tasks() -> int:
    """Tasks living under ``run_gateway`` (the engines' server tasks excluded: Cortex's idle
    keep-alive connections to them keep two tasks each alive on the engine's side)."""
    def find(task: trio.lowlevel.Task) -> trio.lowlevel.Task | None:
        if task.name == "cortex.app.run_gateway":
            return task
        for nursery in task.child_nurseries:
            for child in nursery.child_tasks:
                if (found := find(child)) is not None:
                    return found
        return None

    def count(task: trio.lowlevel.Task) -> int:
        return 1 + sum(count(c) for n in task.child_nurseries for c in n.child_tasks)

    gateway = find(trio.lowlevel.current_root_task())
    assert gateway is not None
    return count(gateway)


def ledger_report(cluster: ChaosCluster) -> dict[str, str]:
    out = {}
    for name in sorted(cluster.slots):
        c = cluster.compare(name)
        state = cluster.state(name)
        out[name] = (f"{state.value if state else None}: ledger {c.ledger_blocks} engine "
                     f"{c.engine_blocks} false_hits {c.false_hits} missed {c.missed}")
    return out


def ledgers_exact(cluster: ChaosCluster) -> bool:
    return cluster.all_ready() and all(cluster.compare(n).exact for n in cluster.slots)


def accounting_idle(cluster: ChaosCluster) -> bool:
    """No request in the server, none counted in flight or queued for prefill on any worker,
    no upstream connection busy."""
    running = cluster.running
    if running.server.in_flight:
        return False
    if any(cluster.upstream_stats(name).busy for name in cluster.slots):
        return False
    return all(pool.pending.in_flight(name) == 0 and pool.pending.queued_prefill_tokens(name) == 0
               for pool in running.pools.values() for name in pool.workers)


async def test_chaos_storm() -> None:
    rng = random.Random(SEED)
    async with chaos_cluster(seed=SEED) as cluster:
        # The start-up work done first: the BPE's start check (a worker thread comparing
        # fastokens with tokenizers over ~1 MB of ids) would otherwise be memory held under
        # Cortex's code whenever the snapshot catches it mid-way
        await cluster.until(lambda: all(pool.profile.bpe.settled
                                        for pool in cluster.running.pools.values()
                                        if pool.profile is not None), timeout_s=60)
        # Warm-up: every tenant's prefix cached somewhere, the segment cache primed.
        warm = Tally()
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            for i in range(CLIENTS):
                nursery.start_soon(partial(client_loop, cluster.port, random.Random(f"warm{i}"),
                                           warm, stop, None, deadline_s=DEADLINE_S))
            await trio.sleep(1.0)
            stop.set()
        assert warm.outcomes["ok"] == warm.sent > 0, warm.figures()

        gc.collect()
        rss_before = rss_bytes()
        tasks_before = gateway_tasks()
        tracemalloc.start(1)
        availability = Availability(sorted(cluster.slots))
        script = ChaosScript(cluster, availability, random.Random(rng.getrandbits(64)))
        tally = Tally()
        stop = trio.Event()
        serials = [0]
        began = trio.current_time()
        async with trio.open_nursery() as nursery:
            for i in range(CLIENTS):
                nursery.start_soon(partial(
                    client_loop, cluster.port, random.Random(f"{SEED}/{i}"), tally, stop,
                    availability, deadline_s=DEADLINE_S, drop_share=0.05, half_close_share=0.05,
                    serials=serials))
            await script.run(STORM_S)
            stop.set()
        storm_s = trio.current_time() - began

        await script.calm()
        await clean_batch_everywhere(cluster, rng)
        try:
            await cluster.until(lambda: ledgers_exact(cluster), timeout_s=30)
        except trio.TooSlowError:
            raise AssertionError(f"ledgers after the storm: {ledger_report(cluster)}") from None
        try:
            await cluster.until(lambda: accounting_idle(cluster), timeout_s=10)
        except trio.TooSlowError:
            pools = cluster.running.pools.values()
            raise AssertionError(
                f"pending work after the storm: server {cluster.running.server.in_flight}, "
                f"upstream {[cluster.upstream_stats(n) for n in sorted(cluster.slots)]}, "
                f"pools {[(n, p.pending.in_flight(n)) for p in pools for n in p.workers]}"
            ) from None

        gc.collect()
        held = cortex_held_bytes(tracemalloc.take_snapshot())
        tracemalloc.stop()
        rss_after = rss_bytes()
        tasks_after = gateway_tasks()

        figures = {
            **tally.figures(),
            "storm_s": round(storm_s, 1),
            "clients": CLIENTS,
            "seed": SEED,
            "warm_up": {"requests": warm.sent, "req_per_s": round(warm.sent / 1.0, 1)},
            "faults": dict(sorted(script.counts.items())),
            "half_closed": dict(tally.half_closed),
            "back_live_after_outage_s_max": round(max(script.back_up_s, default=0.0), 2),
            "ledgers": ledger_report(cluster),
            "cortex_held_bytes_after": held,
            "rss_mib_before_after": [round(rss_before / 2**20, 1), round(rss_after / 2**20, 1)],
            "gateway_tasks_before_after": [tasks_before, tasks_after],
            "event_faults": {
                name: {k: v for k, v in
                       cluster.running.ingest_counters[cluster.target(name)].as_dict().items()
                       if k in ("gaps", "gaps_repaired", "restarts", "duplicates", "replays")}
                for name in sorted(cluster.slots)},
        }
        print("\nchaos storm figures:", json.dumps(figures, indent=1))

        assert tally.outcomes["hung"] == 0, tally.bad
        assert tally.outcomes["no_answer"] == 0 and tally.outcomes["bad"] == 0, tally.bad
        assert tally.lost == [], tally.lost
        assert tally.outcomes["ok"] > tally.sent // 2, figures
        assert sum(script.counts[f] for f in OUTAGES) >= 4
        assert script.counts["fail_500"] + script.counts["fail_429"] >= 1, script.counts
        # half-closing clients ran, and none was taken for gone: each was answered (a clear
        # error, or a stream cut by an engine dying mid-stream, is an answer too)
        assert tally.half_closed["ok"] >= 1, tally.half_closed
        assert set(tally.half_closed) <= {"ok", "error", "cut"}, tally.half_closed
        assert held < HELD_BYTES_BOUND, figures
        assert rss_after - rss_before < 128 << 20, figures
        assert tasks_after <= tasks_before + 4, figures  # (a probe may be mid-fetch)
