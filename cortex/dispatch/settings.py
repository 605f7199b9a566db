"""Settings of the request path that the configuration tree names. Pure, frozen, validated."""

from __future__ import annotations

from dataclasses import dataclass

from cortex.errors import ConfigError


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
