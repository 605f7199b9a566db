"""What the scheduler sees: a frozen view of each worker and the facts of one request.

Rules:

* A view is a snapshot taken for one decision; nothing in it changes while policies read it.
* ``in_flight`` and ``queued_prefill_tokens`` are Cortex's own pending work on the worker,
  counted at decision time (``inflight.PendingWork``), so they are always known. Figures the
  engine reports (``engine_queue``, ``kv_usage``) are ``None`` when unknown — never a guessed 0.
* ``ledger_state`` is how far the ledger of the worker's targets is trusted (the least trusted
  of its DP ranks); ``None`` means the engine publishes no KV events at all.
* ``prefill_tokens_per_s`` is the worker's measured prefill rate; ``None`` means the cost uses
  its configured default.
"""

from __future__ import annotations

import enum
from array import array

import msgspec

from cortex.ledger.state import TargetState


class Role(enum.Enum):
    BOTH = "both"
    PREFILL = "prefill"
    DECODE = "decode"

    def serves(self, wanted: Role) -> bool:
        """Whether a worker of this role can take a request for the ``wanted`` role."""
        return self is Role.BOTH or self is wanted


class WorkerView(msgspec.Struct, frozen=True):
    """A frozen ``msgspec.Struct``, not a dataclass: ``PendingWork`` builds a new view when a
    worker's counts changed (about once per request), and a struct is built in ~0.3 µs against
    ~3 µs for the frozen dataclass (measured). ``msgspec.structs.replace`` derives a changed
    copy."""

    worker: str
    targets: tuple[int, ...] = ()  # one per DP rank, or a single target
    healthy: bool = True
    ledger_state: TargetState | None = None
    role: Role = Role.BOTH
    in_flight: int = 0
    queued_prefill_tokens: int = 0
    engine_queue: int | None = None  # requests the engine reports waiting
    kv_usage: float | None = None  # fraction of the KV cache in use, 0..1
    prefill_tokens_per_s: float | None = None
    kv_tokens: int | None = None  # one engine's (DP rank's) KV pool in tokens, as it reports

    @property
    def ledger_trusted(self) -> bool:
        return self.ledger_state is TargetState.READY

    @property
    def reports_load(self) -> bool:
        """Whether the engine reports its own load figures (queue or KV-cache usage)."""
        return self.engine_queue is not None or self.kv_usage is not None


class RequestFacts(msgspec.Struct, frozen=True):
    """A frozen ``msgspec.Struct`` like ``WorkerView``: one per decision."""

    keys: array  # array('Q') of the prompt's full blocks, as ``block_keys`` returns
    token_count: int
    block_size: int

    def uncached_tokens(self, cached_blocks: int) -> int:
        return max(self.token_count - cached_blocks * self.block_size, 0)
