"""High watermarks: a worker above any of them gets no new request, whatever its cache.

Rules: a limit set to ``None`` is not checked; an engine figure that is unknown (``None``) is
never "above". ``above`` returns the reason (for the decision's log line) or ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass

from cortex.errors import ConfigError
from cortex.scheduling.view import WorkerView


@dataclass(frozen=True, slots=True)
class Watermarks:
    max_in_flight: int | None = 256
    max_queued_prefill_tokens: int | None = 262_144
    max_engine_queue: int | None = 128
    max_kv_usage_fraction: float | None = 0.95

    def __post_init__(self) -> None:
        problems = [f"{name} must be > 0" for name in (
            "max_in_flight", "max_queued_prefill_tokens", "max_engine_queue",
            "max_kv_usage_fraction") if (value := getattr(self, name)) is not None and value <= 0]
        if problems:
            raise ConfigError(problems)

    def above(self, view: WorkerView) -> str | None:
        if self.max_in_flight is not None and view.in_flight >= self.max_in_flight:
            return f"{view.in_flight} requests in flight (limit {self.max_in_flight})"
        if (self.max_queued_prefill_tokens is not None
                and view.queued_prefill_tokens >= self.max_queued_prefill_tokens):
            return (f"{view.queued_prefill_tokens} prefill tokens queued "
                    f"(limit {self.max_queued_prefill_tokens})")
        if (self.max_engine_queue is not None and view.engine_queue is not None
                and view.engine_queue >= self.max_engine_queue):
            return f"engine queue {view.engine_queue} (limit {self.max_engine_queue})"
        if (self.max_kv_usage_fraction is not None and view.kv_usage is not None
                and view.kv_usage >= self.max_kv_usage_fraction):
            return f"KV cache {view.kv_usage:.0%} used (limit {self.max_kv_usage_fraction:.0%})"
        return None
