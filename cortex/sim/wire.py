"""Encode event batches and ZeroMQ frames exactly as a given engine version does.

Pure (msgspec only). Wire facts: ``shared/protocols/kv-events.md`` §2–§6; the bytes produced
here equal the captured ``shared/fixtures/kv-events`` payloads.

A *profile* fixes everything that differs between engine versions on the wire:

| profile        | events | replay reply   | fields beyond the common ones                     |
|----------------|--------|----------------|---------------------------------------------------|
| vllm-0.33      | map    | new (topic)    | extra_keys, group_idx, kv_cache_spec_kind, ...    |
| vllm-0.25      | map    | old (no topic) | as 0.33 up to kv_cache_spec_sliding_window        |
| vllm-0.23      | array  | old            | 11 BlockStored fields, 3 BlockRemoved fields      |
| sglang-0.5.23  | map    | new            | cache_salt, session_id, lora_name                 |
| sglang-0.5.21  | map    | old            | cache_salt, session_id (no lora_name yet)         |
| sglang-0.5.19  | array  | old            | salted stores carry a trailing {"cache_salt": s}  |
| sglang-0.5.15  | array  | old            | as 0.5.19 (no salt); one BlockStored per page     |

Encoding rules that hold for every profile:

* The batch is a positional array ``[ts (float64), events, rank]``, always 3 elements.
* Map-era events start with ``"type": <tag>`` and omit fields that have a default and equal it
  (None); fields without a default are always present, possibly nil. Array-era events are
  ``[tag, every field in declaration order]``, never truncated.
* Model hashes are normalised u64 (``cortex.ledger.kv_events``): SGLang publishes them as signed
  int64, vLLM as unsigned, or as the raw digests (``bin``) when ``hash_digests`` is given
  (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``).
* vLLM's published ``extra_keys`` hold one entry per block: ``[lora_name?, cache_salt?]`` or nil;
  the salt belongs to the first block of a request only, i.e. to block 0 of a store whose
  parent is nil.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import msgspec

from cortex.ledger.kv_events import (
    REPLAY_END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineFamily,
    Event,
)

EventEncoding = Literal["array", "map"]
ReplayGeneration = Literal["old", "new"]
Hash = int | bytes


@dataclass(frozen=True, slots=True)
class WireProfile:
    """What one engine version puts on the wire."""

    name: str
    family: EngineFamily
    version: tuple[int, ...]
    event_encoding: EventEncoding
    replay_generation: ReplayGeneration
    # SGLang <= 0.5.15 (``mem_cache/events.py``) publishes every page as its own BlockStored,
    # chained by parent hash: a 32k-token prompt at page size 1 is 32k stores
    store_per_page: bool = False


PROFILES: dict[str, WireProfile] = {
    p.name: p
    for p in (
        WireProfile("vllm-0.33", EngineFamily.VLLM, (0, 33, 0), "map", "new"),
        WireProfile("vllm-0.25", EngineFamily.VLLM, (0, 25, 0), "map", "old"),
        WireProfile("vllm-0.23", EngineFamily.VLLM, (0, 23, 0), "array", "old"),
        WireProfile("sglang-0.5.23", EngineFamily.SGLANG, (0, 5, 23), "map", "new"),
        WireProfile("sglang-0.5.21", EngineFamily.SGLANG, (0, 5, 21), "map", "old"),
        WireProfile("sglang-0.5.19", EngineFamily.SGLANG, (0, 5, 19), "array", "old"),
        WireProfile("sglang-0.5.15", EngineFamily.SGLANG, (0, 5, 15), "array", "old",
                    store_per_page=True),
    )
}


def profile_named(name: str | WireProfile) -> WireProfile:
    if isinstance(name, WireProfile):
        return name
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown wire profile {name!r}; known: {sorted(PROFILES)}") from None


# ---------------------------------------------------------------- vLLM structs


class _VllmStoredMap(msgspec.Struct, tag="BlockStored", omit_defaults=True):
    block_hashes: list[Hash]
    parent_block_hash: Hash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[list[str] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class _VllmRemovedMap(msgspec.Struct, tag="BlockRemoved", omit_defaults=True):
    block_hashes: list[Hash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class _VllmClearedMap(msgspec.Struct, tag="AllBlocksCleared", omit_defaults=True):
    pass


class _VllmStoredArray(msgspec.Struct, tag="BlockStored", array_like=True):
    block_hashes: list[Hash]
    parent_block_hash: Hash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[list[str] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class _VllmRemovedArray(msgspec.Struct, tag="BlockRemoved", array_like=True):
    block_hashes: list[Hash]
    medium: str | None
    group_idx: int | None = None


class _ClearedArray(msgspec.Struct, tag="AllBlocksCleared", array_like=True):
    pass


# ---------------------------------------------------------------- SGLang structs


class _SglangStoredMap(msgspec.Struct, tag="BlockStored", omit_defaults=True):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    cache_salt: str | None = None
    session_id: str | None = None
    lora_name: str | None = None


class _SglangRemovedMap(msgspec.Struct, tag="BlockRemoved", omit_defaults=True):
    block_hashes: list[int]
    medium: str | None


class _SglangClearedMap(msgspec.Struct, tag="AllBlocksCleared", omit_defaults=True):
    pass


class _SglangSaltMetadata(msgspec.Struct):
    cache_salt: str


class _SglangStoredArray(msgspec.Struct, tag="BlockStored", array_like=True):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class _SglangSaltedStoredArray(msgspec.Struct, tag="BlockStored", array_like=True):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    metadata: _SglangSaltMetadata


class _SglangRemovedArray(msgspec.Struct, tag="BlockRemoved", array_like=True):
    block_hashes: list[int]
    medium: str | None


class _Batch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[msgspec.Struct]
    rank: int | None = None


_ENCODER = msgspec.msgpack.Encoder()


# ---------------------------------------------------------------- model -> wire


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _vllm_extra_keys(event: BlockStored) -> list[list[str] | None]:
    keys: list[list[str] | None] = []
    for index in range(len(event.block_hashes)):
        entry = [] if event.lora_name is None else [event.lora_name]
        if event.cache_salt is not None and index == 0 and event.parent_hash is None:
            entry.append(event.cache_salt)
        keys.append(entry or None)
    return keys


def _vllm_event(
    event: Event, array: bool, digests: Mapping[int, bytes] | None
) -> msgspec.Struct:
    def wire_hash(value: int) -> Hash:
        if digests is None:
            return value
        try:
            return digests[value]
        except KeyError:
            raise ValueError(f"no digest known for block hash {value}") from None

    if isinstance(event, BlockStored):
        stored = _VllmStoredArray if array else _VllmStoredMap
        return stored(
            block_hashes=[wire_hash(h) for h in event.block_hashes],
            parent_block_hash=None if event.parent_hash is None else wire_hash(event.parent_hash),
            token_ids=list(event.token_ids),
            block_size=event.block_size,
            lora_id=event.lora_id,
            medium=event.medium,
            lora_name=event.lora_name,
            extra_keys=_vllm_extra_keys(event),
            group_idx=event.group_idx,
            kv_cache_spec_kind=event.kv_cache_spec_kind,
        )
    if isinstance(event, BlockRemoved):
        removed = _VllmRemovedArray if array else _VllmRemovedMap
        return removed(
            block_hashes=[wire_hash(h) for h in event.block_hashes],
            medium=event.medium,
            group_idx=event.group_idx,
        )
    return _ClearedArray() if array else _VllmClearedMap()


def _sglang_event(event: Event, profile: WireProfile) -> msgspec.Struct:
    array = profile.event_encoding == "array"
    if isinstance(event, BlockStored):
        common = {
            "block_hashes": [_signed64(h) for h in event.block_hashes],
            "parent_block_hash": None if event.parent_hash is None else _signed64(event.parent_hash),
            "token_ids": list(event.token_ids),
            "block_size": event.block_size,
            "lora_id": event.lora_id,
            "medium": event.medium,
        }
        if array:
            if event.cache_salt is None:
                return _SglangStoredArray(**common)
            return _SglangSaltedStoredArray(
                **common, metadata=_SglangSaltMetadata(cache_salt=event.cache_salt)
            )
        lora_name = event.lora_name if profile.version >= (0, 5, 22) else None
        return _SglangStoredMap(**common, cache_salt=event.cache_salt, lora_name=lora_name)
    if isinstance(event, BlockRemoved):
        removed = _SglangRemovedArray if array else _SglangRemovedMap
        return removed(block_hashes=[_signed64(h) for h in event.block_hashes], medium=event.medium)
    if not isinstance(event, AllBlocksCleared):
        raise TypeError(f"not an event: {event!r}")
    return _ClearedArray() if array else _SglangClearedMap()


def _pages(event: Event) -> list[Event]:
    """A store as one store per page, chained (what SGLang <= 0.5.15 publishes)."""
    if not isinstance(event, BlockStored) or len(event.block_hashes) == 1:
        return [event]
    size = event.block_size
    parents = [event.parent_hash, *event.block_hashes[:-1]]
    return [replace(event, block_hashes=[block_hash], parent_hash=parent,
                    token_ids=list(event.token_ids[i * size:(i + 1) * size]))
            for i, (block_hash, parent) in enumerate(zip(event.block_hashes, parents,
                                                         strict=True))]


def encode_batch(
    profile: WireProfile,
    ts: float,
    events: Sequence[Event],
    dp_rank: int | None,
    *,
    hash_digests: Mapping[int, bytes] | None = None,
) -> bytes:
    """The msgpack payload frame of one batch, as ``profile``'s engine encodes it.

    ``hash_digests`` (vLLM only) maps every hash in ``events`` to its raw digest, which is
    then published instead of the int (the engines' bytes-hash mode).
    """
    if profile.family is EngineFamily.VLLM:
        array = profile.event_encoding == "array"
        wire_events = [_vllm_event(e, array, hash_digests) for e in events]
    else:
        if hash_digests is not None:
            raise ValueError("SGLang publishes int64 hashes only")
        if profile.store_per_page:
            events = [page for event in events for page in _pages(event)]
        wire_events = [_sglang_event(e, profile) for e in events]
    return _ENCODER.encode(_Batch(ts=float(ts), events=wire_events, rank=dp_rank))


# ---------------------------------------------------------------- frames


def seq_frame(seq: int) -> bytes:
    """A sequence number frame: 8 bytes, big-endian unsigned."""
    return seq.to_bytes(8, "big")


def live_frames(topic: bytes, seq: int, payload: bytes) -> list[bytes]:
    """A live PUB message: ``[topic, seq, payload]``."""
    return [topic, seq_frame(seq), payload]


def replay_data_frames(
    generation: ReplayGeneration, topic: bytes, seq: int, payload: bytes
) -> list[bytes]:
    """One replayed batch as a DEALER receives it (the ROUTER prepends the client identity)."""
    if generation == "new":
        return [b"", topic, seq_frame(seq), payload]
    return [b"", seq_frame(seq), payload]


def replay_end_frames(generation: ReplayGeneration) -> list[bytes]:
    """The end marker of a replay, as a DEALER receives it."""
    if generation == "new":
        return [b"", b"", REPLAY_END_SEQ, b""]
    return [b"", REPLAY_END_SEQ, b""]


def parse_replay_request(frames: Sequence[bytes]) -> tuple[bytes, int] | None:
    """``(client identity, start_seq)`` of a request a ROUTER received, or None when malformed.

    The only well-formed request is ``[identity, b"", start_seq (8 bytes)]``; engines log and
    ignore anything else, answering nothing.
    """
    if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
        return None
    return frames[0], int.from_bytes(frames[2], "big")
