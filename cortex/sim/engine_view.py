"""A simulated engine as its parts see it: what the HTTP routes (``cortex.sim.http_engine``), the
body builders (``cortex.sim.bodies``) and the PD role (``cortex.sim.pd``) read of the engine.

``SimEngine`` (``cortex.sim.engine``) is the one implementation: it builds its PD role and its
HTTP handler over itself, so those modules see it through these protocols instead of importing
``cortex.sim.engine`` (which would be an import circle). A member the parts start reading is
added here.

* ``SimEngineView`` — the engine: identity, its ranks (prefix caches, counters, load),
  its tokenizer and fault switches, and ``generation`` (queue, admit and run one request).
* ``RankLoad`` — one rank's load as the engines report it (whichever timing model runs it).
* ``SimPdView`` — its prefill/decode role, as the HTTP side uses it; ``PdLeg`` — what that
  role hands the HTTP side for one PD request.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from cortex.ledger.kv_events import EngineFamily
from cortex.sim.generation import RankCounters, TokenStream
from cortex.sim.http_faults import SimFaults
from cortex.sim.kv_engine import SimKVEngine
from cortex.sim.tokenize import SimTokenizer
from cortex.sim.wire import WireProfile

__all__ = ["PdLeg", "RankLoad", "SimEngineView", "SimPdView"]


@dataclass(frozen=True, slots=True)
class RankLoad:
    """One rank's load now, as the engines report it."""

    running: int  # requests in the running batch
    waiting: int  # requests queued
    kv_usage: float  # share of the KV pool in use by requests (evictable cached blocks: free)
    max_running: int  # the batch limit (vLLM max_num_seqs, SGLang max_running_requests)


@dataclass(slots=True)
class PdLeg:
    """What the HTTP side serves for one PD request: its generation and extra body fields."""

    generation: AbstractAsyncContextManager[TokenStream]
    extra: dict[str, Any] | None = None


class SimPdView(Protocol):
    """The PD role of an engine (``cortex.sim.pd.SimPd``), as the HTTP side uses it."""

    role: str  # "prefill" or "decode"
    bootstrap_port: int

    async def prepare(self, body: dict[str, Any], rank: int, token_ids: Sequence[int],
                      output_tokens: int, lora: str | None, salt: str | None) -> PdLeg | None:
        """Before the response head: check the PD fields and do what must precede it."""
        ...


class SimEngineView(Protocol):
    """What the HTTP routes, the body builders and the PD role read of a ``SimEngine``."""

    name: str
    family: EngineFamily
    wire: WireProfile
    served_model_name: str
    max_model_len: int
    lora_names: frozenset[str]
    started_at: float  # the process start time a real engine exposes
    http_host: str
    kv: SimKVEngine
    tokenizer: SimTokenizer
    faults: SimFaults
    counters: list[RankCounters]
    pd: SimPdView | None  # None: an ordinary (aggregated) engine

    @property
    def dp_size(self) -> int: ...

    @property
    def block_size(self) -> int: ...

    @property
    def version(self) -> str: ...

    def check_rank(self, rank: int) -> int:
        """``rank``, or ``BadRequest`` when it is out of range."""
        ...

    def generation(self, rank: int, token_ids: Sequence[int], output_tokens: int, *,
                   lora_name: str | None = None, cache_salt: str | None = None,
                   kv_received: bool = False, cache_prompt: bool = True,
                   read_limit: int | None = None,
                   hold_kv: bool = False) -> AbstractAsyncContextManager[TokenStream]:
        """Queue, admit and run one request on ``rank``."""
        ...

    def release_kv(self, rank: int, lease: int) -> None:
        """Give back the KV hold taken from a generation (``TokenStream.lease``)."""
        ...

    def load(self, rank: int) -> RankLoad:
        """The rank's load now."""
        ...

    def flush_cache(self) -> bool:
        """Clear every rank's cache, or refuse (False) while requests run or wait."""
        ...
