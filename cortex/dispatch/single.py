"""Serving a generation request on one worker, with retries before the first byte.

Rules:

* Each attempt asks the pool for a worker (``ModelPool.decide``), the workers in
  ``request.excluded`` left out — those whose engine does not serve the endpoint or hold a
  stored response, then those that failed this request; a saturated pool's request waits in
  its admission queue.
* A connect failure, a connection that breaks before the first body chunk, or a 429/5xx head
  moves the request to another worker, up to the dispatcher's ``retries`` more attempts,
  while another worker could take it (else the engine's answer is relayed as it came).
* Whose failure it is (``cortex.dispatch.blame``): a 5xx other than 502/503/504 counts toward
  the worker's breaker only once another worker served the request; when a second worker
  answers one too, the failure follows the request (a poison request): that answer is
  relayed, counted (``RouteObserver.poisoned``), nothing more is tried and no worker is
  blamed.
* The first decision's metrics (``RouteObserver.decided``) are recorded once the answer was
  written (``HttpResponse.after_sent``), or when the request ends without one — not while the
  client waits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from time import perf_counter

from cortex.dispatch.blame import RequestBlame
from cortex.dispatch.dispatcher import Dispatcher, in_turn
from cortex.dispatch.legs import RetryableStatus
from cortex.dispatch.model_pool import ModelPool
from cortex.dispatch.request import ServeRequest
from cortex.errors import CortexError, NoWorkerAvailable, UpstreamError
from cortex.front.messages import HttpResponse
from cortex.scheduling import Role

log = logging.getLogger("cortex.gateway")


class SingleWorker:
    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher

    async def serve(self, pool: ModelPool, request: ServeRequest) -> HttpResponse:
        dispatcher = self.dispatcher
        observer = dispatcher.observer
        retries = dispatcher.retries
        failed = request.excluded
        blame = RequestBlame(observer, pool.model)
        last_error: CortexError | None = None
        record_decision: Callable[[], None] | None = None  # recorded after the answer, or on exit
        try:
            for attempt in range(1, retries + 2):
                try:  # admission waits only when the pool is saturated
                    route = pool.decide(request.token_ids, request.prompt, tuple(failed),
                                        keys=request.keys)
                except NoWorkerAvailable as error:
                    if not error.saturated:
                        raise
                    route = await dispatcher.admission_for(pool).wait_for_capacity(partial(
                        pool.decide, request.token_ids, request.prompt, tuple(failed),
                        keys=request.keys), error)
                if attempt == 1:
                    route.timings.update(request.timings)
                    record_decision = partial(observer.decided, pool.model, route,
                                              perf_counter() - request.started)
                worker = route.worker.name
                retry = attempt <= retries and _another_worker(pool, failed, worker)
                try:
                    response = await dispatcher.serve_on(pool, route, request, attempt,
                                                         retry_statuses=retry,
                                                         relay_engine_errors=blame.relay_next)
                except (UpstreamError, RetryableStatus) as error:
                    failed.append(worker)
                    last_error = (error if isinstance(error, UpstreamError)
                                  else UpstreamError(f"{worker}: {error}"))
                    blame.failed(worker, error, retried=retry)
                    log.warning("attempt %d on %s failed before the first byte: %s", attempt,
                                worker, error)
                    if not retry:
                        break
                    continue
                blame.answered(worker, response.status)
                if record_decision is not None:
                    response.after_sent = in_turn(record_decision, response.after_sent)
                    record_decision = None
                return response
            assert last_error is not None
            raise last_error
        finally:
            if record_decision is not None:
                record_decision()


def _another_worker(pool: ModelPool, failed: list[str], current: str) -> bool:
    """Whether a live worker other than ``current`` and those that ``failed`` could take the
    request (one above its watermarks counts: the request would wait for it)."""
    for view in pool.views():
        name = view.worker
        if (view.healthy and view.role is Role.BOTH and name != current
                and name not in failed):
            return True
    return False
