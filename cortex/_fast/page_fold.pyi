"""Contract of the Cython unit ``cortex._fast.page_fold``: SGLang's per-token pages folded into
Cortex's coarse blocks. Rules F1-F4 and the reference twin: ``cortex.ledger.page_fold``.

Single owner (the trio thread); no method blocks. Hashes are u64 (``array('Q')`` or ints),
tokens u32 (``array('I')`` or ints); an int out of range raises OverflowError before anything
changes.
"""

from array import array
from collections.abc import Sequence

class PageFold:
    granularity: int  # G, Cortex's block size in tokens (>= 2)
    capacity: int  # entries per generation (F1)
    forgotten: int  # entries dropped with an old generation (F1), since start
    conflicts: int  # walks that met an entry at another position than its path says (F2)
    def __init__(self, granularity: int, capacity: int) -> None: ...
    @property
    def entries(self) -> int: ...
    @property
    def memory_bytes(self) -> int:
        """Bytes of both generations' tables (24 per slot, at most 7/8 of the slots used)."""
    def fold(
        self, parent: int | None, hashes: Sequence[int], tokens: Sequence[int]
    ) -> tuple[int | None, array[int], array[int]] | None:
        """F2: the coarse store a run of one-token pages makes (coarse parent, the hashes of
        the tokens that end a block, the blocks' tokens), or None when it cannot be placed."""
    def keep(self, hashes: Sequence[int]) -> array[int]:
        """F3: the removed hashes that may name a coarse block."""
