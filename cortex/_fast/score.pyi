"""Contract of the Cython unit ``cortex._fast.score``: the scheduler's common cases in C.

``DecisionTable`` mirrors a tuple of ``WorkerView`` in C columns (re-reading only views that are
new objects) and finds, for one request, what ``Scheduler.decide`` over the events chain would
find in its ``exact_kv`` and ``load_aware`` steps — same filters (health, role, watermarks,
trusted ledgers), same bounded-load cap, same costs computed with the same float operations,
same tie rules. ``cortex.scheduling.fast`` turns the answer into a ``Decision`` with the
policies' own verdict functions and hands every other case to the Python chain.
"""

from typing import Any

class DecisionTable:
    def __init__(
        self,
        *,
        ready_state: object,
        roles: tuple[object, object, object],  # (BOTH, PREFILL, DECODE)
        default_rate: float,
        decode_s: float,
        engine_queue_s: float,
        limits: tuple[float, float, float, float],  # in-flight, queued, engine queue, kv usage
        factor: float | None,
        slack: float,
        step_s: float = 0.0,  # with step_budget > 0: cost.CostConfig's step form
        step_budget: int = 0,
        overflow_weight: float = 0.0,  # cost.CostConfig.kv_overflow_weight (0: no KV-pressure term)
        band: float = 0.0,  # cost.CostConfig.tie_band_s (0: no cost band)
    ) -> None: ...
    def pick(
        self,
        views: tuple[Any, ...],
        target_blocks: dict[int, int],
        token_count: int,
        block_size: int,
        role: object,
        seed: int,  # the request's tie-order seed, cost.tie_seed
        keys: Any = None,  # the request's block keys (the band's seed: cost.band_seed)
    ) -> tuple[Any, ...]: ...
