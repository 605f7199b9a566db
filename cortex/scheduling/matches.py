"""Adapter from the ledger's answer to the policies' input.

``LedgerBook.match`` answers ``{target: leading blocks held}``; policies want ``{worker:
blocks}`` for workers whose ledger is trusted (READY). A worker with several DP ranks counts its
best rank. Untrusted workers are left out: their hits may be missing or stale, so they must not
attract exact routing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from cortex.ledger.state import TargetState
from cortex.scheduling.view import WorkerView


def worker_matches(
    target_blocks: Mapping[int, int], workers: Iterable[WorkerView]
) -> dict[str, int]:
    found: dict[str, int] = {}
    if not target_blocks:
        return found
    get = target_blocks.get
    ready = TargetState.READY
    for view in workers:
        if view.ledger_state is not ready:
            continue
        targets = view.targets
        if len(targets) == 1:
            blocks = get(targets[0])
            if blocks:
                found[view.worker] = blocks
            continue
        best = max([get(target, 0) for target in targets], default=0)
        if best:
            found[view.worker] = best
    return found
