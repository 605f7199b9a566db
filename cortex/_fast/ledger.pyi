"""Contract of the Cython unit ``cortex._fast.ledger``: the radix tree of block keys.

One ``BlockTree`` per (engine family, model, block size) — SGLang and vLLM never share a tree.
Single owner (the trio thread); no method blocks or yields; no locks.

* A node is a block key (chained, so a key names its whole prefix path) with the set of
  targets holding it. A *target* is one (worker, DP rank), an int in [0, 65535); at least
  1,024 distinct targets must work.
* Per target, a map from the engine's block hash (u64) to the node, to resolve parents of
  later stores and the blocks named by removals. Entries carry their medium
  (``cortex.ledger.kv_events.Medium`` codes) and a reference count per (target, medium, hash):
  vLLM may store one hash twice (two physical blocks) and then remove it twice.
* Invariant: a target appears in a node's set iff it has at least one map entry pointing at the
  node (for some medium). No operation on one target touches another target's entries.
* Choices the implementation makes (``ledger.pyx`` states them as rules R1–R5): a store of a
  hash already held with the *same* key in another medium adds that medium (not a duplicate);
  with a *different* key it replaces the whole entry (every medium) by one holding only the new
  medium. Refcounts saturate at 255 (a block stored more often than that without removals is
  dropped early: a miss, never a false hit). ``now`` is kept modulo 2**32. Arguments are all
  checked before anything changes, so an invalid call (ValueError/OverflowError/TypeError)
  leaves the tree untouched.
* Recency and budget (rules R6, R7 in ``ledger.pyx``): ``store(now=...)`` stamps the nodes it
  touches and the path above its parent, so a node is never older than its descendants. With
  ``max_entries`` > 0 a store that leaves more entries evicts down to ``low_water *
  max_entries``: least-recently-touched nodes first, childless first among equals, each losing
  every holder exactly as BlockRemoved of the hashes naming it would. Evicted hashes are then
  unknown (removals counted in ``unknown_removal``, stores under them in ``unknown_parent``).
* Sequences of ints may also be given as buffers: ``array('Q')`` for hashes and keys,
  ``array('I')`` for token ids.
"""

from collections.abc import Sequence

GPU_ONLY: int  # media mask with only Medium.GPU set (the default for match): 1
ALL_MEDIA: int  # 0b1111 (the default for target_keys)

class BlockTree:
    block_size: int
    # Counters (monotonic): events the tree handled but could not fully apply.
    unknown_parent: int  # stores whose parent hash the target does not hold: skipped whole
    unknown_removal: int  # removed hashes the target does not hold: ignored
    duplicate_store: int  # stores of a hash the target already holds (refcount + 1)
    hash_conflict: int  # a held hash re-stored with a different key: old entry replaced
    evicted_entries: int  # entries evicted to keep within max_entries
    evictions: int  # eviction rounds (each frees down to the low water)
    max_entries: int  # entry budget; 0: none
    low_water: float  # an eviction goes down to low_water * max_entries
    clock: int  # newest ``now`` given to store, modulo 2**32

    def __init__(self, block_size: int, max_entries: int = 0, low_water: float = 0.95) -> None: ...
    sync_work: int  # R9: trees whose round is at most this many visits evict synchronously
    step_work: int  # R9: visits per store of an incremental eviction (0: sized from the slack)
    def set_budget(self, max_entries: int, low_water: float = 0.95, sync_work: int = 65536,
                   step_work: int = 0) -> None:
        """Change the budget (0: none); applies from the next store. ValueError unless
        0 < low_water <= 1. Large trees evict incrementally over the following stores (R9)."""
    def evict(self, goal: int) -> int:
        """Evict least-recently-touched entries until at most ``goal`` are left; how many were
        evicted. O(nodes + target map slots) per call. Ends an incremental eviction."""
    def evict_step(self, goal: int, work: int, depth: int = 0) -> bool:
        """Advance an incremental eviction (R9) by about ``work`` node and slot visits, each
        round aiming ``depth`` below ``goal``; True once at most ``goal`` entries are left."""
    @property
    def evict_work(self) -> int:
        """Visits of one incremental eviction round (3 x node pool + target map slots)."""
    @property
    def evicting(self) -> bool: ...
    def export_target(self, target: int) -> tuple[bytes, bytes, bytes, bytes, bytes]:
        """(node keys u64, node parents u32 = 1 + parent index or 0, entry hashes u64, entry
        nodes u32, entry refcounts u32), native order, parents listed first (R8)."""
    def import_target(self, target: int, node_keys: memoryview, node_parents: memoryview,
                      entry_hashes: memoryview, entry_nodes: memoryview,
                      entry_refs: memoryview, now: int = 0) -> int:
        """Rebuild ``export_target``'s entries into a target holding nothing (typed buffers:
        ``memoryview(b).cast("Q"/"I")``); entries added. ValueError, tree unchanged, when the
        arrays are inconsistent or disagree with the tree (R8)."""
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
        """Apply one BlockStored. Returns the number of blocks stored (duplicates included),
        or -1 when the parent is unknown to this target (nothing stored, counted).
        ``seed`` (the namespace) keys the first block when ``parent_hash`` is None; blocks with
        a parent chain from the parent's key, which carries its namespace (blockkeys.pyi)."""
    def remove(self, target: int, block_hashes: Sequence[int], medium: int = 0) -> int:
        """Apply one BlockRemoved. Returns how many hashes were unknown (counted, ignored)."""
    def clear_target(self, target: int) -> int:
        """Drop every entry of the target (AllBlocksCleared, restart, death). Returns entries
        dropped."""
    def match(self, keys: Sequence[int], media: int = GPU_ONLY) -> dict[int, int]:
        """For each target holding at least the first block: how many leading blocks of
        ``keys`` it holds (in the media of the mask). O(depth x targets still matching)."""
    def target_keys(self, target: int, media: int = ALL_MEDIA) -> set[int]:
        """Every key the target holds (tests and snapshots; not for the hot path)."""
    def holds(self, target: int, block_hash: int, medium: int = -1) -> bool:
        """Whether the target holds the engine hash in ``medium`` (-1: in any medium)."""
    def target_entries(self, target: int) -> int: ...
    def targets(self) -> list[int]: ...
    @property
    def nodes(self) -> int: ...
    @property
    def entries(self) -> int:
        """(block, target, medium) entries held."""
    @property
    def memory_bytes(self) -> int:
        """Bytes the tree has allocated (nodes, worker sets, hash maps)."""
