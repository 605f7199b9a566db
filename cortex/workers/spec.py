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
  raise ``ConfigError`` with them. Every field has bounds (an admin API is input too): a name
  of 1-128 visible ASCII characters (it goes into response headers and metric labels),
  ``dp_size`` at most ``MAX_DP_SIZE`` (each rank is a ledger target and metric series), a
  finite ``weight`` in (0, 1e6], ``model`` and ``topic`` at most 256 characters.
* ``engine_address(url)``: two workers name one engine when their addresses are equal: the
  origin with ``localhost`` and ``[::1]`` read as ``127.0.0.1`` (host names are never
  resolved: SSRF rules).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal
from urllib.parse import urlsplit

from cortex.host_literal import url_host
from cortex.scheduling.view import Role

Engine = Literal["vllm", "sglang"]
MAX_DP_SIZE = 1024
MAX_NAME = 128
MAX_TEXT = 256
MAX_WEIGHT = 1e6
_NAME = re.compile(r"[\x21-\x7e]+")  # visible ASCII: safe in a header and a label


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
        elif len(self.name) > MAX_NAME or not _NAME.fullmatch(self.name):
            label = f"worker {self.name[:40]!a}"
            problems.append(f"{label}: name must be 1-{MAX_NAME} visible ASCII characters "
                            "(no spaces, control or non-ASCII characters)")
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
        if not 1 <= self.dp_size <= MAX_DP_SIZE:
            problems.append(f"{label}: dp_size must be in [1, {MAX_DP_SIZE}]")
        for field_name in ("model", "topic"):
            value = getattr(self, field_name)
            if value is not None and len(value) > MAX_TEXT:
                problems.append(f"{label}: {field_name} longer than {MAX_TEXT} characters")
        for field_name in ("events", "replay"):
            value = getattr(self, field_name)
            if value is not None and not value.startswith(("tcp://", "ipc://")):
                problems.append(f"{label}: {field_name} must be a tcp:// or ipc:// endpoint")
        if self.replay is not None and self.events is None:
            problems.append(f"{label}: a replay endpoint needs an events endpoint")
        if self.bootstrap_port is not None and not 0 < self.bootstrap_port < 65536:
            problems.append(f"{label}: bootstrap_port out of range")
        if not (math.isfinite(self.weight) and 0 < self.weight <= MAX_WEIGHT):
            problems.append(f"{label}: weight must be a number in (0, {MAX_WEIGHT:g}]")
        return problems


@lru_cache(maxsize=4096)
def engine_address(url: str) -> str:
    """The engine a worker url names, for telling two workers on one engine apart."""
    origin = _origin_of(url)
    return origin.replace("://localhost:", "://127.0.0.1:").replace("://[::1]:", "://127.0.0.1:")


@lru_cache(maxsize=4096)
def _origin_of(url: str) -> str:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = url_host(parts.hostname or "")  # an IPv6 literal keeps its brackets
    return f"{parts.scheme}://{host}:{port}"
