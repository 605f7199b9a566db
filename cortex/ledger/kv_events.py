"""Typed KV-event batches: what the wire decoder produces, whatever the engine and era.

Pure data, no I/O. Wire facts: ``shared/protocols/kv-events.md``.

Normalisation rules (hold for every value of these types):

* Engine block hashes are ``int`` in ``[0, 2**64)``: signed int64 (SGLang) become their
  two's complement, 32-byte binary digests (vLLM with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``)
  become their low 64 bits read big-endian (the same number the engine publishes in int mode).
  Engine hashes are opaque identifiers; Cortex never recomputes them.
* ``BlockStored.token_ids`` is flat and holds exactly ``len(block_hashes) * block_size`` ints in
  ``[0, 2**32)``, unless ``reproducible`` is false (then it may be empty: Cortex cannot key
  those blocks from tokens and keys them so they never produce a false hit). The decoder gives
  an ``array('I')`` (compact, read by the ledger without conversion); other producers (the
  simulator, tests) may give any sequence of ints. Compare with ``list(...)``.
* ``medium`` is the engine's string (``None`` means the engine did not say; engines that do not
  say store on the GPU).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

U64_MASK = (1 << 64) - 1


class EngineFamily(enum.Enum):
    """Which engine published the events. The array era needs it to name positions >= 5."""

    VLLM = "vllm"
    SGLANG = "sglang"


class Medium(enum.IntEnum):
    """Where a stored block lives. Codes are stable: the Cython ledger stores them in a byte."""

    GPU = 0
    CPU = 1
    DISK = 2
    OTHER = 3

    @classmethod
    def from_wire(cls, medium: str | None) -> Medium:
        if medium is None or medium == "GPU":
            return cls.GPU
        if medium in ("CPU", "CPU_PINNED"):
            return cls.CPU
        if medium == "DISK":
            return cls.DISK
        return cls.OTHER


# KV-cache groups whose blocks are ordinary prefix blocks (kv-events.md §4.5). Events of any
# other group (sliding window, mamba, ...) are not prefix-cache facts and stay out of the ledger.
MAIN_ATTENTION_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: list[int]
    parent_hash: int | None
    token_ids: Sequence[int]
    block_size: int
    medium: str | None = None
    lora_name: str | None = None
    lora_id: int | None = None
    cache_salt: str | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    # False when the block keys depend on something the event does not let Cortex reproduce
    # (multimodal items, prompt embeddings, EAGLE bigram tokens, lookahead tokens).
    reproducible: bool = True

    @property
    def is_main_attention(self) -> bool:
        if self.kv_cache_spec_kind is None:
            return self.group_idx in (None, 0)
        return self.kv_cache_spec_kind in MAIN_ATTENTION_KINDS


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: list[int]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One engine scheduler step's events, in the order they happened."""

    ts: float
    events: tuple[Event, ...]
    dp_rank: int | None
    # Skipped and counted by the decoder: events with an unknown tag, and unknown map keys or
    # extra trailing array elements inside known events.
    unknown_events: int = 0
    unknown_fields: int = 0


@dataclass(frozen=True, slots=True)
class LiveMessage:
    """The three frames of a live PUB message, payload still undecoded."""

    topic: bytes
    seq: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class ReplayItem:
    """One buffered batch re-sent by a replay ROUTER. ``topic`` is None for the old generation."""

    seq: int
    payload: bytes
    topic: bytes | None


@dataclass(frozen=True, slots=True)
class ReplayEnd:
    """The end marker of a replay (sequence frame ``ff`` x 8)."""


REPLAY_END_SEQ = b"\xff" * 8
