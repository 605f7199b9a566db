"""Settings of the request path that the configuration tree names. Pure, frozen, validated."""

from __future__ import annotations

from dataclasses import dataclass, field

from cortex.errors import ConfigError
from cortex.scheduling import BoundedLoad, CostConfig, Watermarks


@dataclass(frozen=True, slots=True)
class AdmissionSettings:
    max_waiting: int = 256  # requests waiting for capacity per model; more get 429
    max_wait_s: float = 5.0  # how long one request waits for capacity before 503
    retry_after_s: float = 1.0  # Retry-After sent with 429 and saturation 503

    def __post_init__(self) -> None:
        problems = []
        if self.max_waiting < 0:
            problems.append("admission.max_waiting must be >= 0")
        if not self.max_wait_s >= 0:
            problems.append("admission.max_wait_s must be >= 0")
        if not self.retry_after_s > 0:
            problems.append("admission.retry_after_s must be > 0")
        if problems:
            raise ConfigError(problems)


@dataclass(frozen=True, slots=True)
class PoolSettings:
    """How one model's pool routes and what its caches may hold: the configuration's
    ``scheduler`` section and the model's own entry (``CortexConfig.pool_settings``)."""

    cost: CostConfig | None = None  # None: the cost model's defaults
    watermarks: Watermarks | None = None  # None: the scheduler's defaults
    bounds: BoundedLoad = field(default_factory=BoundedLoad)
    route_on_partial: bool = False  # route exact on PARTIAL ledgers (true lower bounds)
    max_prompt_chars: int = 0  # longer prompts are routed by load, not tokenized (0: any)
    segment_cache_bytes: int = 64 << 20
    render_cache_bytes: int = 32 << 20
    prompt_reuse_bytes: int = 16 << 20
