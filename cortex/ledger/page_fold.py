"""Folding SGLang's per-token pages into Cortex's coarse blocks: the rules, and the reference.

SGLang's default page size is 1: its radix cache publishes one ``BlockStored`` per token, each
naming the token and the hash of the token before it (``shared/protocols/kv-events.md`` §4.5,
``block-hashing.md`` §2). Cortex keeps its ledger in blocks of ``G`` tokens (the model's
``block_size``) all the same: a worker holds coarse block ``k`` (tokens ``[kG, (k+1)G)``) once it
has stored the block's last token, and stops holding it when that token is removed. Both follow
from SGLang's radix cache and hold for SGLang only:

* a stored token implies its whole prefix (a radix node's parent is in the tree), so storing the
  last token of a block means every token of the block is stored;
* eviction takes leaves first (``RadixCache.evict``), so when any token of a block is removed its
  descendants — the block's last token among them — are removed in the same ``BlockRemoved`` or
  before it. Removing the last token is removing the block. (vLLM evicts parents before children:
  never fold vLLM's events.)

So a coarse block is named by the engine hash of its last token, and the ledger's tree of block
size ``G`` takes coarse stores as any engine's. What the fold needs to know of every token it has
seen is where it sits: its *position* (tokens before it on its path), its token id and the hash
before it — to find, for a store continuing a path at position ``d``, the tokens of the partly
filled block ``[floor(d/G)*G, d)`` and the last token of the block before. SGLang's hashes are a
SHA-256 chain over the path with no per-instance seed, so a hash names one path on every worker:
one index per model serves all workers, and its facts never go stale (a cleared or restarted
worker does not make them false).

Rules of ``PageFold`` (``cortex._fast.page_fold`` keeps them in C; this module is the reference
the property test compares it with, operation by operation):

* F1 — the index holds (hash → parent hash, position, token) in two generations, *young* and
  *old*, each at most ``capacity`` entries. A lookup reads young, then old; an entry found in
  old is copied into young (it is in use). Every insert goes into young (replacing an entry of
  the same hash there). Right after an insert that leaves young with ``capacity`` entries, old
  is dropped (its entries are *forgotten*, counted) and young becomes old. So memory is bounded
  by ``2 x capacity`` entries, and a path continued now and then is never forgotten.
* F2 — ``fold(parent, hashes, tokens)``: ``parent`` None starts a path at position 0;
  otherwise the parent is looked up (unknown → ``None``: the store cannot be placed, nothing
  is inserted). With ``d`` the run's first position and ``s = floor(d/G)*G``, the ``d - s`` tokens
  before the run back to ``s`` are gathered walking parent links from the parent; every step
  must find the entry one position lower (else ``None``, counted as a conflict when the entry
  is there at another position). Then each token of the run is inserted at its position, and the
  result is the coarse store: the coarse parent (the hash before position ``s``; None when
  ``s == 0``), the hashes of the run's tokens that end a block (position ``p`` with
  ``(p + 1) % G == 0``) and the ``G`` tokens of each such block, in order.
* F3 — ``keep(hashes)``: the hashes of a ``BlockRemoved`` that may name a coarse block: those
  that end a block or that the index does not know (no promotion). Known tokens inside a block
  name no coarse block and are dropped.
* F4 — positions are below ``2**32 - 1``; a run that would pass it is refused like an unknown
  parent.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

MAX_POSITION = 0xFFFF_FFFE


class PageFoldReference:
    """The rules above in plain Python (dicts of tuples): the twin of ``cortex._fast.page_fold``."""

    def __init__(self, granularity: int, capacity: int) -> None:
        if granularity < 2:
            raise ValueError(f"granularity must be >= 2, got {granularity}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.granularity = granularity
        self.capacity = capacity
        self._young: dict[int, tuple[int, int, int]] = {}
        self._old: dict[int, tuple[int, int, int]] = {}
        self.forgotten = 0
        self.conflicts = 0

    @property
    def entries(self) -> int:
        return len(self._young) + len(self._old)

    def _insert(self, block_hash: int, parent: int, position: int, token: int) -> None:
        self._young[block_hash] = (parent, position, token)
        if len(self._young) >= self.capacity:
            self.forgotten += len(self._old)
            self._old, self._young = self._young, {}

    def _lookup(self, block_hash: int) -> tuple[int, int, int] | None:
        found = self._young.get(block_hash)
        if found is None:
            found = self._old.get(block_hash)
            if found is not None:
                self._insert(block_hash, *found)
        return found

    def fold(
        self, parent: int | None, hashes: Sequence[int], tokens: Sequence[int]
    ) -> tuple[int | None, array[int], array[int]] | None:
        size = self.granularity
        if len(hashes) != len(tokens):
            raise ValueError(f"{len(tokens)} token ids for {len(hashes)} pages of 1 token")
        gathered: list[int] = []
        coarse_parent: int | None = None
        start = 0
        if parent is None and len(hashes) > MAX_POSITION:
            return None
        if parent is not None:
            found = self._lookup(parent)
            if found is None:
                return None
            start = found[1] + 1
            if start + len(hashes) > MAX_POSITION:
                return None
            block_start = start - start % size
            entry, position = found, start - 1
            while position >= block_start:  # the tokens of the partly filled block, backwards
                if entry[1] != position:
                    self.conflicts += 1
                    return None
                gathered.append(entry[2])
                if position == block_start:
                    break
                entry = self._lookup(entry[0])
                if entry is None:
                    return None
                position -= 1
            gathered.reverse()
            if block_start > 0:
                coarse_parent = parent if start == block_start else entry[0]
        out_hashes = array("Q")
        out_tokens = array("I")
        block = gathered
        before = 0 if parent is None else parent
        for offset, (block_hash, token) in enumerate(zip(hashes, tokens, strict=True)):
            position = start + offset
            self._insert(block_hash, before, position, token)
            block.append(token)
            if (position + 1) % size == 0:
                out_hashes.append(block_hash)
                out_tokens.extend(block)
                block = []
            before = block_hash
        return coarse_parent, out_hashes, out_tokens

    def keep(self, hashes: Sequence[int]) -> array[int]:
        size = self.granularity
        kept = array("Q")
        for block_hash in hashes:
            found = self._young.get(block_hash) or self._old.get(block_hash)
            if found is None or (found[1] + 1) % size == 0:
                kept.append(block_hash)
        return kept
