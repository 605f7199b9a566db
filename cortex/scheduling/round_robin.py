"""``round_robin``: only liveness is known. Always decides (the end of every chain).

Rules: the cursor is the policy's only state; it advances by one per decision and indexes the
open workers in the order given (callers give views in a stable order), so a pool that does not
change is served in turn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cortex.scheduling.decision import Decision, Mode
from cortex.scheduling.view import RequestFacts, WorkerView


class RoundRobin:
    name = "round_robin"

    def __init__(self, start: int = 0) -> None:
        self.cursor = start

    def decide(
        self, request: RequestFacts, workers: Sequence[WorkerView], matched: Mapping[str, int]
    ) -> Decision | None:
        view = workers[self.cursor % len(workers)]
        self.cursor += 1
        return Decision(view.worker, Mode.FALLBACK_ROUND_ROBIN,
                        "only liveness known; next worker in turn")
