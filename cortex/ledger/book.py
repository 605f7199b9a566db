"""``LedgerBook``: every target's ledger entries, in one ``BlockTree`` per (engine family,
model, block size), plus the registry of targets and their trust states.

Pure: no I/O, no wall clock, single owner (the trio thread). Decisions about
states are made by the sync machine (``cortex.events.sync``); the book only stores them.

Rules:

* Targets: ids in [0, 65535), one per (worker, DP rank); ``register`` is idempotent for the same
  (worker, rank, family, model); ids freed by ``unregister`` are reused, smallest first. A new
  target starts ``SYNCING``.
* Trees: SGLang and vLLM never share a tree; a target's stores go to the tree of its registered
  (family, model) and the event's block size. The namespace (model, LoRA name, cache salt)
  keys a store without a parent; a store with a parent continues the parent's namespace (vLLM
  names the salt only in a request's first block).
* ``apply`` applies a batch's events in order and never raises on a decoded batch: events it
  cannot use (a bad block size, token ids that do not fill the blocks, ids out of range) are
  skipped whole and counted in ``ApplyResult.invalid_events``. BlockStored of a non-main KV
  group is skipped (``skipped_non_main``). BlockRemoved carries no block size: its hashes are
  looked up in the trees the target stored into (almost always one). AllBlocksCleared empties
  the target everywhere.
* Recency: the book owns a logical clock, one tick per ``apply`` (a batch), and stamps every
  store with it, so the trees' least-recently-touched order is the order batches arrived in.
* Entry budget: with ``max_entries`` set, a BlockStored that leaves more than ``max_entries``
  entries in all trees together evicts down to ``low_water * max_entries`` (amortized: one
  eviction frees ``(1 - low_water) * max_entries`` entries), least recently touched first,
  deepest first (``ledger.pyx`` R6/R7). With several trees each gives up a share of the excess
  proportional to its entries. Evictions only remove entries, so a target's ledger stays a true
  lower bound (misses only, no false hits); later events naming evicted hashes are counted as
  unknown ones. ``evicted_entries`` / ``evictions`` count them (all trees, since start).
  Large books evict incrementally (``ledger.pyx`` R9): the eviction starts ``_slack`` entries
  (half the evicted fraction) before the budget, aims ``_slack`` below the low water and
  advances a bounded number of node and map-slot visits per store, so no store pauses for a
  whole pass over the ledger; it finishes at once only when a store would exceed
  ``max_entries``, which stays a hard bound.
* Page folding (``cortex.ledger.page_fold``, rules F1-F4): for a model given ``fold_pages``, an
  SGLang store of one-token pages (SGLang's default page size) is folded into the model's
  coarse blocks before it reaches the tree of that block size, and a removal keeps only the
  hashes that may name a coarse block. A folded store counts its pages in ``stored_blocks``;
  one that cannot be placed (parent unknown to the index) counts in ``unknown_parent``, as a
  tree's does. vLLM's events are never folded (it evicts parents before children).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cortex._fast.blockkeys import namespace_seed
from cortex._fast.ledger import ALL_MEDIA, GPU_ONLY, BlockTree
from cortex._fast.page_fold import PageFold
from cortex.errors import ConfigError, CortexError
from cortex.ledger.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineFamily,
    EventBatch,
    Medium,
)
from cortex.ledger.state import TargetState

MAX_TARGETS = 65535
SYNC_WORK = 1 << 16  # node and map-slot visits: evictions of books this small stay synchronous
MIN_STEP_WORK = 1 << 12
UNLIMITED_WORK = (1 << 64) - 1
MAX_BLOCK_SIZE = 1 << 16  # tokens; larger values are corrupt input, not a cache geometry
_CACHE_LIMIT = 4096  # namespace seeds / media remembered before the caches are reset
_INPUT_ERRORS = (ValueError, OverflowError, TypeError)
DEFAULT_FOLD_ENTRIES = 1 << 22  # tokens per generation of a model's page fold


@dataclass(frozen=True, slots=True)
class LedgerSettings:
    """The ``ledger`` section of the configuration."""

    # (block, worker rank, medium) entries kept in all trees together; None: no budget.
    # ~75 bytes each (perf/RESULTS.md), so the default bounds the ledger near 1.5 GB.
    max_entries: int | None = 20_000_000
    # Fraction of max_entries one eviction frees (it goes down to the low water 1 - this):
    # amortizes the eviction's passes over the tree.
    evict_fraction: float = 0.05
    # Warm start: a peer replica's control plane (http://host:port); at start its
    # /admin/ledger/snapshot is loaded and continued by replay (None: always replay from 0).
    warm_start_url: str | None = None
    # The peer's admin bearer token (a secret: masked in print-config and logs).
    warm_start_token: str | None = field(default=None, repr=False, metadata={"secret": True})
    # Deadline of fetching the snapshot; past it Cortex starts without one.
    warm_start_timeout_s: float = 10.0
    # Largest snapshot accepted (bytes); a larger one is refused and ignored.
    warm_start_max_bytes: int = 1 << 30
    # SGLang page-size-1 tokens remembered per model and generation, to fold per-token events
    # into the model's blocks (cortex.ledger.page_fold F1: at most twice this, ~32 bytes each).
    fold_entries: int = DEFAULT_FOLD_ENTRIES

    def __post_init__(self) -> None:
        problems = []
        if self.max_entries is not None and self.max_entries < 1:
            problems.append("max_entries must be >= 1 (or none: no budget)")
        if not 0.0 < self.evict_fraction < 1.0:
            problems.append("evict_fraction must be in (0, 1)")
        if self.warm_start_url is not None and not self.warm_start_url.startswith("http://"):
            problems.append("warm_start_url must be an http:// URL of a peer's control plane")
        if not self.warm_start_timeout_s > 0:
            problems.append("warm_start_timeout_s must be > 0")
        if self.warm_start_max_bytes < 1:
            problems.append("warm_start_max_bytes must be >= 1")
        if self.fold_entries < 1:
            problems.append("fold_entries must be >= 1")
        if problems:
            raise ConfigError(problems)

    @property
    def low_water(self) -> float:
        return 1.0 - self.evict_fraction


@dataclass(frozen=True, slots=True)
class TargetInfo:
    worker: str
    rank: int
    family: EngineFamily
    model: str


@dataclass(slots=True)
class ApplyResult:
    """What one ``apply`` did (counts)."""

    stored_blocks: int = 0  # blocks of applied BlockStored events (duplicates included)
    removed_blocks: int = 0  # removed hashes the target held
    unknown_parent: int = 0  # BlockStored events skipped: parent hash not held
    unknown_removal: int = 0  # removed hashes the target did not hold
    duplicate_store: int = 0  # stored hashes already held (refcount + 1)
    skipped_non_main: int = 0  # BlockStored events of other KV-cache groups
    cleared: int = 0  # AllBlocksCleared events
    hash_conflict: int = 0  # held hashes stored again with another key (entry replaced)
    invalid_events: int = 0  # events with unusable contents, skipped whole


class LedgerBook:
    def __init__(self, max_entries: int | None = None, low_water: float = 0.95,
                 fold_entries: int = DEFAULT_FOLD_ENTRIES) -> None:
        if max_entries is not None and max_entries < 1:
            raise ValueError(f"max_entries must be >= 1 (or None: no budget), got {max_entries}")
        if not 0.0 < low_water <= 1.0:
            raise ValueError(f"low_water must be in (0, 1], got {low_water}")
        self.max_entries = max_entries
        self.low_water = low_water
        # Entries below the budget at which an incremental eviction starts (R9 of ledger.pyx).
        self._slack = 0 if max_entries is None else (
            max_entries - int(max_entries * low_water)) // 2
        # Evictions of trees whose round is at most this many visits stay synchronous; visits
        # per store of an incremental eviction (0: sized from the slack). Tests lower them.
        self.sync_work = SYNC_WORK
        self.step_work = 0
        self._evicting: dict[BlockTree, int] = {}  # tree -> its goal, while incremental
        self._round_work = 0
        self._clock = 0
        self._trees: dict[tuple[EngineFamily, str, int], BlockTree] = {}
        self._infos: dict[int, TargetInfo] = {}
        self._ids: dict[tuple[str, int], int] = {}
        self._free_ids: list[int] = []  # heap
        self._next_id = 0
        self._states: dict[int, TargetState] = {}
        self._reasons: dict[int, str] = {}
        self._target_trees: dict[int, dict[int, BlockTree]] = {}  # block size -> tree
        self._seeds: dict[tuple[str, str | None, str | None], int] = {}
        self._media: dict[str | None, int] = {}
        self._state_listeners: list[Callable[[int, TargetState], None]] = []
        self.warm_start_failures = 0  # peer snapshots that could not be fetched or read
        self.fold_entries = fold_entries
        self._folds: dict[str, PageFold] = {}  # model -> its SGLang page fold

    def fold_pages(self, model: str, block_size: int) -> None:
        """Fold ``model``'s SGLang one-token pages into blocks of ``block_size`` (>= 2) tokens:
        the block size its requests are keyed with (rules at the top)."""
        fold = self._folds.get(model)
        if fold is not None and fold.granularity != block_size:
            raise ValueError(f"model {model!r} already folds pages into {fold.granularity}")
        if fold is None:
            self._folds[model] = PageFold(block_size, self.fold_entries)

    def folds_pages(self, model: str) -> bool:
        """Whether ``model``'s SGLang one-token pages are folded (``fold_pages``)."""
        return model in self._folds

    @property
    def folds(self) -> dict[str, PageFold]:
        """Model -> its page fold (metrics: entries, memory, forgotten)."""
        return dict(self._folds)

    # ------------------------------------------------------------------ registry

    def register(self, worker: str, rank: int, family: EngineFamily, model: str) -> int:
        known = self._ids.get((worker, rank))
        if known is not None:
            info = self._infos[known]
            if (info.family, info.model) != (family, model):
                raise ValueError(
                    f"{worker}/{rank} is registered as {info.family.value} {info.model!r}; "
                    "unregister it first"
                )
            return known
        if self._free_ids:
            target = heapq.heappop(self._free_ids)
        elif self._next_id < MAX_TARGETS:
            target = self._next_id
            self._next_id += 1
        else:
            raise CortexError(f"no free target id: {MAX_TARGETS} targets registered")
        self._ids[(worker, rank)] = target
        self._infos[target] = TargetInfo(worker, rank, family, model)
        self._states[target] = TargetState.SYNCING
        self._reasons[target] = "registered"
        self._target_trees[target] = {}
        return target

    def unregister(self, target: int) -> None:
        info = self._infos[target]
        self.drop_target_entries(target)
        del self._ids[(info.worker, info.rank)]
        del self._infos[target], self._states[target], self._reasons[target]
        del self._target_trees[target]
        heapq.heappush(self._free_ids, target)

    def info(self, target: int) -> TargetInfo:
        return self._infos[target]

    def find(self, worker: str, rank: int) -> int | None:
        return self._ids.get((worker, rank))

    # ------------------------------------------------------------------ states (stored only)

    def state(self, target: int) -> TargetState:
        return self._states[target]

    def set_state(self, target: int, state: TargetState, reason: str = "") -> None:
        if target not in self._infos:
            raise KeyError(target)
        before = self._states[target]
        self._states[target] = state
        self._reasons[target] = reason
        if state is not before:
            for listener in self._state_listeners:
                listener(target, state)

    def on_state_change(self, listener: Callable[[int, TargetState], None]) -> None:
        """Call ``listener(target, new_state)`` after every change of a target's state (the
        request path re-reads a worker's trust at once instead of per decision)."""
        self._state_listeners.append(listener)

    def reason(self, target: int) -> str:
        return self._reasons[target]

    def states(self) -> dict[int, TargetState]:
        return dict(self._states)

    # ------------------------------------------------------------------ events

    def apply(self, target: int, batch: EventBatch) -> ApplyResult:
        """Apply a batch's events in order (see the rules at the top)."""
        info = self._infos[target]
        model = info.model
        fold = self._folds.get(model) if info.family is EngineFamily.SGLANG else None
        self._clock = now = (self._clock + 1) & 0xFFFFFFFF
        budget = self.max_entries
        trees = self._target_trees[target]
        seeds, media = self._seeds, self._media
        stored_blocks = removed_blocks = unknown_parent = unknown_removal = 0
        duplicates = conflicts = skipped = cleared = invalid = 0
        for event in batch.events:
            kind = type(event)
            if kind is BlockStored:
                if not event.is_main_attention:
                    skipped += 1
                    continue
                parent, hashes, tokens = event.parent_hash, event.block_hashes, event.token_ids
                size = event.block_size
                if fold is not None and size == 1 and event.reproducible:
                    try:
                        folded = fold.fold(parent, hashes, tokens)
                    except _INPUT_ERRORS:
                        invalid += 1
                        continue
                    if folded is None:
                        unknown_parent += 1
                        continue
                    parent, hashes, tokens = folded
                    if not hashes:  # no block completed yet: the index alone learned the pages
                        stored_blocks += len(event.block_hashes)
                        continue
                    size = fold.granularity
                try:
                    tree = trees.get(size) or self._tree_for(target, size)
                    seed = seeds.get((model, event.lora_name, event.cache_salt))
                    if seed is None:
                        seed = self._seed(model, event.lora_name, event.cache_salt)
                    medium = media.get(event.medium)
                    if medium is None:
                        medium = self._medium(event.medium)
                except _INPUT_ERRORS:
                    tree = None
                if tree is None:
                    invalid += 1
                    continue
                duplicates_before, conflicts_before = tree.duplicate_store, tree.hash_conflict
                try:
                    stored = tree.store(target, parent, hashes, tokens, seed, medium,
                                        event.reproducible, now)
                except _INPUT_ERRORS:  # checked before anything changed (ledger.pyx, R5)
                    invalid += 1
                    continue
                duplicates += tree.duplicate_store - duplicates_before
                conflicts += tree.hash_conflict - conflicts_before
                if stored < 0:
                    unknown_parent += 1
                else:
                    stored_blocks += stored if size == event.block_size else len(
                        event.block_hashes)
                    if budget is not None and (self._evicting
                                               or self.entries + self._slack > budget):
                        self._keep_budget(budget, stored)
            elif kind is BlockRemoved:
                hashes = event.block_hashes
                try:
                    if fold is not None:
                        hashes = fold.keep(hashes)
                    unknown = self._remove(target, trees, hashes, event.medium)
                except _INPUT_ERRORS:
                    invalid += 1
                    continue
                unknown_removal += unknown
                removed_blocks += len(hashes) - unknown
            elif kind is AllBlocksCleared:
                for tree in trees.values():
                    tree.clear_target(target)
                cleared += 1
        return ApplyResult(stored_blocks, removed_blocks, unknown_parent, unknown_removal,
                           duplicates, skipped, cleared, conflicts, invalid)

    def _evict(self, budget: int) -> None:
        """Evict down to the low water at once (rules at the top)."""
        for tree, goal in self._goals(budget).items():
            tree.evict(goal)

    def _goals(self, budget: int) -> dict[BlockTree, int]:
        """Each tree's entries after an eviction down to the low water (shares of the excess
        proportional to the trees' entries)."""
        trees = list(self._trees.values())
        total = sum(tree.entries for tree in trees)
        excess = total - int(budget * self.low_water)
        goals = {}
        for tree in trees:
            share = -(-excess * tree.entries // total) if len(trees) > 1 else excess
            if share > 0:
                goals[tree] = max(0, tree.entries - share)
        return goals

    def _keep_budget(self, budget: int, stored: int) -> None:
        """After a store: start, advance or finish an eviction (R9 of ledger.pyx). Small trees
        evict at once past the budget; large ones start ``_slack`` entries before it and spread
        the work over the following stores, finishing at once only if the budget is reached."""
        if not self._evicting:
            work = sum(tree.evict_work for tree in self._trees.values())
            if work <= self.sync_work:
                if self.entries > budget:
                    self._evict(budget)
                return
            self._evicting = self._goals(budget)
            self._round_work = work
        if self.entries > budget:
            step = UNLIMITED_WORK
        else:
            step = self.step_work or max(MIN_STEP_WORK,
                                         4 * self._round_work * max(1, stored)
                                         // max(1, self._slack))
        for tree, goal in list(self._evicting.items()):
            if tree.evict_step(goal, step, self._slack * tree.entries // max(1, self.entries)):
                del self._evicting[tree]

    @property
    def evicted_entries(self) -> int:
        """Entries evicted to keep within ``max_entries`` since start (all trees)."""
        return sum(tree.evicted_entries for tree in self._trees.values())

    @property
    def evictions(self) -> int:
        """Evictions (of many entries each) since start, summed over the trees."""
        return sum(tree.evictions for tree in self._trees.values())

    def drop_target_entries(self, target: int) -> int:
        """Drop everything the target holds (replay failure, restart, death); entries dropped."""
        return sum(tree.clear_target(target) for tree in self._target_trees[target].values())

    def export_target(self, target: int) -> dict[int, tuple[bytes, bytes, bytes, bytes, bytes]]:
        """Block size -> the target's image in that tree (``BlockTree.export_target``: node
        keys, node parents, entry hashes, entry nodes, entry refcounts as native-order bytes)."""
        images = {}
        for size, tree in self._target_trees[target].items():
            if tree.target_entries(target):
                images[size] = tree.export_target(target)
        return images

    def import_target(
        self, target: int, images: dict[int, tuple[bytes, bytes, bytes, bytes, bytes]]
    ) -> int:
        """Load ``export_target`` images into a target holding nothing: all or nothing
        (``ValueError`` leaves the target empty). The entries are stamped with one new tick
        of the book's clock; the entry budget holds after. Entries added."""
        if self.target_entries(target):
            raise ValueError(f"target {target} already holds entries")
        self._clock = now = (self._clock + 1) & 0xFFFFFFFF
        added = 0
        try:
            for size, image in images.items():
                tree = self._tree_for(target, size)
                if tree is None:
                    raise ValueError(f"snapshot tree of block size {size}")
                keys, parents, hashes, nodes, refs = image
                added += tree.import_target(
                    target, memoryview(keys).cast("Q"), memoryview(parents).cast("I"),
                    memoryview(hashes).cast("Q"), memoryview(nodes).cast("I"),
                    memoryview(refs).cast("I"), now)
        except (ValueError, TypeError) as error:
            self.drop_target_entries(target)
            raise ValueError(f"snapshot image rejected: {error}") from error
        budget = self.max_entries
        if budget is not None and self.entries > budget:
            self._evict(budget)
        return added

    def _tree_for(self, target: int, block_size: int) -> BlockTree | None:
        if not 0 < block_size <= MAX_BLOCK_SIZE:
            return None
        info = self._infos[target]
        key = (info.family, info.model, block_size)
        tree = self._trees.get(key)
        if tree is None:
            tree = self._trees[key] = BlockTree(block_size)
        self._target_trees[target][block_size] = tree
        return tree

    def _seed(self, model: str, lora_name: str | None, cache_salt: str | None) -> int:
        key = (model, lora_name, cache_salt)
        seed = self._seeds.get(key)
        if seed is None:
            if len(self._seeds) >= _CACHE_LIMIT:
                self._seeds.clear()
            seed = self._seeds[key] = namespace_seed(model, lora_name, cache_salt)
        return seed

    def _medium(self, wire: str | None) -> int:
        medium = self._media.get(wire)
        if medium is None:
            if len(self._media) >= _CACHE_LIMIT:
                self._media.clear()
            medium = self._media[wire] = int(Medium.from_wire(wire))
        return medium

    def _remove(self, target: int, trees: dict[int, BlockTree], hashes: Sequence[int],
                wire_medium: str | None) -> int:
        """Apply one BlockRemoved's ``hashes``; how many of them the target did not hold."""
        medium = self._medium(wire_medium)
        if len(trees) == 1:
            for tree in trees.values():
                return tree.remove(target, hashes, medium)
        holding = [tree for tree in trees.values() if tree.target_entries(target)]
        if len(holding) <= 1:
            if not holding:
                return len(hashes)
            return holding[0].remove(target, hashes, medium)
        unknown = 0
        for block_hash in hashes:
            for tree in holding:
                if tree.holds(target, block_hash, medium):
                    tree.remove(target, [block_hash], medium)
                    break
            else:
                unknown += 1
        return unknown

    # ------------------------------------------------------------------ queries

    def tree(self, family: EngineFamily, model: str, block_size: int) -> BlockTree | None:
        return self._trees.get((family, model, block_size))

    def match(
        self, family: EngineFamily, model: str, block_size: int, keys: object, media: int = GPU_ONLY
    ) -> dict[int, int]:
        """{target: leading blocks of ``keys`` it holds}, for targets holding at least one."""
        tree = self._trees.get((family, model, block_size))
        return {} if tree is None else tree.match(keys, media)

    def target_keys(self, target: int, media: int = ALL_MEDIA) -> dict[int, set[int]]:
        """Block size -> every key the target holds (tests and snapshots)."""
        found = {}
        for size, tree in self._target_trees[target].items():
            keys = tree.target_keys(target, media)
            if keys:
                found[size] = keys
        return found

    def target_entries(self, target: int) -> int:
        return sum(tree.target_entries(target) for tree in self._target_trees[target].values())

    @property
    def nodes(self) -> int:
        return sum(tree.nodes for tree in self._trees.values())

    @property
    def entries(self) -> int:
        return sum(tree.entries for tree in self._trees.values())

    @property
    def memory_bytes(self) -> int:
        return sum(tree.memory_bytes for tree in self._trees.values())
