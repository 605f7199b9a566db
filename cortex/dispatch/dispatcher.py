"""Sending a request to an engine and answering the client: the one layer every way of
serving shares (a single worker, ``cortex.dispatch.single``; a prefill/decode pair,
``cortex.pd.orchestrate``; the tokenizer endpoints, ``cortex.gateway.tokenizer_endpoints``).

Rules:

* ``open_leg`` sends one request and waits for its head and first body chunk — the last moment
  a failure can still be retried; the exchange is closed by the ``Exits`` it was given.
* ``serve_on`` is one attempt of a generation request on one routed worker: Cortex's decision
  headers on the answer, the route's hold released by the answer (or at once on failure).
* Retries happen only before the first response byte reaches the client: a connect failure, a
  connection that breaks before the first body chunk, or a 429/5xx head
  (``RetryableStatus``). Once the head and first chunk are in hand the response is committed:
  a later failure ends the client's stream and is never replayed.
* Everything an attempt holds — its in-flight accounting and its upstream connection — lives in
  one ``Exits`` that the streamed body (``LegBody``) closes when it ends or is ``aclose``d,
  started or not, so a client that leaves aborts the engine's request and releases the
  accounting; nothing leaks on any path.
* An answer already whole when its first bytes arrive (a small JSON response) skips the
  streaming machinery: the body goes out as bytes with the head, and right after the write
  (``HttpResponse.after_sent``, which runs also when the write failed) the exchange is closed
  (connection back to the pool, accounting released) and its ``cached_tokens`` report
  sniffed — off the client's wait.
* The body is passed through as it arrives; ``CachedTokensSniffer`` only scans for the engine's
  ``cached_tokens`` report to measure the ledger's accuracy (predicted vs reported).
* A Responses answer teaches ``response_owners`` which worker stores it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from cortex.dispatch.admission import Admission
from cortex.dispatch.blame import may_be_the_requests
from cortex.dispatch.endpoints import Endpoint, decision_headers, with_dp_rank
from cortex.dispatch.exits import Exits
from cortex.dispatch.legs import Leg, LegBody, RetryableStatus, retryable_status
from cortex.dispatch.model_pool import ModelPool
from cortex.dispatch.observer import RouteObserver
from cortex.dispatch.request import ServeRequest
from cortex.dispatch.response_owners import ResponseOwners
from cortex.dispatch.route import Route
from cortex.dispatch.settings import AdmissionSettings
from cortex.front.messages import HttpResponse
from cortex.upstream.connection import NOT_READY
from cortex.upstream.connection_pool import ConnectionPool
from cortex.upstream.errors import UpstreamBroken
from cortex.upstream.sse import CachedTokensSniffer

_DROPPED_RESPONSE_HEADERS = frozenset({
    b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade",
    b"server", b"date",
})

Headers = list[tuple[bytes, bytes]]


class Dispatcher:
    def __init__(
        self,
        upstream: ConnectionPool,
        observer: RouteObserver,
        *,
        retries: int = 2,
        admission: AdmissionSettings | None = None,
        client_dp_rank: bool = False,
    ) -> None:
        self.upstream = upstream
        self.observer = observer
        self.retries = retries  # attempts after the first, before the first byte
        self.client_dp_rank = client_dp_rank  # clients may pick the DP rank (else stripped)
        self.admission_settings = admission or AdmissionSettings()
        self.admissions: dict[str, Admission] = {}
        self.response_owners = ResponseOwners()  # stored Responses answers -> their worker

    def admission_for(self, pool: ModelPool) -> Admission:
        """``pool``'s admission queue (made once per model): where a request waits while
        every worker of the pool is saturated."""
        admission = self.admissions.get(pool.model)
        if admission is None:
            admission = self.admissions[pool.model] = Admission(self.admission_settings)
            pool.on_capacity(admission.capacity_changed)
        return admission

    async def serve_on(
        self,
        pool: ModelPool,
        route: Route,
        request: ServeRequest,
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
        the worker's breaker unless it may be the request's own (``cortex.dispatch.blame``)."""
        worker = route.worker
        http = request.http
        raw, sent_headers = with_dp_rank(worker.engine, request.body, http.body,
                                         request.headers, route.rank, self.client_dp_rank)
        stack = Exits()
        try:
            stack.enter_context(route.hold)
            leg = await self.open_leg(
                stack, worker.origin, http.target, sent_headers, raw,
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
        if request.endpoint is Endpoint.RESPONSES and status == 200:
            self.response_owners.learn(leg.first or b"", worker.name)
        if whole is not None:
            # released and measured once the answer is on its way, off the client's wait
            return HttpResponse(status, client_headers(leg, with_length=False) + extra, whole,
                                in_turn(partial(_close_at_once, stack),
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
        headers: Headers,
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
        extra_headers: Headers,
        worker: str,
        on_cached_tokens: Callable[[int], None] | None = None,
        transform: Callable[[bytes], bytes] | None = None,
    ) -> HttpResponse:
        """The client's response: the leg's head (minus hop-by-hop and ``x-cortex-*``) plus
        Cortex's headers, and its body streamed as it arrives."""
        headers = client_headers(leg, with_length=transform is None)
        return HttpResponse(leg.response.status, headers + extra_headers,
                            LegBody(leg, stack, partial(self.observer.upstream_failed, worker,
                                                        retried=False, after_first_byte=True),
                                    on_cached_tokens, transform))


def in_turn(first: Callable[[], None], then: Callable[[], None] | None) -> Callable[[], None]:
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


def client_headers(leg: Leg, *, with_length: bool) -> Headers:
    """The leg's response headers the client gets: no hop-by-hop, no ``x-cortex-*``, and
    ``content-length`` only when the body passes unchanged and unframed by Cortex."""
    return [(name, value) for name, value in leg.response.headers
            if name not in _DROPPED_RESPONSE_HEADERS and not name.startswith(b"x-cortex-")
            and (with_length or name != b"content-length")]
