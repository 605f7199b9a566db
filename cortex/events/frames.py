"""Sans-IO framing of the engines' ZeroMQ KV-event messages (kv-events.md §2 and §6).

Rules:

* A live message is exactly ``[topic, seq(8 bytes BE), payload]``. A replay reply, as a DEALER
  receives it, is ``[b"", topic, seq, payload]`` (new generation) or ``[b"", seq, payload]``
  (old); its end is recognised by the seq frame ``ff`` x 8 alone (with an empty payload frame).
* The only exception raised on bad frames is ``cortex.errors.DecodeError``
  (``encode_replay_request`` raises ``ValueError`` for a caller's out-of-range argument).
  Payloads stay undecoded here: ``cortex.events.decoder`` decodes them.
"""

from __future__ import annotations

from collections.abc import Sequence

from cortex.errors import DecodeError
from cortex.ledger.kv_events import REPLAY_END_SEQ, U64_MASK, LiveMessage, ReplayEnd, ReplayItem

_SEQ_LEN = 8


def _frame_bytes(frame: object, what: str) -> bytes:
    if type(frame) is bytes:
        return frame
    if isinstance(frame, (bytes, bytearray, memoryview)):
        return bytes(frame)
    raise DecodeError(f"{what} frame is {type(frame).__name__}, not bytes")


def _frame_list(frames: Sequence[bytes], what: str) -> list[bytes]:
    try:
        items = list(frames)
    except TypeError:
        raise DecodeError(f"{what} is not a sequence of frames") from None
    return [_frame_bytes(f, what) for f in items]


def _seq(frame: bytes, what: str) -> int:
    if len(frame) != _SEQ_LEN:
        raise DecodeError(f"{what} sequence frame has {len(frame)} bytes, expected 8")
    return int.from_bytes(frame, "big")


def parse_live_frames(frames: Sequence[bytes]) -> LiveMessage:
    """Split a live PUB message ``[topic, seq, payload]``; the payload stays undecoded."""
    parts = _frame_list(frames, "live message")
    if len(parts) != 3:
        raise DecodeError(f"live message has {len(parts)} frames, expected 3")
    topic, seq, payload = parts
    return LiveMessage(topic=topic, seq=_seq(seq, "live message"), payload=payload)


def parse_replay_reply(frames: Sequence[bytes]) -> ReplayItem | ReplayEnd:
    """One replay reply as a DEALER receives it (either generation, see the module rules)."""
    parts = _frame_list(frames, "replay reply")
    if len(parts) == 4:
        delimiter, topic, seq, payload = parts
        item_topic: bytes | None = topic
    elif len(parts) == 3:
        delimiter, seq, payload = parts
        item_topic = None
    else:
        raise DecodeError(f"replay reply has {len(parts)} frames, expected 3 or 4")
    if delimiter:
        raise DecodeError("replay reply does not start with the empty delimiter frame")
    if seq == REPLAY_END_SEQ:
        if payload:
            raise DecodeError("replay end marker carries a non-empty payload frame")
        return ReplayEnd()
    return ReplayItem(seq=_seq(seq, "replay reply"), payload=payload, topic=item_topic)


def encode_replay_request(start_seq: int) -> list[bytes]:
    """The frames a DEALER sends to ask a replay ROUTER for every batch from ``start_seq``."""
    if type(start_seq) is not int or not 0 <= start_seq <= U64_MASK:
        raise ValueError(f"start_seq must be an int in [0, 2**64), got {start_seq!r}")
    return [b"", start_seq.to_bytes(_SEQ_LEN, "big")]
