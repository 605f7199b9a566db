"""The interface of a continuous-batching engine model, and the types it speaks.

Rules every flavour keeps:

* ``add`` queues a request (FCFS by ``add`` order unless the flavour's policy says otherwise);
  nothing runs until ``step``.
* ``step`` schedules one step as the engine's scheduler would (token budget, sequence cap,
  chunked prefill, prefix match at scheduling, KV block allocation, eviction, preemption),
  and returns what it computes (``StepOutcome``): its duration from the timing profile, the
  requests scheduled for the first time with their ``cached_tokens``, the requests whose first
  or next token is ready at the step's end, those that finished, those preempted, and the KV
  events published at the step's end (as the engine publishes them: vLLM one batch per step,
  SGLang after prefill batches, every 40th decode batch, and when idle). ``None`` when nothing
  can run (idle).
* A request produces exactly ``output_tokens`` tokens (the simulator never stops early); the
  first at the end of the step that computes its last prompt token.
* ``abort`` takes a request out wherever it is (waiting, running, mid-prefill): its blocks are
  freed as the engine frees a finished request's, and it produces nothing more.
* The cache never claims a block it does not hold: ``truth()`` is what a consumer of the
  published events must end up with.

Prefill/decode disaggregation (``cortex.sim.pd`` drives both through ``cortex.sim.stepper``):

* ``hold_kv`` (the prefill leg): the request runs and finishes as any other (its last token,
  ``finished``), but its KV stays: its blocks remain held, counting against the pool and never
  evicted, until ``release(request_id)`` (the decode side read them, or the lease ran out) or
  ``abort``; then they are freed as a finished request's are (vLLM: tail first, the hashed
  ones staying cached; SGLang: the sequence was inserted into the tree at the end of its
  forward and stays locked until then). A held request is neither waiting nor running, but its
  id stays in use and ``clear`` is refused while it holds blocks.
* ``kv_received`` (the decode leg): the prompt's KV arrived from a prefill engine (the shell
  waited the transfer before ``add``). At admission blocks for the whole prompt are allocated
  and none of it is computed: no prefill chunk in any step; its first token comes from its
  first decode step (``StepWork.decodes``, shared with the running decodes). vLLM: local prefix hits
  are reused (``cached_tokens``) and the received blocks enter the prefix cache (``BlockStored``,
  as vLLM's decode publishes them); SGLang's decode keeps no radix cache (its default): the
  prompt is neither matched nor inserted, no events, ``cached_tokens`` 0. A received request
  preempted or retracted has lost that KV: it is recomputed locally like any other.
* ``local_hit(request)``: for a ``kv_received`` request, the prompt tokens the engine's own
  cache would serve if it were admitted now (read-only); the transfer brings only the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from cortex.ledger.kv_events import Event
from cortex.sim.step_time import StepWork

TruthEntry = tuple[str | None, str | None, tuple[int, ...]]  # (lora, salt, tokens to block end)


@dataclass(frozen=True, slots=True)
class SimRequest:
    request_id: int
    tokens: tuple[int, ...]  # prompt token ids
    output_tokens: int  # tokens it generates (>= 1)
    lora_name: str | None = None
    cache_salt: str | None = None
    read_limit: int | None = None  # prompt tokens it may read from the cache at most
    hold_kv: bool = False  # PD prefill: its KV stays held after it finishes, until release
    kv_received: bool = False  # PD decode: its prompt's KV came from a prefill engine


@dataclass(slots=True)
class StepOutcome:
    seconds: float  # the step's duration (timing profile)
    work: StepWork  # what it computed
    scheduled: dict[int, int] = field(default_factory=dict)  # first scheduled: cached_tokens
    first_tokens: list[int] = field(default_factory=list)  # prefill ended: first token ready
    tokens: list[int] = field(default_factory=list)  # one more output token ready
    finished: list[int] = field(default_factory=list)  # produced their last token
    preempted: list[int] = field(default_factory=list)  # lost their KV; recomputed later
    events: list[Event] = field(default_factory=list)  # published at the step's end
    hash_digests: dict[int, bytes] = field(default_factory=dict)  # vLLM bytes-hash wire mode


class BatchingEngine(Protocol):
    """One engine rank under continuous batching (see the module docstring)."""

    def add(self, request: SimRequest) -> None: ...

    def abort(self, request_id: int) -> None: ...

    def release(self, request_id: int) -> None:
        """Free the KV a finished ``hold_kv`` request still holds (no-op for an id that holds
        none: unknown, released, or not finished yet)."""
        ...

    def local_hit(self, request: SimRequest) -> int:
        """Prompt tokens of a ``kv_received`` request this engine's cache would serve if it
        were admitted now (read-only: nothing is touched)."""
        ...

    def step(self) -> StepOutcome | None: ...

    def idle_events(self) -> list[Event]:
        """Events queued and not yet published, taken for publishing now (SGLang publishes
        when idle); vLLM publishes every step, so none."""
        ...

    def clear(self) -> list[Event]:
        """Empty the prefix cache (the engine's reset endpoint): its events."""
        ...

    def reset(self) -> None:
        """The engine restarted: everything gone, silently."""
        ...

    def truth(self) -> set[TruthEntry]: ...

    @property
    def waiting(self) -> int: ...

    @property
    def running(self) -> int: ...

    @property
    def kv_usage(self) -> float:
        """Share of the KV pool in use (evictable cached blocks count as free, as the engines
        report it)."""
        ...
