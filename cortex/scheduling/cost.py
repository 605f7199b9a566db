"""The cost of sending a request to a worker (lower is better).

Two forms of one idea, chosen by ``CostConfig.form``:

* ``"ttft"`` (default) — expected time to first token, in seconds:
  ``(queued_prefill_tokens + uncached_tokens) / prefill_tokens_per_s``
  ``+ decode_s_per_in_flight × in_flight + engine_queue_s_per_request × engine_queue``.
  The first term is the prefill work ahead of the request plus its own; the second stands for
  the decode batch the prefill shares the GPU with; the third is counted only when the engine
  reports its queue (Cortex's own queue is already in the first term).
  With the engines' step budget given (``step_token_budget`` > 0: the **step form**, for
  continuous-batching engines; ``step_s`` is read only then), the same quantities are read as a
  continuous-batching engine spends them. Each step (one forward pass) carries one token of
  every decoding request and prompt tokens up to the budget, and lasts
  ``step_s + decode_s_per_in_flight × in_flight + prompt tokens / prefill_tokens_per_s``
  (``prefill_tokens_per_s`` is then the marginal rate of prompt tokens within a step, not an
  end-to-end figure). The queued work and the request's own prompt go through in chunks of
  the room left by the decodes, ``room = max(budget − in_flight, budget / 4)``, so each token
  costs ``1 / prefill_tokens_per_s + (step_s + decode_s_per_in_flight × in_flight) / room`` —
  the decode batch slows every chunk of a long prompt, not only its first — and the request
  first waits out the step in progress, ``step_s + decode_s_per_in_flight × in_flight``.
  Read from an engine's step-time profile (``cortex/sim/profiles/``): ``step_s`` = its
  ``step_s + prefill_step_s``, ``decode_s_per_in_flight`` = ``decode_seq_s +
  decode_kv_token_s × a typical context``, ``prefill_tokens_per_s`` = ``1 / (prefill_token_s
  + attention_pair_s × half a typical prompt)``, ``step_token_budget`` = vLLM's
  ``max_num_batched_tokens`` / SGLang's ``chunked_prefill_size``. Without them (the default)
  the form above: safe, and what a fixed-speed engine spends.
  **KV pressure** (both ``"ttft"`` forms; ``kv_overflow_weight`` > 0 and the engine reporting its
  KV pool, ``WorkerView.kv_tokens``): an engine runs a request only with blocks for its whole
  prompt, cached ones included, so where the pool has no room for it next to what the running
  requests hold, the request waits, and meanwhile the blocks it would hit are the first
  evicted by the others' allocations (they are free, least recently used) — a predicted hit
  that turns into a recompute on a busy worker, the agentic replay's TTFT tail. The room is
  ``kv_room = kv_tokens × (1 − kv_usage) − queued_prefill_tokens`` (the engine's reported use,
  polled, plus the prompts Cortex sent that have not reached their first token: their blocks
  may not be in that figure yet; ``kv_usage`` unknown counts as 0), and the request is charged
  ``kv_overflow_weight × min(max(prompt_tokens − kv_room, 0), cached tokens there)`` more
  prompt tokens at the worker's seconds per token: the hit it may lose, computed again. A
  prompt with nothing cached there is not charged: its wait for blocks is not a recompute
  (charging the whole overflow made long uncached prompts pick the worker with room over the
  shorter queue: conversation trace, 15% cache, TTFT p99 +5–15%).
* ``"linear"`` — the seed's score ``α·matched_blocks − β·in_flight − γ·queued_prefill_tokens``,
  negated so lower is better.

``affinity_tolerance_s`` is how much more expected TTFT the worker with the longest hit may
cost than the cheapest worker and still be chosen by ``exact_kv``: a session's history stays
useful for its later turns, so a small queue imbalance should not move it (``"ttft"`` only).
``recompute_weight`` charges moving away from the longest hit again: the cheaper worker would
recompute blocks another worker already holds, so ``exact_kv`` adds
``recompute_weight × recomputed_tokens / rate`` (the cheaper worker's rate) to its side of the
comparison. That recomputation is GPU time the cluster spends twice — every request queued
behind it on that worker waits for it too — and a duplicate that crowds other prefixes out of
the cache: costs the request's own TTFT does not show. The default is 0 (the request's own
TTFT alone), measured on the continuous-batching engines (``perf/RESULTS.md``, issue 34): at 0
against 10, conversation trace with every engine able to hold the whole slice at ~50% load TTFT
mean / p99 390 / 1,373 ms against 428 / 1,753 (hit 17.1% against 17.5%); agentic sessions with
a 15% cache at ~85% load 297 / 1,844 against 490 / 2,811 (hit 71% against 67%); the
conversation trace with a 15% cache at ~85% load within noise. On a batching engine the wait
behind a busy holder is what the charge buys, and it is the TTFT tail: with 10, the slowest
1% were cache hits queued up to ~1.2 s behind their holder; with 0, only long uncached prompts.
Only a cache so small that each engine holds about one prompt (the shared-prefix workload at
15%: 29 blocks for prompts of 20) did better with 10 (883 / 2,056 against 1,054 / 2,496 ms).
On the fixed-speed engines it was tuned on first, 10 kept more continuations home at equal TTFT
(``perf/HISTORY.md``, issue 5, session 4). ``recompute_charge_max_s`` (default 1 s) bounds the
charge when it is set: a request waits at most that much (plus the tolerance) behind a busy
holder of its prefix (without the bound, on the fixed-speed engines, agent sessions queued on
the four workers holding their agents' prompts: ``perf/HISTORY.md``, "Agentic sessions").

Both read ``queued_prefill_tokens`` and ``in_flight``, which Cortex updates at decision time,
so a burst of requests sees its own earlier picks (the herding guard).

Ties (equal cost) go to the worker first in the request's **tie order**: workers ordered by
``splitmix64(xxh3(worker name) ^ seed)``, the seed being the request's last full block key
(its token count when it has no full block), then by name. Idle workers all cost the same, so
a fixed order (smallest id) would send every new prefix group arriving at idle to the same
worker; the tie order spreads them like a hash while staying a pure function of the request,
so the compiled path (``cortex/_fast/score.pyx``) reproduces it exactly.

**The cost band** (``tie_band_s`` > 0, "ttft" form): where the request goes when the cheapest
worker wins (``exact_kv``'s verdict, ``load_aware``, ``p2c``'s pair): of the open workers
costing at most the least cost plus the band, those holding the most of its prefix, and of them
the first in the tie order seeded by the request's first block that no open worker holds
(``band_seed``). Replicas deciding the same new prompt at once (a herd arriving at every
replica) see costs that differ by what each has routed and not yet told the others; within the
band they agree on one worker without a word, where the strict least cost sent each replica's
first request elsewhere. The longest hit is still weighed against the least cost itself, and no
hit is given up for the band (at N = 1 either cost agent sessions 1.6x TTFT or a shared-prefix
workload a third of its hits: ``perf/HISTORY.md``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import xxhash

from cortex.errors import ConfigError
from cortex.scheduling.view import RequestFacts, WorkerView


@dataclass(frozen=True, slots=True)
class CostConfig:
    form: Literal["ttft", "linear"] = "ttft"
    default_prefill_tokens_per_s: float = 10_000.0
    decode_s_per_in_flight: float = 0.002
    engine_queue_s_per_request: float = 0.05
    affinity_tolerance_s: float = 0.25  # exact_kv: extra TTFT a longer hit may cost and still win
    recompute_weight: float = 0.0  # exact_kv: extra charge on recomputing another's cached blocks
    recompute_charge_max_s: float = 1.0  # exact_kv: the most TTFT that charge may add
    kv_overflow_weight: float = 1.0  # "ttft": charge on cached tokens the KV pool has no room for
    tie_band_s: float = 0.0  # "ttft": costs within this of the least are a tie (the band below)
    step_token_budget: int = 0  # tokens one engine step carries; > 0: the step form
    step_s: float = 0.0  # the engines' fixed time per step (step form only)
    alpha_per_cached_block: float = 1.0
    beta_per_in_flight: float = 1.0
    gamma_per_queued_token: float = 0.01

    def __post_init__(self) -> None:
        problems = []
        if self.form not in ("ttft", "linear"):
            problems.append(f"cost form must be 'ttft' or 'linear', not {self.form!r}")
        if not self.default_prefill_tokens_per_s > 0:
            problems.append("default_prefill_tokens_per_s must be > 0")
        for name in ("decode_s_per_in_flight", "engine_queue_s_per_request", "affinity_tolerance_s",
                     "recompute_weight", "recompute_charge_max_s", "alpha_per_cached_block",
                     "beta_per_in_flight", "gamma_per_queued_token", "step_s",
                     "step_token_budget", "kv_overflow_weight", "tie_band_s"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0")
        if problems:
            raise ConfigError(problems)

    @property
    def steps(self) -> bool:
        """Whether the step form is on (the engines' step budget given)."""
        return self.step_token_budget > 0


def step_terms(config: CostConfig, rate: float, in_flight: int) -> tuple[float, float]:
    """The step form's ``(seconds per prompt token, the step in progress)`` on a worker with
    ``in_flight`` requests; the compiled path (``_fast/score.pyx``) does the same operations
    in the same order."""
    step = config.step_s + config.decode_s_per_in_flight * in_flight
    budget = config.step_token_budget
    room = budget - in_flight
    if room < budget * 0.25:
        room = budget * 0.25
    return 1.0 / rate + step / room, step


def load_terms(config: CostConfig, view: WorkerView) -> tuple[float, float]:
    """``(load_s, s_per_token)``: the ``"ttft"`` cost's request-independent part of a worker
    and its seconds per prompt token (``cost == load_s + uncached × s_per_token``, exactly in
    the step form; ``_fast/score.pyx`` does the same operations in the same order)."""
    rate = view.prefill_tokens_per_s or config.default_prefill_tokens_per_s
    if config.steps:
        s_per_token, step = step_terms(config, rate, view.in_flight)
        load_s = view.queued_prefill_tokens * s_per_token + step
    else:
        s_per_token = 1.0 / rate
        load_s = (view.queued_prefill_tokens * s_per_token
                  + config.decode_s_per_in_flight * view.in_flight)
    if view.engine_queue is not None:
        load_s += config.engine_queue_s_per_request * view.engine_queue
    return load_s, s_per_token


def kv_room(config: CostConfig, view: WorkerView) -> float:
    """Prompt tokens the worker's KV pool has room for now (``inf``: unknown, or the KV-pressure
    term off); ``_fast/score.pyx`` does the same operations in the same order."""
    pool = view.kv_tokens
    if not pool or config.kv_overflow_weight <= 0:
        return math.inf
    usage = view.kv_usage
    return pool * (1.0 - (usage if usage is not None else 0.0)) - view.queued_prefill_tokens


def kv_overflow(prompt_tokens: int, uncached_tokens: int, room: float) -> float:
    """The KV-pressure term's tokens: the prompt's cached tokens beyond ``room`` (the hit it
    may lose; 0 or less: none). The one rule for ``cost``, ``ExactKv`` and
    ``_fast/score.pyx`` (same operations, same order)."""
    over = prompt_tokens - room
    cached = prompt_tokens - uncached_tokens
    return cached if over > cached else over


def cost(config: CostConfig, view: WorkerView, uncached_tokens: int, cached_blocks: int,
         prompt_tokens: int = 0) -> float:
    """Cost of one worker for a request of ``prompt_tokens`` with ``uncached_tokens`` left to
    prefill there."""
    if config.form == "linear":
        return -(config.alpha_per_cached_block * cached_blocks
                 - config.beta_per_in_flight * view.in_flight
                 - config.gamma_per_queued_token * view.queued_prefill_tokens)
    if config.steps:
        load_s, s_per_token = load_terms(config, view)
        seconds = load_s + uncached_tokens * s_per_token
    else:
        rate = view.prefill_tokens_per_s or config.default_prefill_tokens_per_s
        s_per_token = 1.0 / rate
        seconds = ((view.queued_prefill_tokens + uncached_tokens) / rate
                   + config.decode_s_per_in_flight * view.in_flight)
        if view.engine_queue is not None:
            seconds += config.engine_queue_s_per_request * view.engine_queue
    over = kv_overflow(prompt_tokens, uncached_tokens, kv_room(config, view))
    if over > 0:
        seconds += config.kv_overflow_weight * over * s_per_token
    return seconds


@dataclass(frozen=True, slots=True)
class BoundedLoad:
    """The bounded-load cap of the policies that pick among all open workers.

    ``factor`` None means no cap. The slack keeps a quiet pool from bouncing a session's
    second request away from its worker when only a handful of requests are in flight.
    """

    factor: float | None = 1.25
    slack: int = 4

    def cap(self, workers: Sequence[WorkerView]) -> float:
        """Most requests in flight a worker may hold after taking this one:
        ``max(ceil(factor × mean), mean + slack)`` over the mean in-flight count *including
        this request*; ``inf`` without a factor."""
        if self.factor is None or not workers:
            return math.inf
        mean = (sum([view.in_flight for view in workers]) + 1) / len(workers)
        return max(math.ceil(self.factor * mean), mean + self.slack)


_U64 = (1 << 64) - 1


@functools.lru_cache(maxsize=65536)
def worker_hash(worker: str) -> int:
    """The worker name's 64-bit hash the tie order starts from."""
    return xxhash.xxh3_64_intdigest(worker.encode())


def tie_seed(request: RequestFacts) -> int:
    """The request's tie-order seed: its last full block key, else its token count."""
    keys = request.keys
    return int(keys[-1]) if len(keys) else request.token_count & _U64


def band_seed(request: RequestFacts, longest: int) -> int:
    """The tie order of the cost band: seeded by the request's first block no open worker
    holds (``longest`` = the longest hit among them), which every request of a herd shares;
    ``tie_seed`` when every block is held somewhere."""
    keys = request.keys
    return int(keys[longest]) if longest < len(keys) else tie_seed(request)


def tie_rank(worker: str, seed: int) -> int:
    """Position key of ``worker`` in the tie order of seed ``seed`` (splitmix64's finalizer);
    equal ranks (never seen: 64 bits) fall back to the name."""
    z = (worker_hash(worker) ^ seed) + 0x9E3779B97F4A7C15 & _U64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & _U64
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB & _U64
    return z ^ (z >> 31)


def tie_before(worker: str, other: str, seed: int) -> bool:
    """Whether ``worker`` comes before ``other`` in the tie order of ``seed``."""
    mine, theirs = tie_rank(worker, seed), tie_rank(other, seed)
    return mine < theirs or mine == theirs and worker < other


def cheapest(
    config: CostConfig,
    request: RequestFacts,
    workers: Sequence[WorkerView],
    matched: Mapping[str, int],
    cap: float = math.inf,
) -> tuple[WorkerView, int] | None:
    """The worker of least cost and its cached blocks; ties go by the request's tie order
    (with ``tie_band_s``: the band's, ``in_band``).

    Workers whose ``in_flight + 1`` would exceed ``cap`` are skipped; ``None`` if all are.
    """
    best: WorkerView | None = None
    best_cost = math.inf
    best_blocks = 0
    get = matched.get
    token_count, block_size = request.token_count, request.block_size
    seed = tie_seed(request)
    band = config.tie_band_s if config.form == "ttft" else 0.0
    costs: list[tuple[WorkerView, float, int]] = []
    longest = 0
    for view in workers:
        blocks = get(view.worker, 0)
        if blocks > longest:
            longest = blocks
        if view.in_flight + 1 > cap:
            continue
        uncached = token_count - blocks * block_size
        if uncached < 0:
            uncached = 0
        value = cost(config, view, uncached, blocks, token_count)
        if band:
            costs.append((view, value, blocks))
        if value < best_cost or (value == best_cost and best is not None
                                 and tie_before(view.worker, best.worker, seed)):
            best, best_cost, best_blocks = view, value, blocks
    if best is not None and band:
        best, _, best_blocks = in_band(costs, best_cost + band, band_seed(request, longest))
    return None if best is None else (best, best_blocks)


def in_band(costs: Sequence[tuple[WorkerView, float, int]], limit: float,
            seed: int) -> tuple[WorkerView, float, int]:
    """Of ``(view, cost, blocks)`` entries costing at most ``limit`` (the least cost plus the
    band: one does), those with the most cached blocks, and of them the first in the tie order
    of ``seed``."""
    most = max(blocks for _, value, blocks in costs if value <= limit)
    pick = None
    for entry in costs:
        if entry[1] <= limit and entry[2] == most and (
                pick is None or tie_before(entry[0].worker, pick[0].worker, seed)):
            pick = entry
    assert pick is not None
    return pick


class LoadSeconds:
    """The request-independent part of the ``"ttft"`` cost of each view, computed once per view.

    ``cost == load_s + uncached_tokens × s_per_token`` (plus the KV-pressure charge on the
    cached tokens beyond ``kv_room``) where ``load_s`` is the queued prefill, decode and
    engine-queue terms; an entry is ``(view, load_s, s_per_token, kv_room)``. Views are frozen
    and a changed worker gets a new view object, so entries are keyed by ``id(view)`` and
    checked by identity (an id reused by a new object misses). The memo is emptied when it
    exceeds ``limit`` entries.
    """

    def __init__(self, config: CostConfig, limit: int = 4096) -> None:
        self.config = config
        self.limit = limit
        self.memo: dict[int, tuple[WorkerView, float, float, float]] = {}

    def prepare(self, view: WorkerView) -> tuple[WorkerView, float, float, float]:
        load_s, s_per_token = load_terms(self.config, view)
        if len(self.memo) >= self.limit:
            self.memo.clear()
        entry = self.memo[id(view)] = (view, load_s, s_per_token, kv_room(self.config, view))
        return entry
