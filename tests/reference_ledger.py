"""A slow, obviously-correct pure-Python ledger with the semantics of ``cortex._fast.ledger``.

Everything is dicts and sets, keys come from the ``xxhash`` package following the definition in
``cortex/_fast/blockkeys.pyi``; nothing here imports the Cython units. Property tests drive the
same streams through both and compare every observable.

Semantics (the contract ``ledger.pyi`` plus the choices its docstrings leave open):

* per target: engine hash -> (key, {medium: refcount > 0}); refcounts saturate at 255;
* store: unknown parent -> nothing stored, -1; same hash and key -> refcount + 1 (a duplicate
  only when that medium already held it); same hash, other key -> the entry is replaced
  (every medium) by one holding only the new medium;
* nodes: a key is live while some target holds it or it is the parent of a live key; a key's
  parent is the key it was first stored under while live.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import xxhash

GPU_ONLY = 1
ALL_MEDIA = 0b1111
MAX_REFCOUNT = 255


def _part(text: str | None) -> bytes:
    if text is None:
        return b"\x00"
    encoded = text.encode("utf-8")
    return b"\x01" + struct.pack("<I", len(encoded)) + encoded


def namespace_seed(model: str, lora_name: str | None = None, cache_salt: str | None = None) -> int:
    data = b"cortex-ns-v1" + _part(model) + _part(lora_name) + _part(cache_salt)
    return xxhash.xxh3_64_intdigest(data, seed=0)


def block_keys(
    token_ids: Sequence[int], block_size: int, seed: int, parent_key: int | None = None
) -> list[int]:
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    for token in token_ids:
        if not 0 <= token < 2**32:
            raise ValueError(f"token id {token} outside [0, 2**32)")
    keys = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        block = b"".join(struct.pack("<I", t) for t in token_ids[start : start + block_size])
        if parent_key is None:  # a root block: the namespace seeds it
            parent_key = xxhash.xxh3_64_intdigest(block, seed=seed)
        else:  # a chained block: the parent's key carries the namespace
            parent_key = xxhash.xxh3_64_intdigest(struct.pack("<Q", parent_key) + block, seed=0)
        keys.append(parent_key)
    return keys


def opaque_key(parent_key: int | None, engine_hash: int, seed: int) -> int:
    data = b"cortex-opaque\x00" + struct.pack("<QQ", parent_key or 0, engine_hash)
    return xxhash.xxh3_64_intdigest(data, seed=seed if parent_key is None else 0)


@dataclass
class _Entry:
    key: int
    refs: dict[int, int] = field(default_factory=dict)  # medium -> refcount, all > 0


class ReferenceTree:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.unknown_parent = 0
        self.unknown_removal = 0
        self.duplicate_store = 0
        self.hash_conflict = 0
        self._maps: dict[int, dict[int, _Entry]] = {}
        self._parent_of: dict[int, int | None] = {}  # live keys -> parent key

    def store(
        self,
        target: int,
        parent_hash: int | None,
        block_hashes: Sequence[int],
        token_ids: Sequence[int],
        seed: int,
        medium: int = 0,
        reproducible: bool = True,
        now: int = 0,
    ) -> int:
        size = self.block_size
        if reproducible:
            if len(token_ids) != len(block_hashes) * size:
                raise ValueError("token ids do not fill the blocks")
            block_keys(token_ids, size, seed)  # validates the token ids
        held = self._maps.setdefault(target, {})
        parent_key: int | None = None
        if parent_hash is not None:
            if parent_hash not in held:
                self.unknown_parent += 1
                return -1
            parent_key = held[parent_hash].key
        for i, engine_hash in enumerate(block_hashes):
            if reproducible:
                tokens = token_ids[i * size : (i + 1) * size]
                key = block_keys(tokens, size, seed, parent_key)[0]
            else:
                key = opaque_key(parent_key, engine_hash, seed)
            self._parent_of.setdefault(key, parent_key)
            entry = held.get(engine_hash)
            if entry is None:
                held[engine_hash] = _Entry(key, {medium: 1})
            elif entry.key == key:
                if medium in entry.refs:
                    self.duplicate_store += 1
                    entry.refs[medium] = min(MAX_REFCOUNT, entry.refs[medium] + 1)
                else:
                    entry.refs[medium] = 1
            else:
                self.hash_conflict += 1
                held[engine_hash] = _Entry(key, {medium: 1})
            parent_key = key
        self._collect()
        return len(block_hashes)

    def remove(self, target: int, block_hashes: Sequence[int], medium: int = 0) -> int:
        held = self._maps.get(target, {})
        unknown = 0
        for engine_hash in block_hashes:
            entry = held.get(engine_hash)
            if entry is None or medium not in entry.refs:
                unknown += 1
                continue
            entry.refs[medium] -= 1
            if entry.refs[medium] == 0:
                del entry.refs[medium]
                if not entry.refs:
                    del held[engine_hash]
        self.unknown_removal += unknown
        self._collect()
        return unknown

    def clear_target(self, target: int) -> int:
        dropped = self.target_entries(target)
        self._maps.pop(target, None)
        self._collect()
        return dropped

    def held_keys(self, target: int, media: int) -> set[int]:
        return {
            entry.key
            for entry in self._maps.get(target, {}).values()
            if any(media & (1 << medium) for medium in entry.refs)
        }

    def match(self, keys: Sequence[int], media: int = GPU_ONLY) -> dict[int, int]:
        result = {}
        for target in self._maps:
            held = self.held_keys(target, media)
            count = 0
            while count < len(keys) and keys[count] in held:
                count += 1
            if count:
                result[target] = count
        return result

    def target_keys(self, target: int, media: int = ALL_MEDIA) -> set[int]:
        return self.held_keys(target, media)

    def target_entries(self, target: int) -> int:
        return sum(len(entry.refs) for entry in self._maps.get(target, {}).values())

    def targets(self) -> list[int]:
        return sorted(t for t in self._maps if self.target_entries(t))

    @property
    def nodes(self) -> int:
        return len(self._parent_of)

    @property
    def entries(self) -> int:
        return sum(self.target_entries(t) for t in self._maps)

    def _collect(self) -> None:
        """Keep exactly the held keys and their ancestors."""
        live: set[int] = set()
        for held in self._maps.values():
            for entry in held.values():
                key: int | None = entry.key
                while key is not None and key not in live:
                    live.add(key)
                    key = self._parent_of[key]
        self._parent_of = {key: self._parent_of[key] for key in live}
