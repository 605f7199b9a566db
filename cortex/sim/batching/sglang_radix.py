"""SGLang's radix cache over KV pages: match, insert, lock, LRU eviction, and their KV events.

Pure. Facts from SGLang 0.5.23 (``shared/protocols/engine-scheduling.md`` §8.1-§8.3, read in
``mem_cache/radix_cache.py`` and the unified tree's Python core). The batching model
(``cortex.sim.batching.sglang``) owns one tree and decides when to match, insert, lock and
evict; this module only keeps the tree.

Structure: one tree per namespace ``(lora_name, cache_salt)`` (SGLang's ``extra_key`` and
salt); a node holds a run of whole pages, so a 4000-token prompt at page size 1 is one node,
not 4000. A node is split only where a match or an insert diverges inside it; splits publish
nothing, so node granularity never shows on the wire, only in which runs are evicted whole.

Rules:

* ``match(ns, tokens, limit)``: the longest cached prefix of ``tokens[:limit]``, in whole
  pages (``limit`` is floored to a page); a match that ends inside a node splits it. Every node
  on the matched path is touched (LRU). Returns the last matched node (``.end`` = the match
  length; a root at 0).
* ``insert(ns, tokens)``: caches ``tokens`` (floored to whole pages). What is already cached is
  reused, never stored twice; the rest becomes one new leaf, recorded as one ``BlockStored``
  (its pages, chained to the parent's last page) in the event queue. Touches the path.
* ``lock``/``unlock``: ``lock_ref`` along the path to the root. A locked node is never evicted.
* ``evict(n)``: removes least recently touched unlocked leaves, whole, until at least ``n``
  tokens are freed or nothing is evictable; a parent left an unlocked leaf becomes a
  candidate, so descendants always go before their ancestors. One ``BlockRemoved`` per node
  (the queue merges consecutive ones).

Invariants (``audit`` checks them): ``size_tokens`` = sum of node lengths;
``evictable_tokens`` = sum of the lengths of nodes with ``lock_ref == 0``; every unlocked leaf
is an eviction candidate at its last touch; every node holds a positive whole number of pages,
its engine hashes (``hashes``) and raw digests (``digests``, 32 bytes a page, for the chain of
children) one per page; no two children of a node start with the same page; every cached
page's ancestors are cached (no orphans).

Cost: match and insert O(nodes on the path + tokens compared); lock and unlock O(nodes on the
path); eviction O(log heap) per node. Hashing costs one SHA-256 per new page (two with a
LoRA namespace). ``truth`` and ``audit`` walk every page and are meant for tests.
"""

from __future__ import annotations

import heapq
import itertools
from array import array
from collections.abc import Iterator, Sequence

from cortex.sim.batching.core import TruthEntry
from cortex.sim.engine_hashes import SglangChainHasher
from cortex.sim.sglang_events import SglangEventQueue

Namespace = tuple[str | None, str | None]
PageKey = int | tuple[int, ...]
DIGEST_BYTES = 32


class RadixNode:
    """A run of cached pages (a root: the empty run of its namespace)."""

    __slots__ = ("alive", "children", "digests", "end", "hashes", "key", "lock_ref", "namespace",
                 "parent", "serial", "tick")

    def __init__(
        self, namespace: Namespace, key: tuple[int, ...], parent: RadixNode | None, end: int,
        serial: int, tick: int,
    ) -> None:
        self.namespace = namespace
        self.key = key  # the node's own tokens
        self.parent = parent
        self.children: dict[PageKey, RadixNode] = {}
        self.lock_ref = 0
        self.tick = tick  # last touch (LRU)
        self.serial = serial
        self.end = end  # tokens from the root through this node
        self.hashes = array("Q")  # engine hash of each page (event values)
        self.digests = b""  # raw SHA-256 of each page, concatenated
        self.alive = True

    @property
    def is_root(self) -> bool:
        return self.parent is None


class SglangRadixTree:
    """SGLang's radix cache (see the module docstring)."""

    def __init__(
        self, hasher: SglangChainHasher, page_size: int, events: SglangEventQueue
    ) -> None:
        if page_size <= 0:
            raise ValueError("page_size must be positive")
        self.hasher = hasher
        self.page_size = page_size
        self.events = events
        self.size_tokens = 0
        self.evictable_tokens = 0
        self._roots: dict[Namespace, RadixNode] = {}
        self._serials = itertools.count()
        self._tick = 0
        # (tick, serial, node): eviction candidates, checked again when popped
        self._heap: list[tuple[int, int, RadixNode]] = []
        self._live_nodes = 0

    # ------------------------------------------------------------ lookups

    def root(self, namespace: Namespace) -> RadixNode:
        root = self._roots.get(namespace)
        if root is None:
            root = RadixNode(namespace, (), None, 0, next(self._serials), 0)
            self._roots[namespace] = root
        return root

    def match(self, namespace: Namespace, tokens: Sequence[int], limit: int) -> RadixNode:
        limit = min(limit, len(tokens)) // self.page_size * self.page_size
        node, _ = self._walk(namespace, tokens, limit)
        return node

    def insert(self, namespace: Namespace, tokens: Sequence[int]) -> RadixNode:
        page = self.page_size
        length = len(tokens) // page * page
        node, pos = self._walk(namespace, tokens, length)
        if pos == length:
            return node
        key = tuple(tokens[pos:length])
        lora_name, cache_salt = namespace
        prior = None if node.is_root else node.digests[-DIGEST_BYTES:]
        values, digests = self.hasher.continue_chain(prior, key, page, lora_name, cache_salt)
        leaf = RadixNode(namespace, key, node, length, next(self._serials), self._tick)
        leaf.hashes = array("Q", values)
        leaf.digests = b"".join(digests)
        node.children[self._page_key(key, 0)] = leaf
        self._live_nodes += 1
        self.size_tokens += len(key)
        self.evictable_tokens += len(key)
        self.events.record_store(
            values, None if node.is_root else node.hashes[-1], key, page, lora_name, cache_salt)
        self._offer(leaf)
        return leaf

    # ------------------------------------------------------------ locks and eviction

    def lock(self, node: RadixNode) -> None:
        while node.parent is not None:
            if node.lock_ref == 0:
                self.evictable_tokens -= len(node.key)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        while node.parent is not None:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_tokens += len(node.key)
                self._offer(node)
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        """Evict whole LRU leaves until ``num_tokens`` are freed or none is left: the tokens
        freed."""
        freed = 0
        heap = self._heap
        while freed < num_tokens and heap:
            tick, _, node = heapq.heappop(heap)
            if not (node.alive and node.lock_ref == 0 and not node.children
                    and node.tick == tick):
                continue
            parent = node.parent
            assert parent is not None
            del parent.children[self._page_key(node.key, 0)]
            node.alive = False
            self._live_nodes -= 1
            self.size_tokens -= len(node.key)
            self.evictable_tokens -= len(node.key)
            freed += len(node.key)
            self.events.record_remove(node.hashes)
            self._offer(parent)
        if len(heap) > 4 * (self._live_nodes + 16):
            self._heap = [e for e in heap if e[2].alive]
            heapq.heapify(self._heap)
        return freed

    def reset(self) -> None:
        """Empty the tree (events are the caller's: a flush clears, a restart says nothing)."""
        for node in self.nodes():
            node.alive = False
        self._roots.clear()
        self._heap.clear()
        self._live_nodes = 0
        self.size_tokens = 0
        self.evictable_tokens = 0

    # ------------------------------------------------------------ inspection

    def nodes(self) -> Iterator[RadixNode]:
        """Every cached node (roots excluded)."""
        stack = [child for root in self._roots.values() for child in root.children.values()]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def truth(self) -> set[TruthEntry]:
        page = self.page_size
        entries: set[TruthEntry] = set()
        stack = [(child, ()) for root in self._roots.values() for child in root.children.values()]
        while stack:
            node, above = stack.pop()
            path = above + node.key
            lora_name, cache_salt = node.namespace
            for end in range(len(above) + page, len(path) + 1, page):
                entries.add((lora_name, cache_salt, path[:end]))
            stack.extend((child, path) for child in node.children.values())
        return entries

    def audit(self) -> list[str]:
        """Every broken invariant (empty when sound); checks every page's hash too."""
        problems: list[str] = []
        page = self.page_size
        size = evictable = 0
        stack = [(child, ()) for root in self._roots.values() for child in root.children.values()]
        while stack:
            node, above = stack.pop()
            path = above + node.key
            size += len(node.key)
            if node.lock_ref == 0:
                evictable += len(node.key)
            if node.lock_ref < 0:
                problems.append(f"node {node.serial}: lock_ref {node.lock_ref}")
            if not node.key or len(node.key) % page:
                problems.append(f"node {node.serial}: {len(node.key)} tokens, page {page}")
            if node.end != len(path) or not node.alive:
                problems.append(f"node {node.serial}: end {node.end} != {len(path)} or dead")
            expected = [h.value for h in self.hasher(path, page, *node.namespace)]
            if list(node.hashes) != expected[len(above) // page:]:
                problems.append(f"node {node.serial}: page hashes differ from the chain")
            if len(node.digests) != DIGEST_BYTES * (len(node.key) // page):
                problems.append(f"node {node.serial}: {len(node.digests)} digest bytes")
            for first, child in node.children.items():
                if child.parent is not node or self._page_key(child.key, 0) != first:
                    problems.append(f"node {child.serial}: misfiled under {node.serial}")
            stack.extend((child, path) for child in node.children.values())
        candidates = {(tick, serial) for tick, serial, node in self._heap if node.alive}
        for node in self.nodes():
            if (node.lock_ref == 0 and not node.children
                    and (node.tick, node.serial) not in candidates):
                problems.append(f"node {node.serial}: an unlocked leaf eviction never finds")
        if size != self.size_tokens or evictable != self.evictable_tokens:
            problems.append(f"sizes {self.size_tokens}/{self.evictable_tokens} counted, "
                            f"{size}/{evictable} held")
        return problems

    # ------------------------------------------------------------ internals

    def _page_key(self, tokens: Sequence[int], pos: int) -> PageKey:
        if self.page_size == 1:
            return tokens[pos]
        return tuple(tokens[pos : pos + self.page_size])

    def _walk(
        self, namespace: Namespace, tokens: Sequence[int], length: int
    ) -> tuple[RadixNode, int]:
        """Follow ``tokens[:length]`` (whole pages) down the tree, touching and splitting as
        SGLang's match does: the deepest node reached and how many tokens it covers."""
        self._tick += 1
        tick = self._tick
        page = self.page_size
        node = self.root(namespace)
        node.tick = tick
        pos = 0
        while pos < length:
            child = node.children.get(self._page_key(tokens, pos))
            if child is None:
                break
            key = child.key
            n = min(len(key), length - pos)
            if n == len(key) and tuple(tokens[pos : pos + n]) == key:
                common = n
            else:
                common = 0
                for a, b in zip(key[:n], tokens[pos : pos + n], strict=True):
                    if a != b:
                        break
                    common += 1
                common = common // page * page
            child.tick = tick
            if common < len(key):
                upper = self._split(child, common)
                self._offer(child)  # the touched tail may be an evictable leaf
                node, pos = upper, pos + common
                break
            node, pos = child, pos + common
        self._offer(node)
        return node, pos

    def _split(self, node: RadixNode, at: int) -> RadixNode:
        """Cut ``node`` after ``at`` tokens (a whole number of pages > 0): the new upper node
        takes the head, ``node`` keeps the tail (and its identity, locks and children)."""
        parent = node.parent
        assert parent is not None and 0 < at < len(node.key)
        pages = at // self.page_size
        upper = RadixNode(node.namespace, node.key[:at], parent, node.end - len(node.key) + at,
                          next(self._serials), node.tick)
        upper.lock_ref = node.lock_ref
        upper.hashes = node.hashes[:pages]
        upper.digests = node.digests[: pages * DIGEST_BYTES]
        parent.children[self._page_key(node.key, 0)] = upper
        node.key = node.key[at:]
        node.hashes = node.hashes[pages:]
        node.digests = node.digests[pages * DIGEST_BYTES :]
        node.parent = upper
        upper.children[self._page_key(node.key, 0)] = node
        self._live_nodes += 1
        return upper

    def _offer(self, node: RadixNode) -> None:
        """Make ``node`` an eviction candidate if it is an unlocked leaf (checked again when
        popped, so stale entries are harmless)."""
        if node.parent is not None and node.lock_ref == 0 and not node.children and node.alive:
            heapq.heappush(self._heap, (node.tick, node.serial, node))
