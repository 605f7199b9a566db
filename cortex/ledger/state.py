"""How far Cortex trusts the ledger of one target (one worker's DP rank).

States and their meaning:

* ``SYNCING`` — the target was just registered, reconnected or restarted and its history is
  being fetched; its entries may be incomplete. Not used for exact routing.
* ``READY``   — every batch since the publisher's sequence 0 (or since an AllBlocksCleared /
  restart that emptied the engine's cache) has been applied in order: the ledger equals the
  engine's cache, less what the entry budget evicted (below). Exact routing uses it.
* ``STALE``   — a sequence gap was seen and replay has not (yet) closed it. Not used for exact
  routing. Replay success → ``READY``; replay failure → entries dropped, → ``PARTIAL``.
* ``PARTIAL`` — history before some point is unrecoverable (joined mid-stream without a replay
  buffer reaching back to 0, or an unrepairable gap after which entries were dropped). What the
  ledger holds is true (a lower bound: misses possible, no false hits) but incomplete. Becomes
  ``READY`` when the engine's cache is known empty again (AllBlocksCleared or restart).

Under the entry budget (``LedgerBook(max_entries=...)``, config ``ledger.max_entries``) the
book evicts least-recently-touched entries of any target without changing its state. So
``READY`` means: every batch was applied in order, and what the ledger holds is exactly what the
engine holds **minus evicted entries** — still a true lower bound (an evicted block is a miss,
never a false hit; later events naming it are counted as unknown). Without evictions
(``evicted_entries`` unchanged) it is the engine's cache exactly. ``PARTIAL`` keeps its meaning.

Transitions are decided by the pure sync state machine in ``cortex.events.sync``; this module
only names the states.
"""

from __future__ import annotations

import enum


class TargetState(enum.Enum):
    SYNCING = "syncing"
    READY = "ready"
    STALE = "stale"
    PARTIAL = "partial"

    @property
    def exact_routable(self) -> bool:
        return self is TargetState.READY
