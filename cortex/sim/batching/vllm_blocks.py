"""vLLM's KV block pool: physical blocks, their reference counts, the prefix-cache map from
block hash to blocks, the free queue that orders their reuse, and the KV events all of that
generates. The scheduler model that drives it is ``cortex.sim.batching.vllm``.

Pure. Facts from vLLM 0.32's ``v1/core/block_pool.py`` and ``kv_cache_utils.py``
(``shared/protocols/engine-scheduling.md`` §3, §5.1):

* The pool has ``num_gpu_blocks`` blocks; block 0 is the null block and is never handed out,
  so ``usable_blocks = num_gpu_blocks - 1`` and ``usage = 1 - free / usable`` (a cached block
  nobody holds is free).
* A block is held (``ref_cnt > 0``: by each request whose block table lists it) or free (in the
  free queue). ``get_new_blocks`` pops from the queue's front; ``free_blocks`` takes blocks in
  the order they should be reused (a request's tail first), appends those that carry a hash to
  the back (LRU by release time: least recently released reused first) and prepends those
  that do not (reused first).
* A hashed block stays in the map while free: a lookup may still hit it, and ``touch`` takes
  it out of the queue (it returns to the back when its last holder frees it, so the order is
  that of last release, not of last hit). It leaves the map only when ``get_new_blocks`` pops
  it for reuse (lazy eviction): one ``BlockRemoved`` per evicted hash, at that moment.
* ``cache_full_blocks`` gives newly full blocks of a request their hashes and puts them in the
  map: one ``BlockStored`` per call for all of them. The map does not deduplicate: a hash may
  be held by two blocks (two stores, later two removals); a lookup returns the oldest.
* ``reset_prefix_cache`` succeeds only when no block is held: every hash goes, silently but
  for one ``AllBlocksCleared``.

Representation: the free queue is always [blocks without a hash][blocks with a hash, in
release order] (unhashed blocks only ever enter at the front, hashed ones at the back, and a
block only gets a hash while held), and blocks without a hash are interchangeable, so the
free unhashed blocks are a count and only held or hashed blocks are objects.

Invariants: ``num_free_blocks + num_used_blocks == usable_blocks`` with both >= 0; a block is
in the map (under its own hash) iff it has a hash; a free block with a hash is in the
eviction queue exactly once; ``truth()`` is what replaying every event taken so far yields.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cortex.ledger.kv_events import AllBlocksCleared, Event
from cortex.sim.batching.core import TruthEntry
from cortex.sim.engine_hashes import BlockHash
from cortex.sim.vllm_events import note_digests, vllm_block_removed, vllm_block_stored


@dataclass(slots=True, eq=False)
class BlockSource:
    """The request whose tokens blocks hold: its namespace and its growing token list
    (prompt, then outputs; only ever appended to, so a block's tokens stay ``tokens[:end]``)."""

    tokens: list[int]
    lora_name: str | None = None
    lora_id: int | None = None
    cache_salt: str | None = None


@dataclass(slots=True, eq=False)
class KVBlock:
    """One physical block held by a request or cached (a hash) while free."""

    ref_cnt: int = 1
    hash: BlockHash | None = None
    source: BlockSource | None = None  # set with the hash
    end: int = 0  # the block's tokens are the last block_size of source.tokens[:end]


class VllmBlockPool:
    """vLLM's block pool (see the module docstring for the rules)."""

    def __init__(self, num_gpu_blocks: int, block_size: int, *, enable_caching: bool = True):
        if num_gpu_blocks < 2:
            raise ValueError("num_gpu_blocks must be >= 2 (block 0 is the null block)")
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.usable_blocks = num_gpu_blocks - 1
        self._free_unhashed = self.usable_blocks
        self._evictable: OrderedDict[KVBlock, None] = OrderedDict()  # front = reused first
        self._cached: dict[BlockHash, list[KVBlock]] = {}  # hash -> copies, oldest first
        self._events: list[Event] = []
        self._digests: dict[int, bytes] = {}

    # ------------------------------------------------------------ counts

    @property
    def num_free_blocks(self) -> int:
        return self._free_unhashed + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.usable_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.usable_blocks

    @staticmethod
    def count_free(blocks: Sequence[KVBlock]) -> int:
        """How many of ``blocks`` (prefix hits) sit in the free queue: touching them takes free
        capacity, so an allocation must count them."""
        return sum(1 for block in blocks if block.ref_cnt == 0)

    # ------------------------------------------------------------ operations

    def lookup(self, hashes: Iterable[BlockHash]) -> list[KVBlock]:
        """The longest run of leading ``hashes`` that are cached: the first copy of each."""
        hits: list[KVBlock] = []
        cached = self._cached
        for h in hashes:
            copies = cached.get(h)
            if not copies:
                break
            hits.append(copies[0])
        return hits

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Prefix hits join a request: one more holder each, out of the free queue."""
        evictable = self._evictable
        for block in blocks:
            if block.ref_cnt == 0:
                del evictable[block]
            block.ref_cnt += 1

    def get_new_blocks(self, count: int) -> list[KVBlock]:
        """``count`` blocks from the front of the free queue, each held once; a reused block
        that still has a hash is evicted now."""
        if count > self.num_free_blocks:
            raise ValueError(f"cannot get {count} free blocks from {self.num_free_blocks}")
        fresh = min(count, self._free_unhashed)
        self._free_unhashed -= fresh
        blocks = [KVBlock() for _ in range(fresh)]
        for _ in range(count - fresh):
            block, _ = self._evictable.popitem(last=False)
            self._evict(block)
            block.ref_cnt = 1
            blocks.append(block)
        return blocks

    def cache_full_blocks(
        self,
        blocks: Sequence[KVBlock],
        hashes: Sequence[BlockHash],
        first: int,
        end: int,
        source: BlockSource,
    ) -> None:
        """Blocks ``first..end-1`` of a request's table (``blocks``, its chain ``hashes``)
        became full: they enter the map, announced by one ``BlockStored``."""
        if not self.enable_caching or end <= first:
            return
        size = self.block_size
        cached = self._cached
        for index in range(first, end):
            block = blocks[index]
            h = hashes[index]
            block.hash = h
            block.source = source
            block.end = (index + 1) * size
            copies = cached.get(h)
            if copies is None:
                cached[h] = [block]
            else:
                copies.append(block)
        stored = hashes[first:end]
        parent = hashes[first - 1] if first else None
        note_digests(self._digests, stored if parent is None else (parent, *stored))
        self._events.append(
            vllm_block_stored(
                stored,
                parent,
                source.tokens[first * size : end * size],
                size,
                lora_name=source.lora_name,
                lora_id=source.lora_id,
                cache_salt=source.cache_salt,
            )
        )

    def free_blocks(self, ordered_blocks: Iterable[KVBlock]) -> None:
        """One holder fewer for each of ``blocks``, given in the order they should be reused
        (vLLM frees a request tail first); those nobody holds any more join the free queue."""
        evictable = self._evictable
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.hash is None:
                    self._free_unhashed += 1
                else:
                    evictable[block] = None

    def reset_prefix_cache(self) -> bool:
        """Drop every hash (``AllBlocksCleared``) if no block is held; else change nothing."""
        if self.num_used_blocks:
            return False
        for copies in self._cached.values():
            for block in copies:
                block.hash = None
                block.source = None
        self._cached.clear()
        self._evictable.clear()
        self._free_unhashed = self.usable_blocks
        self._events.append(AllBlocksCleared())
        return True

    def take_events(self) -> tuple[list[Event], dict[int, bytes]]:
        """The events generated since the last call, in order, and the raw digest of every
        hash they name."""
        events, digests = self._events, self._digests
        self._events, self._digests = [], {}
        return events, digests

    def truth(self) -> set[TruthEntry]:
        """Every cached prefix (for checks: it copies each block's whole path)."""
        entries: set[TruthEntry] = set()
        for copies in self._cached.values():
            block = copies[0]
            source = block.source
            assert source is not None
            entries.add((source.lora_name, source.cache_salt, tuple(source.tokens[: block.end])))
        return entries

    # ------------------------------------------------------------ internals

    def _evict(self, block: KVBlock) -> None:
        h = block.hash
        if h is None:
            return
        copies = self._cached[h]
        copies.remove(block)
        if not copies:
            del self._cached[h]
        block.hash = None
        block.source = None
        self._events.append(vllm_block_removed(h))
        note_digests(self._digests, (h,))
