"""The simulator's engine hashes reproduce every value the real engines produced.

Sources: ``shared/fixtures/block-hashing/hash-examples.json`` (engine functions run on
tokens [1..8], block size 4) and the block labels of the four KV-event fixture stories.
Not covered: the ``references`` section (CPython ``hash()`` of SGLang <= 0.5.5 and a
Dynamo-style XXH3 key), which are not hashes any simulated engine publishes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cortex.ledger.kv_events import EngineFamily
from cortex.sim.engine_hashes import (
    BlockHash,
    LoraAdapter,
    LoraRegistry,
    SglangChainHasher,
    VllmChainHasher,
    canonical_cbor,
    hash_str_to_int64,
    low64,
    make_chain_hasher,
    pickle_protocol5,
    sglang_page_digest,
    sglang_page_hashes,
    vllm_block_digests,
    vllm_extra_keys,
    vllm_hash_function,
    vllm_none_hash,
    vllm_none_hash_seed_string,
)

U64 = (1 << 64) - 1


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


@pytest.fixture(scope="module")
def examples(hash_examples_path: Path) -> dict[str, Any]:
    return json.loads(hash_examples_path.read_text())


def _vllm_cases(examples: dict[str, Any]) -> list[tuple[tuple[int, ...], dict[str, Any]]]:
    return [
        (_version(result["version"]), case)
        for result in examples["results"]
        if result["engine"] == "vllm"
        for case in result["cases"]
    ]


def test_every_vllm_plain_case(examples: dict[str, Any]) -> None:
    tokens, block_size = examples["tokens"], examples["block_size"]
    checked = 0
    for version, case in _vllm_cases(examples):
        if "request" in case:
            continue
        algo, seed = case["algo"], case["PYTHONHASHSEED"]
        seed_string = vllm_none_hash_seed_string(algo, seed, version)
        if not case["none_hash_deterministic_across_processes"]:
            assert seed_string is None, (version, case)
            draws = iter([b"\x01" * 32, b"\x02" * 32])
            first = vllm_none_hash(algo, seed, version, random_bytes=lambda n: next(draws))
            second = vllm_none_hash(algo, seed, version, random_bytes=lambda n: next(draws))
            assert first != second
            checked += 1
            continue
        if case["none_hash_seed_string"] is not None:
            assert seed_string == case["none_hash_seed_string"]
        none_hash = vllm_none_hash(algo, seed, version)
        assert none_hash.hex() == case["NONE_HASH_hex"], (version, algo, seed)
        digests = vllm_block_digests(tokens, block_size, none_hash, vllm_hash_function(algo))
        assert [d.hex() for d in digests] == case["block_hashes_hex"], (version, algo, seed)
        assert [low64(d) for d in digests] == case["event_block_hashes_int_default"]
        if "reference_block1_serialized_input_hex" in case:
            serialise = canonical_cbor if algo.endswith("_cbor") else pickle_protocol5
            block1 = (none_hash, tuple(tokens[:block_size]), None)
            assert serialise(block1).hex() == case["reference_block1_serialized_input_hex"]
        checked += 1
    assert checked == 16


def test_every_vllm_lora_and_salt_case(examples: dict[str, Any]) -> None:
    tokens, block_size = examples["tokens"], examples["block_size"]
    adapter = LoraAdapter(name="my-adapter", lora_id=1, path="/adapters/my-adapter")
    checked = 0
    for version, case in _vllm_cases(examples):
        if "request" not in case:
            continue
        tagged = version >= (0, 31)
        keys = [
            vllm_extra_keys(i, lora=adapter, cache_salt="tenant-42", tagged=tagged)
            for i in range(len(tokens) // block_size)
        ]
        assert keys == [_tuples(k) for k in case["hashed_extra_keys_per_block"]]
        hasher = make_chain_hasher(
            EngineFamily.VLLM,
            version,
            python_hash_seed=case["PYTHONHASHSEED"],
            loras=LoraRegistry([adapter]),
        )
        hashes = hasher(tokens, block_size, lora_name="my-adapter", cache_salt="tenant-42")
        assert [h.digest.hex() for h in hashes if h.digest] == case["block_hashes_hex"]
        assert [h.value for h in hashes] == case["event_block_hashes_int_default"]
        checked += 1
    assert checked == 3


def test_every_sglang_case(examples: dict[str, Any]) -> None:
    tokens, page = examples["tokens"], examples["block_size"]
    checked = 0
    for result in examples["results"]:
        if result["engine"] != "sglang":
            continue
        version = _version(result["version"])
        for case in result["cases"]:
            if "page_digests_hex" in case:
                digests, prior = [], None
                for i in range(len(tokens) // page):
                    prior = sglang_page_digest(prior, tokens[i * page : (i + 1) * page])
                    digests.append(prior)
                assert [d.hex() for d in digests] == case["page_digests_hex"]
                assert [hash_str_to_int64(d) for d in digests] == case["event_block_hashes_int64"]
                assert sglang_page_hashes(tokens, page) == case["event_block_hashes_int64"]
            else:
                (event,) = case["events"]
                salt = event.get("cache_salt") or event["metadata"]["cache_salt"]
                hasher = make_chain_hasher(
                    EngineFamily.SGLANG, version, sglang_dynamo_format="dynamo" in case["request"]
                )
                hashes = hasher(tokens, page, cache_salt=salt)
                assert [h.value for h in hashes] == [v & U64 for v in event["block_hashes"]]
            checked += 1
    assert checked == 6


@pytest.mark.parametrize(
    ("folder", "family", "seed"),
    [
        ("vllm-0.33.0", EngineFamily.VLLM, None),
        ("vllm-0.23.0", EngineFamily.VLLM, "0"),
        ("sglang-0.5.23", EngineFamily.SGLANG, None),
        ("sglang-0.5.19", EngineFamily.SGLANG, None),
    ],
)
def test_fixture_story_block_labels(
    kv_fixtures_dir: Path, folder: str, family: EngineFamily, seed: str | None
) -> None:
    frames = json.loads((kv_fixtures_dir / folder / "frames.json").read_text())
    assert frames["PYTHONHASHSEED"] == seed
    hasher = make_chain_hasher(family, _version(frames["version"]), python_hash_seed=seed)
    size = frames["block_size"]
    a = hasher(list(range(1, 9)), size)
    b = hasher(list(range(1, 13)), size)
    c = hasher([1, 2, 3, 4, 100, 101, 102, 103], size)
    computed = {"A1": a[0].value, "A2": a[1].value, "B3": b[2].value, "C2": c[1].value}
    assert b[:2] == a and c[0] == a[0]
    assert computed == {label: v & U64 for label, v in frames["block_labels"].items()}


def test_sglang_lora_namespacing_depends_on_version() -> None:
    tokens = list(range(1, 9))
    old = make_chain_hasher(EngineFamily.SGLANG, (0, 5, 19))
    new = make_chain_hasher(EngineFamily.SGLANG, (0, 5, 23))
    assert old(tokens, 4, lora_name="ad") == old(tokens, 4)
    assert new(tokens, 4, lora_name="ad") != new(tokens, 4)
    assert new(tokens, 4, lora_name="ad") != new(tokens, 4, lora_name="other")
    assert isinstance(new, SglangChainHasher) and new.dynamo_format is False


@pytest.mark.parametrize("lora,salt", [(None, None), ("ad", None), (None, "s"), ("ad", "s")])
def test_sglang_chain_continued_from_a_digest_equals_the_chain_from_the_root(
    lora: str | None, salt: str | None
) -> None:
    hasher = SglangChainHasher(dynamo_format=True)
    tokens = list(range(7, 19))
    whole = [h.value for h in hasher(tokens, 2, lora, salt)]
    head, digests = hasher.continue_chain(None, tokens[:4], 2, lora, salt)
    tail, _ = hasher.continue_chain(digests[-1], tokens[4:], 2, lora, salt)
    assert head + tail == whole and len(digests) == 2


def test_vllm_hashes_separate_loras_salts_and_ignore_partial_blocks() -> None:
    hasher = make_chain_hasher(EngineFamily.VLLM, (0, 33))
    assert isinstance(hasher, VllmChainHasher)
    tokens = list(range(1, 11))
    plain = hasher(tokens, 4)
    assert len(plain) == 2 and plain == hasher(tokens[:8], 4)
    salted = hasher(tokens, 4, cache_salt="s")
    lora = hasher(tokens, 4, lora_name="a")
    assert len({plain[0], salted[0], lora[0]}) == 3
    assert hasher.loras.lora_id("a") == 1 and hasher.loras.lora_id("b") == 2


def test_vllm_chain_extends_as_tokens_grow() -> None:
    """A request's chain extended block by block (decode) equals the chain hashed at once,
    with a salt (block 0 only) and a LoRA (every block)."""
    hasher = make_chain_hasher(EngineFamily.VLLM, (0, 33))
    assert isinstance(hasher, VllmChainHasher)
    tokens = list(range(1, 15))
    grown: list[BlockHash] = []
    for end in range(len(tokens) + 1):
        hasher.extend(grown, tokens[:end], 4, "a", "s")
    assert grown == hasher(tokens, 4, "a", "s") and len(grown) == 3
    hasher.extend(grown, tokens, 4, "a", "s")
    assert len(grown) == 3


def test_old_vllm_restart_redraws_random_none_hash() -> None:
    draws = iter([b"\x01" * 32, b"\x02" * 32])
    first = make_chain_hasher(EngineFamily.VLLM, (0, 23), random_bytes=lambda n: next(draws))
    second = make_chain_hasher(EngineFamily.VLLM, (0, 23), random_bytes=lambda n: next(draws))
    assert first([1, 2, 3, 4], 4) != second([1, 2, 3, 4], 4)


def test_canonical_cbor_heads_and_sglang_wide_tokens() -> None:
    assert canonical_cbor((23, 24, 255, 256, -1, 2**40)) == bytes.fromhex(
        "86" "17" "1818" "18ff" "190100" "20" "1b0000010000000000"
    )
    assert canonical_cbor(("ab", b"\x00")) == bytes.fromhex("82626162" "4100")
    narrow = sglang_page_hashes([1, 2], 2)
    wide = sglang_page_hashes([1, 2**32], 2)
    assert narrow != wide
