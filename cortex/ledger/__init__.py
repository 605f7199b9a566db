"""The ledger: which target (worker, DP rank) holds which prompt-prefix blocks.

``LedgerBook`` is the facade the event path writes and the request path reads; the trees are
the Cython ``BlockTree`` (``cortex/_fast/ledger.pyx``).
"""

from cortex._fast.ledger import ALL_MEDIA, GPU_ONLY, BlockTree
from cortex.ledger.book import ApplyResult, LedgerBook, LedgerSettings, TargetInfo
from cortex.ledger.state import TargetState

__all__ = [
    "ALL_MEDIA",
    "GPU_ONLY",
    "ApplyResult",
    "BlockTree",
    "LedgerBook",
    "LedgerSettings",
    "TargetInfo",
    "TargetState",
]
