"""Fuzzing the wire decoder: whatever comes in, it returns a value that satisfies the model
invariants or raises DecodeError — nothing else escapes. And the typed fast path never changes
a result: ``decode_payload`` always equals the generic reference path ``decode_generic``.
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cortex.errors import DecodeError
from cortex.events.decoder import decode_payload
from cortex.events.decoder_generic import decode_generic
from cortex.events.frames import parse_live_frames, parse_replay_reply
from cortex.ledger.kv_events import EngineFamily, EventBatch, LiveMessage, ReplayEnd, ReplayItem
from tests.conftest import shared_dir
from tests.unit.test_decoder_invariants import assert_model_invariants

FIXTURES = shared_dir() / "fixtures" / "kv-events"
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
pack = msgspec.msgpack.encode


def _fixture_payloads() -> list[bytes]:
    files = sorted(FIXTURES.glob("*/payloads/*.msgpack")) + sorted(
        FIXTURES.glob("*/variants/*.msgpack")
    )
    return [f.read_bytes() for f in files]


def _fixture_replies() -> list[list[bytes]]:
    import json

    replies: list[list[bytes]] = []
    for path in sorted(FIXTURES.glob("*/replay.json")):
        for reply in json.loads(path.read_text())["reply_frames_hex"]:
            replies.append([bytes.fromhex(f) for f in reply])
    return replies


def _synthetic_batches() -> list[bytes]:
    """Valid payloads the fixtures do not cover: bigram, lookahead, multimodal, mixed eras."""
    stored = {
        "type": "BlockStored",
        "block_hashes": [1, -2],
        "parent_block_hash": b"\x01" * 32,
        "token_ids": [1, 2, 3, 4],
        "block_size": 2,
        "lora_name": "ad",
        "extra_keys": [["ad", "salt"], ["ad", ["mm", 3]]],
        "lookahead_token_ids": None,
    }
    bigram = [
        "BlockStored",
        [5],
        None,
        [[1, 2], [2, 3]],
        2,
        None,
        "CPU_PINNED",
        {"cache_salt": "s"},
    ]
    lookahead = dict(stored, lookahead_token_ids=[[7], [8]], extra_keys=None)
    return [
        pack([1.5, [stored, bigram, ["AllBlocksCleared"], {"type": "Future", "a": 1}], 2]),
        pack([2, [lookahead, ["BlockRemoved", [b"\x02" * 16], "GPU", 0, "LOCAL", None, "x"]]]),
    ]


PAYLOADS = _fixture_payloads() + _synthetic_batches()
REPLIES = _fixture_replies()
FAMILIES = st.sampled_from(list(EngineFamily))


def check_payload(payload: bytes, family: EngineFamily) -> EventBatch | None:
    """The property: a valid batch or DecodeError, and the same outcome as the reference."""
    try:
        result: EventBatch | None = decode_payload(payload, family)
    except DecodeError:
        result = None
    else:
        assert_model_invariants(result)
    try:
        reference: EventBatch | None = decode_generic(payload, family)
    except DecodeError:
        reference = None
    assert result == reference
    return result


def test_the_corpus_is_valid() -> None:
    """Mutations start from payloads that decode (so the near-valid cases are near valid)."""
    assert len(PAYLOADS) > 30
    for payload in PAYLOADS:
        results = [check_payload(payload, family) for family in EngineFamily]
        assert any(r is not None for r in results)


# --- byte-level -------------------------------------------------------------------------------


@st.composite
def mutated(draw: st.DrawFn, corpus: list[bytes]) -> bytes:
    data = bytearray(draw(st.sampled_from(corpus)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "splice", "byte"]))
        at = draw(st.integers(0, len(data)))
        if op == "flip" and data:
            i = min(at, len(data) - 1)
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "byte" and data:
            data[min(at, len(data) - 1)] = draw(st.integers(0, 255))
        elif op == "truncate":
            del data[at:]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[at : at + draw(st.integers(1, 8))]
        elif op == "splice":
            other = draw(st.sampled_from(corpus))
            start = draw(st.integers(0, len(other)))
            data[at:] = other[start:]
    return bytes(data)


@FUZZ
@given(payload=st.binary(max_size=400), family=FAMILIES)
def test_random_bytes(payload: bytes, family: EngineFamily) -> None:
    check_payload(payload, family)


@FUZZ
@given(payload=mutated(PAYLOADS), family=FAMILIES)
def test_mutated_fixture_payloads(payload: bytes, family: EngineFamily) -> None:
    check_payload(payload, family)


# --- structure-level --------------------------------------------------------------------------

NAMES = ["type", "BlockStored", "BlockRemoved", "AllBlocksCleared", "block_hashes",
         "parent_block_hash", "token_ids", "block_size", "medium", "lora_name", "lora_id",
         "extra_keys", "group_idx", "kv_cache_spec_kind", "lookahead_token_ids", "cache_salt",
         "session_id", "GPU"]  # fmt: skip
EDGE_INTS = [0, 1, -1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, -(2**63), 2**64 - 1]
LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.sampled_from(EDGE_INTS)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(NAMES)
    | st.binary(max_size=40)
)
VALUES = st.recursive(
    LEAVES,
    lambda inner: (
        st.lists(inner, max_size=6)
        | st.dictionaries(
            st.sampled_from(NAMES) | st.text(max_size=6) | st.integers(-9, 2**64 - 1),
            inner,
            max_size=6,
        )
    ),
    max_leaves=40,
)


@FUZZ
@given(value=VALUES, family=FAMILIES)
def test_random_structures(value: Any, family: EngineFamily) -> None:
    check_payload(pack(value), family)


@settings(FUZZ, max_examples=80)
@given(ts=LEAVES, events=st.lists(VALUES, max_size=3), rank=LEAVES, family=FAMILIES)
def test_random_batches(ts: Any, events: list[Any], rank: Any, family: EngineFamily) -> None:
    check_payload(pack([ts, events, rank]), family)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(node, list):
        for i, child in enumerate(node):
            found += _paths(child, (*prefix, i))
    elif isinstance(node, dict):
        for key, child in node.items():
            found += _paths(child, (*prefix, key))
    return found


@st.composite
def near_valid(draw: st.DrawFn) -> bytes:
    """A valid batch with one node replaced, one map key or array element dropped, or one
    element appended."""
    tree = msgspec.msgpack.decode(draw(st.sampled_from(PAYLOADS)))
    path = draw(st.sampled_from(_paths(tree)))
    if not path:
        return pack(draw(VALUES))
    parent = tree
    for step in path[:-1]:
        parent = parent[step]
    op = draw(st.sampled_from(["replace", "replace", "drop", "append"]))
    if op == "replace":
        parent[path[-1]] = draw(VALUES)
    elif op == "drop":
        del parent[path[-1]]
    elif isinstance(parent, list):
        parent.append(draw(VALUES))
    else:
        parent[draw(st.sampled_from(NAMES) | st.text(max_size=6))] = draw(VALUES)
    return pack(tree)


@FUZZ
@given(payload=near_valid(), family=FAMILIES)
def test_near_valid_batches(payload: bytes, family: EngineFamily) -> None:
    check_payload(payload, family)


# --- frames -----------------------------------------------------------------------------------


@st.composite
def mutated_frames(draw: st.DrawFn, corpus: list[list[bytes]]) -> list[bytes]:
    frames = list(draw(st.sampled_from(corpus)))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["drop", "duplicate", "insert", "bytes"]))
        at = draw(st.integers(0, max(0, len(frames) - 1)))
        if op == "drop" and frames:
            del frames[at]
        elif op == "duplicate" and frames:
            frames.insert(at, frames[at])
        elif op == "insert":
            frames.insert(at, draw(st.binary(max_size=10) | st.just(b"\xff" * 8)))
        elif op == "bytes" and frames:
            frames[at] = draw(mutated([frames[at] or b"\x00"]))
    return frames


LIVE = [[b"kv", (i).to_bytes(8, "big"), p] for i, p in enumerate(PAYLOADS[:10])]


def check_live(frames: list[bytes], family: EngineFamily) -> None:
    try:
        live = parse_live_frames(frames)
    except DecodeError:
        return
    assert type(live) is LiveMessage
    assert type(live.topic) is bytes and type(live.payload) is bytes
    assert type(live.seq) is int and 0 <= live.seq < 2**64
    check_payload(live.payload, family)


def check_replay(frames: list[bytes], family: EngineFamily) -> None:
    try:
        reply = parse_replay_reply(frames)
    except DecodeError:
        return
    if isinstance(reply, ReplayEnd):
        assert frames[-2] == b"\xff" * 8
        return
    assert type(reply) is ReplayItem
    assert type(reply.seq) is int and 0 <= reply.seq < 2**64 - 1
    assert reply.topic is None or type(reply.topic) is bytes
    assert (reply.topic is None) == (len(frames) == 3)
    check_payload(reply.payload, family)


@FUZZ
@given(frames=mutated_frames(LIVE) | st.lists(st.binary(max_size=12), max_size=5), family=FAMILIES)
def test_live_frames(frames: list[bytes], family: EngineFamily) -> None:
    check_live(frames, family)


@FUZZ
@given(
    frames=mutated_frames(REPLIES) | st.lists(st.binary(max_size=12), max_size=5), family=FAMILIES
)
def test_replay_frames(frames: list[bytes], family: EngineFamily) -> None:
    check_replay(frames, family)


# --- SGLang's one store per page (0.5.15): merged as decoded --------------------------------


@st.composite
def page_runs(draw: st.DrawFn) -> tuple[bytes, list[tuple[int, int | None, int, str | None]]]:
    """SGLang stores of one page each, chaining unless a step breaks the chain (a new root, a
    changed medium or salt, a binary hash, a removal between); both eras. Returns the payload
    and each store's (hash, parent, token, salt)."""
    map_era = draw(st.booleans())
    binary = draw(st.sampled_from([0, 0, 0, 1]))  # a binary hash sends the batch down the generic path
    events: list[Any] = []
    stores = []
    last: int | None = None
    for _ in range(draw(st.integers(1, 30))):
        block_hash = draw(st.integers(-(2**63), 2**63 - 1))
        parent = last
        salt = None
        medium = "GPU"
        brk = draw(st.sampled_from(["chain"] * 6 + ["root", "medium", "salt", "removal"]
                                   + ["bin"] * binary))
        if brk == "root":
            parent = None
        elif brk == "medium":
            medium = "CPU"
        elif brk == "salt":
            salt = "s"
        elif brk == "removal":
            events.append({"type": "BlockRemoved", "block_hashes": [7]} if map_era
                          else ["BlockRemoved", [7], None])
        token = draw(st.integers(0, 2**32 - 1))
        wire_parent: Any = parent if brk != "bin" or parent is None else (
            (parent & (2**64 - 1)).to_bytes(8, "big"))
        if map_era:
            events.append({"type": "BlockStored", "block_hashes": [block_hash],
                           "parent_block_hash": wire_parent, "token_ids": [token],
                           "block_size": 1, "lora_id": None, "medium": medium,
                           "cache_salt": salt})
        else:
            events.append(["BlockStored", [block_hash], wire_parent, [token], 1, None, medium]
                          + ([] if salt is None else [{"cache_salt": salt}]))
        stores.append((block_hash & (2**64 - 1), parent, token, salt))
        last = block_hash
    return pack([1.0, events, None]), stores


@FUZZ
@given(run=page_runs())
def test_sglang_page_runs_are_merged_without_changing_their_meaning(
    run: tuple[bytes, list[tuple[int, int | None, int, str | None]]],
) -> None:
    payload, stores = run
    batch = check_payload(payload, EngineFamily.SGLANG)
    assert batch is not None
    decoded = [e for e in batch.events if type(e).__name__ == "BlockStored"]
    assert [h for e in decoded for h in e.block_hashes] == [s[0] for s in stores]
    assert [t for e in decoded for t in e.token_ids] == [s[2] for s in stores]
    for event in decoded:  # a merged store is a chain: each page's parent is the page before
        assert len(event.token_ids) == len(event.block_hashes) * event.block_size
    firsts = {e.block_hashes[0] for e in decoded}
    for block_hash, parent, _, _ in stores:
        if block_hash not in firsts:
            assert parent is not None
