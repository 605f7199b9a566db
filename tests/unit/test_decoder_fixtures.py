"""The decoder against the golden bytes captured from the real vLLM and SGLang publishers.

Expected values come from the fixture JSON (``decoded``, ``upstream_objects``, ``block_labels``),
normalised here independently of the decoder: ints mod 2**64, binary digests read whole as
big-endian and taken mod 2**64.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cortex.events.decoder import decode_payload
from cortex.events.decoder_generic import decode_generic
from cortex.events.decoder_typed import decode_typed
from cortex.events.frames import encode_replay_request, parse_live_frames, parse_replay_reply
from cortex.ledger.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineFamily,
    Event,
    EventBatch,
    ReplayEnd,
    ReplayItem,
)
from tests.conftest import shared_dir
from tests.unit.test_decoder_invariants import assert_model_invariants

FIXTURES = shared_dir() / "fixtures" / "kv-events"
FOLDERS = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
NEW_REPLAY_GENERATION = {"vllm-0.33.0", "sglang-0.5.23"}  # replies carry the topic frame

# The story every folder encodes (fixtures README): per seq, (tag, hash labels, parent label).
STORY: dict[int, list[tuple[str, list[str], str | None]]] = {
    0: [("BlockStored", ["A1", "A2"], None)],
    1: [("BlockStored", ["B3"], "A2")],
    2: [("BlockStored", ["C2"], "A1")],
    3: [("BlockRemoved", ["B3"], None)],
    4: [("BlockRemoved", ["C2"], None), ("BlockRemoved", ["A2"], None)],  # vLLM: two events
    5: [("BlockStored", ["A2"], "A1")],
    6: [("AllBlocksCleared", [], None)],
}
SGLANG_STORY_4 = [("BlockRemoved", ["C2", "A2"], None)]  # SGLang coalesces the removals


def test_all_four_fixture_folders_are_present() -> None:
    assert FOLDERS == ["sglang-0.5.19", "sglang-0.5.23", "vllm-0.23.0", "vllm-0.33.0"]


def family_of(folder: str) -> EngineFamily:
    return EngineFamily.VLLM if folder.startswith("vllm-") else EngineFamily.SGLANG


def load(folder: str, name: str) -> Any:
    return json.loads((FIXTURES / folder / name).read_text())


def u64(value: Any) -> int:
    """Independent normalisation: an int mod 2**64, or a whole digest as a big number mod 2**64."""
    if isinstance(value, dict):
        digest = bytes.fromhex(value.get("bin_hex") or value["bytes_hex"])
        return int.from_bytes(digest, "big") % 2**64
    return int(value) % 2**64


def decode_both_paths(payload: bytes, family: EngineFamily) -> EventBatch:
    """decode_payload, also checking that the fast path took it and agrees with the reference."""
    batch = decode_payload(payload, family)
    assert_model_invariants(batch)
    assert decode_generic(payload, family) == batch
    typed = decode_typed(payload, family)
    assert typed == batch, "fixture payloads must take the typed fast path"
    return batch


def expected_salt(upstream: dict[str, Any]) -> str | None:
    """SGLang states the salt; vLLM hides it in block 0's extra keys after the LoRA name."""
    if "cache_salt" in upstream:
        return upstream["cache_salt"]
    if upstream.get("metadata"):
        return upstream["metadata"]["cache_salt"]
    extra = upstream.get("extra_keys")
    if extra and extra[0]:
        first = [k for k in extra[0] if k != upstream.get("lora_name")]
        return first[0] if first else None
    return None


def check_against_upstream(event: Event, upstream: dict[str, Any]) -> None:
    kind = upstream["type"]
    if kind in ("BlockStored", "BlockStoredWithMetadata"):
        assert isinstance(event, BlockStored)
        assert event.block_hashes == [u64(h) for h in upstream["block_hashes"]]
        parent = upstream["parent_block_hash"]
        assert event.parent_hash == (None if parent is None else u64(parent))
        assert list(event.token_ids) == upstream["token_ids"]
        assert event.block_size == upstream["block_size"]
        assert event.medium == upstream.get("medium")
        assert event.lora_id == upstream.get("lora_id")
        assert event.lora_name == upstream.get("lora_name")
        assert event.cache_salt == expected_salt(upstream)
        assert event.group_idx == upstream.get("group_idx")
        assert event.kv_cache_spec_kind == upstream.get("kv_cache_spec_kind")
        assert event.reproducible is True
    elif kind == "BlockRemoved":
        assert isinstance(event, BlockRemoved)
        assert event.block_hashes == [u64(h) for h in upstream["block_hashes"]]
        assert event.medium == upstream.get("medium")
        assert event.group_idx == upstream.get("group_idx")
    else:
        assert kind == "AllBlocksCleared"
        assert isinstance(event, AllBlocksCleared)


def check_against_decoded(batch: EventBatch, decoded: list[Any]) -> None:
    ts, events, rank = decoded
    assert batch.ts == ts
    assert batch.dp_rank == rank
    assert len(batch.events) == len(events)
    tags = [e["type"] if isinstance(e, dict) else e[0] for e in events]
    assert [type(e).__name__ for e in batch.events] == tags
    assert (batch.unknown_events, batch.unknown_fields) == (0, 0)


@pytest.mark.parametrize("folder", FOLDERS)
def test_live_messages_decode_to_what_was_published(folder: str) -> None:
    family = family_of(folder)
    frames = load(folder, "frames.json")
    assert len(frames["messages"]) == 7
    for message in frames["messages"]:
        live = parse_live_frames([bytes.fromhex(f) for f in message["frames_hex"]])
        assert live.topic == b"kv"
        assert live.seq == message["seq"]
        assert live.payload == (FIXTURES / folder / message["payload_file"]).read_bytes()
        batch = decode_both_paths(live.payload, family)
        check_against_decoded(batch, message["decoded"])
        assert len(batch.events) == len(message["upstream_objects"])
        for event, upstream in zip(batch.events, message["upstream_objects"], strict=True):
            check_against_upstream(event, upstream)


@pytest.mark.parametrize("folder", FOLDERS)
def test_block_labels_line_up_with_the_story(folder: str) -> None:
    family = family_of(folder)
    frames = load(folder, "frames.json")
    labels = {name: u64(value) for name, value in frames["block_labels"].items()}
    assert len(set(labels.values())) == 4
    for message in frames["messages"]:
        seq = message["seq"]
        story = SGLANG_STORY_4 if family is EngineFamily.SGLANG and seq == 4 else STORY[seq]
        batch = decode_payload(bytes.fromhex(message["frames_hex"][2]), family)
        assert len(batch.events) == len(story)
        for event, (tag, hash_labels, parent_label) in zip(batch.events, story, strict=True):
            assert type(event).__name__ == tag
            if isinstance(event, (BlockStored, BlockRemoved)):
                assert event.block_hashes == [labels[name] for name in hash_labels]
            if isinstance(event, BlockStored):
                assert event.parent_hash == (None if parent_label is None else labels[parent_label])
        assert batch.ts == 1767225600.0 + 0.25 * seq


@pytest.mark.parametrize("folder", FOLDERS)
def test_replay_exchange(folder: str) -> None:
    replay = load(folder, "replay.json")
    assert encode_replay_request(3) == [bytes.fromhex(f) for f in replay["request_frames_hex"]]
    replies = [
        parse_replay_reply([bytes.fromhex(f) for f in r]) for r in replay["reply_frames_hex"]
    ]
    assert isinstance(replies[-1], ReplayEnd)
    items = replies[:-1]
    assert all(isinstance(item, ReplayItem) for item in items)
    assert [item.seq for item in items] == [3, 4, 5, 6]  # type: ignore[union-attr]
    expected_topic = b"kv" if folder in NEW_REPLAY_GENERATION else None
    for item in items:
        assert isinstance(item, ReplayItem)
        assert item.topic == expected_topic
        assert item.payload == (FIXTURES / folder / f"payloads/{item.seq:03d}.msgpack").read_bytes()
        decode_both_paths(item.payload, family_of(folder))


def variants(folder: str) -> dict[str, dict[str, Any]]:
    return load(folder, "variants.json")


@pytest.mark.parametrize("folder", FOLDERS)
def test_variants_decode_to_what_was_published(folder: str) -> None:
    family = family_of(folder)
    for name, variant in variants(folder).items():
        payload = (FIXTURES / folder / variant["file"]).read_bytes()
        assert payload == bytes.fromhex(variant["payload_hex"]), name
        batch = decode_both_paths(payload, family)
        check_against_decoded(batch, variant["decoded"])
        upstream_objects = variant["upstream_objects"]
        if not upstream_objects:  # the DP-rank variant records no upstream objects
            continue
        for event, upstream in zip(batch.events, upstream_objects, strict=True):
            check_against_upstream(event, upstream)


@pytest.mark.parametrize("folder", FOLDERS)
def test_dp_rank_3_variant(folder: str) -> None:
    payload = (FIXTURES / folder / "variants/dp-rank-3.msgpack").read_bytes()
    batch = decode_payload(payload, family_of(folder))
    assert batch.dp_rank == 3
    assert batch.events == (AllBlocksCleared(),)


@pytest.mark.parametrize("folder", ["vllm-0.23.0", "vllm-0.33.0"])
def test_vllm_lora_and_salt_variant(folder: str) -> None:
    payload = (FIXTURES / folder / "variants/lora-and-cache-salt.msgpack").read_bytes()
    (event,) = decode_payload(payload, EngineFamily.VLLM).events
    assert isinstance(event, BlockStored)
    assert (event.lora_name, event.lora_id, event.cache_salt) == ("my-adapter", 1, "tenant-42")
    assert event.reproducible is True
    assert list(event.token_ids) == [1, 2, 3, 4, 5, 6, 7, 8]


@pytest.mark.parametrize("folder", ["vllm-0.23.0", "vllm-0.33.0"])
def test_vllm_bytes_hashes_equal_the_int_hashes_of_the_same_story(folder: str) -> None:
    labels = {k: u64(v) for k, v in load(folder, "frames.json")["block_labels"].items()}
    payload = (FIXTURES / folder / "variants/bytes-hashes.msgpack").read_bytes()
    stored, removed = decode_payload(payload, EngineFamily.VLLM).events
    assert isinstance(stored, BlockStored) and isinstance(removed, BlockRemoved)
    assert stored.block_hashes == [labels["A1"], labels["A2"]]
    assert stored.parent_hash is None
    assert removed.block_hashes == [labels["A2"]]


@pytest.mark.parametrize("folder", ["sglang-0.5.19", "sglang-0.5.23"])
def test_sglang_salt_variant(folder: str) -> None:
    payload = (FIXTURES / folder / "variants/cache-salt.msgpack").read_bytes()
    (event,) = decode_payload(payload, EngineFamily.SGLANG).events
    assert isinstance(event, BlockStored)
    assert event.cache_salt == "tenant-42"
    assert event.lora_name is None
    assert all(0 <= h < 2**64 for h in event.block_hashes)
    assert event.block_hashes == [-6979314068674572881 + 2**64, -6904572152155599217 + 2**64]


def test_fixture_files_exist_for_every_message() -> None:
    for folder in FOLDERS:
        for message in load(folder, "frames.json")["messages"]:
            assert Path(FIXTURES / folder / message["payload_file"]).is_file()
