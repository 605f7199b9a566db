"""The engines' own block hashes, so simulated engines publish the values real ones would.

Pure (standard library + ``xxhash``). Facts from ``shared/protocols/block-hashing.md`` §1–§2;
``shared/fixtures/block-hashing/hash-examples.json`` holds the values these functions must hit.
Cortex itself never needs these (its ledger keys blocks by its own hash of the token ids); only
the simulator does, to be byte-faithful on the wire.

vLLM (0.10.2 and later), block *i* of a request, tokens ``[i*B, (i+1)*B)``::

    digest_i = hash_fn((digest_{i-1} or NONE_HASH, tuple(block_tokens), extra_keys_i))
    event value = low 64 bits of digest_i (its last 8 bytes, big-endian)

* ``hash_fn`` serialises the 3-tuple with CPython pickle protocol 5 (``sha256``, ``xxhash``) or
  canonical CBOR (``*_cbor``) and digests it with SHA-256 (32 bytes) or XXH3-128 (16 bytes).
* ``NONE_HASH = hash_fn(seed_string)``; seed_string = ``$PYTHONHASHSEED`` when set, else
  ``"vllm-none-hash"`` for the sha256 algorithms of vLLM >= 0.29. Otherwise (older vLLM, or
  xxhash algorithms) the engine draws random bytes per process: different on every restart.
* ``extra_keys_i``: ``None`` for plain text; with a LoRA adapter every block gets the LoRA key,
  with a ``cache_salt`` block 0 only gets the salt key. vLLM >= 0.31 tags them
  (``("lora", name, path)``, ``("cache_salt", salt)``), older versions use the bare values
  (name, salt).

SGLang (0.5.6 and later), page *i* along a radix path::

    digest_i = SHA256(prior || u32le(t) for each page token)    prior_0 = b"" (or salt prior)
    event value = signed int64 of digest_i[0:8] big-endian         (hash_str_to_int64)

* a page holding a token >= 2**32 is hashed as ``prior || 0xFF || u64le(t) ...``;
* with a ``cache_salt`` the first page's prior is ``SHA256(b"sglang-cache-salt-v1\\0" + salt)``;
* SGLang >= 0.5.22 maps every published hash of a LoRA request (default format), or of any
  salted/LoRA request (``format: "dynamo"``), through
  ``namespaced(h) = int64(SHA256(seed || int64_be(h))[0:8])``,
  ``seed = SHA256(b"sglang-kv-event-namespace-v1" || part(extra_key) || part(salt))``. Real
  SGLang's ``extra_key`` ends with an internal LoRA id; the simulator uses the LoRA name.

Chain hashers (``VllmChainHasher``, ``SglangChainHasher``) return, per full block, a
``BlockHash``: the event value normalised to ``[0, 2**64)`` (as ``cortex.ledger.kv_events`` wants)
and, for vLLM, the raw digest (what the engine publishes with
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``). A trailing partial block is never hashed.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import xxhash

from cortex.ledger.kv_events import EngineFamily

U64_MASK = (1 << 64) - 1
U32_LIMIT = 1 << 32
_INT64_BE = struct.Struct(">q")

VllmHashAlgo = Literal["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]
VLLM_HASH_ALGOS: tuple[VllmHashAlgo, ...] = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
VLLM_DEFAULT_SEED_STRING = "vllm-none-hash"

Version = tuple[int, ...]


class BlockHash(NamedTuple):
    """One full block's identity as an engine publishes it."""

    value: int  # event hash, normalised to [0, 2**64)
    digest: bytes | None  # vLLM's raw digest; None for SGLang


# ---------------------------------------------------------------- serialisation (vLLM)


def pickle_protocol5(obj: object) -> bytes:
    """CPython pickle, protocol 5 (what vLLM's ``sha256``/``xxhash`` algorithms hash)."""
    return pickle.dumps(obj, protocol=5)


def _cbor_head(major: int, value: int) -> bytes:
    if value < 24:
        return bytes([(major << 5) | value])
    for extra, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if value < 1 << (8 * size):
            return bytes([(major << 5) | extra]) + value.to_bytes(size, "big")
    raise ValueError(f"integer {value} does not fit CBOR's 64-bit head")


def canonical_cbor(obj: object) -> bytes:
    """Canonical CBOR of the few types a vLLM hash input holds (None, int, bytes, str, tuple)."""
    if obj is None:
        return b"\xf6"
    if isinstance(obj, bool):
        return b"\xf5" if obj else b"\xf4"
    if isinstance(obj, int):
        return _cbor_head(0, obj) if obj >= 0 else _cbor_head(1, -1 - obj)
    if isinstance(obj, bytes):
        return _cbor_head(2, len(obj)) + obj
    if isinstance(obj, str):
        data = obj.encode()
        return _cbor_head(3, len(data)) + data
    if isinstance(obj, (tuple, list)):
        return _cbor_head(4, len(obj)) + b"".join(canonical_cbor(item) for item in obj)
    raise TypeError(f"no CBOR encoding for {type(obj).__name__}")


def vllm_hash_function(algo: VllmHashAlgo) -> Callable[[object], bytes]:
    """The digest function behind ``--prefix-caching-hash-algo``."""
    if algo == "sha256":
        return lambda obj: hashlib.sha256(pickle_protocol5(obj)).digest()
    if algo == "sha256_cbor":
        return lambda obj: hashlib.sha256(canonical_cbor(obj)).digest()
    if algo == "xxhash":
        return lambda obj: xxhash.xxh3_128_digest(pickle_protocol5(obj))
    if algo == "xxhash_cbor":
        return lambda obj: xxhash.xxh3_128_digest(canonical_cbor(obj))
    raise ValueError(f"unknown vLLM hash algorithm {algo!r}")


# ---------------------------------------------------------------- vLLM chain


def vllm_none_hash_seed_string(
    algo: VllmHashAlgo, python_hash_seed: str | None, version: Version
) -> str | None:
    """The string vLLM hashes into NONE_HASH, or None when the engine uses random bytes."""
    if python_hash_seed is not None:
        return python_hash_seed
    if version >= (0, 29) and algo in ("sha256", "sha256_cbor"):
        return VLLM_DEFAULT_SEED_STRING
    return None


def vllm_none_hash(
    algo: VllmHashAlgo,
    python_hash_seed: str | None,
    version: Version,
    *,
    random_bytes: Callable[[int], bytes] = os.urandom,
) -> bytes:
    """The root parent of every chain. Random per process unless a seed string applies."""
    seed = vllm_none_hash_seed_string(algo, python_hash_seed, version)
    if seed is None:
        return random_bytes(32)
    return vllm_hash_function(algo)(seed)


def low64(digest: bytes) -> int:
    """vLLM's int event value of a digest: its low 64 bits (last 8 bytes, big-endian)."""
    return int.from_bytes(digest[-8:], "big")


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    """A LoRA adapter as a vLLM engine knows it: its id is published, its path is hashed."""

    name: str
    lora_id: int
    path: str


def vllm_extra_keys(
    block_index: int,
    *,
    lora: LoraAdapter | None,
    cache_salt: str | None,
    tagged: bool,
) -> tuple[object, ...] | None:
    """The extra keys vLLM hashes into block ``block_index`` of a request (text only)."""
    keys: list[object] = []
    if lora is not None:
        keys.append(("lora", lora.name, lora.path) if tagged else lora.name)
    if cache_salt is not None and block_index == 0:
        keys.append(("cache_salt", cache_salt) if tagged else cache_salt)
    return tuple(keys) if keys else None


def vllm_block_digests(
    token_ids: Sequence[int],
    block_size: int,
    none_hash: bytes,
    hash_fn: Callable[[object], bytes],
    extra_keys_of: Callable[[int], tuple[object, ...] | None] = lambda _index: None,
    *,
    first_block: int = 0,
    parent: bytes | None = None,
) -> list[bytes]:
    """Digests of every full block, chained from ``none_hash``; or, given ``first_block`` and
    the digest of the block before it (``parent``), of the full blocks from ``first_block`` on."""
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    if first_block and parent is None:
        raise ValueError("continuing a chain needs the digest of the block before")
    digests: list[bytes] = []
    if parent is None:
        parent = none_hash
    for index in range(first_block, len(token_ids) // block_size):
        block = tuple(map(int, token_ids[index * block_size : (index + 1) * block_size]))
        parent = hash_fn((parent, block, extra_keys_of(index)))
        digests.append(parent)
    return digests


class LoraRegistry:
    """The adapters an engine serves. A name nobody configured is registered on first use,
    with the next free id and the path ``/adapters/<name>``."""

    def __init__(self, adapters: Sequence[LoraAdapter] = ()) -> None:
        self._by_name: dict[str, LoraAdapter] = {a.name: a for a in adapters}

    def get(self, name: str) -> LoraAdapter:
        adapter = self._by_name.get(name)
        if adapter is None:
            next_id = max((a.lora_id for a in self._by_name.values()), default=0) + 1
            adapter = LoraAdapter(name=name, lora_id=next_id, path=f"/adapters/{name}")
            self._by_name[name] = adapter
        return adapter

    def lora_id(self, name: str | None) -> int | None:
        return None if name is None else self.get(name).lora_id


@dataclass(slots=True)
class VllmChainHasher:
    """Block hashes of one vLLM engine process (fixed algorithm and NONE_HASH)."""

    none_hash: bytes
    algo: VllmHashAlgo = "sha256"
    tagged_extra_keys: bool = True
    loras: LoraRegistry = field(default_factory=LoraRegistry)

    def lora(self, lora_name: str | None) -> LoraAdapter | None:
        return None if lora_name is None else self.loras.get(lora_name)

    def __call__(
        self,
        token_ids: Sequence[int],
        block_size: int,
        lora_name: str | None = None,
        cache_salt: str | None = None,
    ) -> list[BlockHash]:
        hashes: list[BlockHash] = []
        self.extend(hashes, token_ids, block_size, lora_name, cache_salt)
        return hashes

    def extend(
        self,
        hashes: list[BlockHash],
        token_ids: Sequence[int],
        block_size: int,
        lora_name: str | None = None,
        cache_salt: str | None = None,
    ) -> None:
        """Append to ``hashes``, the chain of ``token_ids``' leading blocks so far, the hashes
        of its full blocks after them (as the engine does when a request's tokens grow)."""
        first = len(hashes)
        if first >= len(token_ids) // block_size:
            return
        lora = self.lora(lora_name)
        tagged = self.tagged_extra_keys
        digests = vllm_block_digests(
            token_ids,
            block_size,
            self.none_hash,
            vllm_hash_function(self.algo),
            lambda index: vllm_extra_keys(index, lora=lora, cache_salt=cache_salt, tagged=tagged),
            first_block=first,
            parent=hashes[-1].digest if hashes else None,
        )
        hashes.extend(BlockHash(low64(d), d) for d in digests)


# ---------------------------------------------------------------- SGLang chain


def _sglang_page_body(page_tokens: Sequence[int]) -> bytes:
    if all(0 <= t < U32_LIMIT for t in page_tokens):
        return struct.pack(f"<{len(page_tokens)}I", *page_tokens)
    return b"\xff" + struct.pack(f"<{len(page_tokens)}Q", *page_tokens)


def sglang_page_digest(prior: bytes | None, page_tokens: Sequence[int]) -> bytes:
    """SHA-256 of one page, continuing from the previous page's digest (None at the root)."""
    return hashlib.sha256((prior or b"") + _sglang_page_body(page_tokens)).digest()


def sglang_salt_prior(cache_salt: str) -> bytes:
    """The prior of a salted request's first page."""
    return hashlib.sha256(b"sglang-cache-salt-v1\x00" + cache_salt.encode()).digest()


def hash_str_to_int64(digest: bytes) -> int:
    """SGLang's event value: the first 8 digest bytes as a signed big-endian int64."""
    return int.from_bytes(digest[:8], "big", signed=True)


def _namespace_part(value: str | None) -> bytes:
    if value is None:
        return b"\x00"
    data = value.encode()
    return b"\x01" + struct.pack("<Q", len(data)) + data


def sglang_namespace_seed(extra_key: str | None, cache_salt: str | None) -> bytes:
    """Seed of SGLang >= 0.5.22's event-hash namespacing."""
    return hashlib.sha256(
        b"sglang-kv-event-namespace-v1" + _namespace_part(extra_key) + _namespace_part(cache_salt)
    ).digest()


def sglang_namespaced(event_hash: int, seed: bytes) -> int:
    """Map one signed event hash into a namespace."""
    return hash_str_to_int64(
        hashlib.sha256(seed + event_hash.to_bytes(8, "big", signed=True)).digest()
    )


def sglang_page_chain(
    token_ids: Sequence[int],
    page_size: int,
    prior: bytes | None,
    *,
    namespace_seed: bytes | None = None,
) -> tuple[list[int], list[bytes]]:
    """Signed int64 event hashes and raw digests of every full page of ``token_ids``, the
    chain continuing from ``prior`` (the digest of the page before; at the root: None, or the
    salt prior of a salted request)."""
    if page_size <= 0:
        raise ValueError("page_size must be positive")
    pages = len(token_ids) // page_size
    hashes: list[int] = []
    digests: list[bytes] = []
    if not pages:
        return hashes, digests
    used = token_ids[: pages * page_size]
    if min(used) >= 0 and max(used) < U32_LIMIT:  # the usual case: pack every page at once
        packed = struct.pack(f"<{len(used)}I", *used)
        width = 4 * page_size
        bodies = [packed[i * width : (i + 1) * width] for i in range(pages)]
    else:
        bodies = [_sglang_page_body(used[i * page_size : (i + 1) * page_size])
                  for i in range(pages)]
    sha256 = hashlib.sha256
    head = prior or b""
    for body in bodies:
        head = sha256(head + body).digest()
        value = _INT64_BE.unpack_from(head)[0]  # hash_str_to_int64
        if namespace_seed is not None:
            value = sglang_namespaced(value, namespace_seed)
        hashes.append(value)
        digests.append(head)
    return hashes, digests


def sglang_page_hashes(
    token_ids: Sequence[int],
    page_size: int,
    *,
    cache_salt: str | None = None,
    namespace_seed: bytes | None = None,
) -> list[int]:
    """Signed int64 event hashes of every full page of a radix path from the root."""
    prior = sglang_salt_prior(cache_salt) if cache_salt is not None else None
    return sglang_page_chain(token_ids, page_size, prior, namespace_seed=namespace_seed)[0]


@dataclass(frozen=True, slots=True)
class SglangChainHasher:
    """Page hashes of an SGLang engine.

    ``namespace_lora``: SGLang >= 0.5.22 namespaces the hashes of LoRA requests (older ones
    publish the plain chain, so equal tokens under two adapters give equal hashes).
    ``dynamo_format``: ``format: "dynamo"`` also namespaces salted requests.
    """

    namespace_lora: bool = True
    dynamo_format: bool = False

    def namespace_seed(self, lora_name: str | None, cache_salt: str | None) -> bytes | None:
        if self.dynamo_format and (lora_name is not None or cache_salt is not None):
            return sglang_namespace_seed(lora_name, cache_salt)
        if self.namespace_lora and lora_name is not None:
            return sglang_namespace_seed(lora_name, None)
        return None

    def __call__(
        self,
        token_ids: Sequence[int],
        block_size: int,
        lora_name: str | None = None,
        cache_salt: str | None = None,
    ) -> list[BlockHash]:
        values = sglang_page_hashes(
            token_ids,
            block_size,
            cache_salt=cache_salt,
            namespace_seed=self.namespace_seed(lora_name, cache_salt),
        )
        return [BlockHash(v & U64_MASK, None) for v in values]

    def continue_chain(
        self,
        prior: bytes | None,
        token_ids: Sequence[int],
        block_size: int,
        lora_name: str | None = None,
        cache_salt: str | None = None,
    ) -> tuple[list[int], list[bytes]]:
        """The pages of ``token_ids`` that follow a page whose raw digest is ``prior`` (None:
        they start at the root): their event values (normalised as ``__call__``'s) and raw
        digests, so a radix tree hashes only the pages it adds."""
        if prior is None and cache_salt is not None:
            prior = sglang_salt_prior(cache_salt)
        values, digests = sglang_page_chain(
            token_ids, block_size, prior,
            namespace_seed=self.namespace_seed(lora_name, cache_salt))
        return [v & U64_MASK for v in values], digests


ChainHasher = VllmChainHasher | SglangChainHasher


def make_chain_hasher(
    family: EngineFamily,
    version: Version,
    *,
    algo: VllmHashAlgo = "sha256",
    python_hash_seed: str | None = None,
    random_bytes: Callable[[int], bytes] = os.urandom,
    loras: LoraRegistry | None = None,
    sglang_dynamo_format: bool = False,
) -> ChainHasher:
    """The hasher of one engine process of ``family`` at ``version``.

    Call again after a simulated restart: vLLM's NONE_HASH is redrawn when it is random.
    """
    if family is EngineFamily.VLLM:
        return VllmChainHasher(
            none_hash=vllm_none_hash(algo, python_hash_seed, version, random_bytes=random_bytes),
            algo=algo,
            tagged_extra_keys=version >= (0, 31),
            loras=loras if loras is not None else LoraRegistry(),
        )
    return SglangChainHasher(
        namespace_lora=version >= (0, 5, 22),
        dynamo_format=sglang_dynamo_format and version >= (0, 5, 22),
    )
