"""What both KV-event decoding paths mean by a field: hash normalisation, the verdict on vLLM's
extra keys, the checks on a store, and the batch they build (``cortex.events.decoder``).

Rules (the decoder's, for the parts held here):

* The only exception raised on bad input is ``cortex.errors.DecodeError``.
* Hashes are ints (masked to u64) or bin of >= 8 bytes (last 8 bytes, big-endian).
* A store is *reproducible* unless its tokens are EAGLE bigram pairs, it carries
  ``lookahead_token_ids``, or its vLLM ``extra_keys`` hold anything but the LoRA name (first
  element of every block's keys) and one cache salt string in block 0. A reproducible store
  has exactly ``len(block_hashes) * block_size`` tokens; a non-reproducible one is returned
  with empty ``token_ids`` (Cortex keys such blocks opaquely and never from tokens).
* A batch's ``ts`` must be a finite number.
* Consecutive stores that continue each other (``continues``) are merged into one: the same
  facts in fewer events.
* ``stored_event``'s arguments arrive with their wire types already checked by the calling
  path; both paths build their stores and batches here, so they cannot disagree on meaning.
  No trio, no zmq.
"""

from __future__ import annotations

import math
from array import array
from typing import Any

from cortex.errors import DecodeError
from cortex.ledger.kv_events import U64_MASK, BlockStored, Event, EventBatch

MAX_U32 = 0xFFFF_FFFF


def block_hash(value: object, what: str) -> int:
    if type(value) is int:
        return value & U64_MASK
    if type(value) is bytes:
        if len(value) < 8:
            raise DecodeError(f"{what}: binary hash of {len(value)} bytes (need >= 8)")
        return int.from_bytes(value[-8:], "big")
    raise DecodeError(f"{what}: hash is {type(value).__name__}, expected int or bin")


def block_hash_list(values: list[int | bytes], what: str) -> list[int]:
    """Normalise hashes msgspec already typed as msgpack ints (within [-2**63, 2**64)) or bin.

    Hot path: vLLM's hashes are all non-negative, so the list is returned as it is."""
    if not values:
        return []
    try:
        if min(values) >= 0:  # type: ignore[operator]
            return values  # type: ignore[return-value]
        return [h & U64_MASK for h in values]  # type: ignore[operator]
    except TypeError:  # bin hashes among them
        return [block_hash(h, what) for h in values]


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


def stored_event(
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


def continues(before: Event, store: BlockStored) -> bool:
    """Whether ``store`` continues the store ``before`` it: its parent is ``before``'s last
    block, in the same namespace, medium, KV group and block size, both keyed from tokens.
    Such a pair means what one store of both blocks means (SGLang 0.5.15 publishes one store
    per page: a 32k-token prompt is 32k stores of one page)."""
    return (
        type(before) is BlockStored
        and store.parent_hash is not None
        and store.parent_hash == before.block_hashes[-1]
        and store.block_size == before.block_size
        and store.reproducible
        and before.reproducible
        and store.medium == before.medium
        and store.lora_name == before.lora_name
        and store.lora_id == before.lora_id
        and store.cache_salt == before.cache_salt
        and store.group_idx == before.group_idx
        and store.kv_cache_spec_kind == before.kv_cache_spec_kind
    )


def coalesce_stores(events: list[Event]) -> list[Event]:
    """The events with every store that ``continues`` the event before it merged into it
    (greedily, left to right). The merged stores are the decoder's own, not yet handed out:
    their lists are extended in place."""
    merged: list[Event] = []
    for event in events:
        if type(event) is BlockStored and merged and continues(merged[-1], event):
            before = merged[-1]
            assert isinstance(before, BlockStored)
            before.block_hashes.extend(event.block_hashes)
            before.token_ids.extend(event.token_ids)  # type: ignore[attr-defined]
        else:
            merged.append(event)
    return merged


def event_batch(
    ts: float, events: list[Event], dp_rank: int | None, unknown_events: int, unknown_fields: int
) -> EventBatch:
    """The batch, stores that continue each other merged (``coalesce_stores``)."""
    if not math.isfinite(ts):
        raise DecodeError(f"batch timestamp {ts!r} is not finite")
    if len(events) > 1:
        events = coalesce_stores(events)
    return EventBatch(float(ts), tuple(events), dp_rank, unknown_events, unknown_fields)
