"""The data plane handler: parse once, decide, forward, stream back untouched.

Rules:

* One ``Gateway.handle`` per HTTP request (``cortex.front.messages`` contract). Errors are
  ``CortexError`` leaves; the front maps them to responses in one place.
* Generation requests: body parsed once; the model's pool tokenizes (segment cache, cold
  pieces off the trio thread) and decides; the request goes to the worker with Cortex's
  decision headers on the response.
* The decision's metrics (``RouteObserver.decided``) are recorded once the answer was written
  (``HttpResponse.after_sent``), or when the request ends without one — not while the client
  waits.
* Retries happen only before the first response byte reaches the client: a connect failure, a
  connection that breaks before the first body chunk, or a 429/5xx head moves the request to
  another worker (the failed ones excluded), up to ``retries`` more attempts, while another
  worker could take it (else the engine's answer is relayed as it came). Once the head and
  first chunk are in hand the response is committed: a later failure ends the client's stream
  (the server closes the connection without the final chunk) and is never replayed.
* Whose failure it is (``cortex.gateway.blame``): a 5xx other than 502/503/504 counts toward
  the worker's breaker only once another worker served the request; when a second worker
  answers one too, the failure follows the request (a poison request): that answer is relayed,
  counted (``RouteObserver.poisoned``), nothing more is tried and no worker is blamed.
* Everything an attempt holds — its in-flight accounting and its upstream connection — lives in
  one ``Exits`` (``cortex.gateway.exits``, a lean ``AsyncExitStack``) that the streamed body
  (``LegBody``) closes when it ends or is ``aclose``d, started or not (the server always
  ``aclose``s a streamed body, also when the client left before the first chunk was asked
  for), so a client that leaves aborts the engine's request and releases the accounting;
  nothing leaks on any path.
* A Responses request continuing a stored response (``previous_response_id``) goes to the
  worker that answered it when Cortex relayed that answer (``response_owners``): no other
  worker has it.
* The engines' tokenizer endpoints (``/tokenize``, ``/detokenize``, SGLang's ``/v1/`` ones)
  are passed to a live worker of the model by ``cortex.gateway.tokenizer_endpoints``.
* A PD-enabled pool's requests go to ``cortex.pd.orchestrate.PdOrchestrator``, which sees the
  gateway through its ``PdGateway`` protocol — ``admission_for``, ``serve_on`` (one attempt
  on one worker), ``open_leg``, ``respond``, ``observe_cached_tokens``, ``observer`` — and
  does not import this module.
* The body is passed through as it arrives; ``CachedTokensSniffer`` only scans for the engine's
  ``cached_tokens`` report to measure the ledger's accuracy (predicted vs reported).
* An answer already whole when its first bytes arrive (a small JSON response) skips the
  streaming machinery: the body goes out as bytes with the head, and right after the write
  (``HttpResponse.after_sent``, which runs also when the write failed) the exchange is closed
  (connection back to the pool, accounting released) and its ``cached_tokens`` report
  sniffed — off the client's wait. Nothing awaits between the answer's arrival and that
  release but the client's write.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from time import perf_counter
from typing import Any

import msgspec

from cortex.control.readiness import Readiness, assess
from cortex.errors import (
    BadRequest,
    CortexError,
    MethodNotAllowed,
    NotFound,
    NoWorkerAvailable,
    UpstreamError,
)
from cortex.front.messages import HttpRequest, HttpResponse, json_response
from cortex.gateway.admission import Admission
from cortex.gateway.blame import RequestBlame, may_be_the_requests
from cortex.gateway.endpoints import (
    ENDPOINTS,
    ENGINES,
    EXACT_FOR,
    SERVED_BY,
    Endpoint,
    body_model,
    decision_headers,
    forwarded_headers,
    parse_body,
    request_prompt,
    with_dp_rank,
)
from cortex.gateway.exits import Exits
from cortex.gateway.legs import Leg, LegBody, RetryableStatus, retryable_status
from cortex.gateway.observer import RouteObserver
from cortex.gateway.pool import ModelPool, Route
from cortex.gateway.response_owners import ResponseOwners
from cortex.gateway.settings import AdmissionSettings
from cortex.gateway.tokenizer_endpoints import SERVED_BY as TOKENIZER_PATHS
from cortex.gateway.tokenizer_endpoints import TokenizerEndpoints
from cortex.logs import request_started
from cortex.pd.orchestrate import PdOrchestrator
from cortex.pd.plan import PdSettings
from cortex.profile.trio_tokenize import encode_offloaded
from cortex.prompt.unrenderable import Unrenderable
from cortex.scheduling import Role
from cortex.tokenize.segment_cache import Lookup
from cortex.upstream.connection import NOT_READY
from cortex.upstream.errors import UpstreamBroken
from cortex.upstream.pool import UpstreamPool
from cortex.upstream.sse import CachedTokensSniffer

log = logging.getLogger("cortex.gateway")

_DROPPED_RESPONSE_HEADERS = frozenset({
    b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade",
    b"server", b"date",
})


class Gateway:
    def __init__(
        self,
        pools: Mapping[str, ModelPool],
        upstream: UpstreamPool,
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
        self.retries = retries
        self.observer = observer or RouteObserver()
        self.readiness = readiness or self._pool_readiness
        self.pd = PdOrchestrator(self, pd)
        self.admission_settings = admission or AdmissionSettings()
        self.admissions: dict[str, Admission] = {}
        self.response_owners = ResponseOwners()  # stored Responses answers -> their worker
        self.tokenizer_endpoints = TokenizerEndpoints(self)  # /tokenize, /detokenize: passed on
        for pool in pools.values():  # (made here, not per request: a saturated pool waits in it)
            self.admission_for(pool)

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

    async def generate(self, endpoint: Endpoint, request: HttpRequest) -> HttpResponse:
        started = perf_counter()  # the decision's latency metric (a duration)
        body = parse_body(request.body)
        pool = self.pool_for(body_model(body))
        prompt, token_ids = None, None
        tokenize_s: float | None = None  # observed with the decision, after the answer
        if pool.tokenizer is not None and pool.exact_off is None and pool.profile is not None:
            profile = pool.profile
            try:
                if endpoint in EXACT_FOR:
                    _check_exact_for(pool, endpoint)
                prompt = request_prompt(endpoint, body, profile.chat_templates,
                                        pool.chat_engine)
            except Unrenderable as why:  # not exactly as the engine will: route on load only
                self.observer.unrenderable(pool.model, why.reason)
                log.debug("routed by load: %s", why)
            except BadRequest:
                raise
            except Exception as error:  # noqa: BLE001 (counted) a template that cannot render: route on load only
                self.observer.template_failed(pool.model, error)
            if prompt is not None and prompt.text is not None and (
                    0 < pool.max_prompt_chars < len(prompt.text)):
                self.observer.prompt_too_long(pool.model, len(prompt.text))
                prompt = None  # too costly to tokenize: routed by load, never a guess
            if prompt is not None:
                if prompt.token_ids is not None:
                    token_ids = prompt.token_ids
                else:
                    tokenize_start = perf_counter()
                    tokenizer = pool.tokenizer
                    token_ids = tokenizer.encode_now(prompt.text or "",
                                                     prompt.add_special_tokens,
                                                     tokenizer.offload_min_chars)
                    if type(token_ids) is Lookup:  # a long new text: off the trio thread
                        token_ids = await encode_offloaded(tokenizer, token_ids)
                    tokenize_s = perf_counter() - tokenize_start
        headers = forwarded_headers(request.headers, self.client_dp_rank)
        unable = _not_serving(pool, endpoint)
        if endpoint is Endpoint.RESPONSES and "previous_response_id" in body:
            owner = self.response_owners.owner(body["previous_response_id"])
            if owner is not None and owner in pool.workers:  # only it holds that response
                unable = tuple(name for name in pool.workers if name != owner)
        try:
            if self.pd.enabled(pool):
                return await self.pd.serve(pool, endpoint, request, body, headers, token_ids,
                                           prompt, started, tokenize_s)
            return await self._serve_single(pool, endpoint, request, body, headers, token_ids,
                                            prompt, started, tokenize_s, unable)
        except NoWorkerAvailable as error:
            self.observer.no_worker(pool.model)
            if error.retry_after_s is None and self.back_in is not None:
                error.retry_after_s = self.back_in(pool.workers)
            raise

    async def _serve_single(
        self,
        pool: ModelPool,
        endpoint: Endpoint,
        request: HttpRequest,
        body: dict,
        headers: list[tuple[bytes, bytes]],
        token_ids: Any,
        prompt: Any,
        started: float,
        tokenize_s: float | None = None,
        unable: tuple[str, ...] = (),
    ) -> HttpResponse:
        """``unable``: workers whose engine does not serve ``endpoint`` (never tried)."""
        failed: list[str] = list(unable)
        blame = RequestBlame(self.observer, pool.model)
        last_error: CortexError | None = None
        record_decision: Callable[[], None] | None = None  # recorded after the answer, or on exit
        try:
            for attempt in range(1, self.retries + 2):
                try:  # admission waits only when the pool is saturated
                    route = pool.decide(token_ids, prompt, tuple(failed))
                except NoWorkerAvailable as error:
                    if not error.saturated:
                        raise
                    route = await self.admission_for(pool).wait_for_capacity(
                        partial(pool.decide, token_ids, prompt, tuple(failed)), error)
                if attempt == 1:
                    if tokenize_s is not None:
                        route.timings["tokenize_s"] = tokenize_s
                    record_decision = partial(self.observer.decided, pool.model, route,
                                              perf_counter() - started)
                worker = route.worker.name
                retry = attempt <= self.retries and _another_worker(pool, failed, worker)
                try:
                    response = await self.serve_on(pool, route, endpoint, request, body,
                                                   headers, attempt, retry_statuses=retry,
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
                    response.after_sent = _in_turn(record_decision, response.after_sent)
                    record_decision = None
                return response
            assert last_error is not None
            raise last_error
        finally:
            if record_decision is not None:
                record_decision()

    async def serve_on(
        self,
        pool: ModelPool,
        route: Route,
        endpoint: Endpoint,
        request: HttpRequest,
        body: dict,
        headers: list[tuple[bytes, bytes]],
        attempt: int,
        *,
        retry_statuses: bool | None = None,
        relay_engine_errors: bool = False,
    ) -> HttpResponse:
        """One attempt (number ``attempt``, from 1) of ``request`` on ``route``'s worker alone:
        the client's response once the head and first chunk are in. Before that a failure
        raises ``UpstreamError``, or ``RetryableStatus`` for a 429 or 5xx head
        (``retryable_status``) when ``retry_statuses`` (default: while attempts are left),
        except a ``may_be_the_requests`` status under ``relay_engine_errors``; the route's
        hold is released then, else by the response. A failing status relayed counts toward
        the worker's breaker unless it may be the request's own (``cortex.gateway.blame``)."""
        worker = route.worker
        raw, sent_headers = with_dp_rank(worker.engine, body, request.body, headers, route.rank,
                                         self.client_dp_rank)
        stack = Exits()
        try:
            stack.enter_context(route.hold)
            leg = await self.open_leg(
                stack, worker.origin, request.target, sent_headers, raw,
                retry_statuses=attempt <= self.retries if retry_statuses is None
                else retry_statuses, relay_engine_errors=relay_engine_errors)
        except BaseException:
            await stack.aclose()
            raise
        status = leg.response.status
        if retryable_status(status):  # a failure relayed (the last try, or the verdict): counted
            self.observer.upstream_failed(worker.name, RetryableStatus(status), retried=False,
                                          blame=not may_be_the_requests(status))
        decision = route.decision
        extra = decision_headers(worker.name, decision.mode.value,
                                 decision.predicted_cached_tokens, route.rank, attempt)
        whole = leg.whole_body()
        if endpoint is Endpoint.RESPONSES and leg.response.status == 200:
            self.response_owners.learn(leg.first or b"", worker.name)
        if whole is not None:
            # released and measured once the answer is on its way, off the client's wait
            return HttpResponse(leg.response.status,
                                _client_headers(leg, with_length=False) + extra, whole,
                                _in_turn(partial(_close_at_once, stack),
                                         partial(self.observe_cached_tokens, pool, route,
                                                 whole)))
        route.hold.prefill_done()  # (a whole answer's hold was released in one step above)
        return self.respond(leg, stack, extra, worker.name,
                            self.cached_tokens_report(pool, route))

    def cached_tokens_report(self, pool: ModelPool, route: Route) -> Callable[[int], None]:
        """Where the engine's ``cached_tokens`` for ``route``'s request goes: the observer,
        against the route's prediction."""
        return partial(self.observer.cached_tokens, pool.model, route,
                       route.decision.predicted_cached_tokens)

    def observe_cached_tokens(self, pool: ModelPool, route: Route, body: bytes) -> None:
        """The engine's cached-token report in a whole answer (JSON or SSE), if it has one."""
        sniffer = CachedTokensSniffer()
        sniffer.feed(body)
        if sniffer.cached_tokens is not None:
            self.cached_tokens_report(pool, route)(sniffer.cached_tokens)

    async def open_leg(
        self,
        stack: Exits,
        origin: str,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        raw: bytes,
        *,
        retry_statuses: bool,
        relay_engine_errors: bool = False,
    ) -> Leg:
        """Send one request and wait for its head and first body chunk (the last moment a
        failure can still be retried). The exchange is closed by ``stack``. A failing status
        raises ``RetryableStatus`` when ``retry_statuses``, unless ``relay_engine_errors`` and
        it may be the request's own (``may_be_the_requests``)."""
        response = await stack.enter_async_context(self.upstream.request(
            origin, b"POST", target, headers, raw))
        if not 100 <= response.status <= 599:  # not HTTP: never relayed as it came
            raise UpstreamBroken(f"answered status {response.status}", origin=origin,
                                 phase="head", response_started=True)
        status = response.status
        if retry_statuses and retryable_status(status) and not (
                relay_engine_errors and may_be_the_requests(status)):
            raise RetryableStatus(status)
        chunks = response.body_chunks()
        first = response.chunk_now()  # a small answer came whole with its head: no await
        if first is NOT_READY:
            try:
                first = await chunks.__anext__()
            except StopAsyncIteration:
                first = None
        return Leg(response, first, chunks)

    def respond(
        self,
        leg: Leg,
        stack: Exits,
        extra_headers: list[tuple[bytes, bytes]],
        worker: str,
        on_cached_tokens: Callable[[int], None] | None = None,
        transform: Callable[[bytes], bytes] | None = None,
    ) -> HttpResponse:
        """The client's response: the leg's head (minus hop-by-hop and ``x-cortex-*``) plus
        Cortex's headers, and its body streamed as it arrives."""
        headers = _client_headers(leg, with_length=transform is None)
        return HttpResponse(leg.response.status, headers + extra_headers,
                            LegBody(leg, stack, partial(self.observer.upstream_failed, worker,
                                                        retried=False, after_first_byte=True),
                                    on_cached_tokens, transform))

    def admission_for(self, pool: ModelPool) -> Admission:
        """``pool``'s admission queue (made once per model): where a request waits while
        every worker of the pool is saturated."""
        admission = self.admissions.get(pool.model)
        if admission is None:
            admission = self.admissions[pool.model] = Admission(self.admission_settings)
            pool.on_capacity(admission.capacity_changed)
        return admission

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


def _in_turn(first: Callable[[], None], then: Callable[[], None] | None) -> Callable[[], None]:
    """``first`` then ``then`` (if any), ``then`` also when ``first`` raises."""
    if then is None:
        return first

    def both() -> None:
        try:
            first()
        finally:
            then()
    return both


def _close_at_once(stack: Exits) -> None:
    """Closes a whole answer's ``stack`` from synchronous code (``after_sent``): its exits —
    the in-flight hold and an exchange whose response is complete — never wait, so closing
    ends at its first step, with no checkpoint."""
    closing = stack.aclose()
    try:
        closing.send(None)
    except StopIteration:
        return
    closing.close()
    raise RuntimeError("an exit of a whole answer's exchange waited")


def _client_headers(leg: Leg, *, with_length: bool) -> list[tuple[bytes, bytes]]:
    """The leg's response headers the client gets: no hop-by-hop, no ``x-cortex-*``, and
    ``content-length`` only when the body passes unchanged and unframed by Cortex."""
    return [(name, value) for name, value in leg.response.headers
            if name not in _DROPPED_RESPONSE_HEADERS and not name.startswith(b"x-cortex-")
            and (with_length or name != b"content-length")]


def _another_worker(pool: ModelPool, failed: list[str], current: str) -> bool:
    """Whether a live worker other than ``current`` and those that ``failed`` could take the
    request (one above its watermarks counts: the request would wait for it)."""
    for view in pool.views():
        name = view.worker
        if (view.healthy and view.role is Role.BOTH and name != current
                and name not in failed):
            return True
    return False


def _check_exact_for(pool: ModelPool, endpoint: Endpoint) -> None:
    """``Unrenderable`` when a worker of ``pool`` renders ``endpoint``'s requests its own way
    (``EXACT_FOR``): no one prediction holds for every worker."""
    engines = EXACT_FOR[endpoint]
    for spec in pool.workers.values():
        if spec.engine not in engines:
            raise Unrenderable("engine_rendering", f"{spec.engine} worker in the pool")


def _not_serving(pool: ModelPool, endpoint: Endpoint) -> tuple[str, ...]:
    """The pool's workers whose engine does not serve ``endpoint`` (``SERVED_BY``); a clear
    404 when none does."""
    engines = SERVED_BY[endpoint]
    if engines is ENGINES:  # chat, completions: every worker (no scan on the hot path)
        return ()
    unable = tuple(name for name, spec in pool.workers.items() if spec.engine not in engines)
    if unable and len(unable) == len(pool.workers):
        kinds = " or ".join(sorted(engines))
        raise NotFound(f"POST {endpoint.value} is served by {kinds} engines only, and no "
                       f"worker of model {pool.model!r} is one; use /v1/completions")
    return unable
