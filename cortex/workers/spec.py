"""What an operator says about one worker (flags, config file, admin API). Frozen, validated.

Rules:

* ``name`` is unique in the registry and is what ``x-cortex-assigned-worker`` carries.
* ``url`` is the engine's HTTP base (``http://host:port``, no path).
* ``events`` is the ZeroMQ endpoint of DP rank 0's KV-event publisher (``tcp://host:port``);
  rank ``r`` publishes on port + r (kv-events.md §1.2). ``None``: the engine publishes no KV
  events, so its pool is routed without a ledger. ``replay`` likewise for the replay ROUTER.
* ``model`` is the served model name the worker answers for; ``None`` means "learn it from
  ``/v1/models``".
* ``role`` and ``bootstrap_port`` matter for PD (SGLang prefill workers advertise a bootstrap port).
* ``validate()`` returns every problem at once (empty list = fine); the config and admin API
  raise ``ConfigError`` with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal
from urllib.parse import urlsplit

from cortex.scheduling.view import Role

Engine = Literal["vllm", "sglang"]


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    name: str
    url: str
    engine: Engine = "sglang"
    model: str | None = None
    role: Role = Role.BOTH
    dp_size: int = 1
    events: str | None = None  # tcp://host:port of rank 0's KV-event PUB socket
    replay: str | None = None  # tcp://host:port of rank 0's replay ROUTER socket
    topic: str = ""
    bootstrap_port: int | None = None
    weight: float = 1.0

    @property
    def origin(self) -> str:
        """``scheme://host:port`` as the upstream pool keys connections (parsed once per URL:
        this is read on every request)."""
        return _origin_of(self.url)

    def validate(self) -> list[str]:
        problems: list[str] = []
        label = f"worker {self.name or '?'}"
        if not self.name:
            problems.append("worker name must not be empty")
        try:
            parts = urlsplit(self.url)
            parts.port  # noqa: B018 — raises on a bad port
        except ValueError as error:
            problems.append(f"{label}: url {self.url!r}: {error}")
        else:
            if parts.scheme != "http" or not parts.hostname:
                problems.append(f"{label}: url must be http://host:port, not {self.url!r}")
            elif parts.path not in ("", "/") or parts.query:
                problems.append(f"{label}: url must not have a path or query ({self.url!r})")
        if self.engine not in ("vllm", "sglang"):
            problems.append(f"{label}: engine must be 'vllm' or 'sglang', not {self.engine!r}")
        if not isinstance(self.role, Role):
            problems.append(f"{label}: role must be one of both, prefill, decode")
        if self.dp_size < 1:
            problems.append(f"{label}: dp_size must be >= 1")
        for field_name in ("events", "replay"):
            value = getattr(self, field_name)
            if value is not None and not value.startswith(("tcp://", "ipc://")):
                problems.append(f"{label}: {field_name} must be a tcp:// or ipc:// endpoint")
        if self.replay is not None and self.events is None:
            problems.append(f"{label}: a replay endpoint needs an events endpoint")
        if self.bootstrap_port is not None and not 0 < self.bootstrap_port < 65536:
            problems.append(f"{label}: bootstrap_port out of range")
        if not self.weight > 0:
            problems.append(f"{label}: weight must be > 0")
        return problems


@lru_cache(maxsize=4096)
def _origin_of(url: str) -> str:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # an IPv6 literal keeps its brackets
    return f"{parts.scheme}://{host}:{port}"
