"""Herding guard, simulated deterministically: 8 workers, a 32-block system prompt every request
starts with (cached on one worker only), a burst of 200 new sessions routed before any KV event
comes back, then a burst of their second turns.

The ledger is a real ``BlockTree``; after each burst the simulated engines store what they
prefilled (prompt blocks; engine hash = block key), as their BlockStored events would. Load is
the number of requests each worker holds in flight at the end of a burst.
"""

from __future__ import annotations

import random
from contextlib import ExitStack

from cortex._fast.blockkeys import block_keys, namespace_seed
from cortex._fast.ledger import BlockTree
from cortex.ledger.state import TargetState
from cortex.scheduling import (
    Mode,
    PendingWork,
    RequestFacts,
    Scheduler,
    WorkerView,
    events_chain,
    worker_matches,
)

BLOCK = 16
WORKERS = 8
SESSIONS = 200
SEED = namespace_seed("sim-model")
SYSTEM = [7_000_000 + t for t in range(32 * BLOCK)]  # 32 blocks


def engine_store(tree: BlockTree, target: int, tokens: list[int]) -> None:
    keys = block_keys(tokens, BLOCK, SEED)
    tree.store(target, None, keys, tokens[: len(keys) * BLOCK], SEED)


def user_turn(session: int, turn: int, blocks: int) -> list[int]:
    rng = random.Random(session * 1000 + turn)
    return [rng.randrange(50_000) for _ in range(blocks * BLOCK)]


class Cluster:
    def __init__(self, apply_pending: bool = True) -> None:
        self.tree = BlockTree(BLOCK)
        self.bases = [WorkerView(f"w{i}", targets=(i,), ledger_state=TargetState.READY)
                      for i in range(WORKERS)]
        self.pending = PendingWork()
        self.scheduler = Scheduler(events_chain(random.Random(0)))
        self.apply_pending = apply_pending

    def route(self, tokens: list[int], holds: ExitStack) -> tuple[str, Mode, int]:
        keys = block_keys(tokens, BLOCK, SEED)
        request = RequestFacts(keys, len(tokens), BLOCK)
        views = ([self.pending.view(b) for b in self.bases] if self.apply_pending
                 else self.bases)
        matched = worker_matches(self.tree.match(keys), views)
        decision = self.scheduler.decide(request, views, matched)
        uncached = request.token_count - decision.predicted_cached_tokens
        holds.enter_context(self.pending.hold(decision.worker, uncached))
        return decision.worker, decision.mode, decision.predicted_cached_tokens

    def burst(self, prompts: list[list[int]]) -> tuple[list[str], dict[str, int], list[Mode]]:
        """Route every prompt while all earlier ones are still in flight; then the engines
        finish and store the prompts they prefilled."""
        with ExitStack() as holds:
            routed = [self.route(p, holds) for p in prompts]
            load = {b.worker: self.pending.in_flight(b.worker) for b in self.bases}
        for prompt, (worker, _, _) in zip(prompts, routed):
            engine_store(self.tree, int(worker[1:]), prompt)
        return [w for w, _, _ in routed], load, [m for _, m, _ in routed]


def spread(load: dict[str, int]) -> float:
    return max(load.values()) / (sum(load.values()) / len(load))


def first_turns() -> list[list[int]]:
    return [SYSTEM + user_turn(s, 1, 8) for s in range(SESSIONS)]


def test_shared_prefix_burst_spreads_and_repeat_turns_stay():
    cluster = Cluster()
    engine_store(cluster.tree, 0, SYSTEM)  # the first worker that cached the system prompt
    prompts = first_turns()
    assigned, load, modes = cluster.burst(prompts)
    assert set(modes) == {Mode.EXACT_KV_EVENTS}
    assert spread(load) <= 1.3, load
    assert set(load) == {f"w{i}" for i in range(WORKERS)} and min(load.values()) > 0

    second = [p + user_turn(s, 2, 4) + user_turn(s, 3, 4) for s, p in enumerate(prompts)]
    again, load2, _ = cluster.burst(second)
    stayed = sum(a == b for a, b in zip(assigned, again))
    assert stayed == SESSIONS
    assert spread(load2) <= 1.3, load2


def test_repeat_turns_predict_their_whole_history_cached():
    cluster = Cluster()
    prompts = first_turns()[:16]
    cluster.burst(prompts)
    with ExitStack() as holds:
        _, mode, cached = cluster.route(prompts[3] + user_turn(3, 2, 2), holds)
    assert mode is Mode.EXACT_KV_EVENTS
    assert cached == len(prompts[3])


def test_without_decision_time_pending_work_the_burst_herds():
    """The guard is what spreads the burst: views without pending work send it all to w0."""
    cluster = Cluster(apply_pending=False)
    engine_store(cluster.tree, 0, SYSTEM)
    _, load, _ = cluster.burst(first_turns())
    assert load["w0"] == SESSIONS


def test_cold_burst_spreads_evenly():
    cluster = Cluster()
    _, load, modes = cluster.burst(first_turns())
    assert modes[0] is Mode.LOAD_AWARE
    assert spread(load) <= 1.3, load


def test_repeat_turns_in_shuffled_order_mostly_stay_and_stay_spread():
    """Second turns arriving in another order: a few sessions leave a worker whose share of the
    reshuffled burst runs ahead of the bounded-load cap; the rest stay."""
    for seed in range(3):
        cluster = Cluster()
        engine_store(cluster.tree, 0, SYSTEM)
        prompts = first_turns()
        assigned, _, _ = cluster.burst(prompts)
        order = list(range(SESSIONS))
        random.Random(seed).shuffle(order)
        again, load, _ = cluster.burst(
            [prompts[s] + user_turn(s, 2, 4) + user_turn(s, 3, 4) for s in order])
        moved = [s for s, worker in zip(order, again) if assigned[s] != worker]
        assert len(moved) <= SESSIONS * 0.05
        assert spread(load) <= 1.3, load
