"""What replicas tell each other, as bytes: one ZeroMQ message per event, two frames —
``[peer id, payload]`` — the payload a msgpack array tagged by kind (msgspec).

* ``Routed(model, request, worker, rank, prefill_tokens, keys)``: ``keys`` the block keys the
  request will leave on its worker beyond what the ledger credited, as little-endian uint64
  bytes (8 per block); ``rank`` -1 when the engine picks the DP rank.
* ``PrefillDone(model, request)``, ``Finished(model, request)``.
* ``Heartbeat(in_flight)``: model -> the numbers of the sender's requests still in flight.

``decode`` raises ``WireError`` for anything else (counted by the shell, never fatal). Pure.
"""

from __future__ import annotations

from array import array

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
_decoder = msgspec.msgpack.Decoder(Message)


class WireError(DecodeError):
    """A replica message that is not one of ours."""


def encode(message: Message) -> bytes:
    return _encoder.encode(message)


def decode(payload: bytes) -> Message:
    try:
        message = _decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise WireError(f"replica message: {error}") from None
    if isinstance(message, Routed) and len(message.keys) % 8:
        raise WireError("replica message: keys are not whole uint64s")
    return message


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
