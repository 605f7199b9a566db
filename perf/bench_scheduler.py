"""Benchmark of one scheduling decision (keys → worker), tokenization excluded.

Setup: ``--workers`` workers (one target each, ledger READY, a measured prefill rate, some
pending work and engine figures), a ``BlockTree`` populated as the ledger bench does — ``16``
system prompts of 32 blocks held by every worker, then ``--conversations`` conversations of a
system prompt + a private tail (256-block prompts, 16-token blocks), each held by one worker
(70 %) or two (30 %).

Timed, per query (a stored conversation: its holders match all 256 blocks, every worker the
32-block system prompt; or a new conversation: only the system prompt matches):

* ``decision_us`` — ``BlockTree.match`` + ``FastScheduler.decide`` (the compiled common cases,
  ``cortex/_fast/score.pyx``) on the current views: the request path's cost from keys to a
  decision;
* ``reference_decision_us`` — the same with the pure-Python reference chain
  (``worker_matches`` + ``Scheduler.decide``), measured in the same run for the ratio;
* ``policy_us`` — ``FastScheduler.decide`` alone (ledger answer precomputed);
* ``accounting_us`` — entering the request's hold and leaving the oldest one (``PendingWork``
  rebuilds the two workers' views): decision-time accounting, paid once per request.

Steady state: each query's request is held and the oldest of ``4 × workers`` held requests
finishes, so views change between every two decisions as they do in service.

Usage: ``python -m perf.bench_scheduler`` (64 workers, 20k conversations, about half a minute);
``--quick`` for a smoke run.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from array import array

from cortex._fast.blockkeys import block_keys, namespace_seed
from cortex._fast.ledger import BlockTree
from cortex.ledger.state import TargetState
from cortex.scheduling import (
    FastScheduler,
    PendingWork,
    RequestFacts,
    Scheduler,
    WorkerView,
    events_chain,
    worker_matches,
)
from perf.benchkit import machine_info, percentiles_us

BLOCK = 16
SYSTEM_BLOCKS = 32
SYSTEM_PROMPTS = 16
PROMPT_BLOCKS = 256
SEED = namespace_seed("bench-model")


def tokens(rng: random.Random, blocks: int) -> list[int]:
    return [rng.randrange(128_000) for _ in range(blocks * BLOCK)]



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small, fast smoke run")
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--conversations", type=int, default=20_000)
    parser.add_argument("--queries", type=int, default=20_000)
    args = parser.parse_args()
    if args.quick:
        args.conversations, args.queries = 2_000, 2_000
    rng = random.Random(1)

    tree = BlockTree(BLOCK)
    systems = [tokens(rng, SYSTEM_BLOCKS) for _ in range(SYSTEM_PROMPTS)]
    for system in systems:
        keys = block_keys(system, BLOCK, SEED)
        for target in range(args.workers):
            tree.store(target, None, keys, system, SEED)
    stored: list[array] = []
    for _ in range(args.conversations):
        prompt = rng.choice(systems) + tokens(rng, PROMPT_BLOCKS - SYSTEM_BLOCKS)
        keys = block_keys(prompt, BLOCK, SEED)
        holders = rng.sample(range(args.workers), 1 if rng.random() < 0.7 else 2)
        for target in holders:
            tree.store(target, None, keys, prompt, SEED)
        if len(stored) < 1000:
            stored.append(keys)
    fresh = [block_keys(rng.choice(systems) + tokens(rng, PROMPT_BLOCKS - SYSTEM_BLOCKS),
                        BLOCK, SEED) for _ in range(1000)]

    pending = PendingWork()
    for i in range(args.workers):
        pending.track(WorkerView(f"w{i:02d}", targets=(i,), ledger_state=TargetState.READY,
                                 engine_queue=rng.randrange(4), kv_usage=rng.random() * 0.8,
                                 prefill_tokens_per_s=rng.uniform(8_000, 12_000)))
    scheduler = Scheduler(events_chain(random.Random(2)))
    fast = FastScheduler(random.Random(2))
    queries = [(keys, RequestFacts(keys, len(keys) * BLOCK, BLOCK))
               for keys in stored + fresh]

    # Steady state: 4 requests in flight per worker on average; each query's request is held
    # (decision-time accounting) and the oldest one finishes.
    holds: list = []
    decision_ns, reference_ns, policy_ns, accounting_ns = [], [], [], []
    modes: dict[str, int] = {}
    clock = time.perf_counter_ns
    gc.disable()
    for n in range(args.queries + 4 * args.workers):
        keys, request = queries[rng.randrange(len(queries))]
        start = clock()
        views = pending.views()
        decision = fast.decide(request, views, tree.match(keys))
        middle = clock()
        views = pending.views()
        reference = scheduler.decide(request, views, worker_matches(tree.match(keys), views))
        after_reference = clock()
        target_blocks = tree.match(keys)
        policy_start = clock()
        fast.decide(request, views, target_blocks)
        end = clock()
        assert reference == decision, (reference, decision)
        hold = pending.hold(decision.worker,
                            request.token_count - decision.predicted_cached_tokens)
        hold.open()
        holds.append(hold)
        if len(holds) > 4 * args.workers:
            holds.pop(0).close()
        done = clock()
        if n >= 4 * args.workers:  # warmed up: the pool is at its steady load
            decision_ns.append(middle - start)
            reference_ns.append(after_reference - middle)
            policy_ns.append(end - policy_start)
            accounting_ns.append(done - end)
            modes[decision.mode.value] = modes.get(decision.mode.value, 0) + 1
    gc.enable()
    for hold in holds:
        hold.close()
    assert pending.total_in_flight() == 0
    in_flight = [v.in_flight for v in pending.views()]
    assert not any(in_flight)

    print(json.dumps({
        "machine": machine_info(),
        "workers": args.workers,
        "prompt_blocks": PROMPT_BLOCKS,
        "tree_nodes": tree.nodes,
        "tree_entries": tree.entries,
        "queries": args.queries,
        "modes": modes,
        "decision_us": percentiles_us(decision_ns),
        "reference_decision_us": percentiles_us(reference_ns),
        "policy_us": percentiles_us(policy_ns),
        "accounting_us": percentiles_us(accounting_ns),
        "note": "decision = BlockTree.match + FastScheduler.decide (compiled); reference = "
                "BlockTree.match + worker_matches + Scheduler.decide (Python); policy = "
                "FastScheduler.decide alone; tokenization excluded",
    }, indent=2))


if __name__ == "__main__":
    main()
