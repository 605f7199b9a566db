"""The simulator's wire encoder gives byte-identical payloads and frames to the real engines.

Every fixture payload (story and variants) is turned into model events by a small
fixture-only reader below, re-encoded with the folder's profile, and compared byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from cortex.ledger.kv_events import (
    REPLAY_END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineFamily,
    Event,
)
from cortex.sim.engine_hashes import low64
from cortex.sim.wire import (
    PROFILES,
    encode_batch,
    live_frames,
    parse_replay_request,
    profile_named,
    replay_data_frames,
    replay_end_frames,
    seq_frame,
)

U64 = (1 << 64) - 1
FOLDERS = {
    "vllm-0.33.0": "vllm-0.33",
    "vllm-0.23.0": "vllm-0.23",
    "sglang-0.5.23": "sglang-0.5.23",
    "sglang-0.5.19": "sglang-0.5.19",
}


class _Reader:
    """Fixture JSON (plain msgpack decoding) -> model events, plus raw digests if bin hashes."""

    def __init__(self, family: EngineFamily) -> None:
        self.family = family
        self.digests: dict[int, bytes] = {}

    def hash(self, value: Any) -> int:
        if isinstance(value, dict):
            digest = bytes.fromhex(value["bin_hex"])
            self.digests[low64(digest)] = digest
            return low64(digest)
        return value & U64

    def event(self, raw: Any) -> Event:
        if isinstance(raw, dict):
            tag, get = raw["type"], raw.get
        else:
            names = self._array_names(raw[0])
            assert len(raw) - 1 <= len(names)  # SGLang 0.5.19: metadata only on salted stores
            fields = dict(zip(names, raw[1:]))
            tag, get = raw[0], fields.get
        if tag == "AllBlocksCleared":
            return AllBlocksCleared()
        hashes = [self.hash(h) for h in get("block_hashes")]
        if tag == "BlockRemoved":
            return BlockRemoved(hashes, medium=get("medium"), group_idx=get("group_idx"))
        parent = get("parent_block_hash")
        salt = get("cache_salt") or (get("metadata") or {}).get("cache_salt")
        first_keys = (get("extra_keys") or [None])[0] or []
        if get("lora_name") in first_keys:
            first_keys = first_keys[1:]
        if self.family is EngineFamily.VLLM and first_keys:
            salt = first_keys[0]
        return BlockStored(
            block_hashes=hashes,
            parent_hash=None if parent is None else self.hash(parent),
            token_ids=get("token_ids"),
            block_size=get("block_size"),
            medium=get("medium"),
            lora_name=get("lora_name"),
            lora_id=get("lora_id"),
            cache_salt=salt,
            group_idx=get("group_idx"),
            kv_cache_spec_kind=get("kv_cache_spec_kind"),
        )

    def _array_names(self, tag: str) -> list[str]:
        common = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id"]
        if self.family is EngineFamily.VLLM:
            stored = common + ["medium", "lora_name", "extra_keys", "group_idx"]
            stored += ["kv_cache_spec_kind", "kv_cache_spec_sliding_window"]
            names = {"BlockStored": stored, "BlockRemoved": ["block_hashes", "medium", "group_idx"]}
        else:
            stored = common + ["medium", "metadata"]
            names = {"BlockStored": stored, "BlockRemoved": ["block_hashes", "medium"]}
        return names.get(tag, [])


def _reencode(folder: str, decoded: list[Any]) -> bytes:
    profile = PROFILES[FOLDERS[folder]]
    ts, raw_events, rank = decoded
    reader = _Reader(profile.family)
    events = [reader.event(raw) for raw in raw_events]
    digests = reader.digests or None
    return encode_batch(profile, ts, events, rank, hash_digests=digests)


@pytest.mark.parametrize("folder", sorted(FOLDERS))
def test_story_payloads_and_live_frames_are_byte_identical(
    kv_fixtures_dir: Path, folder: str
) -> None:
    frames = json.loads((kv_fixtures_dir / folder / "frames.json").read_text())
    topic = frames["kv_events_config"]["topic"].encode()
    assert len(frames["messages"]) == 7
    for message in frames["messages"]:
        payload = (kv_fixtures_dir / folder / message["payload_file"]).read_bytes()
        assert _reencode(folder, message["decoded"]) == payload, (folder, message["seq"])
        expected = [bytes.fromhex(f) for f in message["frames_hex"]]
        assert live_frames(topic, message["seq"], payload) == expected


@pytest.mark.parametrize("folder", sorted(FOLDERS))
def test_variant_payloads_are_byte_identical(kv_fixtures_dir: Path, folder: str) -> None:
    variants = json.loads((kv_fixtures_dir / folder / "variants.json").read_text())
    assert len(variants) >= 2
    for name, variant in variants.items():
        payload = (kv_fixtures_dir / folder / variant["file"]).read_bytes()
        assert payload.hex() == variant["payload_hex"]
        assert _reencode(folder, variant["decoded"]) == payload, (folder, name)


@pytest.mark.parametrize("folder", sorted(FOLDERS))
def test_replay_frames_per_generation(kv_fixtures_dir: Path, folder: str) -> None:
    profile = PROFILES[FOLDERS[folder]]
    replay = json.loads((kv_fixtures_dir / folder / "replay.json").read_text())
    frames = json.loads((kv_fixtures_dir / folder / "frames.json").read_text())
    topic = frames["kv_events_config"]["topic"].encode()
    request = [bytes.fromhex(f) for f in replay["request_frames_hex"]]
    assert parse_replay_request([b"client-id", *request]) == (b"client-id", 3)
    *data, end = [[bytes.fromhex(f) for f in reply] for reply in replay["reply_frames_hex"]]
    for offset, reply in enumerate(data):
        seq = 3 + offset
        payload = (kv_fixtures_dir / folder / f"payloads/{seq:03d}.msgpack").read_bytes()
        assert replay_data_frames(profile.replay_generation, topic, seq, payload) == reply
    assert replay_end_frames(profile.replay_generation) == end


def test_generations_of_every_profile() -> None:
    assert {p.name for p in PROFILES.values() if p.replay_generation == "new"} == {
        "vllm-0.33",
        "sglang-0.5.23",
    }
    assert replay_end_frames("old") == [b"", REPLAY_END_SEQ, b""]
    assert replay_data_frames("old", b"kv", 1, b"p") == [b"", seq_frame(1), b"p"]
    assert profile_named("vllm-0.25").event_encoding == "map"
    with pytest.raises(ValueError):
        profile_named("vllm-9.9")


def test_malformed_replay_requests_are_not_parsed() -> None:
    good = [b"id", b"", seq_frame(7)]
    assert parse_replay_request(good) == (b"id", 7)
    assert parse_replay_request([b"id", seq_frame(7)]) is None
    assert parse_replay_request([b"id", b"x", seq_frame(7)]) is None
    assert parse_replay_request([b"id", b"", b"\x07"]) is None
    assert parse_replay_request([b"id", b"", seq_frame(7), b""]) is None


def _stored(**kw: Any) -> BlockStored:
    base: dict[str, Any] = {
        "block_hashes": [1, 2], "parent_hash": None, "token_ids": [1, 2, 3, 4], "block_size": 2, "medium": "GPU"
    }
    return BlockStored(**(base | kw))


def test_optional_fields_per_version() -> None:
    salted_lora = _stored(lora_name="ad", cache_salt="s", parent_hash=9)
    for name, has_lora_name in (("sglang-0.5.23", True), ("sglang-0.5.21", False)):
        batch = msgspec.msgpack.decode(encode_batch(PROFILES[name], 0.0, [salted_lora], 0))
        event = batch[1][0]
        assert event["cache_salt"] == "s"
        assert ("lora_name" in event) is has_lora_name
    vllm = msgspec.msgpack.decode(encode_batch(PROFILES["vllm-0.25"], 0.0, [salted_lora], 1))
    # the salt rides on block 0 of a request only; this store continues a chain
    assert vllm[1][0]["extra_keys"] == [["ad"], ["ad"]] and vllm[2] == 1
    old = msgspec.msgpack.decode(encode_batch(PROFILES["sglang-0.5.19"], 0.0, [_stored()], None))
    assert old == [0.0, [["BlockStored", [1, 2], None, [1, 2, 3, 4], 2, None, "GPU"]], None]
    signed = msgspec.msgpack.decode(
        encode_batch(PROFILES["sglang-0.5.23"], 0.0, [BlockRemoved([U64], medium="GPU")], 0)
    )
    assert signed[1][0]["block_hashes"] == [-1]
    with pytest.raises(ValueError):
        encode_batch(PROFILES["vllm-0.33"], 0.0, [_stored()], 0, hash_digests={1: b"x" * 32})
    with pytest.raises(ValueError):
        encode_batch(PROFILES["sglang-0.5.23"], 0.0, [_stored()], 0, hash_digests={})
