"""The scheduler: pure policies over a frozen view of the workers. Decides, never dispatches.

``chain.Scheduler`` runs the fixed fallback order (``exact_kv`` → ``load_aware`` → ``p2c`` →
``round_robin``, or ``consistent_hash`` → ``round_robin`` for engines without events);
``inflight.PendingWork`` is the decision-time accounting the cost reads (the herding guard).
``fast.FastScheduler`` is the events chain with its common cases compiled; it decides exactly as
``Scheduler`` does (property-tested) and is what the request path uses.
"""

from cortex.scheduling.chain import Scheduler, events_chain, no_events_chain
from cortex.scheduling.cost import BoundedLoad, CostConfig
from cortex.scheduling.decision import Decision, Mode
from cortex.scheduling.fast import FastScheduler
from cortex.scheduling.inflight import PendingWork
from cortex.scheduling.matches import worker_matches
from cortex.scheduling.view import RequestFacts, Role, WorkerView
from cortex.scheduling.watermark import Watermarks

__all__ = [
    "BoundedLoad",
    "CostConfig",
    "Decision",
    "FastScheduler",
    "Mode",
    "PendingWork",
    "RequestFacts",
    "Role",
    "Scheduler",
    "Watermarks",
    "WorkerView",
    "events_chain",
    "no_events_chain",
    "worker_matches",
]
