"""Both legs of a prefill/decode request, under one set of failure rules (trio).

Rules (issue 6, protocols/pd-disaggregation.md):

* A model's pool is PD-enabled while it has a live ``prefill`` and a live ``decode`` worker.
  Prefill is chosen by the scheduler on ledger overlap and load; decode by the same scheduler
  (ledger credit counts when the decode engine publishes events). ``both`` workers never take
  a PD leg; they are the fallback.
* SGLang: both legs get the same body with ``bootstrap_host/port/room`` (the port as
  registered, else as the prefill server reported it) and are sent at once; a leg that fails
  (transport error or a 5xx head) while the two heads are awaited cancels the other at once
  (one nursery) — its peer would otherwise wait for its own PD timeout; a leg answering 4xx
  (the engine refuses the request itself) closes the other and is the client's answer. Prefill's
  body is read to the end (the engine frees its slot; logprobs merged from it when asked), then
  decode's answer streams to the client.
* vLLM: prefill first (``max_tokens`` 1, not streamed, ``do_remote_decode``), its
  ``kv_transfer_params`` go unchanged into the decode request, whose answer streams.
* Before the first byte reaches the client, a failed pair is retried (the failed worker
  excluded, a new room) up to ``retries`` times; then, if ``fallback_to_both``, one ``both``
  worker serves the request alone; otherwise the client gets a clear upstream error. Nothing is
  replayed after the first byte: a decode that dies mid-stream ends the client's stream with an
  error, and closing the exchanges aborts whatever an engine still runs.
* Whose failure it is follows ``cortex.dispatch.blame``: a leg's 5xx other than 502/503/504
  counts toward its worker's breaker only once the request is served; a second such failure of
  the same request is the request's own — counted (``poisoned``), nobody blamed, no further
  pair and no fallback: the client gets a 502 naming the status.
* Bypass (vLLM): when the decode worker already holds all but ``bypass_max_uncached_tokens``
  of the prompt, decode serves alone (it prefills the rest itself). SGLang decode servers need
  a bootstrap peer, so there is no bypass for them.
* Every outcome is counted in ``PdCounters``; response headers name both workers. The first
  pair's decision is reported to the dispatcher's observer like a single-worker decision (its
  prefill route: mode, reason, timing), and the prefill engine's cached-token report, read from
  the prefill answer Cortex drains, is compared with the prediction for the prefill pick (the
  decode engine's answer reports no prefill work of its own).
* A serving strategy beside ``cortex.dispatch.single``, over the same dispatch layer
  (``cortex.dispatch.dispatcher``: admission queues, one attempt on one worker, opening a
  leg, answering the client, the observer); the gateway picks it for a PD-enabled pool and
  hands it the request's record (``ServeRequest``). Nothing here calls back into the gateway.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from time import perf_counter
from typing import Any
from urllib.parse import urlsplit

import trio

from cortex.dispatch.blame import RequestBlame
from cortex.dispatch.dispatcher import Dispatcher
from cortex.dispatch.endpoints import Endpoint, decision_headers
from cortex.dispatch.exits import Exits
from cortex.dispatch.legs import Leg, RetryableStatus
from cortex.dispatch.model_pool import ModelPool
from cortex.dispatch.request import ServeRequest
from cortex.dispatch.route import Route
from cortex.errors import CortexError, NoWorkerAvailable, UpstreamError
from cortex.front.messages import HttpResponse
from cortex.pd.plan import (
    PdSettings,
    batch_items,
    bypass_prefill,
    merge_logprobs_event,
    merge_logprobs_json,
    prefill_input_logprobs,
    sglang_leg_body,
    vllm_decode_body,
    vllm_prefill_body,
    vllm_transfer_params,
    wants_logprobs,
)
from cortex.scheduling import Role
from cortex.scheduling.inflight import Hold

log = logging.getLogger("cortex.pd")

MAX_PREFILL_ANSWER_BYTES = 64 << 20


@dataclass(slots=True)
class PdCounters:
    served: int = 0  # answered through a prefill/decode pair
    bypassed: int = 0  # decode alone (it held the prefix)
    retried_prefill: int = 0  # a pair given up because its prefill leg failed
    retried_decode: int = 0  # ... because its decode leg failed
    fallback_both: int = 0  # served by a `both` worker after PD failed
    failed: int = 0  # the client got an error before its first byte
    by_engine: dict[str, int] = field(default_factory=dict)


class LegFailed(Exception):
    """One leg failed before the first byte reached the client."""

    def __init__(self, leg: str, worker: str, error: BaseException) -> None:
        super().__init__(f"{leg} leg on {worker}: {error}")
        self.leg = leg
        self.worker = worker
        self.error = error


class LegRefused(Exception):
    """A leg answered 4xx: the engine refuses the request itself; the client gets that answer."""

    def __init__(self, leg: str, answer: Leg) -> None:
        super().__init__(f"{leg} leg answered {answer.response.status}")
        self.leg = leg
        self.answer = answer


class PdOrchestrator:
    def __init__(self, dispatcher: Dispatcher, settings: PdSettings | None = None,
                 new_request_id: Callable[[], str] = lambda: uuid.uuid4().hex) -> None:
        self.dispatcher = dispatcher
        self.settings = settings or PdSettings()
        self.counters = PdCounters()
        self.new_request_id = new_request_id

    @staticmethod
    def enabled(pool: ModelPool) -> bool:
        return pool.pending.prefill_and_decode

    async def serve(self, pool: ModelPool, request: ServeRequest) -> HttpResponse:
        """Serve ``request`` through a prefill/decode pair (its first decision observed with
        the request's tokenize and hash timings), else as the rules above say."""
        dispatcher = self.dispatcher
        token_ids, prompt, keys = request.token_ids, request.prompt, request.keys
        started: float | None = request.started
        views = pool.views()
        both = {view.worker for view in views if view.role is Role.BOTH}
        admission = dispatcher.admission_for(pool)
        failed_prefill: set[str] = set()
        failed_decode: set[str] = set()
        blame = RequestBlame(dispatcher.observer, pool.model)
        last: BaseException | None = None
        for _ in range(self.settings.retries + 1):
            try:
                prefill, decode = await admission.admit(partial(
                    self._pair, pool, token_ids, prompt, keys, both | failed_prefill,
                    both | failed_decode))
            except NoWorkerAvailable as error:
                last = last or error
                break
            if started is not None:
                prefill.timings.update(request.timings)
                dispatcher.observer.decided(pool.model, prefill, perf_counter() - started)
                started = None  # the first decision only, as for a single worker
            engine = decode.worker.engine
            try:
                if engine == "vllm" and token_ids is not None and bypass_prefill(
                        len(token_ids), decode.decision.predicted_cached_tokens,
                        self.settings.bypass_max_uncached_tokens):
                    try:
                        response = await dispatcher.serve_on(
                            pool, decode, request, 1, relay_engine_errors=blame.relay_next)
                    except (UpstreamError, RetryableStatus) as error:
                        raise LegFailed("decode", decode.worker.name, error) from None
                    blame.answered(decode.worker.name, response.status)
                    self.counters.bypassed += 1
                    return response
                if engine == "sglang":
                    response = await self._sglang(pool, prefill, decode, request)
                else:
                    response = await self._vllm(pool, prefill, decode, request)
            except LegFailed as error:
                last = error
                log.warning("PD: %s", error)
                status = getattr(error.error, "status", None)
                if status is not None and blame.poisoned(status):  # it followed the request
                    self._poisoned(blame, error, status)
                if error.leg == "prefill":
                    failed_prefill.add(error.worker)
                    self.counters.retried_prefill += 1
                else:
                    failed_decode.add(error.worker)
                    self.counters.retried_decode += 1
                blame.failed(error.worker, error.error, retried=True)
                continue
            blame.answered(decode.worker.name, response.status)
            self.counters.served += 1
            self.counters.by_engine[engine] = self.counters.by_engine.get(engine, 0) + 1
            return response
        if self.settings.fallback_to_both and both:
            pd_workers = {view.worker for view in views if view.role is not Role.BOTH}
            try:
                route = pool.decide(token_ids, prompt, exclude=pd_workers, role=Role.BOTH,
                                    keys=keys)
                response = await dispatcher.serve_on(pool, route, request, 1,
                                                     relay_engine_errors=blame.relay_next)
            except RetryableStatus as error:
                blame.failed(route.worker.name, error, retried=False)
                last = UpstreamError(f"{route.worker.name}: {error}")
            except CortexError as error:
                last = error
            else:
                blame.answered(route.worker.name, response.status)
                self.counters.fallback_both += 1
                return response
        self.counters.failed += 1
        if isinstance(last, LegFailed):
            error = last.error
            raise error if isinstance(error, CortexError) else UpstreamError(str(last))
        raise last if last is not None else NoWorkerAvailable("no prefill/decode pair")

    def _poisoned(self, blame: RequestBlame, error: LegFailed, status: int) -> None:
        """A leg failed with ``status`` after another worker had failed the same request that
        way (``cortex.dispatch.blame``): the request's own failure. Counted, nobody blamed,
        nothing more tried: the client gets a clear 502 naming the engine's status."""
        self.counters.failed += 1
        self.dispatcher.observer.upstream_failed(error.worker, error.error, retried=False,
                                                 blame=False)
        blame.answered(error.worker, status)
        raise UpstreamError(f"the request failed with {status} on two workers, last the "
                            f"{error.leg} leg on {error.worker}: not retried") from None

    @staticmethod
    def _pair(pool: ModelPool, token_ids: Any, prompt: Any, keys: Any, not_prefill: set[str],
              not_decode: set[str]) -> tuple[Route, Route]:
        """A prefill and a decode route of the same engine family (a vLLM prefill cannot hand
        its KV to an SGLang decode, nor the reverse; a pool may hold both flavors). A prefill
        worker still awaiting its own report (an SGLang prefill registered without a bootstrap
        port) makes the pool count as saturated, so the request waits for the report instead
        of failing."""
        awaiting = {name for name, spec in pool.workers.items() if pool.awaiting_report(spec)}
        peers = {spec.engine for name, spec in pool.workers.items()
                 if spec.role is Role.DECODE and name not in not_decode}
        no_peer = {name for name, spec in pool.workers.items() if spec.engine not in peers}
        try:
            prefill = pool.decide(token_ids, prompt, exclude=not_prefill | awaiting | no_peer,
                                  role=Role.PREFILL, keys=keys)
        except NoWorkerAvailable as error:
            if awaiting - not_prefill and not error.saturated:
                raise NoWorkerAvailable(f"{error}; prefill {', '.join(sorted(awaiting))} "
                                        "not reported yet", saturated=True) from None
            raise
        other_family = {name for name, spec in pool.workers.items()
                        if spec.engine != prefill.worker.engine}
        decode = pool.decide(token_ids, prompt, exclude=not_decode | other_family,
                             role=Role.DECODE, keys=keys)
        return prefill, decode

    # ------------------------------------------------------------------ SGLang

    async def _sglang(self, pool: ModelPool, prefill: Route, decode: Route,
                      request: ServeRequest) -> HttpResponse:
        dispatcher = self.dispatcher
        path = request.endpoint.value
        body, headers, target = request.body, request.headers, request.http.target
        host = urlsplit(prefill.worker.url).hostname or ""
        raw, _rooms = sglang_leg_body(body, host, pool.bootstrap_port(prefill.worker),
                                      batch_items(path, body))
        legs: dict[str, Leg] = {}
        decode_stack = Exits()
        prefill_stack = Exits()

        async def open_leg(name: str, route: Route, stack: Exits) -> None:
            try:
                leg = await dispatcher.open_leg(stack, route.worker.origin, target, headers, raw,
                                             retry_statuses=True)
            except (UpstreamError, OSError, RetryableStatus) as error:
                raise LegFailed(name, route.worker.name, error) from None
            status = leg.response.status
            if status >= 500:  # a failed leg cancels the other at once (its peer would wait)
                raise LegFailed(name, route.worker.name,
                                UpstreamError(f"{name} answered {status}"))
            if status >= 400:  # the engine refused the request itself: the client's answer
                raise LegRefused(name, leg)
            legs[name] = leg

        try:
            prefill_stack.enter_context(prefill.hold)
            decode_stack.enter_context(_decode_hold(pool, decode))
            try:
                await _first_failure(open_leg, ("prefill", prefill, prefill_stack),
                                     ("decode", decode, decode_stack))
            except LegRefused as refused:  # forwarded as it is; the other leg is closed
                mine, other = ((prefill_stack, decode_stack) if refused.leg == "prefill"
                               else (decode_stack, prefill_stack))
                await other.aclose()
                return dispatcher.respond(refused.answer, mine,
                                       self._headers(prefill, decode, "sglang"),
                                       prefill.worker.name)
            prefill_leg = legs["prefill"]
            try:
                prefill_answer = await _read_rest(prefill_leg)
            except UpstreamError as error:
                raise LegFailed("prefill", prefill.worker.name, error) from None
            await prefill_stack.aclose()
            dispatcher.observe_cached_tokens(pool, prefill, prefill_answer)
            decode_leg = legs["decode"]
            transform = None
            extra = self._headers(prefill, decode, "sglang")
            if wants_logprobs(path, body):
                logprobs = prefill_input_logprobs(prefill_answer)
                if logprobs:
                    if not _is_sse(decode_leg):
                        try:
                            whole = await _read_rest(decode_leg)
                        except UpstreamError as error:
                            raise LegFailed("decode", decode.worker.name, error) from None
                        merged = merge_logprobs_json(whole, logprobs)
                        await decode_stack.aclose()
                        return HttpResponse(decode_leg.response.status, [
                            (n, v) for n, v in decode_leg.response.headers
                            if n not in (b"content-length", b"transfer-encoding",
                                         b"connection")] + extra, merged)
                    transform = SseEventTransform(
                        lambda event: merge_logprobs_event(event, logprobs))
            return dispatcher.respond(decode_leg, decode_stack, extra, decode.worker.name,
                                   transform=transform)
        except BaseException:
            with trio.CancelScope(shield=True):
                await prefill_stack.aclose()
                await decode_stack.aclose()
            raise

    # ------------------------------------------------------------------ vLLM

    async def _vllm(self, pool: ModelPool, prefill: Route, decode: Route,
                    request: ServeRequest) -> HttpResponse:
        dispatcher = self.dispatcher
        body, headers, target = request.body, request.headers, request.http.target
        request_id = _header(headers, b"x-request-id") or self.new_request_id().encode()
        leg_headers = [(n, v) for n, v in headers if n != b"x-request-id"]
        leg_headers.append((b"x-request-id", request_id))
        prefill_stack = Exits()
        decode_stack = Exits()
        try:
            prefill_stack.enter_context(prefill.hold)
            try:
                leg = await dispatcher.open_leg(prefill_stack, prefill.worker.origin, target,
                                             leg_headers, vllm_prefill_body(
                                                 body, request.endpoint is Endpoint.RESPONSES),
                                             retry_statuses=True)
                if leg.response.status >= 500:
                    raise UpstreamError(f"prefill answered {leg.response.status}")
                if leg.response.status >= 400:
                    return dispatcher.respond(leg, prefill_stack,
                                           self._headers(prefill, decode, "vllm"),
                                           prefill.worker.name)
                answer = await _read_rest(leg)
                params = vllm_transfer_params(answer)
            except (UpstreamError, OSError, RetryableStatus) as error:
                raise LegFailed("prefill", prefill.worker.name, error) from None
            await prefill_stack.aclose()
            dispatcher.observe_cached_tokens(pool, prefill, answer)
            decode_stack.enter_context(_decode_hold(pool, decode))
            try:
                leg = await dispatcher.open_leg(decode_stack, decode.worker.origin, target,
                                             leg_headers, vllm_decode_body(body, params),
                                             retry_statuses=True)
            except (UpstreamError, OSError, RetryableStatus) as error:
                raise LegFailed("decode", decode.worker.name, error) from None
            return dispatcher.respond(leg, decode_stack, self._headers(prefill, decode, "vllm"),
                                   decode.worker.name)
        except BaseException:
            with trio.CancelScope(shield=True):
                await prefill_stack.aclose()
                await decode_stack.aclose()
            raise

    @staticmethod
    def _headers(prefill: Route, decode: Route, engine: str) -> list[tuple[bytes, bytes]]:
        decision = prefill.decision
        headers = decision_headers(decode.worker.name, decision.mode.value,
                                   decision.predicted_cached_tokens, decode.rank, 1)
        headers += [(b"x-cortex-prefill-worker", prefill.worker.name.encode()),
                    (b"x-cortex-decode-worker", decode.worker.name.encode()),
                    (b"x-cortex-pd", engine.encode())]
        return headers


class SseEventTransform:
    """Applies a function to whole SSE events of a byte stream cut anywhere."""

    def __init__(self, change: Callable[[bytes], bytes]) -> None:
        self.change = change
        self.pending = b""

    def __call__(self, chunk: bytes) -> bytes:
        data = self.pending + chunk
        end = data.rfind(b"\n\n")
        if end < 0:
            self.pending = data
            return b""
        complete, self.pending = data[: end + 2], data[end + 2:]
        events = complete.split(b"\n\n")[:-1]
        return b"".join(self.change(event + b"\n\n") for event in events)


def _decode_hold(pool: ModelPool, decode: Route) -> Hold:
    """Decode receives the prompt's KV: it counts in flight, with no prefill work queued."""
    return pool.pending.hold(decode.worker.name, 0)


async def _first_failure(open_leg: Callable[..., Any], *legs: tuple[Any, ...]) -> None:
    """Open every leg at once; the first failure cancels the others and is raised alone."""
    try:
        async with trio.open_nursery() as nursery:
            for leg in legs:
                nursery.start_soon(open_leg, *leg)
    except BaseExceptionGroup as group:
        failed = [e for e in _leaves(group) if isinstance(e, (LegFailed, LegRefused))]
        if failed:
            raise failed[0] from None
        raise


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    found: list[BaseException] = []
    for error in group.exceptions:
        if isinstance(error, BaseExceptionGroup):
            found += _leaves(error)
        else:
            found.append(error)
    return found


async def _read_rest(leg: Leg) -> bytes:
    parts = [leg.first or b""]
    size = len(parts[0])
    async for chunk in leg.chunks:
        size += len(chunk)
        if size > MAX_PREFILL_ANSWER_BYTES:
            raise UpstreamError("a prefill/decode answer exceeded its size limit")
        parts.append(chunk)
    return b"".join(parts)


def _is_sse(leg: Leg) -> bool:
    for name, value in leg.response.headers:
        if name == b"content-type":
            return value.startswith(b"text/event-stream")
    return False


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in headers:
        if key == name:
            return value
    return None
