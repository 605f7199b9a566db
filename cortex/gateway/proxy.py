"""The data plane handler: parse once, decide, forward, stream back untouched.

Rules:

* One ``Gateway.handle`` per HTTP request (``cortex.front.messages`` contract). Errors are
  ``CortexError`` leaves; the front maps them to responses in one place.
* Generation requests: body parsed once into one ``ServeRequest`` record; the model's pool
  prepares it (``ModelPool.prepare``: prompt, token ids, block keys) and the gateway hands it
  to one of two serving strategies side by side over the same dispatch layer
  (``cortex.dispatch.dispatcher``): one worker (``cortex.dispatch.single``), or a
  prefill/decode pair when the pool is PD-enabled (``cortex.pd.orchestrate``). Neither calls
  back into the gateway.
* A Responses request continuing a stored response (``previous_response_id``) goes to the
  worker that answered it when Cortex relayed that answer (``response_owners``): no other
  worker has it.
* The engines' tokenizer endpoints (``/tokenize``, ``/detokenize``, SGLang's ``/v1/`` ones)
  are passed to a live worker of the model by ``cortex.gateway.tokenizer_endpoints``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from time import perf_counter

import msgspec

from cortex.control.readiness import Readiness, assess
from cortex.dispatch.dispatcher import Dispatcher
from cortex.dispatch.endpoints import ENDPOINTS, Endpoint
from cortex.dispatch.model_pool import ModelPool
from cortex.dispatch.observer import RouteObserver
from cortex.dispatch.request import ServeRequest
from cortex.dispatch.settings import AdmissionSettings
from cortex.dispatch.single import SingleWorker
from cortex.errors import BadRequest, MethodNotAllowed, NotFound, NoWorkerAvailable
from cortex.front.messages import HttpRequest, HttpResponse, json_response
from cortex.gateway.tokenizer_endpoints import SERVED_BY as TOKENIZER_PATHS
from cortex.gateway.tokenizer_endpoints import TokenizerEndpoints
from cortex.logs import request_started
from cortex.pd.orchestrate import PdOrchestrator
from cortex.pd.plan import PdSettings
from cortex.upstream.connection_pool import ConnectionPool


class Gateway:
    def __init__(
        self,
        pools: Mapping[str, ModelPool],
        upstream: ConnectionPool,
        *,
        retries: int = 2,
        observer: RouteObserver | None = None,
        readiness: Callable[[], Readiness] | None = None,
        pd: PdSettings | None = None,
        admission: AdmissionSettings | None = None,
        client_dp_rank: bool = False,
        back_in: Callable[[Iterable[str]], float | None] | None = None,
    ) -> None:
        """``back_in``: seconds until one of the named workers may take requests again (the
        worker registry's), sent as ``Retry-After`` when no worker can take a request."""
        self.pools = pools
        self.back_in = back_in
        self.client_dp_rank = client_dp_rank  # clients may pick the DP rank (else stripped)
        self.upstream = upstream
        self.observer = observer or RouteObserver()
        self.readiness = readiness or self._pool_readiness
        self.dispatcher = Dispatcher(upstream, self.observer, retries=retries,
                                     admission=admission, client_dp_rank=client_dp_rank)
        self.single = SingleWorker(self.dispatcher)
        self.pd = PdOrchestrator(self.dispatcher, pd)
        self.admissions = self.dispatcher.admissions  # model -> its admission queue
        self.response_owners = self.dispatcher.response_owners
        self.tokenizer_endpoints = TokenizerEndpoints(self.dispatcher, self.pool_for)
        for pool in pools.values():  # (made here, not per request: a saturated pool waits in it)
            self.dispatcher.admission_for(pool)

    async def handle(self, request: HttpRequest) -> HttpResponse:
        request_started(request)  # the request id every log record of this request carries
        path = request.path
        endpoint = ENDPOINTS.get(path)
        if endpoint is not None:
            if request.method != b"POST":
                raise MethodNotAllowed(f"{path.decode(errors='replace')} accepts POST only",
                                       allow=("POST",))
            return await self.generate(endpoint, request)
        if path in TOKENIZER_PATHS:
            return await self.tokenizer_endpoints.serve(request)
        if request.method == b"GET":
            if path == b"/v1/models":
                return self._models()
            if path == b"/health/live":
                return json_response(200, b'{"status":"live"}')
            if path == b"/health/ready":
                return self._ready()
        raise NotFound(f"no route {request.method.decode(errors='replace')} "
                       f"{path.decode(errors='replace')}")

    # ------------------------------------------------------------------ generation

    async def generate(self, endpoint: Endpoint, http: HttpRequest) -> HttpResponse:
        started = perf_counter()  # the decision's latency metric (a duration)
        request = ServeRequest.parse(endpoint, http, started, self.client_dp_rank)
        pool = self.pool_for(request.model)
        await pool.prepare(request, self.observer)
        if endpoint is Endpoint.RESPONSES and "previous_response_id" in request.body:
            owner = self.response_owners.owner(request.body["previous_response_id"])
            if owner is not None and owner in pool.workers:  # only it holds that response
                request.excluded[:] = [name for name in pool.workers if name != owner]
        try:
            if self.pd.enabled(pool):
                return await self.pd.serve(pool, request)
            return await self.single.serve(pool, request)
        except NoWorkerAvailable as error:
            self.observer.no_worker(pool.model)
            if error.retry_after_s is None and self.back_in is not None:
                error.retry_after_s = self.back_in(pool.workers)
            raise

    # ------------------------------------------------------------------ other routes

    def pool_for(self, model: str | None) -> ModelPool:
        """The pool serving ``model`` (``None``: the only one), else the client's error."""
        if model is None:
            if len(self.pools) == 1:
                return next(iter(self.pools.values()))
            raise BadRequest("model is required: more than one model is served",
                             reason="model_required")
        pool = self.pools.get(model)
        if pool is None:
            raise NotFound(f"model {model!r} is not served here")
        return pool

    def _models(self) -> HttpResponse:
        data = [{"id": name, "object": "model", "owned_by": "cortex"}
                for name in sorted(self.pools)]
        return json_response(200, msgspec.json.encode({"object": "list", "data": data}))

    def _pool_readiness(self) -> Readiness:
        views = [msgspec.structs.replace(view, ledger_state=pool.ledger_state(view.worker))
                 for pool in self.pools.values() for view in pool.views()]
        extra = [f"model {name}: exact routing off ({pool.exact_off})"
                 for name, pool in sorted(self.pools.items())
                 if pool.exact_off is not None and not pool.passthrough]
        return assess(views, extra)

    def _ready(self) -> HttpResponse:
        state = self.readiness()
        return json_response(state.http_status, msgspec.json.encode(state.as_json()))
