"""The typed fast path of KV-event decoding: msgspec structs per engine family and era, and the
field tables the generic path shares (``cortex.events.decoder``).

Rules:

* It handles the common single-era batches of known events (the first event's layout, map or
  array, picks the decoder); any unknown field, unknown tag, mixed era, unusual layout, bad
  token id or EAGLE bigram pair makes it return None, leaving the payload to the generic path,
  which is the reference and says what is wrong. It never raises on bad input except
  ``DecodeError`` from the shared checks (``cortex.events.decoder_semantics``).
* Whenever it returns a batch, that batch equals the generic path's
  (tests/property/test_decoder_fuzz.py).
* ``token_ids`` is unpacked straight into an ``array('I')`` (``cortex._fast.msgpack_u32``), so
  no Python int is made per token; the structs are not GC-tracked (short-lived, acyclic).
* ``ARRAY_FIELDS`` and ``MAP_FIELDS`` (field names per family and era, kv-events.md
  §4.2-§4.4) are derived from the structs, so both paths know the same fields. No trio, no zmq.
"""

from __future__ import annotations

from typing import Annotated, Any, Generic, TypeVar

import msgspec
from msgspec import Meta, Struct

from cortex._fast.msgpack_u32 import unpack_u32_array
from cortex._fast.store_runs import extend_run
from cortex.events.decoder_semantics import (
    MAX_U32,
    block_hash,
    block_hash_list,
    event_batch,
    stored_event,
)
from cortex.ledger.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineFamily,
    Event,
    EventBatch,
)

_BlockSize = Annotated[int, Meta(ge=1, le=MAX_U32)]
_NonNegative = Annotated[int, Meta(ge=0)]
_Hash = int | bytes
_E = TypeVar("_E")


class _Event(Struct, tag_field="type", forbid_unknown_fields=True, gc=False):
    """Config shared by the typed events: map tag key ``type``, any unknown field rejected
    (so the generic path counts it), no GC tracking (short-lived, acyclic)."""


class _StoredHead(_Event):
    """The fields every engine's ``BlockStored`` begins with, in wire order (kv-events.md):
    array-like forms read them by position, so each engine's struct starts with these."""

    block_hashes: list[_Hash]
    parent_block_hash: _Hash | None
    token_ids: msgspec.Raw  # unpacked by unpack_u32_array (ValueError -> generic path)
    block_size: _BlockSize
    lora_id: _NonNegative | None = None
    medium: str | None = None


class _VllmStored(_StoredHead, tag="BlockStored"):
    lora_name: str | None = None
    extra_keys: list[list[Any] | None] | None = None
    group_idx: _NonNegative | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: Any = None
    locality: Any = None
    ownership: Any = None
    session_id: Any = None
    lookahead_token_ids: list[Any] | None = None


class _VllmRemoved(_Event, tag="BlockRemoved"):
    block_hashes: list[_Hash]
    medium: str | None = None
    group_idx: _NonNegative | None = None
    locality: Any = None
    ownership: Any = None


class _Cleared(_Event, tag="AllBlocksCleared"):
    pass


class _SglangStored(_StoredHead, tag="BlockStored"):
    cache_salt: str | None = None
    session_id: Any = None
    lora_name: str | None = None


class _SglangSaltMetadata(Struct, forbid_unknown_fields=True, gc=False):
    cache_salt: str | None = None


class _SglangStoredArray(_StoredHead, array_like=True, tag="BlockStored"):
    metadata: _SglangSaltMetadata | None = None


class _SglangRemoved(_Event, tag="BlockRemoved"):
    block_hashes: list[_Hash]
    medium: str | None = None


class _VllmStoredArray(_VllmStored, array_like=True):
    pass


class _VllmRemovedArray(_VllmRemoved, array_like=True):
    pass


class _ClearedArray(_Cleared, array_like=True):
    pass


class _SglangRemovedArray(_SglangRemoved, array_like=True):
    pass


class _TypedBatch(Struct, Generic[_E], array_like=True, forbid_unknown_fields=True, gc=False):
    ts: float
    events: list[_E]
    dp_rank: _NonNegative | None = None


_TYPED_DECODERS: dict[tuple[EngineFamily, bool], msgspec.msgpack.Decoder[Any]] = {
    (EngineFamily.VLLM, True): msgspec.msgpack.Decoder(
        _TypedBatch[_VllmStored | _VllmRemoved | _Cleared]
    ),
    (EngineFamily.VLLM, False): msgspec.msgpack.Decoder(
        _TypedBatch[_VllmStoredArray | _VllmRemovedArray | _ClearedArray]
    ),
    (EngineFamily.SGLANG, True): msgspec.msgpack.Decoder(
        _TypedBatch[_SglangStored | _SglangRemoved | _Cleared]
    ),
    (EngineFamily.SGLANG, False): msgspec.msgpack.Decoder(
        _TypedBatch[_SglangStoredArray | _SglangRemovedArray | _ClearedArray]
    ),
}


def _first_event_is_map(payload: bytes) -> bool | None:
    """Peek at ``[float64 ts, [event, ...], ...]``: is the first event a map (True), an array
    (False), or is the layout unusual (None: leave it to the generic path)?"""
    if len(payload) < 12 or payload[0] not in (0x92, 0x93) or payload[1] != 0xCB:
        return None
    header = payload[10]
    if 0x91 <= header <= 0x9F:
        first = payload[11]
    elif header == 0xDC and len(payload) > 13:
        first = payload[13]
    else:
        return None
    if 0x80 <= first <= 0x8F or first in (0xDE, 0xDF):
        return True
    if 0x90 <= first <= 0x9F or first in (0xDC, 0xDD):
        return False
    return None


def decode_typed(payload: bytes, family: EngineFamily) -> EventBatch | None:
    """The fast path, or None when the payload needs the generic path."""
    is_map = _first_event_is_map(payload)
    if is_map is None:
        return None
    try:
        typed = _TYPED_DECODERS[family, is_map].decode(payload)
    except (msgspec.MsgspecError, RecursionError):
        return None
    events: list[Event] = []
    sglang = family is EngineFamily.SGLANG
    for ev in typed.events:
        if isinstance(ev, _StoredHead):
            try:
                tokens = unpack_u32_array(ev.token_ids)
            except ValueError:
                return None  # bigram pairs or bad ids: the generic path says which
            parent = ev.parent_block_hash
            if sglang and events and type(events[-1]) is BlockStored and extend_run(
                    events[-1], ev, tokens, is_map):
                continue  # one page continuing the store before it (SGLang 0.5.15)
            if isinstance(ev, _VllmStored):
                lora_name, extra_keys, group_idx = ev.lora_name, ev.extra_keys, ev.group_idx
                kind, lookahead, salt = ev.kv_cache_spec_kind, ev.lookahead_token_ids, None
            else:
                lora_name, extra_keys, group_idx, kind, lookahead = None, None, None, None, None
                if isinstance(ev, _SglangStored):
                    lora_name, salt = ev.lora_name, ev.cache_salt
                else:
                    salt = None if ev.metadata is None else ev.metadata.cache_salt
            events.append(
                stored_event(
                    block_hash_list(ev.block_hashes, "BlockStored.block_hashes"),
                    None if parent is None else block_hash(parent, "BlockStored.parent_block_hash"),
                    tokens,
                    ev.block_size,
                    bigram=False,
                    lora_id=ev.lora_id,
                    medium=ev.medium,
                    lora_name=lora_name,
                    extra_keys=extra_keys,
                    group_idx=group_idx,
                    kind=kind,
                    lookahead=lookahead,
                    salt=salt,
                )
            )
        elif isinstance(ev, (_VllmRemoved, _SglangRemoved)):
            events.append(
                BlockRemoved(
                    block_hash_list(ev.block_hashes, "BlockRemoved.block_hashes"),
                    ev.medium,
                    ev.group_idx if isinstance(ev, _VllmRemoved) else None,
                )
            )
        else:
            events.append(AllBlocksCleared())
    return event_batch(typed.ts, events, typed.dp_rank, 0, 0)


# ---------------------------------------------------------------------------------------------
# The generic path's field tables, derived from the structs above (one list of fields each)

STORED = "BlockStored"
REMOVED = "BlockRemoved"
CLEARED = "AllBlocksCleared"

# Field names by array position (after the tag), kv-events.md §4.2-§4.4.
ARRAY_FIELDS: dict[EngineFamily, dict[str, tuple[str, ...]]] = {
    EngineFamily.VLLM: {
        STORED: tuple(_VllmStored.__struct_fields__),
        REMOVED: tuple(_VllmRemoved.__struct_fields__),
        CLEARED: (),
    },
    EngineFamily.SGLANG: {
        STORED: tuple(_SglangStoredArray.__struct_fields__),  # 7 = {"cache_salt": s}
        REMOVED: tuple(_SglangRemoved.__struct_fields__),
        CLEARED: (),
    },
}
MAP_FIELDS: dict[EngineFamily, dict[str, frozenset[str]]] = {
    EngineFamily.VLLM: {
        tag: frozenset(names) for tag, names in ARRAY_FIELDS[EngineFamily.VLLM].items()
    },
    EngineFamily.SGLANG: {
        STORED: frozenset(_SglangStored.__struct_fields__),
        REMOVED: frozenset(_SglangRemoved.__struct_fields__),
        CLEARED: frozenset(),
    },
}
