"""Replica-sync messages as bytes (``cortex.replicas.wire``): every kind round-trips, keys keep
their values and order, and anything else is a ``WireError`` (counted by the shell, never
fatal)."""

from __future__ import annotations

from array import array

import pytest

from cortex.replicas import wire


@pytest.mark.parametrize("message", [
    wire.Routed("m", 7, "w1", wire.NO_RANK, 300, wire.keys_bytes(array("Q", [1, 2**64 - 1]), 0)),
    wire.PrefillDone("m", 7),
    wire.Finished("m", 7),
    wire.Heartbeat({"m": [1, 7], "other": []}),
])
def test_every_kind_round_trips(message):
    assert wire.decode(wire.encode([message])) == [message]


def test_a_batch_keeps_its_order():
    batch = [wire.Finished("m", 2), wire.Routed("m", 3, "w", 0, 1, b""), wire.Heartbeat({})]
    assert wire.decode(wire.encode(batch)) == batch


def test_what_came_and_went_within_a_batch_is_left_out():
    r = [wire.Routed("m", n, "w", 0, 1, b"") for n in range(4)]
    p = [wire.PrefillDone("m", n) for n in range(4)]
    f = [wire.Finished("m", n) for n in range(4)]
    beat = wire.Heartbeat({"m": [1]})
    batch = [p[0], r[1], r[2], p[1], p[2], beat, f[0], f[1], r[3], wire.Finished("other", 2)]
    # 0: its routed went out earlier, its end stands alone; 1: came and went; 2: still in
    # flight; 3: new; a request of another model with the same number is another request
    assert wire.coalesced(batch) == [r[2], p[2], beat, f[0], r[3], wire.Finished("other", 2)]
    assert wire.coalesced(batch[:3]) == batch[:3]  # nothing ended: the same list


def test_keys_from_a_start_keep_their_values():
    raw = wire.keys_bytes([5, 6, 7, 8], 2)
    assert list(wire.keys_of(raw)) == [7, 8]
    assert wire.keys_bytes(array("Q", [5, 6, 7]), 1) == wire.keys_bytes([6, 7], 0)


@pytest.mark.parametrize("payload", [
    b"", b"\xc1", b"\x93\x09\x01\x02",  # empty, invalid msgpack, an unknown tag
    wire.encode([wire.Finished("m", 1)])[:-1],  # cut short
    wire.encode([wire.Routed("m", 1, "w", 0, 1, b"123")]),  # keys not whole uint64s
    wire.encode([]),  # an empty batch
    wire.encode(wire.Finished("m", 1)),  # one event, not a batch
])
def test_anything_else_is_a_wire_error(payload):
    with pytest.raises(wire.WireError):
        wire.decode(payload)
