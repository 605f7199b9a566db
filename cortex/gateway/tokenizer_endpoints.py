"""The engines' tokenizer endpoints, passed to a live worker of the model: ``POST /tokenize``
and ``/detokenize`` (vLLM and SGLang), ``/v1/tokenize`` and ``/v1/detokenize`` (SGLang only).

Rules:

* Forwarded, never answered by Cortex. Cortex holds the engine's tokenizer and chat template,
  but an answer holds what only the engine knows (vLLM's ``max_model_len`` is its configured
  context; SGLang's is its tokenizer's ``model_max_length``), the requests take the engine's
  whole chat rendering (``tools``, ``add_generation_prompt``, ``continue_final_message``,
  ``chat_template``/``chat_template_kwargs``, media parts, ``return_token_strs``, LoRA model
  names) and its validation errors, and the engines answer in their own shapes (vLLM
  ``{count, max_model_len, tokens, token_strs}`` and ``{prompt}``; SGLang
  ``{tokens, count, max_model_len}`` and ``{text}``, batches of prompts too). A worker's
  answer is exact by construction; a local one would be a copy to keep equal.
* Which worker: one of the model the body names (``model``, else the only model served) whose
  engine serves the path (``SERVED_BY``), live (healthy, breaker closed, not draining), taken
  in turn. No KV routing (nothing is cached), no admission queue and no in-flight hold: a
  tokenizer call takes no batch slot, so it neither waits for nor counts as engine load.
  Any role: prefill and decode workers tokenize alike (one leg, never a PD pair).
* No worker of the model has an engine serving the path: 404 saying so. None of them live:
  503 (``NoWorkerAvailable``, counted as ``cortex_no_worker_total``).
* Failures as for generation: a connect failure, a connection broken before the first body
  chunk, or a 429/5xx head moves the request to another such worker (the failed ones left
  out), up to ``retries`` more attempts; the answer of the last attempt, or of the last worker
  left, is relayed as it came. Each failure goes to the observer
  (``cortex_upstream_errors_total``, ``cortex_retries_total``, the worker's breaker) under the
  same rules of whose failure it is (``cortex.dispatch.blame``), as a generation request's does. Not a routing decision:
  nothing in ``cortex_decisions_total``.
* The body and headers go as they came (minus hop-by-hop and ``x-cortex-*`` headers, and the
  DP-rank header: no rank to choose); the answer comes back streamed as the engine sent it,
  with ``x-cortex-assigned-worker`` (and ``x-cortex-attempts`` after a retry).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable

from cortex.dispatch.blame import RequestBlame, may_be_the_requests
from cortex.dispatch.dispatcher import Dispatcher
from cortex.dispatch.endpoints import body_model, forwarded_headers, parse_body
from cortex.dispatch.exits import Exits
from cortex.dispatch.legs import RetryableStatus, retryable_status
from cortex.dispatch.model_pool import ModelPool
from cortex.errors import (
    CortexError,
    MethodNotAllowed,
    NotFound,
    NoWorkerAvailable,
    UpstreamError,
)
from cortex.front.messages import HttpRequest, HttpResponse

log = logging.getLogger("cortex.gateway")

_BOTH = frozenset({"vllm", "sglang"})
_SGLANG = frozenset({"sglang"})
# path -> the engines that serve it (engine-endpoints.md §2; SGLang's http_server routes both
# spellings, vLLM's api router the short one only)
SERVED_BY: dict[bytes, frozenset[str]] = {
    b"/tokenize": _BOTH, b"/detokenize": _BOTH,
    b"/v1/tokenize": _SGLANG, b"/v1/detokenize": _SGLANG,
}


class TokenizerEndpoints:
    def __init__(self, dispatcher: Dispatcher,
                 pool_for: Callable[[str | None], ModelPool]) -> None:
        """``pool_for``: the pool serving a model name (``None``: the only one), else the
        client's error."""
        self.dispatcher = dispatcher
        self.pool_for = pool_for
        self._turn = itertools.count()

    async def serve(self, request: HttpRequest) -> HttpResponse:
        """Answer ``request`` (its path one of ``SERVED_BY``) with a worker's answer."""
        path = request.path
        if request.method != b"POST":
            raise MethodNotAllowed(f"{path.decode()} accepts POST only", allow=("POST",))
        dispatcher = self.dispatcher
        pool = self.pool_for(body_model(parse_body(request.body)))
        serving = engines_serving(pool, path)
        headers = forwarded_headers(request.headers)
        failed: list[str] = []
        blame = RequestBlame(dispatcher.observer, pool.model)
        last_error: CortexError | None = None
        for attempt in range(1, dispatcher.retries + 2):
            live = _live(pool, serving, failed)
            if not live:
                if last_error is not None:
                    raise last_error
                dispatcher.observer.no_worker(pool.model)
                raise NoWorkerAvailable(f"no live worker of model {pool.model!r} serves "
                                        f"{path.decode()}")
            name = live[next(self._turn) % len(live)]
            stack = Exits()
            try:
                leg = await dispatcher.open_leg(  # (a failing status with no one left: relayed)
                    stack, pool.workers[name].origin, request.target, headers, request.body,
                    retry_statuses=attempt <= dispatcher.retries and len(live) > 1,
                    relay_engine_errors=blame.relay_next)
            except (UpstreamError, RetryableStatus) as error:
                await stack.aclose()
                failed.append(name)
                last_error = (error if isinstance(error, UpstreamError)
                              else UpstreamError(f"{name}: {error}"))
                retried = attempt <= dispatcher.retries and bool(_live(pool, serving, failed))
                blame.failed(name, error, retried=retried)
                log.warning("%s attempt %d on %s failed before the first byte: %s",
                            path.decode(), attempt, name, error)
                continue
            except BaseException:
                await stack.aclose()
                raise
            status = leg.response.status
            if retryable_status(status):  # the last attempt's failure: relayed
                dispatcher.observer.upstream_failed(name, RetryableStatus(status), retried=False,
                                                 blame=not may_be_the_requests(status))
            blame.answered(name, status)
            extra = [(b"x-cortex-assigned-worker", name.encode())]
            if attempt > 1:
                extra.append((b"x-cortex-attempts", str(attempt).encode()))
            return dispatcher.respond(leg, stack, extra, name)
        assert last_error is not None
        raise last_error


def _live(pool: ModelPool, serving: frozenset[str], failed: list[str]) -> list[str]:
    """The pool's live workers among ``serving`` that have not failed this request."""
    return [view.worker for view in pool.views()
            if view.healthy and view.worker in serving and view.worker not in failed]


def engines_serving(pool: ModelPool, path: bytes) -> frozenset[str]:
    """The pool's workers whose engine serves ``path``; a clear 404 when it has workers and
    none of them does."""
    engines = SERVED_BY[path]
    serving = frozenset(name for name, spec in pool.workers.items() if spec.engine in engines)
    if pool.workers and not serving:
        kinds = " or ".join(sorted(engines))
        raise NotFound(f"POST {path.decode()} is served by {kinds} engines only, and no "
                       f"worker of model {pool.model!r} is one"
                       + ("; use /tokenize or /detokenize" if path.startswith(b"/v1/") else ""))
    return serving
