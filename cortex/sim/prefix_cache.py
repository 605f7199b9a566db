"""A simulated engine's paged prefix cache: what it holds, and the KV events it emits.

Pure (no I/O). Two behaviours, one interface (``admit`` / ``release`` / ``clear`` / ``reset`` /
``truth``), both with a capacity in blocks:

``VllmPrefixCache`` (vLLM V1 block pool):
* Blocks are keyed by their engine hash. A request hits its longest run of cached leading full
  blocks, capped at ``(len(tokens) - 1) // block_size`` blocks: the engine always recomputes the
  last prompt token, so a fully cached prompt recomputes (and re-stores) its last block.
  ``read_limit`` caps the hit further (vLLM skips its cache for prompt logprobs: 0). The same
  hash can therefore be cached in two physical blocks, stored twice and removed twice.
* The absent full blocks after the hit are computed and stored as ONE ``BlockStored`` per
  request; its parent is the hash of the block before them (None at the root).
* Eviction is LRU over blocks not in use, one ``BlockRemoved`` (one hash) per evicted block.
  Nothing ties eviction to the tree, but vLLM frees a finished request's blocks tail first
  (``free_order="tail_first"``, the default), and every hit refreshes the whole prefix, so
  children still go before their parents in practice. ``free_order="head_first"`` frees the
  parent first (plain LRU by position): parents are then evicted before their children, whose
  cached blocks become unreachable orphans, a case consumers must survive.

``SglangPrefixCache`` (SGLang radix cache over pages):
* One radix tree per namespace; each page is a node (splits emit nothing, so node granularity
  does not show on the wire). Hits are capped like vLLM's (and by ``read_limit``: SGLang's
  ``logprob_start_len``), but matched pages are never stored again (the radix insert
  deduplicates).
* New pages of a request form one chain and are published as ONE coalesced ``BlockStored``
  (fields as SGLang's recorder sets them: ``cortex.sim.sglang_events``).
* Eviction takes the least recently used unlocked leaf, repeatedly: descendants always go before
  ancestors. All removals of one step form ONE ``BlockRemoved`` with several hashes.

Both:
* A namespace is ``(lora_name, cache_salt)``; namespaces never share blocks.
* Partial trailing blocks are never stored.
* ``admit`` returns events in happening order: the evictions that made room, then the store.
  Blocks that still do not fit (everything else in use) are computed but not cached.
* Invariant: ``used_blocks <= capacity_blocks``; the blocks of a request in flight (its hits and
  new blocks) are never evicted to make room for that same request.
* ``clear`` empties the cache and emits ``AllBlocksCleared``; ``reset`` (engine restart) empties
  it silently. Either way outstanding leases become no-ops.
* ``truth()`` = ``{(lora_name, cache_salt, tokens from the root through the block end)}`` for
  every cached block.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from cortex.ledger.kv_events import AllBlocksCleared, Event
from cortex.sim.engine_hashes import BlockHash, ChainHasher, VllmChainHasher
from cortex.sim.sglang_events import pages_removed, pages_stored
from cortex.sim.vllm_events import note_digests, vllm_block_removed, vllm_block_stored

Namespace = tuple[str | None, str | None]
FreeOrder = Literal["tail_first", "head_first"]
TruthEntry = tuple[str | None, str | None, tuple[int, ...]]

MEDIUM = "GPU"


@dataclass(frozen=True, slots=True)
class AdmitResult:
    """What admitting one request did."""

    cached_tokens: int
    events: list[Event]
    # vLLM only: the raw digest of every hash in ``events`` (for the bytes-hash wire mode)
    hash_digests: dict[int, bytes] = field(default_factory=dict)
    # set when the request keeps its blocks in use until ``release(lease)``
    lease: int | None = None


def _check_config(block_size: int, capacity_blocks: int) -> None:
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    if capacity_blocks < 0:
        raise ValueError("capacity_blocks must not be negative")


def _full_blocks_hit_cap(n_tokens: int, block_size: int, read_limit: int | None = None) -> int:
    """How many leading blocks may count as cached: the last token is always recomputed, and a
    request may read at most ``read_limit`` tokens from the cache (prompt logprobs)."""
    tokens = max(n_tokens - 1, 0)
    if read_limit is not None and read_limit < tokens:
        tokens = read_limit
    return tokens // block_size


# ---------------------------------------------------------------- vLLM


@dataclass(slots=True, eq=False)
class _Block:
    namespace: Namespace
    hash: BlockHash
    source: tuple[int, ...]  # tokens of the request that computed the block
    end: int  # the block's path is source[:end]
    refs: int = 0
    cached: bool = True


class VllmPrefixCache:
    """vLLM-like block pool (see the module docstring for the rules)."""

    def __init__(
        self,
        hasher: VllmChainHasher,
        *,
        block_size: int,
        capacity_blocks: int,
        free_order: FreeOrder = "tail_first",
    ) -> None:
        _check_config(block_size, capacity_blocks)
        if free_order not in ("tail_first", "head_first"):
            raise ValueError(f"unknown free_order {free_order!r}")
        self.hasher = hasher
        self.free_order = free_order
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self._copies: dict[tuple[Namespace, int], list[_Block]] = {}
        self._free: OrderedDict[int, _Block] = OrderedDict()  # front = evicted first
        self._used = 0
        self._leases: dict[int, list[_Block]] = {}
        self._lease_ids = itertools.count(1)

    @property
    def used_blocks(self) -> int:
        return self._used

    def admit(
        self,
        token_ids: Sequence[int],
        *,
        lora_name: str | None = None,
        cache_salt: str | None = None,
        hold: bool = False,
        read_limit: int | None = None,
    ) -> AdmitResult:
        tokens = tuple(int(t) for t in token_ids)
        ns: Namespace = (lora_name, cache_salt)
        size = self.block_size
        hashes = self.hasher(tokens, size, lora_name, cache_salt)
        in_use: list[_Block] = []
        for h in hashes[: _full_blocks_hit_cap(len(tokens), size, read_limit)]:
            copies = self._copies.get((ns, h.value))
            if not copies:
                break
            in_use.append(copies[0])
        hit = len(in_use)
        for block in in_use:
            self._acquire(block)
        events: list[Event] = []
        digests: dict[int, bytes] = {}
        new = hashes[hit:]
        while self.capacity_blocks - self._used < len(new) and self._free:
            _, victim = self._free.popitem(last=False)
            self._drop(victim)
            events.append(vllm_block_removed(victim.hash))
            note_digests(digests, (victim.hash,))
        stored = new[: max(self.capacity_blocks - self._used, 0)]
        for index, h in enumerate(stored, start=hit):
            block = _Block(ns, h, tokens, (index + 1) * size)
            self._copies.setdefault((ns, h.value), []).append(block)
            self._used += 1
            self._acquire(block)
            in_use.append(block)
        if stored:
            parent = hashes[hit - 1] if hit else None
            note_digests(digests, stored if parent is None else (parent, *stored))
            events.append(
                vllm_block_stored(
                    stored,
                    parent,
                    tokens[hit * size : (hit + len(stored)) * size],
                    size,
                    lora_name=lora_name,
                    lora_id=self.hasher.loras.lora_id(lora_name),
                    cache_salt=cache_salt,
                )
            )
        lease = None
        if hold:
            lease = next(self._lease_ids)
            self._leases[lease] = in_use
        else:
            self._release_blocks(in_use)
        return AdmitResult(hit * size, events, digests, lease)

    def release(self, lease: int) -> None:
        """The request holding ``lease`` finished: its blocks become evictable."""
        self._release_blocks(self._leases.pop(lease, []))

    def clear(self) -> list[Event]:
        self.reset()
        return [AllBlocksCleared()]

    def reset(self, hasher: VllmChainHasher | None = None) -> None:
        for copies in self._copies.values():
            for block in copies:
                block.cached = False
        self._copies.clear()
        self._free.clear()
        self._leases.clear()
        self._used = 0
        if hasher is not None:
            self.hasher = hasher

    def truth(self) -> set[TruthEntry]:
        return {
            (*ns, block.source[: block.end])
            for (ns, _), copies in self._copies.items()
            for block in copies[:1]
        }

    def _acquire(self, block: _Block) -> None:
        block.refs += 1
        self._free.pop(id(block), None)

    def _release_blocks(self, path: Sequence[_Block]) -> None:
        ordered = reversed(path) if self.free_order == "tail_first" else iter(path)
        for block in ordered:  # the first freed is the first evicted
            block.refs -= 1
            if block.refs == 0 and block.cached:
                self._free[id(block)] = block

    def _drop(self, block: _Block) -> None:
        key = (block.namespace, block.hash.value)
        copies = self._copies[key]
        copies.remove(block)
        if not copies:
            del self._copies[key]
        block.cached = False
        self._used -= 1


# ---------------------------------------------------------------- SGLang


@dataclass(slots=True, eq=False)
class _Page:
    namespace: Namespace
    hash: int
    key: tuple[int, ...]  # the page's own tokens
    parent: _Page | None
    source: tuple[int, ...]
    end: int
    serial: int
    last_access: int = 0
    locks: int = 0
    cached: bool = True
    children: dict[tuple[int, ...], _Page] = field(default_factory=dict)


class SglangPrefixCache:
    """SGLang-like radix cache over pages (see the module docstring for the rules)."""

    def __init__(self, hasher: ChainHasher, *, block_size: int, capacity_blocks: int) -> None:
        _check_config(block_size, capacity_blocks)
        self.hasher = hasher
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self._roots: dict[Namespace, dict[tuple[int, ...], _Page]] = {}
        self._used = 0
        self._clock = 0
        self._serials = itertools.count()
        # (last_access, serial, page): candidates for eviction, checked again when popped
        self._leaf_heap: list[tuple[int, int, _Page]] = []
        self._leases: dict[int, list[_Page]] = {}
        self._lease_ids = itertools.count(1)

    @property
    def used_blocks(self) -> int:
        return self._used

    def admit(
        self,
        token_ids: Sequence[int],
        *,
        lora_name: str | None = None,
        cache_salt: str | None = None,
        hold: bool = False,
        read_limit: int | None = None,
    ) -> AdmitResult:
        tokens = tuple(int(t) for t in token_ids)
        ns: Namespace = (lora_name, cache_salt)
        size = self.block_size
        n_full = len(tokens) // size
        self._clock += 1
        children = self._roots.setdefault(ns, {})
        path: list[_Page] = []
        for index in range(n_full):
            page = children.get(tokens[index * size : (index + 1) * size])
            if page is None:
                break
            path.append(page)
            children = page.children
        matched = len(path)
        for page in path:
            page.last_access = self._clock
            page.locks += 1
        events: list[Event] = []
        need = n_full - matched
        removed = self._evict(need - (self.capacity_blocks - self._used))
        if removed:
            events.append(pages_removed(removed))
        n_store = min(need, self.capacity_blocks - self._used)
        if n_store > 0:
            hashes = self.hasher(tokens[: (matched + n_store) * size], size, lora_name, cache_salt)
            parent = path[-1] if path else None
            for index in range(matched, matched + n_store):
                key = tokens[index * size : (index + 1) * size]
                page = _Page(
                    ns, hashes[index].value, key, parent, tokens, (index + 1) * size,
                    next(self._serials), last_access=self._clock, locks=1,
                )
                (parent.children if parent else self._roots[ns])[key] = page
                self._used += 1
                path.append(page)
                parent = page
            events.append(
                pages_stored(
                    [p.hash for p in path[matched:]],
                    path[matched - 1].hash if matched else None,
                    tokens[matched * size : (matched + n_store) * size],
                    size,
                    lora_name,
                    cache_salt,
                )
            )
        lease = None
        if hold:
            lease = next(self._lease_ids)
            self._leases[lease] = path
        else:
            self._unlock(path)
        cached_tokens = min(matched, _full_blocks_hit_cap(len(tokens), size, read_limit)) * size
        return AdmitResult(cached_tokens, events, {}, lease)

    def release(self, lease: int) -> None:
        self._unlock(self._leases.pop(lease, []))

    def clear(self) -> list[Event]:
        self.reset()
        return [AllBlocksCleared()]

    def reset(self, hasher: ChainHasher | None = None) -> None:
        for page in self._pages():
            page.cached = False
        self._roots.clear()
        self._leaf_heap.clear()
        self._leases.clear()
        self._used = 0
        if hasher is not None:
            self.hasher = hasher

    def truth(self) -> set[TruthEntry]:
        return {(*page.namespace, page.source[: page.end]) for page in self._pages()}

    def _pages(self) -> Iterable[_Page]:
        stack = [page for children in self._roots.values() for page in children.values()]
        while stack:
            page = stack.pop()
            yield page
            stack.extend(page.children.values())

    def _unlock(self, path: Sequence[_Page]) -> None:
        for page in path:
            page.locks -= 1
            self._offer_leaf(page)

    def _offer_leaf(self, page: _Page) -> None:
        if page.cached and page.locks == 0 and not page.children:
            heapq.heappush(self._leaf_heap, (page.last_access, page.serial, page))

    def _evict(self, count: int) -> list[int]:
        removed: list[int] = []
        while len(removed) < count and self._leaf_heap:
            last_access, _, page = heapq.heappop(self._leaf_heap)
            evictable = page.cached and page.locks == 0 and not page.children
            if not evictable or last_access != page.last_access:
                continue
            siblings = page.parent.children if page.parent else self._roots[page.namespace]
            del siblings[page.key]
            page.cached = False
            self._used -= 1
            removed.append(page.hash)
            if page.parent is not None:
                self._offer_leaf(page.parent)
        if len(self._leaf_heap) > 4 * (self._used + 16):
            self._leaf_heap = [e for e in self._leaf_heap if e[2].cached]
            heapq.heapify(self._leaf_heap)
        return removed


PrefixCache = VllmPrefixCache | SglangPrefixCache
