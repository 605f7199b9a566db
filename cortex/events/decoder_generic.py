"""The generic path of KV-event decoding, the reference: any payload, hand validation
(``cortex.events.decoder``).

Rules:

* The only exception raised on bad input is ``cortex.errors.DecodeError``; its message says
  which field is wrong.
* A payload is the msgpack array ``[ts, events, dp_rank]``; a missing rank is None, extra
  trailing elements are counted in ``unknown_fields``.
* An event is an array ``[tag, f1, f2, ...]`` (positions per family, §4.2/§4.3) or a map
  ``{"type": tag, field: value}``; both eras are accepted, even mixed in one batch. Unknown
  tags are skipped and counted in ``unknown_events`` (their content is not looked at). Keys a
  family does not define and array elements past its last position are counted in
  ``unknown_fields``; in a shorter array (an older version) the fields past its end are
  missing. Defined fields Cortex does not use are accepted with any value.
* Fields Cortex reads are type-checked: ``block_hashes`` of a store is a non-empty array;
  ``block_size`` an int in [1, 2**32); token ids ints in [0, 2**32) or EAGLE bigram pairs of
  them (validated, then dropped); lora_id, group_idx and dp_rank non-negative ints or nil;
  medium, lora_name, kv_cache_spec_kind, cache_salt str or nil.
* Nesting depth is bounded by msgspec's recursion guard (``RecursionError``, turned into
  ``DecodeError``). No trio, no zmq.
"""

from __future__ import annotations

from array import array
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from cortex.errors import DecodeError
from cortex.events.decoder_semantics import MAX_U32, block_hash, event_batch, stored_event
from cortex.events.decoder_typed import ARRAY_FIELDS, MAP_FIELDS, REMOVED, STORED
from cortex.ledger.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineFamily,
    Event,
    EventBatch,
)

_U32 = Annotated[int, Meta(ge=0, le=MAX_U32)]
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
    what = STORED
    hashes = _required(fields, "block_hashes", list, what)
    parent = fields.get("parent_block_hash")
    tokens, bigram = _tokens(_required(fields, "token_ids", list, what))
    block_size = _required(fields, "block_size", int, what)
    if not 1 <= block_size <= MAX_U32:
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
    event = stored_event(
        [block_hash(h, "BlockStored.block_hashes") for h in hashes],
        None if parent is None else block_hash(parent, "BlockStored.parent_block_hash"),
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
        names = ARRAY_FIELDS[family].get(tag)
        if names is None:
            return None, 0
        fields = dict(zip(names, raw[1:], strict=False))  # shorter arrays: older versions
        unknown = max(0, len(raw) - 1 - len(names))
    elif type(raw) is dict:
        tag = raw.get("type")
        if type(tag) is not str:
            raise DecodeError("map event has no string 'type'")
        known = MAP_FIELDS[family].get(tag)
        if known is None:
            return None, 0
        fields = {key: value for key, value in raw.items() if key in known}
        unknown = len(raw) - 1 - len(fields)
    else:
        raise DecodeError(f"event is {type(raw).__name__}, expected array or map")
    if tag == STORED:
        event, inner_unknown = _generic_stored(fields, family)
        return event, unknown + inner_unknown
    if tag == REMOVED:
        hashes = _required(fields, "block_hashes", list, tag)
        removed = BlockRemoved(
            [block_hash(h, "BlockRemoved.block_hashes") for h in hashes],
            _opt(fields, "medium", str, tag),
            _opt(fields, "group_idx", int, tag),  # never a SGLang name, so never in its fields
        )
        return removed, unknown
    return AllBlocksCleared(), unknown


def decode_generic(payload: bytes, family: EngineFamily) -> EventBatch:
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
    return event_batch(float(ts), events, dp_rank, unknown_events, unknown_fields)
