"""What a policy returns: the worker, which mode decided, why, and the cache it expects.

``mode`` values are what the ``x-cortex-match-mode`` response header carries and what metrics
count; ``reason`` is a short human sentence for logs and tests.
"""

from __future__ import annotations

import enum

import msgspec


class Mode(enum.Enum):
    EXACT_KV_EVENTS = "exact_kv_events"
    LOAD_AWARE = "load_aware"
    FALLBACK_P2C = "fallback_p2c"
    FALLBACK_ROUND_ROBIN = "fallback_round_robin"
    CONSISTENT_HASH = "consistent_hash"


class Decision(msgspec.Struct, frozen=True):
    """A frozen ``msgspec.Struct``, not a frozen dataclass: one is built per request, ~10x
    cheaper (the same as ``WorkerView`` and ``RequestPrompt``)."""

    worker: str
    mode: Mode
    reason: str
    predicted_cached_tokens: int = 0
