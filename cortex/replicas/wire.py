"""What replicas tell each other, as bytes: one ZeroMQ message of two frames — ``[peer id,
payload]`` — per batch of events, the payload a msgpack array of events, each an array tagged
by kind (msgspec). Batches amortize ZeroMQ's per-message cost: a replica sends what its event
loop's tick announced at once (``cortex.replicas.sync``).

* ``Routed(model, request, worker, rank, prefill_tokens, keys)``: ``keys`` the block keys the
  request will leave on its worker beyond what the ledger credited, as little-endian uint64
  bytes (8 per block); ``rank`` -1 when the engine picks the DP rank.
* ``PrefillDone(model, request)``, ``Finished(model, request)``.
* ``Heartbeat(in_flight)``: model -> the numbers of the sender's requests still in flight.

``decode`` raises ``WireError`` for anything else — a payload that is not a batch of these, or
an empty batch (counted by the shell, never fatal). Pure.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import msgspec

from cortex.errors import DecodeError

NO_RANK = -1


class Routed(msgspec.Struct, array_like=True, tag=1):
    model: str
    request: int
    worker: str
    rank: int
    prefill_tokens: int
    keys: bytes


class PrefillDone(msgspec.Struct, array_like=True, tag=2):
    model: str
    request: int


class Finished(msgspec.Struct, array_like=True, tag=3):
    model: str
    request: int


class Heartbeat(msgspec.Struct, array_like=True, tag=4):
    in_flight: dict[str, list[int]]


Message = Routed | PrefillDone | Finished | Heartbeat

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(list[Message])


class WireError(DecodeError):
    """A replica message that is not one of ours."""


def encode(messages: Sequence[Message]) -> bytes:
    """One batch (in the order given: a peer applies it in that order)."""
    return _encoder.encode(messages)


def decode(payload: bytes) -> list[Message]:
    try:
        messages = _decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise WireError(f"replica message: {error}") from None
    if not messages:
        raise WireError("replica message: an empty batch")
    for message in messages:
        if isinstance(message, Routed) and len(message.keys) % 8:
            raise WireError("replica message: keys are not whole uint64s")
    return messages


def coalesced(messages: list[Message]) -> list[Message]:
    """``messages`` without what peers need never hear: every event of a request routed and
    finished within them (it came and went between two batches), and the ``PrefillDone`` of one
    finished within them (``Finished`` implies it). Order otherwise kept."""
    ended = {(m.model, m.request) for m in messages if isinstance(m, Finished)}
    if not ended:
        return messages
    came_and_went = {(m.model, m.request) for m in messages
                     if isinstance(m, Routed) and (m.model, m.request) in ended}
    return [m for m in messages if isinstance(m, Heartbeat)
            or (m.model, m.request) not in ended
            or ((m.model, m.request) not in came_and_went and isinstance(m, Finished))]


def keys_bytes(keys: object, start: int) -> bytes:
    """``keys[start:]`` (an ``array('Q')`` or a sequence of ints) as uint64 bytes."""
    tail = keys[start:]  # type: ignore[index]
    if not isinstance(tail, array) or tail.typecode != "Q":
        tail = array("Q", tail)
    return tail.tobytes()


def keys_of(raw: bytes) -> array[int]:
    out = array("Q")
    out.frombytes(raw)
    return out
