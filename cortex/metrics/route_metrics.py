"""The request path's reports turned into ``cortex_*`` metrics and worker-breaker input.

Upstream failures are labelled with the upstream client's phase (``acquire``, ``connect``,
``send``, ``head``, ``body``) and the worker's failing status (429, 5xx) when it answered one;
a failing status counts as ``head``, and so does a body that broke before its first byte
reached the client (still retryable). Every failure but a 429 (load, not a fault) counts toward
the worker's circuit breaker, except a failure that may be the request's own
(``cortex.dispatch.blame``): that one counts only once another worker served the request
(``blamed``), and never when the failure followed the request (``poisoned``, counted per model
and status). A refused connection also makes the worker unhealthy at once.
"""

from __future__ import annotations

from cortex.dispatch.observer import RouteObserver
from cortex.dispatch.route import Route
from cortex.metrics.cortex_metrics import CortexMetrics
from cortex.workers.registry import WorkerRegistry


class MetricsObserver(RouteObserver):
    def __init__(self, metrics: CortexMetrics, registry: WorkerRegistry) -> None:
        self.metrics = metrics
        self.registry = registry

    def decided(self, model: str, route: Route, seconds: float) -> None:
        self.metrics.observe_route(route.decision.mode, seconds)
        self.metrics.record_decision(model, route.decision)
        timings = route.timings
        tokenize_s = timings.get("tokenize_s")
        if tokenize_s is not None:
            self.metrics.observe_tokenize(tokenize_s)
        hash_s = timings.get("hash_s")
        if hash_s is not None:
            self.metrics.observe_hash(hash_s)

    def no_worker(self, model: str) -> None:
        self.metrics.record_no_worker(model)

    def template_failed(self, model: str, error: Exception) -> None:
        self.metrics.record_unpredicted(model, "template_failed")

    def unrenderable(self, model: str, reason: str) -> None:
        self.metrics.record_unpredicted(model, reason)

    def prompt_too_long(self, model: str, chars: int) -> None:
        self.metrics.record_unpredicted(model, "prompt_too_long")

    def upstream_failed(
        self, worker: str, error: Exception, retried: bool, after_first_byte: bool = False,
        *, blame: bool = True,
    ) -> None:
        phase = getattr(error, "phase", "head")
        if phase == "body" and not after_first_byte:
            phase = "head"
        status = getattr(error, "status", None)
        self.metrics.record_upstream_error(worker, phase, status)
        if retried:
            self.metrics.record_retry(phase)
        if not blame or worker not in self.registry:
            return
        if phase == "connect":
            self.registry.upstream_connect_failed(worker, str(error))
        elif status != 429:  # an overloaded worker answered: load, not a failure
            self.registry.upstream_answer_failed(worker, str(error))

    def blamed(self, worker: str, error: Exception) -> None:
        if worker in self.registry:
            self.registry.upstream_answer_failed(worker, str(error))

    def poisoned(self, model: str, status: int) -> None:
        self.metrics.record_poisoned(model, status)

    def cached_tokens(self, model: str, route: Route, predicted: int, reported: int) -> None:
        self.metrics.record_cached_tokens(model, predicted, reported, route.prompt_tokens)
