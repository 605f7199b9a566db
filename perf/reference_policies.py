"""Reference routers: the best peers' routing policies, as pure policies in Cortex's harness.

Each class implements ``cortex.scheduling.policy.Policy`` (``decide(request, workers,
matched)``) and is run by the replay's gateway through ``ModelPool.use_policy``: the same
process, the same tokenization and block keys, the same ledger and the same worker views as
Cortex's own policy, so a comparison measures the scoring alone. ``matched`` (worker -> leading
blocks of the request it holds, trusted ledgers only) is what the peers' KV-event indexers
compute from the same engine events (Dynamo's ``KvIndexer``, llm-d's ``kvcache.Indexer``:
both answer "consecutive prefix blocks per worker").

Written from the peers' public documentation (pages named in each class); where the pages are
silent, from the behaviour of their public source, said so where it is used. No peer code is
copied. ``REFERENCE_POLICIES`` maps the replay's router names to factories taking the RNG.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from cortex.scheduling import Decision, Mode, RequestFacts, WorkerView
from cortex.scheduling.policy import Policy


def _verdict(name: str, request: RequestFacts, worker: str, blocks: int, why: str) -> Decision:
    """Both policies decide on the ledger's exact matches: ``exact_kv_events`` when the pick
    holds some of the prompt, ``load_aware`` when it holds none (the modes Cortex reports)."""
    cached = min(blocks * request.block_size, request.token_count)
    mode = Mode.EXACT_KV_EVENTS if cached else Mode.LOAD_AWARE
    return Decision(worker, mode, f"{name}: {why}", cached)


def _pick(rng: random.Random, best: list[str]) -> str:
    return best[0] if len(best) == 1 else best[rng.randrange(len(best))]


class DynamoKvRouter:
    """NVIDIA Dynamo's KV router cost (``--router-mode kv``) at its documented defaults.

    Sources: Dynamo docs "Routing Concepts" / "KV Cache Routing"
    (docs.nvidia.com/dynamo/latest/components/router/routing-concepts, and
    ``docs/router/kv_cache_routing.md`` in ai-dynamo/dynamo), "Router Design"
    (docs.nvidia.com/dynamo/design-docs/router-design) and the frontend configuration
    reference (docs.nvidia.com/dynamo/v1.0.0/additional-resources/frontend-configuration-reference).

    Per worker ``w``, lowest cost wins::

        cost(w) = overlap_score_weight × prefill_blocks(w) + decode_blocks(w)
        prefill_blocks(w) = (active_prefill_tokens(w) + ISL − overlap_blocks(w) × block) / block
        decode_blocks(w)  = active_blocks(w) + new blocks of this request on w

    * ``prefill_blocks`` (a fraction): the prompt tokens left to compute on the worker — of the
      requests it routed there that have not yet produced a first token ("updating the count
      when the first output token signals prefill completion"), plus this request's uncached
      ones. Cortex's ``queued_prefill_tokens`` is exactly that quantity: the uncached tokens of
      each request routed to the worker, dropped at its first byte.
    * ``decode_blocks``: the KV blocks of the requests in flight on the worker, tracked by the
      router itself ("incremented when adding a new request ... decremented upon request
      completion"), plus the blocks the new request would add. Defaults
      ``--router-track-active-blocks`` true, ``--router-assume-kv-reuse`` true (a block shared
      by several active requests on one worker counts once, and the new request adds only the
      blocks not already active there), ``--router-track-output-blocks`` false (prompt blocks
      only).
    * ``--router-kv-overlap-score-weight`` 1.0 (newer docs: ``prefill_load_scale`` 1.0 and
      overlap credit 1.0, ``cost = scale × max(active_prefill + prompt − credit, 0) +
      decode_blocks``: the same at defaults), ``--router-temperature`` 0.0: the lowest cost is
      taken deterministically (softmax sampling only above 0; not modelled).

    Where Cortex's views approximate what Dynamo measures:

    * Active blocks. Dynamo frees a request's blocks when its response ends; a policy sees no
      completions, only each worker's ``in_flight`` count at the next decision. This policy
      records the blocks (keys) of every request it routed and, when a worker's ``in_flight``
      has dropped below its records, forgets its oldest ones (first routed, first finished).
      The count of active requests is exact; which ones finished is assumed.
    * Ties (equal cost, e.g. every worker idle): the docs say only "deterministic"; Dynamo's
      source breaks them by the smallest indexer tree (the worker caching least), then at
      random. The views carry no per-worker cache size, so ties go at random (injected RNG).
    """

    name = "dynamo-ref"

    def __init__(self, rng: random.Random, overlap_score_weight: float = 1.0) -> None:
        self.rng = rng
        self.overlap_score_weight = overlap_score_weight
        # Per worker: the requests routed there believed still in flight, oldest first (their
        # full-block keys and block count), and how many of them hold each block key.
        self._active: dict[str, deque[tuple[Sequence[int], int]]] = {}
        self._holding: dict[str, Counter[int]] = {}
        self._blocks: dict[str, int] = {}  # active blocks, shared full blocks counted once

    def active_blocks(self, worker: str) -> int:
        return self._blocks.get(worker, 0)

    def cost(self, request: RequestFacts, view: WorkerView, cached_blocks: int) -> float:
        """The documented cost of ``view``'s worker for ``request`` (lower is better)."""
        block = request.block_size
        prefill_blocks = (view.queued_prefill_tokens + request.uncached_tokens(cached_blocks)) \
            / block
        return self.overlap_score_weight * prefill_blocks + self._decode_blocks(request,
                                                                                 view.worker)

    def decide(
        self, request: RequestFacts, workers: Sequence[WorkerView], matched: Mapping[str, int]
    ) -> Decision | None:
        for view in workers:
            self._settle(view.worker, view.in_flight)
        best: list[str] = []
        least = float("inf")
        for view in workers:
            value = self.cost(request, view, matched.get(view.worker, 0))
            if value < least:
                best, least = [view.worker], value
            elif value == least:
                best.append(view.worker)
        worker = _pick(self.rng, best)
        self._add(worker, request)
        blocks = matched.get(worker, 0)
        return _verdict(self.name, request, worker, blocks,
                        f"least cost {least:.2f} blocks ({blocks} cached)")

    def _request_blocks(self, request: RequestFacts) -> int:
        return -(-request.token_count // request.block_size)  # the partial tail block too

    def _decode_blocks(self, request: RequestFacts, worker: str) -> int:
        holding = self._holding.get(worker)
        shared = 0 if not holding else sum(1 for key in request.keys if key in holding)
        return self.active_blocks(worker) + self._request_blocks(request) - shared

    def _add(self, worker: str, request: RequestFacts) -> None:
        holding = self._holding.setdefault(worker, Counter())
        blocks = self._request_blocks(request)
        new = blocks - len(request.keys)  # a partial tail block is never shared
        for key in request.keys:
            if not holding[key]:
                new += 1
            holding[key] += 1
        self._active.setdefault(worker, deque()).append((request.keys, blocks))
        self._blocks[worker] = self._blocks.get(worker, 0) + new

    def _settle(self, worker: str, in_flight: int) -> None:
        """Forget the oldest records of ``worker`` beyond its ``in_flight`` requests."""
        records = self._active.get(worker)
        if not records:
            return
        holding = self._holding[worker]
        freed = 0
        while len(records) > in_flight:
            keys, blocks = records.popleft()
            freed += blocks - len(keys)
            for key in keys:
                holding[key] -= 1
                if not holding[key]:
                    del holding[key]
                    freed += 1
        self._blocks[worker] -= freed


PrefixForm = Literal["min-max", "fraction"]


class LlmdPrecisePrefix:
    """llm-d's precise-prefix-cache routing: three weighted scorers and ``max-score-picker``.

    Sources: the llm-d guide "precise prefix cache aware routing" (llm-d/llm-d
    ``guides/precise-prefix-cache-aware/README.md`` and its scheduler values
    ``scheduler/precise-prefix-cache-aware.values.yaml``; llm-d.ai/docs/.../precise-prefix-cache-routing),
    the ``precise-prefix-cache-scorer`` README (llm-d/llm-d-inference-scheduler), the
    KV-cache indexer architecture (llm-d/llm-d-kv-cache ``docs/architecture.md``), and the
    Gateway API Inference Extension's ``queue-scorer``, ``kv-cache-utilization-scorer`` and
    ``max-score-picker`` (kubernetes-sigs/gateway-api-inference-extension).

    ``score(w) = 2.0 × prefix(w) + 1.0 × kv(w) + 1.0 × queue(w)``, the highest wins, ties at
    random (the picker shuffles the candidates before a stable sort by score). Weights: the
    guide's current scheduling profile ("the precise scorer's default weight is 2.0, paired 1:1
    with kv-cache-utilization and queue scorers"); its earlier ``gaie-kv-events/values.yaml``
    had 3 / 2 / 2.

    * ``prefix``: the indexer scores each pod by its consecutive prefix blocks from the start
      (Cortex's ``matched``). The guide describes the score as "the fraction of an incoming
      request's prefix blocks that are resident"; the scorer plugin normalizes the indexer's
      counts to 0..1 by min-max over the pods the indexer returned (pods with at least one
      block): ``(n − min) / (max − min)``, 1.0 for each when they all hold the same count, 0
      for a pod holding none. ``prefix_form="min-max"`` (default) is the plugin's behaviour;
      ``"fraction"`` is the guide's wording, ``matched / request blocks``.
    * ``queue``: ``(max_q − q) / (max_q − min_q)`` over the candidates of the engine's waiting
      queue (vLLM ``num_requests_waiting``), 1.0 for all when equal.
    * ``kv``: ``1 − kv_usage`` (vLLM ``kv_cache_usage_perc``, 0..1).

    Where Cortex's views approximate what llm-d measures: queue and KV usage are the engines'
    own figures, read from their metrics as llm-d's EPP reads vLLM's /metrics (its default
    refresh is 50 ms; Cortex's load scrape interval is the gateway's ``health.load_interval_s``,
    0.25 s in the replay), so both lag bursts the same way; Cortex's own pending counts
    (``in_flight``, ``queued_prefill_tokens``) are not used — the guide's profile has no scorer
    for them. A figure the engine has not reported (``None``) counts as 0 (an idle pod).
    """

    name = "llmd-ref"

    def __init__(self, rng: random.Random, prefix_weight: float = 2.0,
                 kv_weight: float = 1.0, queue_weight: float = 1.0,
                 prefix_form: PrefixForm = "min-max") -> None:
        if prefix_form not in ("min-max", "fraction"):
            raise ValueError(f"prefix_form must be 'min-max' or 'fraction', not {prefix_form!r}")
        self.rng = rng
        self.weights = (prefix_weight, kv_weight, queue_weight)
        self.prefix_form = prefix_form

    def prefix_scores(self, request: RequestFacts, workers: Sequence[WorkerView],
                      matched: Mapping[str, int]) -> list[float]:
        counts = [matched.get(view.worker, 0) for view in workers]
        if self.prefix_form == "fraction":
            total = len(request.keys)
            return [min(n / total, 1.0) if total else 0.0 for n in counts]
        held = [n for n in counts if n > 0]
        if not held:
            return [0.0] * len(counts)
        low, high = min(held), max(held)
        if low == high:
            return [1.0 if n > 0 else 0.0 for n in counts]
        return [(n - low) / (high - low) if n > 0 else 0.0 for n in counts]

    @staticmethod
    def queue_scores(workers: Sequence[WorkerView]) -> list[float]:
        queues = [view.engine_queue or 0 for view in workers]
        low, high = min(queues), max(queues)
        if low == high:
            return [1.0] * len(queues)
        return [(high - q) / (high - low) for q in queues]

    @staticmethod
    def kv_scores(workers: Sequence[WorkerView]) -> list[float]:
        return [1.0 - (view.kv_usage or 0.0) for view in workers]

    def scores(self, request: RequestFacts, workers: Sequence[WorkerView],
               matched: Mapping[str, int]) -> list[float]:
        """Each worker's weighted sum, in ``workers``' order (higher is better)."""
        prefix_w, kv_w, queue_w = self.weights
        return [prefix_w * p + kv_w * k + queue_w * q for p, k, q in zip(
            self.prefix_scores(request, workers, matched), self.kv_scores(workers),
            self.queue_scores(workers), strict=True)]

    def decide(
        self, request: RequestFacts, workers: Sequence[WorkerView], matched: Mapping[str, int]
    ) -> Decision | None:
        scores = self.scores(request, workers, matched)
        top = max(scores)
        worker = _pick(self.rng, [v.worker for v, s in zip(workers, scores, strict=True)
                                  if s == top])
        blocks = matched.get(worker, 0)
        return _verdict(self.name, request, worker, blocks,
                        f"highest score {top:.3f} ({blocks} blocks cached)")


REFERENCE_POLICIES: dict[str, Callable[[random.Random], Policy]] = {
    DynamoKvRouter.name: DynamoKvRouter,
    LlmdPrecisePrefix.name: LlmdPrecisePrefix,
}
