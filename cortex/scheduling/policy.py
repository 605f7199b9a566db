"""The one small interface every policy implements.

A policy is given the request, the *open* workers (healthy, of the wanted role, below every
watermark — never empty; the chain checks) and ``matched``: worker → leading blocks of the
request held in a *trusted* ledger (``matches.worker_matches``). It returns a ``Decision``, or
``None`` when its precondition does not hold and the next policy in the chain should decide.
Policies are pure apart from state they own and say so (a round-robin cursor, an injected RNG,
a cache of rings).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from cortex.scheduling.decision import Decision
from cortex.scheduling.view import RequestFacts, WorkerView


class Policy(Protocol):
    name: str

    def decide(
        self, request: RequestFacts, workers: Sequence[WorkerView], matched: Mapping[str, int]
    ) -> Decision | None: ...
