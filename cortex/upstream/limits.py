"""Limits of the upstream (Cortex → worker) connection pool. Frozen, validated."""

from __future__ import annotations

from dataclasses import dataclass

from cortex.errors import ConfigError


@dataclass(frozen=True, slots=True)
class PoolLimits:
    max_connections_per_worker: int = 256  # open connections to one worker (busy + idle)
    max_idle_per_worker: int = 64  # idle keep-alive connections kept per worker
    idle_timeout_s: float = 30.0  # an idle connection older than this is closed (reaper)
    connect_timeout_s: float = 3.0
    acquire_timeout_s: float = 10.0  # waiting for a free connection slot at the limit
    head_timeout_s: float = 600.0  # request sent → response head (long prefill is normal)
    read_timeout_s: float = 600.0  # between two body chunks of a streaming response

    def __post_init__(self) -> None:
        problems = [f"upstream limit {name} must be > 0" for name in (
            "max_connections_per_worker", "max_idle_per_worker", "idle_timeout_s",
            "connect_timeout_s", "acquire_timeout_s", "head_timeout_s", "read_timeout_s")
            if not getattr(self, name) > 0]
        if self.max_idle_per_worker > self.max_connections_per_worker:
            problems.append("max_idle_per_worker must be <= max_connections_per_worker")
        if problems:
            raise ConfigError(problems)
