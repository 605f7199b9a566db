"""Sans-IO decoder of the engines' KV-event payloads: msgpack bytes in, typed batches out.

Wire facts: ``shared/protocols/kv-events.md`` (§3 batch, §4 events); the frames around the
payloads are split by ``cortex.events.frames``.
Output types and their invariants: ``cortex.events.model``. No trio, no zmq.

Rules (hold for every call):

* The only exception raised on bad input is ``cortex.errors.DecodeError``.
* A payload is the msgpack array ``[ts, events, dp_rank]``; a missing rank is None, extra
  trailing elements are counted in ``unknown_fields``. ``ts`` must be a finite number.
* An event is an array ``[tag, f1, f2, ...]`` (positions per family, §4.2/§4.3) or a map
  ``{"type": tag, field: value}``; both eras are accepted at any time, even mixed in one batch.
  Unknown tags are skipped and counted in ``unknown_events`` (their content is not looked at).
  Keys a family does not define and array elements past its last position are counted in
  ``unknown_fields``. Defined fields Cortex does not use (session_id, locality, ownership,
  kv_cache_spec_sliding_window) are accepted with any value.
* Fields Cortex reads are type-checked: hashes are ints (masked to u64) or bin of >= 8 bytes
  (last 8 bytes, big-endian); ``block_hashes`` of a store is a non-empty array; ``block_size``
  an int in [1, 2**32); token ids ints in [0, 2**32); lora_id, group_idx and dp_rank
  non-negative ints or nil; medium, lora_name, kv_cache_spec_kind, cache_salt str or nil.
* A store is *reproducible* unless its tokens are EAGLE bigram pairs, it carries
  ``lookahead_token_ids``, or its vLLM ``extra_keys`` hold anything but the LoRA name (first
  element of every block's keys) and one cache salt string in block 0. A reproducible store
  has exactly ``len(block_hashes) * block_size`` tokens; a non-reproducible one is returned
  with empty ``token_ids`` (Cortex keys such blocks opaquely and never from tokens).
* ``token_ids`` is always an ``array('I')``: the fast path unpacks the msgpack array straight
  into it (``cortex._fast.msgpack_u32``), so no Python int is made per token.
* Nesting depth is bounded by msgspec's recursion guard (``RecursionError``, turned into
  ``DecodeError``); sizes are bounded by the payload (nothing is allocated from a length field).

Two paths, one meaning: a typed msgspec decode (fast, validates token ranges in C) handles
the common single-era batches of known events; anything it rejects goes to the generic
decode with hand validation, which is the reference. Whenever the typed path succeeds its
result equals the generic path's (checked by tests/property/test_decoder_fuzz.py).
"""

from __future__ import annotations

import math
from array import array
from typing import Annotated, Any, Generic, TypeVar

import msgspec
from msgspec import Meta, Struct

from cortex._fast.msgpack_u32 import unpack_u32_array
from cortex.errors import DecodeError
from cortex.events.model import (
    U64_MASK,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineFamily,
    Event,
    EventBatch,
)

_MAX_U32 = 0xFFFF_FFFF

# ---------------------------------------------------------------------------------------------
# Payload: shared semantics


def _hash(value: object, what: str) -> int:
    if type(value) is int:
        return value & U64_MASK
    if type(value) is bytes:
        if len(value) < 8:
            raise DecodeError(f"{what}: binary hash of {len(value)} bytes (need >= 8)")
        return int.from_bytes(value[-8:], "big")
    raise DecodeError(f"{what}: hash is {type(value).__name__}, expected int or bin")


def _hash_list(values: list[int | bytes], what: str) -> list[int]:
    """Normalise hashes msgspec already typed as msgpack ints (within [-2**63, 2**64)) or bin.

    Hot path: vLLM's hashes are all non-negative, so the list is returned as it is."""
    if not values:
        return []
    try:
        if min(values) >= 0:  # type: ignore[operator]
            return values  # type: ignore[return-value]
        return [h & U64_MASK for h in values]  # type: ignore[operator]
    except TypeError:  # bin hashes among them
        return [_hash(h, what) for h in values]


def _extra_keys_verdict(
    extra_keys: list[Any] | None, n_blocks: int, lora_name: str | None
) -> tuple[str | None, bool]:
    """(cache salt, reproducible) from vLLM's per-block untagged extra keys."""
    if extra_keys is None:
        return None, True
    if extra_keys.count(None) == len(extra_keys):  # plain text: one nil per block
        return None, len(extra_keys) == n_blocks
    salt: str | None = None
    reproducible = len(extra_keys) == n_blocks
    for index, keys in enumerate(extra_keys):
        if keys is None:
            continue
        if type(keys) is not list:
            raise DecodeError(f"BlockStored.extra_keys[{index}] is {type(keys).__name__}")
        if lora_name is not None and keys and keys[0] == lora_name:
            keys = keys[1:]
        if not keys:
            continue
        if index == 0 and len(keys) == 1 and type(keys[0]) is str:
            salt = keys[0]
        else:
            reproducible = False  # multimodal items, prompt-embeds digests, old mm ids
    return salt, reproducible


def _stored(
    hashes: list[int],
    parent: int | None,
    tokens: array[int],
    block_size: int,
    *,
    bigram: bool,
    lora_id: int | None,
    medium: str | None,
    lora_name: str | None,
    extra_keys: list[Any] | None,
    group_idx: int | None,
    kind: str | None,
    lookahead: list[Any] | None,
    salt: str | None,
) -> BlockStored:
    """Semantic checks common to both paths; every argument already has its wire type."""
    if not hashes:
        raise DecodeError("BlockStored without block hashes")
    key_salt, reproducible = _extra_keys_verdict(extra_keys, len(hashes), lora_name)
    reproducible = reproducible and not bigram and lookahead is None
    if reproducible:
        if len(tokens) != len(hashes) * block_size:
            raise DecodeError(
                f"BlockStored has {len(tokens)} token ids for {len(hashes)} blocks of {block_size}"
            )
    else:
        tokens = array("I")
    # Positional: a frozen dataclass builds ~1 us faster so (field order as in model.py).
    return BlockStored(
        hashes,  # block_hashes
        parent,  # parent_hash
        tokens,  # token_ids
        block_size,
        medium,
        lora_name,
        lora_id,
        salt if salt is not None else key_salt,  # cache_salt
        group_idx,
        kind,  # kv_cache_spec_kind
        reproducible,
    )


def _batch(
    ts: float, events: list[Event], dp_rank: int | None, unknown_events: int, unknown_fields: int
) -> EventBatch:
    if not math.isfinite(ts):
        raise DecodeError(f"batch timestamp {ts!r} is not finite")
    return EventBatch(float(ts), tuple(events), dp_rank, unknown_events, unknown_fields)


# ---------------------------------------------------------------------------------------------
# Payload: typed fast path (msgspec structs; anything unusual falls through to the generic path)

_U32 = Annotated[int, Meta(ge=0, le=_MAX_U32)]
_BlockSize = Annotated[int, Meta(ge=1, le=_MAX_U32)]
_NonNegative = Annotated[int, Meta(ge=0)]
_Hash = int | bytes
_E = TypeVar("_E")


class _Event(Struct, tag_field="type", forbid_unknown_fields=True, gc=False):
    """Config shared by the typed events: map tag key ``type``, any unknown field rejected
    (so the generic path counts it), no GC tracking (short-lived, acyclic)."""


class _VllmStored(_Event, tag="BlockStored"):
    block_hashes: list[_Hash]
    parent_block_hash: _Hash | None
    token_ids: msgspec.Raw  # unpacked by unpack_u32_array (ValueError -> generic path)
    block_size: _BlockSize
    lora_id: _NonNegative | None = None
    medium: str | None = None
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


class _SglangStored(_Event, tag="BlockStored"):
    block_hashes: list[_Hash]
    parent_block_hash: _Hash | None
    token_ids: msgspec.Raw  # unpacked by unpack_u32_array (ValueError -> generic path)
    block_size: _BlockSize
    lora_id: _NonNegative | None = None
    medium: str | None = None
    cache_salt: str | None = None
    session_id: Any = None
    lora_name: str | None = None


class _SglangSaltMetadata(Struct, forbid_unknown_fields=True, gc=False):
    cache_salt: str | None = None


class _SglangStoredArray(_Event, array_like=True, tag="BlockStored"):
    block_hashes: list[_Hash]
    parent_block_hash: _Hash | None
    token_ids: msgspec.Raw  # unpacked by unpack_u32_array (ValueError -> generic path)
    block_size: _BlockSize
    lora_id: _NonNegative | None = None
    medium: str | None = None
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


def _decode_typed(payload: bytes, family: EngineFamily) -> EventBatch | None:
    """The fast path, or None when the payload needs the generic path."""
    is_map = _first_event_is_map(payload)
    if is_map is None:
        return None
    try:
        typed = _TYPED_DECODERS[family, is_map].decode(payload)
    except (msgspec.MsgspecError, RecursionError):
        return None
    events: list[Event] = []
    for ev in typed.events:
        if isinstance(ev, (_VllmStored, _SglangStored, _SglangStoredArray)):
            try:
                tokens = unpack_u32_array(ev.token_ids)
            except ValueError:
                return None  # bigram pairs or bad ids: the generic path says which
            parent = ev.parent_block_hash
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
                _stored(
                    _hash_list(ev.block_hashes, "BlockStored.block_hashes"),
                    None if parent is None else _hash(parent, "BlockStored.parent_block_hash"),
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
                    _hash_list(ev.block_hashes, "BlockRemoved.block_hashes"),
                    ev.medium,
                    ev.group_idx if isinstance(ev, _VllmRemoved) else None,
                )
            )
        else:
            events.append(AllBlocksCleared())
    return _batch(typed.ts, events, typed.dp_rank, 0, 0)


# ---------------------------------------------------------------------------------------------
# Payload: generic path (the reference)

_STORED = "BlockStored"
_REMOVED = "BlockRemoved"
_CLEARED = "AllBlocksCleared"

# Field names by array position (after the tag), kv-events.md §4.2-§4.4.
_ARRAY_FIELDS: dict[EngineFamily, dict[str, tuple[str, ...]]] = {
    EngineFamily.VLLM: {
        _STORED: tuple(_VllmStored.__struct_fields__),
        _REMOVED: tuple(_VllmRemoved.__struct_fields__),
        _CLEARED: (),
    },
    EngineFamily.SGLANG: {
        _STORED: tuple(_SglangStoredArray.__struct_fields__),  # 7 = {"cache_salt": s}
        _REMOVED: tuple(_SglangRemoved.__struct_fields__),
        _CLEARED: (),
    },
}
_MAP_FIELDS: dict[EngineFamily, dict[str, frozenset[str]]] = {
    EngineFamily.VLLM: {
        tag: frozenset(names) for tag, names in _ARRAY_FIELDS[EngineFamily.VLLM].items()
    },
    EngineFamily.SGLANG: {
        _STORED: frozenset(_SglangStored.__struct_fields__),
        _REMOVED: frozenset(_SglangRemoved.__struct_fields__),
        _CLEARED: frozenset(),
    },
}
_MISSING = object()
_GENERIC = msgspec.msgpack.Decoder()
_FLAT_TOKENS: type = list[_U32]  # type: ignore[valid-type]
_BIGRAM_TOKENS: type = list[tuple[_U32, _U32]]  # type: ignore[valid-type]


def _opt(fields: dict[str, Any], name: str, kind: type, what: str) -> Any:
    value = fields.get(name)
    if value is None or type(value) is kind:
        if kind is int and value is not None and value < 0:
            raise DecodeError(f"{what}.{name} is negative ({value})")
        return value
    raise DecodeError(f"{what}.{name} is {type(value).__name__}, expected {kind.__name__} or nil")


def _required(fields: dict[str, Any], name: str, kind: type, what: str) -> Any:
    value = fields.get(name, _MISSING)
    if value is _MISSING or value is None:
        raise DecodeError(f"{what}.{name} is missing or nil")
    if type(value) is not kind:
        raise DecodeError(f"{what}.{name} is {type(value).__name__}, expected {kind.__name__}")
    return value


def _opt_list(fields: dict[str, Any], name: str, what: str) -> list[Any] | None:
    value = fields.get(name)
    if value is not None and type(value) is not list:
        raise DecodeError(f"{what}.{name} is {type(value).__name__}, expected array or nil")
    return value


def _tokens(value: list[Any]) -> tuple[array[int], bool]:
    """(flat token ids, is_bigram); bigram pairs are validated, then dropped."""
    try:
        return array("I", msgspec.convert(value, _FLAT_TOKENS)), False
    except msgspec.ValidationError:
        pass
    try:
        msgspec.convert(value, _BIGRAM_TOKENS)
    except msgspec.ValidationError:
        raise DecodeError(
            "BlockStored.token_ids must be ints in [0, 2**32) or EAGLE bigram pairs of them"
        ) from None
    return array("I"), True


def _generic_stored(fields: dict[str, Any], family: EngineFamily) -> tuple[BlockStored, int]:
    """(event, unknown fields found inside it); ``fields`` holds only the family's names."""
    what = _STORED
    hashes = _required(fields, "block_hashes", list, what)
    parent = fields.get("parent_block_hash")
    tokens, bigram = _tokens(_required(fields, "token_ids", list, what))
    block_size = _required(fields, "block_size", int, what)
    if not 1 <= block_size <= _MAX_U32:
        raise DecodeError(f"BlockStored.block_size {block_size} is not in [1, 2**32)")
    unknown = 0
    salt: str | None = None
    extra_keys: list[Any] | None = None
    group_idx = kind = lookahead = None
    if family is EngineFamily.VLLM:
        extra_keys = _opt_list(fields, "extra_keys", what)
        group_idx = _opt(fields, "group_idx", int, what)
        kind = _opt(fields, "kv_cache_spec_kind", str, what)
        lookahead = _opt_list(fields, "lookahead_token_ids", what)
    else:
        salt = _opt(fields, "cache_salt", str, what)
        metadata = fields.get("metadata")
        if metadata is not None:
            if type(metadata) is not dict:
                raise DecodeError(f"SGLang BlockStored metadata is {type(metadata).__name__}")
            salt = _opt(metadata, "cache_salt", str, "BlockStored.metadata")
            unknown = sum(1 for key in metadata if key != "cache_salt")
    event = _stored(
        [_hash(h, "BlockStored.block_hashes") for h in hashes],
        None if parent is None else _hash(parent, "BlockStored.parent_block_hash"),
        tokens,
        block_size,
        bigram=bigram,
        lora_id=_opt(fields, "lora_id", int, what),
        medium=_opt(fields, "medium", str, what),
        lora_name=_opt(fields, "lora_name", str, what),
        extra_keys=extra_keys,
        group_idx=group_idx,
        kind=kind,
        lookahead=lookahead,
        salt=salt,
    )
    return event, unknown


def _generic_event(raw: object, family: EngineFamily) -> tuple[Event | None, int]:
    """(event or None for an unknown tag, unknown fields found inside it)."""
    if type(raw) is list:
        if not raw or type(raw[0]) is not str:
            raise DecodeError("array event does not start with a tag string")
        tag = raw[0]
        names = _ARRAY_FIELDS[family].get(tag)
        if names is None:
            return None, 0
        fields = dict(zip(names, raw[1:], strict=False))  # shorter arrays: older versions
        unknown = max(0, len(raw) - 1 - len(names))
    elif type(raw) is dict:
        tag = raw.get("type")
        if type(tag) is not str:
            raise DecodeError("map event has no string 'type'")
        known = _MAP_FIELDS[family].get(tag)
        if known is None:
            return None, 0
        fields = {key: value for key, value in raw.items() if key in known}
        unknown = len(raw) - 1 - len(fields)
    else:
        raise DecodeError(f"event is {type(raw).__name__}, expected array or map")
    if tag == _STORED:
        event, inner_unknown = _generic_stored(fields, family)
        return event, unknown + inner_unknown
    if tag == _REMOVED:
        hashes = _required(fields, "block_hashes", list, tag)
        removed = BlockRemoved(
            [_hash(h, "BlockRemoved.block_hashes") for h in hashes],
            _opt(fields, "medium", str, tag),
            _opt(fields, "group_idx", int, tag),  # never a SGLang name, so never in its fields
        )
        return removed, unknown
    return AllBlocksCleared(), unknown


def _decode_generic(payload: bytes, family: EngineFamily) -> EventBatch:
    try:
        top = _GENERIC.decode(payload)
    except (msgspec.MsgspecError, RecursionError) as exc:
        raise DecodeError(f"payload is not valid msgpack: {exc}") from None
    if type(top) is not list or len(top) < 2:
        raise DecodeError("payload is not an array [ts, events, dp_rank]")
    ts, raw_events = top[0], top[1]
    if type(ts) is not float and type(ts) is not int:
        raise DecodeError(f"batch timestamp is {type(ts).__name__}, expected a number")
    if type(raw_events) is not list:
        raise DecodeError(f"batch events is {type(raw_events).__name__}, expected array")
    dp_rank = top[2] if len(top) > 2 else None
    if dp_rank is not None and (type(dp_rank) is not int or dp_rank < 0):
        raise DecodeError(f"batch dp_rank {dp_rank!r} is not a non-negative int or nil")
    unknown_events = 0
    unknown_fields = max(0, len(top) - 3)
    events: list[Event] = []
    for raw in raw_events:
        event, unknown = _generic_event(raw, family)
        unknown_fields += unknown
        if event is None:
            unknown_events += 1
        else:
            events.append(event)
    return _batch(float(ts), events, dp_rank, unknown_events, unknown_fields)


def decode_payload(payload: bytes, family: EngineFamily) -> EventBatch:
    """Decode one batch payload (either era, or both mixed) published by ``family``."""
    if type(payload) is not bytes:
        if not isinstance(payload, (bytearray, memoryview)):
            raise DecodeError(f"payload is {type(payload).__name__}, not bytes")
        payload = bytes(payload)
    fast = _decode_typed(payload, family)
    if fast is not None:
        return fast
    return _decode_generic(payload, family)
