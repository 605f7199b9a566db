"""The model invariants every decoded value must satisfy, as one reusable checker.

``assert_model_invariants`` is imported by the decoder's fixture and fuzz tests; the tests
below show that it really rejects each kind of violation (so a green fuzz run means something).
"""

from __future__ import annotations

import math
from array import array

import pytest

from cortex.ledger.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch

U64 = 1 << 64
U32 = 1 << 32


def _is_int(value: object) -> bool:
    return type(value) is int


def _check_hash(value: object, what: str) -> None:
    assert type(value) is int and 0 <= value < U64, f"{what}: {value!r} is not a u64 int"


def _check_opt_str(value: object, what: str) -> None:
    assert value is None or type(value) is str, f"{what}: {value!r}"


def _check_opt_nonneg_int(value: object, what: str) -> None:
    assert value is None or (type(value) is int and value >= 0), f"{what}: {value!r}"


def assert_model_invariants(batch: object) -> None:
    assert type(batch) is EventBatch, f"not an EventBatch: {batch!r}"
    assert type(batch.ts) is float and math.isfinite(batch.ts), f"ts {batch.ts!r}"
    _check_opt_nonneg_int(batch.dp_rank, "dp_rank")
    for counter in (batch.unknown_events, batch.unknown_fields):
        assert _is_int(counter) and counter >= 0, f"counter {counter!r}"
    assert type(batch.events) is tuple
    for event in batch.events:
        if type(event) is BlockStored:
            assert type(event.block_hashes) is list and event.block_hashes, "no block hashes"
            for h in event.block_hashes:
                _check_hash(h, "block hash")
            if event.parent_hash is not None:
                _check_hash(event.parent_hash, "parent hash")
            assert _is_int(event.block_size) and event.block_size >= 1, event.block_size
            assert type(event.token_ids) is array and event.token_ids.typecode == "I"
            for t in event.token_ids:
                assert _is_int(t) and 0 <= t < U32, f"token {t!r}"
            expected = len(event.block_hashes) * event.block_size
            assert type(event.reproducible) is bool
            if event.reproducible:
                assert len(event.token_ids) == expected, "token count != blocks * block_size"
            else:
                assert len(event.token_ids) in (0, expected), "bad token count"
            for name in ("medium", "lora_name", "cache_salt", "kv_cache_spec_kind"):
                _check_opt_str(getattr(event, name), name)
            _check_opt_nonneg_int(event.lora_id, "lora_id")
            _check_opt_nonneg_int(event.group_idx, "group_idx")
        elif type(event) is BlockRemoved:
            assert type(event.block_hashes) is list
            for h in event.block_hashes:
                _check_hash(h, "removed hash")
            _check_opt_str(event.medium, "medium")
            _check_opt_nonneg_int(event.group_idx, "group_idx")
        else:
            assert type(event) is AllBlocksCleared, f"unexpected event {event!r}"


def _stored(**changes: object) -> BlockStored:
    fields: dict[str, object] = {
        "block_hashes": [1, 2], "parent_hash": None, "token_ids": [1, 2, 3, 4], "block_size": 2
    }
    fields.update(changes)
    tokens = fields["token_ids"]
    if isinstance(tokens, list) and all(type(t) is int and 0 <= t < U32 for t in tokens):
        fields["token_ids"] = array("I", tokens)  # what the decoder gives
    return BlockStored(**fields)  # type: ignore[arg-type]


def _batch(*events: object, **changes: object) -> EventBatch:
    fields: dict[str, object] = {"ts": 1.0, "events": events, "dp_rank": 0}
    fields.update(changes)
    return EventBatch(**fields)  # type: ignore[arg-type]


def test_a_valid_batch_passes() -> None:
    assert_model_invariants(
        _batch(_stored(), BlockRemoved([U64 - 1]), AllBlocksCleared(), dp_rank=None)
    )
    assert_model_invariants(_batch(_stored(token_ids=[], reproducible=False)))


@pytest.mark.parametrize(
    "batch",
    [
        _batch(_stored(block_hashes=[])),
        _batch(_stored(block_hashes=[-1])),
        _batch(_stored(block_hashes=[U64])),
        _batch(_stored(block_hashes=[True])),
        _batch(_stored(parent_hash=b"12345678")),
        _batch(_stored(token_ids=[1, 2, 3])),
        _batch(_stored(token_ids=[1, 2, 3, U32])),
        _batch(_stored(token_ids=[1, 2, 3, -1])),
        _batch(_stored(token_ids=[1, 2, 3, 4.0])),
        _batch(_stored(token_ids=[1], reproducible=False)),
        _batch(_stored(block_size=0, token_ids=[])),
        _batch(_stored(medium=1)),
        _batch(_stored(lora_id=-1)),
        _batch(BlockRemoved([U64])),
        _batch(BlockRemoved([1], group_idx=-2)),
        _batch("AllBlocksCleared"),
        _batch(ts=float("nan")),
        _batch(ts=1),
        _batch(dp_rank=-1),
        _batch(dp_rank=True),
        EventBatch(1.0, (), 0, unknown_events=-1),
    ],
)
def test_each_violation_is_caught(batch: EventBatch) -> None:
    with pytest.raises(AssertionError):
        assert_model_invariants(batch)
