"""Sans-IO decoder of the engines' KV-event payloads: msgpack bytes in, typed batches out.

Wire facts: ``shared/protocols/kv-events.md`` (§3 batch, §4 events); the frames around the
payloads are split by ``cortex.events.frames``.
Output types and their invariants: ``cortex.ledger.kv_events``. No trio, no zmq.

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

Two paths, one meaning: a typed msgspec decode (``cortex.events.decoder_typed``: fast,
validates token ranges in C) handles the common single-era batches of known events; anything
it rejects goes to the generic decode with hand validation (``cortex.events.decoder_generic``),
which is the reference. Both build their events through ``cortex.events.decoder_semantics``.
Whenever the typed path succeeds its result equals the generic path's (checked by
tests/property/test_decoder_fuzz.py).
"""

from __future__ import annotations

from cortex.errors import DecodeError
from cortex.events.decoder_generic import decode_generic
from cortex.events.decoder_typed import decode_typed
from cortex.ledger.kv_events import EngineFamily, EventBatch

__all__ = ["decode_payload"]


def decode_payload(payload: bytes, family: EngineFamily) -> EventBatch:
    """Decode one batch payload (either era, or both mixed) published by ``family``."""
    if type(payload) is not bytes:
        if not isinstance(payload, (bytearray, memoryview)):
            raise DecodeError(f"payload is {type(payload).__name__}, not bytes")
        payload = bytes(payload)
    fast = decode_typed(payload, family)
    if fast is not None:
        return fast
    return decode_generic(payload, family)
