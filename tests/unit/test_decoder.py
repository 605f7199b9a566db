"""Decoder behaviour beyond the golden fixtures: counting, reproducibility, malformed input."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from cortex.errors import DecodeError
from cortex.events.decoder import decode_payload
from cortex.events.decoder_generic import decode_generic
from cortex.events.decoder_typed import decode_typed
from cortex.events.frames import encode_replay_request, parse_live_frames, parse_replay_reply
from cortex.ledger.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineFamily,
    EventBatch,
    ReplayEnd,
    ReplayItem,
)
from tests.unit.test_decoder_invariants import assert_model_invariants

VLLM, SGLANG = EngineFamily.VLLM, EngineFamily.SGLANG
TS = 1767225600.0
TOKENS = [1, 2, 3, 4, 5, 6, 7, 8]
pack = msgspec.msgpack.encode


def vllm_map(**changes: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": "BlockStored",
        "block_hashes": [11, 12],
        "parent_block_hash": None,
        "token_ids": list(TOKENS),
        "block_size": 4,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None, None],
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }
    event.update(changes)
    return {k: v for k, v in event.items() if v is not DROP}


DROP = object()


def vllm_array(*, extra: tuple[Any, ...] = (), **changes: Any) -> list[Any]:
    fields = vllm_map(**changes)
    names = [
        "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
        "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
    ]  # fmt: skip
    return ["BlockStored", *[fields.get(n) for n in names], None, *extra]


def sglang_array(*rest: Any, hashes: list[int] | None = None) -> list[Any]:
    hashes = hashes or [-5, 7]
    return ["BlockStored", hashes, None, list(range(4 * len(hashes))), 4, None, "GPU", *rest]


def batch(*events: Any, rank: Any = 0) -> bytes:
    return pack([TS, list(events), rank])


def decode(payload: bytes, family: EngineFamily = VLLM) -> EventBatch:
    """decode_payload, checking invariants and that both paths agree whenever both succeed."""
    result = decode_payload(payload, family)
    assert_model_invariants(result)
    assert decode_generic(payload, family) == result
    typed = decode_typed(payload, family)
    assert typed is None or typed == result
    return result


def only_stored(result: EventBatch) -> BlockStored:
    (event,) = result.events
    assert isinstance(event, BlockStored)
    return event


# --- eras, counting -----------------------------------------------------------------------------


def test_both_eras_mixed_in_one_batch() -> None:
    result = decode(
        batch(vllm_map(), vllm_array(), {"type": "AllBlocksCleared"}, ["BlockRemoved", [3]])
    )
    stored_map, stored_array, cleared, removed = result.events
    assert stored_map == stored_array
    assert isinstance(cleared, AllBlocksCleared)
    assert removed == BlockRemoved([3], None, None)
    assert decode_typed(batch(vllm_map(), vllm_array()), VLLM) is None  # mixed: generic path


def test_unknown_tags_are_skipped_and_counted() -> None:
    result = decode(
        batch({"type": "BlockPinned", "x": 1}, ["FutureEvent", 1, 2], vllm_map(), ["Nope"])
    )
    assert result.unknown_events == 3
    assert result.unknown_fields == 0
    assert len(result.events) == 1 and isinstance(result.events[0], BlockStored)


def test_unknown_map_keys_are_counted_known_unused_ones_are_not() -> None:
    known = vllm_map(session_id="s1", locality="LOCAL", ownership="kvcr",
                     kv_cache_spec_sliding_window=128)  # fmt: skip
    assert decode(batch(known)).unknown_fields == 0
    result = decode(
        batch(vllm_map(new_field=1, other=[1, 2]), {"type": "AllBlocksCleared", "z": 0})
    )
    assert result.unknown_fields == 3
    assert only_stored(decode(batch(vllm_map(new_field=1)))) == only_stored(
        decode(batch(vllm_map()))
    )


def test_a_field_of_the_other_family_counts_as_unknown_and_is_ignored() -> None:
    assert decode(batch(vllm_map(cache_salt="s")), VLLM).unknown_fields == 1
    assert only_stored(decode(batch(vllm_map(cache_salt="s")), VLLM)).cache_salt is None
    sglang_removed = {"type": "BlockRemoved", "block_hashes": [1], "group_idx": 5}
    result = decode(batch(sglang_removed), SGLANG)
    assert result.unknown_fields == 1
    assert result.events == (BlockRemoved([1], None, None),)


def test_extra_trailing_elements_are_counted() -> None:
    result = decode(batch(vllm_array(extra=(None, None, None, None, "x")), ["AllBlocksCleared", 1]))
    assert result.unknown_fields == 2  # position 16 of vLLM's BlockStored; AllBlocksCleared's 1
    assert decode(pack([TS, [], 0, "extra", 5])).unknown_fields == 2
    assert decode(batch(["BlockRemoved", [1], "GPU", 7]), SGLANG).unknown_fields == 1


def test_short_arrays_of_older_versions_decode() -> None:
    six = ["BlockStored", [1], None, [1, 2], 2, None]  # vLLM 0.9 - 0.10.1
    event = only_stored(decode(batch(six)))
    assert (event.medium, event.group_idx, event.kv_cache_spec_kind) == (None, None, None)
    assert decode(batch(["BlockRemoved", [1]])).events == (BlockRemoved([1]),)


def test_missing_rank_is_none() -> None:
    assert decode(pack([TS, [vllm_map()]])).dp_rank is None
    assert decode(pack([TS, [vllm_map()], None])).dp_rank is None


# --- hashes -------------------------------------------------------------------------------------


def test_signed_hashes_become_twos_complement() -> None:
    event = only_stored(decode(batch(sglang_array(hashes=[-1, -(2**63), 2**63])), SGLANG))
    assert event.block_hashes == [2**64 - 1, 2**63, 2**63]
    assert decode(batch({"type": "BlockRemoved", "block_hashes": [-2]}), SGLANG).events == (
        BlockRemoved([2**64 - 2]),
    )


def test_binary_hashes_use_their_last_eight_bytes() -> None:
    digest32 = bytes(range(32))
    digest16 = bytes(range(100, 116))
    event = only_stored(
        decode(batch(vllm_map(block_hashes=[digest32, digest16], parent_block_hash=digest16)))
    )
    assert event.block_hashes == [
        int.from_bytes(digest32, "big") % 2**64,
        int.from_bytes(digest16, "big") % 2**64,
    ]
    assert event.parent_hash == int.from_bytes(digest16[8:], "big")
    mixed = only_stored(decode(batch(vllm_map(block_hashes=[5, digest32]))))
    assert mixed.block_hashes[0] == 5


# --- cache salt, LoRA, reproducibility ----------------------------------------------------------


def test_vllm_salt_and_lora_from_extra_keys() -> None:
    event = only_stored(decode(batch(vllm_map(lora_name="ad", lora_id=3,
                                              extra_keys=[["ad", "salt-1"], ["ad"]]))))  # fmt: skip
    assert (event.lora_name, event.lora_id, event.cache_salt, event.reproducible) == (
        "ad",
        3,
        "salt-1",
        True,
    )
    salt_only = only_stored(decode(batch(vllm_map(extra_keys=[["salt-2"], None]))))
    assert (salt_only.cache_salt, salt_only.reproducible) == ("salt-2", True)


@pytest.mark.parametrize(
    "extra_keys",
    [
        [[["mm-hash", 0]], None],  # multimodal item [identifier, offset]
        [None, [["mm-hash", 2]]],
        [[b"\x01" * 32], [b"\x02" * 32]],  # prompt-embeds digests
        [None, ["old-style-mm-id"]],  # a string after block 0
        [["salt", "mm-id"], None],  # block 0 holds more than one string
        [None],  # not one entry per block
    ],
)
def test_extra_keys_cortex_cannot_reproduce(extra_keys: list[Any]) -> None:
    event = only_stored(decode(batch(vllm_map(extra_keys=extra_keys))))
    assert event.reproducible is False
    assert list(event.token_ids) == []
    assert event.block_hashes == [11, 12]


def test_lora_name_not_stripped_elsewhere_is_not_a_salt() -> None:
    event = only_stored(decode(batch(vllm_map(lora_name="ad", extra_keys=[["other", "ad"], None]))))
    assert event.reproducible is False


def test_eagle_bigram_tokens_are_not_reproducible() -> None:
    pairs = [[t, t + 1] for t in TOKENS]
    event = only_stored(decode(batch(["BlockStored", [1, 2], None, pairs, 4, None, "GPU"]), SGLANG))
    assert (event.reproducible, list(event.token_ids)) == (False, [])


def test_lookahead_tokens_are_not_reproducible() -> None:
    event = only_stored(decode(batch(vllm_map(lookahead_token_ids=[[9], [10]]))))
    assert (event.reproducible, list(event.token_ids)) == (False, [])
    plain = only_stored(decode(batch(vllm_map(lookahead_token_ids=None))))
    assert plain.reproducible is True


def test_sglang_salt_in_both_eras() -> None:
    array = only_stored(decode(batch(sglang_array({"cache_salt": "t"})), SGLANG))
    mapped = {"type": "BlockStored", "block_hashes": [-5, 7], "parent_block_hash": None,
              "token_ids": TOKENS, "block_size": 4, "cache_salt": "t", "lora_name": "l",
              "session_id": "s"}  # fmt: skip
    result = decode(batch(mapped), SGLANG)
    assert array.cache_salt == only_stored(result).cache_salt == "t"
    assert only_stored(result).lora_name == "l"
    assert result.unknown_fields == 0
    with_type = decode(
        batch(sglang_array({"type": "BlockStoredMetadata", "cache_salt": "t"})), SGLANG
    )
    assert with_type.unknown_fields == 1 and only_stored(with_type).cache_salt == "t"
    assert only_stored(decode(batch(sglang_array(None)), SGLANG)).cache_salt is None


def test_sglang_map_key_metadata_is_unknown_not_a_salt() -> None:
    mapped = {
        "type": "BlockStored",
        "block_hashes": [1],
        "parent_block_hash": None,
        "token_ids": [1, 2, 3, 4],
        "block_size": 4,
        "metadata": {"cache_salt": "t"},
    }
    result = decode(batch(mapped), SGLANG)
    assert result.unknown_fields == 1 and only_stored(result).cache_salt is None


# --- malformed input ----------------------------------------------------------------------------

HEAD = bytes.fromhex("93cb41da556e40000000")  # array(3), float64 ts
BAD_PAYLOADS: dict[str, bytes] = {
    "empty": b"",
    "not msgpack": b"\xc1",
    "truncated": batch(vllm_map())[:-5],
    "trailing bytes": batch(vllm_map()) + b"\x00",
    "top is a map": pack({"ts": TS, "events": []}),
    "top too short": pack([TS]),
    "ts is a string": pack(["now", [], 0]),
    "ts is a bool": pack([True, [], 0]),
    "ts is nan": pack([float("nan"), [], 0]),
    "ts is inf": pack([float("inf"), [], 0]),
    "events is a map": pack([TS, {}, 0]),
    "event is an int": batch(5),
    "event is an empty array": batch([]),
    "event tag is an int": batch([1, [1]]),
    "map event without type": batch({"block_hashes": [1]}),
    "map event type nil": batch({"type": None}),
    "map event type an array": batch({"type": ["BlockStored"]}),
    "map event type an int": batch({"type": 1}),
    "hashes nil": batch(vllm_map(block_hashes=None)),
    "hashes missing": batch(vllm_map(block_hashes=DROP)),
    "hashes empty": batch(vllm_map(block_hashes=[], token_ids=[])),
    "hashes a string": batch(vllm_map(block_hashes="ab")),
    "hash a float": batch(vllm_map(block_hashes=[1.0, 2])),
    "hash a bool": batch(vllm_map(block_hashes=[True, 2])),
    "hash a short bin": batch(vllm_map(block_hashes=[b"1234567", 2])),
    "hash a string": batch(vllm_map(block_hashes=["aa", 2])),
    "parent a string": batch(vllm_map(parent_block_hash="p")),
    "parent a list": batch(vllm_map(parent_block_hash=[1])),
    "tokens nil": batch(vllm_map(token_ids=None)),
    "tokens missing": batch(vllm_map(token_ids=DROP)),
    "tokens too few": batch(vllm_map(token_ids=TOKENS[:-1])),
    "tokens too many": batch(vllm_map(token_ids=[*TOKENS, 9])),
    "token negative": batch(vllm_map(token_ids=[-1, *TOKENS[1:]])),
    "token too big": batch(vllm_map(token_ids=[2**32, *TOKENS[1:]])),
    "token a float": batch(vllm_map(token_ids=[1.0, *TOKENS[1:]])),
    "token a bool": batch(vllm_map(token_ids=[True, *TOKENS[1:]])),
    "token a string": batch(vllm_map(token_ids=["a", *TOKENS[1:]])),
    "bigram pair too long": batch(vllm_map(token_ids=[[1, 2, 3]] * 8)),
    "bigram pair out of range": batch(vllm_map(token_ids=[[1, 2**32]] * 8)),
    "block size zero": batch(vllm_map(block_size=0, token_ids=[])),
    "block size negative": batch(vllm_map(block_size=-4)),
    "block size nil": batch(vllm_map(block_size=None)),
    "block size a bool": batch(vllm_map(block_size=True, block_hashes=[1], token_ids=[1])),
    "block size too big": batch(vllm_map(block_size=2**32, token_ids=[])),
    "block size a float": batch(vllm_map(block_size=4.0)),
    "medium an int": batch(vllm_map(medium=1)),
    "lora name a bin": batch(vllm_map(lora_name=b"x")),
    "lora id negative": batch(vllm_map(lora_id=-1)),
    "lora id a string": batch(vllm_map(lora_id="1")),
    "group idx a string": batch(vllm_map(group_idx="0")),
    "kind an int": batch(vllm_map(kv_cache_spec_kind=3)),
    "extra keys a string": batch(vllm_map(extra_keys="x")),
    "extra keys entry an int": batch(vllm_map(extra_keys=[1, None])),
    "lookahead a string": batch(vllm_map(lookahead_token_ids="x")),
    "sglang metadata a string": batch(sglang_array("salt")),
    "sglang salt an int": batch(sglang_array({"cache_salt": 1})),
    "removed hashes nil": batch(["BlockRemoved", None, "GPU"]),
    "removed hashes missing": batch({"type": "BlockRemoved", "medium": "GPU"}),
    "removed medium an int": batch(["BlockRemoved", [1], 5]),
    "rank negative": batch(vllm_map(), rank=-1),
    "rank a string": batch(vllm_map(), rank="0"),
    "rank a bool": batch(vllm_map(), rank=False),
    "invalid utf-8 string": HEAD + b"\x91\x91\xa2\xff\xfe\x00",
    "deep nesting in events": HEAD + b"\x91" * 50_000 + b"\xc0\x00",
    "deep nesting in an unused field": batch(vllm_map(session_id="@MARK@")).replace(
        b"\xa6@MARK@", b"\x91" * 50_000 + b"\xc0"
    ),
    "huge array header": HEAD + b"\xdd\xff\xff\xff\xff\xc0",
    "huge bin header": HEAD + b"\x91\x92\xacBlockRemoved\x91\xc6\xff\xff\xff\xf0",
    "timestamp ext as ts": pack([msgspec.msgpack.Ext(5, b"x"), [], 0]),
    "bad timestamp ext": HEAD + b"\x91\x92\xacBlockRemoved\xd4\xff\x00" + b"\x00",
}


def test_deep_payloads_really_are_deep() -> None:
    for name in ("deep nesting in events", "deep nesting in an unused field"):
        assert b"\x91" * 50_000 in BAD_PAYLOADS[name]


# Malformed for one family only: vLLM-only fields are unknown (ignored) in SGLang events, and
# SGLang's array position 7 is vLLM's lora_name.
ONLY_FOR = {
    "extra keys a string": VLLM,
    "extra keys entry an int": VLLM,
    "group idx a string": VLLM,
    "kind an int": VLLM,
    "lookahead a string": VLLM,
    "sglang metadata a string": SGLANG,
}


def test_family_specific_cases_are_fine_for_the_other_family() -> None:
    for name, family in ONLY_FOR.items():
        other = SGLANG if family is VLLM else VLLM
        assert len(decode(BAD_PAYLOADS[name], other).events) == 1


@pytest.mark.parametrize(
    ("name", "family"),
    [(n, f) for n in sorted(BAD_PAYLOADS) for f in (VLLM, SGLANG) if ONLY_FOR.get(n, f) is f],
)
def test_malformed_payloads_raise_decode_error(name: str, family: EngineFamily) -> None:
    payload = BAD_PAYLOADS[name]
    with pytest.raises(DecodeError):
        decode_payload(payload, family)
    with pytest.raises(DecodeError):
        decode_generic(payload, family)


def test_payload_must_be_bytes_like() -> None:
    with pytest.raises(DecodeError):
        decode_payload("text", VLLM)  # type: ignore[arg-type]
    assert decode_payload(bytearray(batch(vllm_map())), VLLM) == decode_payload(
        memoryview(batch(vllm_map())), VLLM
    )


# --- frames -------------------------------------------------------------------------------------

SEQ7 = (7).to_bytes(8, "big")
END = b"\xff" * 8


def test_live_frames() -> None:
    live = parse_live_frames([b"", SEQ7, b"payload"])
    assert (live.topic, live.seq, live.payload) == (b"", 7, b"payload")
    assert parse_live_frames([b"kv", END, b"p"]).seq == 2**64 - 1


@pytest.mark.parametrize(
    "frames",
    [
        [],
        [b"kv", SEQ7],
        [b"kv", SEQ7, b"p", b"x"],
        [b"kv", SEQ7[1:], b"p"],
        [b"kv", SEQ7 + b"\x00", b"p"],
        [b"kv", SEQ7, "p"],
        [b"kv", 7, b"p"],
        None,
        5,
    ],
)
def test_bad_live_frames(frames: Any) -> None:
    with pytest.raises(DecodeError):
        parse_live_frames(frames)


def test_replay_replies_of_both_generations() -> None:
    assert parse_replay_reply([b"", b"kv", SEQ7, b"p"]) == ReplayItem(7, b"p", b"kv")
    assert parse_replay_reply([b"", b"", SEQ7, b"p"]) == ReplayItem(7, b"p", b"")  # empty topic
    assert parse_replay_reply([b"", SEQ7, b"p"]) == ReplayItem(7, b"p", None)
    assert parse_replay_reply([b"", b"", END, b""]) == ReplayEnd()
    assert parse_replay_reply([b"", END, b""]) == ReplayEnd()


@pytest.mark.parametrize(
    "frames",
    [
        [b"", SEQ7],
        [b"", b"kv", SEQ7, b"p", b""],
        [b"x", SEQ7, b"p"],
        [b"x", b"kv", SEQ7, b"p"],
        [b"", END, b"p"],
        [b"", b"", END, b"p"],
        [b"", b"kv", SEQ7[:4], b"p"],
        [b"", b"\xff" * 7, b""],
        [b"", b"", b"", b""],
        [b"", None, b""],
        None,
    ],
)
def test_bad_replay_replies(frames: Any) -> None:
    with pytest.raises(DecodeError):
        parse_replay_reply(frames)


def test_replay_request() -> None:
    assert encode_replay_request(0) == [b"", bytes(8)]
    assert encode_replay_request(2**64 - 1) == [b"", END]
    assert encode_replay_request(258) == [b"", b"\x00" * 6 + b"\x01\x02"]
    for bad in (-1, 2**64, True, 1.0):
        with pytest.raises(ValueError):
            encode_replay_request(bad)  # type: ignore[arg-type]
