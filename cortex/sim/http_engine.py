"""The HTTP side of a simulated engine: the routes a vLLM or SGLang server answers, same shapes.

A ``Handler`` (``cortex.front.messages``) over one ``SimEngine``, seen as a ``SimEngineView``
(``cortex.sim.engine_view``: the engine builds its handler, so this module does not import
it). Shapes follow
``shared/protocols/engine-endpoints.md``; ``cortex.sim.bodies`` builds the bodies.

Routes (both flavors unless marked):

* ``POST /v1/chat/completions``, ``POST /v1/completions``: JSON, or SSE with ``stream: true``
  (one ``data:`` event per token, the chat role first, ``finish_reason`` on the last token,
  a ``choices: []`` usage event with ``stream_options.include_usage``, then ``data: [DONE]``).
  ``usage.prompt_tokens_details.cached_tokens`` is always present. Output length is
  ``max_completion_tokens``/``max_tokens`` (default 16); every request ends with ``length``.
* ``POST /v1/messages`` (and ``/count_tokens``), ``POST /v1/responses``: converted to the chat
  vLLM renders (400 if not modelled), answered in each API's shapes (``cortex.sim.api_bodies``;
  an unknown ``previous_response_id`` gets vLLM's 404, a known one is served on its input).
* SGLang ``POST /generate`` (``text`` or ``input_ids``; ``sampling_params.max_new_tokens``;
  ``meta_info.prompt_tokens``/``cached_tokens``; SSE with cumulative ``text``/``output_ids``).
  Several prompts (a batch) run at once and answer a JSON list, not streamed.
* ``POST /tokenize``, ``/detokenize`` (SGLang also under ``/v1/``): each engine's shapes
  (``cortex.sim.tokenizer_api``); vLLM's 404 for a model it does not serve.
* ``GET /v1/models``; ``GET /health`` (200, 503 while the ``unhealthy`` fault is on).
* SGLang ``GET /server_info`` (and ``/get_server_info``), ``GET /v1/loads`` (``?dp_rank=N``),
  ``POST|GET /flush_cache`` (400 while requests run or wait).
* vLLM ``GET /metrics`` (Prometheus text, labels ``model_name`` and ``engine`` = rank),
  ``GET /kv_event_sources`` (vLLM >= 0.31), ``GET /version``, ``POST /reset_prefix_cache``.
* ``GET|POST /sim/faults``: read or change the fault switches (JSON object of changes).

Prefill/decode roles (``engine.pd``): the PD fields of a generation request are checked, and a
prefill's work or a decode's KV fetch done, before the response head (``cortex.sim.pd``).

Data-parallel rank of a generation request (default 0; out of range -> 400):

* vLLM: header ``X-data-parallel-rank``. Found in vLLM's OpenAI serving base class,
  ``OpenAIServing._get_data_parallel_rank`` (``vllm/entrypoints/openai/serving_engine.py``, later
  moved to ``vllm/entrypoints/openai/engine/serving.py``): ``raw_request.headers.get(
  "X-data-parallel-rank")``, so any letter case (starlette headers); a value that is not an
  integer is ignored (None: the engine balances; here rank 0). The rank is handed to the engine
  client as ``data_parallel_rank``; out of ``[0, dp_size)`` it is refused (here: 400).
* SGLang: body field ``routed_dp_rank`` (older releases: ``data_parallel_rank``).

Errors: every refusal or failure of an engine route (a ``CortexError`` raised while handling it)
is answered in that engine's own error shape for the route (``cortex.sim.engine_errors``): a
body that does not fit the route (wrong types, missing fields) as the engine's request
validation answers it, 400; a template that fails, an unknown model (404) or a 500 as the route
itself answers. Only ``/sim/faults`` keeps Cortex's error shape. Hostile JSON never makes a route
raise anything else (``tests/property/test_sim_hostile_bodies.py``).

Faults, read at the start of every generation or tokenizer request once its body has been
checked, in this order: ``hang`` (the handler waits until the client goes away), ``slow_s`` (sleep before
anything is answered), ``fail_status`` (the engine's error with that status),
``poison_marker`` (a body containing that string is answered 500 with the engine's
internal-error body, counted in ``handler.poisoned``). ``die_after_chunks`` breaks a streamed
response after N events (the body iterator raises ``EngineCrashed``; the server then closes the
connection without the final chunk); non-streamed responses are unaffected.

LoRA: ``lora_path`` (SGLang), ``model`` written ``base:adapter`` (SGLang), or (vLLM) ``model``
naming a configured adapter. vLLM answers 404 for any other ``model`` that is not the served
name; SGLang ignores ``model``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from functools import partial
from typing import Any
from urllib.parse import parse_qs

import msgspec
import trio

from cortex.errors import BadRequest, CortexError, NotFound
from cortex.front.messages import HttpRequest, HttpResponse, json_response
from cortex.ledger.kv_events import EngineFamily
from cortex.prompt.chat_template import TemplateError
from cortex.prompt.request_text import split_model_name
from cortex.sim import api_bodies, bodies, engine_errors, pd, request_fields, tokenizer_api
from cortex.sim.engine_view import SimEngineView
from cortex.sim.generation import TokenStream
from cortex.sim.http_faults import EngineCrashed
from cortex.sim.tokenize import cache_read_limit

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]
METRICS_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
DONE = b"data: [DONE]\n\n"

Route = Callable[[HttpRequest], Awaitable[HttpResponse]]


class SimHttpHandler:
    """``await handler(request) -> HttpResponse`` for one simulated engine."""

    def __init__(self, engine: SimEngineView) -> None:
        self.engine = engine
        vllm = engine.family is EngineFamily.VLLM
        routes: dict[tuple[bytes, bytes], Route] = {
            (b"POST", b"/v1/chat/completions"): self._chat,
            (b"POST", b"/v1/completions"): self._completions,
            (b"POST", b"/v1/messages"): self._messages,
            (b"POST", b"/v1/responses"): self._responses,
            (b"POST", b"/v1/messages/count_tokens"): self._count_tokens,
            (b"GET", b"/v1/models"): self._models,
            (b"GET", b"/health"): self._health,
            (b"GET", b"/sim/faults"): self._faults,
            (b"POST", b"/sim/faults"): self._faults,
            (b"POST", b"/tokenize"): partial(self._tokenizer, tokenizer_api.tokenize_body),
            (b"POST", b"/detokenize"): partial(self._tokenizer, tokenizer_api.detokenize_body),
        }
        if vllm:
            routes[(b"GET", b"/metrics")] = self._metrics
            routes[(b"GET", b"/version")] = self._version
            routes[(b"POST", b"/reset_prefix_cache")] = self._flush
            if engine.wire.version >= (0, 31):
                routes[(b"GET", b"/kv_event_sources")] = self._kv_event_sources
        else:
            routes[(b"POST", b"/generate")] = self._generate
            routes[(b"POST", b"/v1/tokenize")] = routes[(b"POST", b"/tokenize")]
            routes[(b"POST", b"/v1/detokenize")] = routes[(b"POST", b"/detokenize")]
            routes[(b"GET", b"/health_generate")] = self._health
            routes[(b"GET", b"/server_info")] = self._server_info
            routes[(b"GET", b"/get_server_info")] = self._server_info
            routes[(b"GET", b"/v1/loads")] = self._loads
            routes[(b"POST", b"/flush_cache")] = self._flush
            routes[(b"GET", b"/flush_cache")] = self._flush
        self._routes = routes
        self._stored = api_bodies.StoredIds()  # Responses answers
        self.poisoned = 0  # requests answered 500 for the poison_marker fault

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        route = self._routes.get((request.method, request.path))
        if route is None:
            raise NotFound(f"no route {request.method.decode()} {request.path.decode()}")
        if route == self._faults:  # the simulator's own API: Cortex's error shape
            return await route(request)
        try:
            return await route(request)
        except CortexError as error:
            validation = isinstance(error, BadRequest) and not isinstance(error, TemplateError)
            return self._error(request.path, error.http_status, str(error),
                               validation=validation)

    def _error(self, path: bytes, status: int, message: str, *,
               validation: bool = False) -> HttpResponse:
        """The engine's own error answer (``cortex.sim.engine_errors``)."""
        return _json(status, engine_errors.error_body(self.engine.family, path, status, message,
                                                      validation=validation))

    # ------------------------------------------------------------ generation routes

    async def _chat(self, request: HttpRequest) -> HttpResponse:
        body = request_fields.json_body(request)
        tokenizer = self.engine.tokenizer
        return await self._openai(request, body, "chat", lambda: tokenizer.chat_ids(body))

    async def _completions(self, request: HttpRequest) -> HttpResponse:
        body = request_fields.json_body(request)
        return await self._openai(
            request,
            body,
            "completion",
            lambda: self.engine.tokenizer.prompt_ids(body, body.get("prompt"), "prompt"),
        )

    async def _messages(self, request: HttpRequest) -> HttpResponse:
        body = request_fields.json_body(request)
        return await self._api(request, body, api_bodies.MessagesShape,
                               self.engine.tokenizer.messages_chat, "max_tokens")

    async def _count_tokens(self, request: HttpRequest) -> HttpResponse:
        tokenizer = self.engine.tokenizer
        return _json(200, {"input_tokens": len(tokenizer.chat_ids(tokenizer.messages_chat(
            request_fields.json_body(request))))})

    async def _responses(self, request: HttpRequest) -> HttpResponse:
        body = request_fields.json_body(request)
        previous = body.pop("previous_response_id", None)
        if previous is not None and not isinstance(previous, str):
            raise BadRequest("previous_response_id must be a string")
        if previous is not None and previous not in self._stored:
            return self._error(request.path, 404, f"Response with id '{previous}' not found.")
        return await self._api(request, body, api_bodies.ResponsesShape,
                               self.engine.tokenizer.responses_chat, "max_output_tokens")

    async def _api(self, request: HttpRequest, body: dict[str, Any], make_shape: Any,
                   as_chat: Callable[[dict[str, Any]], dict[str, Any]],
                   max_name: str) -> HttpResponse:
        """A Messages or Responses request: rendered as its chat, answered in its shapes."""
        engine = self.engine
        rank, lora = self._rank(request, body), self._lora(body)
        out = request_fields.max_tokens(body.get(max_name), max_name)
        token_ids = engine.tokenizer.chat_ids(as_chat(body))
        model = body.get("model")
        shape = make_shape(model if isinstance(model, str) and model
                           else engine.served_model_name)
        if isinstance(shape, api_bodies.ResponsesShape):
            self._stored.add(shape.id)
        if (early := await self._fault_gate(request)) is not None:
            return early
        generation, extra = await self._generation(body, rank, token_ids, out, lora,
                                                   request_fields.cache_salt(body))
        if not request_fields.flag(body, "stream", False):
            async with generation as gen:
                text = "".join([text async for _, text, _ in gen])
                return _json(200, {**shape.full(text, gen.prompt_tokens, gen.produced,
                                                gen.cached_tokens), **extra})

        async def events() -> AsyncIterator[bytes]:
            async with generation as gen:
                pieces: list[str] = []
                async for i, text, _ in gen:
                    if i == 0:
                        yield shape.start_events(gen.prompt_tokens, gen.cached_tokens)
                    pieces.append(text)
                    yield shape.token_event(text)
                yield shape.end_events("".join(pieces), gen.prompt_tokens, gen.produced,
                                       gen.cached_tokens)

        return HttpResponse(200, list(SSE_HEADERS), self._breakable(events()))

    async def _openai(
        self,
        request: HttpRequest,
        body: dict[str, Any],
        kind: str,
        tokenize: Callable[[], list[int]],
    ) -> HttpResponse:
        engine = self.engine
        rank = self._rank(request, body)
        lora = self._lora(body)
        if request_fields.positive(body, "n", 1) != 1:
            raise BadRequest("the simulated engine answers n=1 only")
        max_tokens = body.get("max_completion_tokens") if kind == "chat" else None
        if max_tokens is None:
            max_tokens = body.get("max_tokens")
        out = request_fields.max_tokens(max_tokens, "max_tokens")
        token_ids = tokenize()
        salt = request_fields.cache_salt(body)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            model = engine.served_model_name
        if (early := await self._fault_gate(request)) is not None:
            return early
        stream = request_fields.flag(body, "stream", False)
        shape = bodies.OpenAIShape(kind, model, bodies.response_id(kind, engine.name))
        generation, extra = await self._generation(body, rank, token_ids, out, lora, salt)
        if not stream:
            async with generation as gen:
                pieces = [text async for _, text, _ in gen]
                text = "".join(pieces)
                answer = shape.full(text, gen.prompt_tokens, gen.produced, gen.cached_tokens)
                return _json(200, {**answer, **extra})
        options = body.get("stream_options") or {}
        include_usage = isinstance(options, dict) and options.get("include_usage") is True

        async def events() -> AsyncIterator[bytes]:
            async with generation as gen:
                async for i, text, _ in gen:
                    if i == 0 and kind == "chat":
                        yield shape.role_event()
                    yield shape.token_event(text, last=i == gen.output_tokens - 1)
                if include_usage:
                    yield shape.usage_event(gen.prompt_tokens, gen.produced, gen.cached_tokens)
            yield DONE

        return HttpResponse(200, list(SSE_HEADERS), self._breakable(events()))

    async def _generate(self, request: HttpRequest) -> HttpResponse:
        engine = self.engine
        body = request_fields.json_body(request)
        rank = self._rank(request, body)
        lora = self._lora(body)
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise BadRequest("sampling_params must be an object (one request per call)")
        out = request_fields.max_tokens(params.get("max_new_tokens"), "max_new_tokens")
        name = "input_ids" if body.get("input_ids") is not None else "text"
        prompts = body.get(name)
        salt = request_fields.cache_salt(body)
        rid = body.get("rid")
        if not isinstance(rid, str) or not rid:
            rid = bodies.response_id("generate", engine.name)
        if isinstance(prompts, list) and len(prompts) > 1 and isinstance(
                prompts[0], (list, str)):
            items = [engine.tokenizer.prompt_ids(body, [p], name) for p in prompts]
            return await self._generate_batch(request, body, rank, items, out, lora, salt,
                                              rid)
        token_ids = engine.tokenizer.prompt_ids(body, prompts, name)
        if (early := await self._fault_gate(request)) is not None:
            return early
        logprobs = None
        if request_fields.flag(body, "return_logprob", False):
            decode = engine.pd is not None and engine.pd.role == "decode"
            logprobs = [] if decode else bodies.input_logprobs(token_ids)
        began = trio.current_time()
        generation, _ = await self._generation(body, rank, token_ids, out, lora, salt)
        if not request_fields.flag(body, "stream", False):
            async with generation as gen:
                pieces = [(text, tid) async for _, text, tid in gen]
                e2e = trio.current_time() - began
                return _json(200, bodies.generate_body(rid, gen, pieces, e2e, done=True,
                                                       logprobs=logprobs))

        async def events() -> AsyncIterator[bytes]:
            async with generation as gen:
                pieces: list[tuple[str, int]] = []
                async for i, text, tid in gen:
                    pieces.append((text, tid))
                    done = i == gen.output_tokens - 1
                    e2e = trio.current_time() - began
                    payload = bodies.generate_body(rid, gen, pieces, e2e, done=done,
                                                   logprobs=logprobs)
                    yield bodies.sse(payload)
            yield DONE

        return HttpResponse(200, list(SSE_HEADERS), self._breakable(events()))

    async def _generate_batch(self, request: HttpRequest, body: dict[str, Any], rank: int,
                              items: list[list[int]], out: int, lora: str | None,
                              salt: str | None, rid: str) -> HttpResponse:
        """SGLang ``/generate`` with several prompts: the items run at once (each its own PD
        request on a PD engine, with its own room); the answer is a JSON list in item order.
        The simulator streams single prompts only."""
        engine = self.engine
        if request_fields.flag(body, "stream", False):
            raise BadRequest("the simulated engine streams one prompt per request")
        if (early := await self._fault_gate(request)) is not None:
            return early
        wants_logprobs = request_fields.flag(body, "return_logprob", False)
        decode = engine.pd is not None and engine.pd.role == "decode"
        answers: list[Any] = [None] * len(items)
        began = trio.current_time()

        async def item(i: int) -> None:
            item_body = pd.batch_item_body(body, i, len(items)) if engine.pd else body
            generation, _ = await self._generation(item_body, rank, items[i], out, lora, salt)
            async with generation as gen:
                pieces = [(text, tid) async for _, text, tid in gen]
            logprobs = None
            if wants_logprobs:
                logprobs = [] if decode else bodies.input_logprobs(items[i])
            answers[i] = bodies.generate_body(f"{rid}-{i}", gen, pieces,
                                              trio.current_time() - began, done=True,
                                              logprobs=logprobs)

        try:
            async with trio.open_nursery() as nursery:
                for i in range(len(items)):
                    nursery.start_soon(item, i)
        except* CortexError as group:
            raise _first_leaf(group) from None
        return _json(200, answers)

    async def _generation(
        self,
        body: dict[str, Any],
        rank: int,
        token_ids: list[int],
        out: int,
        lora: str | None,
        salt: str | None,
    ) -> tuple[AbstractAsyncContextManager[TokenStream], dict[str, Any]]:
        """The request's generation (not started) and extra answer fields. A PD role
        (``cortex.sim.pd``) does its part that precedes the response head here."""
        engine = self.engine
        if engine.pd is not None:
            leg = await engine.pd.prepare(body, rank, token_ids, out, lora, salt)
            if leg is not None:
                return leg.generation, leg.extra or {}
        limit = cache_read_limit(body, engine.family)
        return engine.generation(rank, token_ids, out, lora_name=lora, cache_salt=salt,
                                 read_limit=limit), {}

    async def _fault_gate(self, request: HttpRequest) -> HttpResponse | None:
        faults = self.engine.faults
        if faults.hang:
            await trio.sleep_forever()
        if faults.slow_s > 0:
            await trio.sleep(faults.slow_s)
        if faults.fail_status is not None:
            return self._error(request.path, faults.fail_status, "simulated failure")
        marker = faults.poison_marker
        if marker is not None and marker.encode() in request.body:
            self.poisoned += 1
            return self._error(request.path, 500,
                               f"simulated internal error: the request contains {marker!r}")
        return None

    async def _breakable(self, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """Pass the events through; with ``die_after_chunks`` set, break after that many."""
        limit = self.engine.faults.die_after_chunks
        sent = 0
        try:
            async for event in events:
                if limit is not None and sent >= limit:
                    raise EngineCrashed(f"simulated crash after {sent} events")
                yield event
                sent += 1
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    def _rank(self, request: HttpRequest, body: dict[str, Any]) -> int:
        if self.engine.family is EngineFamily.VLLM:
            raw = request.header(b"x-data-parallel-rank")
            try:
                rank = int(raw) if raw is not None else 0
            except ValueError:
                rank = 0  # vLLM ignores a rank that is not an integer
        else:
            value = body.get("routed_dp_rank", body.get("data_parallel_rank"))
            if value is not None and type(value) is not int:
                raise BadRequest("routed_dp_rank must be an integer")
            rank = value or 0
        return self.engine.check_rank(rank)

    def _lora(self, body: dict[str, Any]) -> str | None:
        path = body.get("lora_path")
        if isinstance(path, list):
            path = path[0] if path else None
        if isinstance(path, str) and path:
            return path
        model = body.get("model")
        _base, adapter = split_model_name(model)
        if adapter is not None:
            return adapter
        if self.engine.family is EngineFamily.VLLM and isinstance(model, str) and model:
            if model in self.engine.lora_names:
                return model
            if model != self.engine.served_model_name:
                raise NotFound(f"The model `{model}` does not exist.")
        return None

    async def _tokenizer(self, answer: Callable[[SimEngineView, dict[str, Any]],
                                                dict[str, Any]],
                         request: HttpRequest) -> HttpResponse:
        body = request_fields.json_body(request)
        self._lora(body)  # vLLM: 404 for a model it does not serve
        if (early := await self._fault_gate(request)) is not None:
            return early
        return _json(200, answer(self.engine, body))

    # ------------------------------------------------------------ information routes

    async def _models(self, request: HttpRequest) -> HttpResponse:
        return _json(200, bodies.models_body(self.engine))

    async def _health(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(503 if self.engine.faults.unhealthy else 200)

    async def _version(self, request: HttpRequest) -> HttpResponse:
        return _json(200, {"version": self.engine.version})

    async def _server_info(self, request: HttpRequest) -> HttpResponse:
        return _json(200, bodies.server_info_body(self.engine))

    async def _loads(self, request: HttpRequest) -> HttpResponse:
        query = parse_qs(request.target.partition(b"?")[2].decode("latin-1"))
        ranks: list[int] | range = range(self.engine.dp_size)
        if "dp_rank" in query:
            try:
                ranks = [self.engine.check_rank(int(query["dp_rank"][0]))]
            except ValueError:
                raise BadRequest("dp_rank must be an integer") from None
        return _json(200, bodies.loads_body(self.engine, ranks))

    async def _metrics(self, request: HttpRequest) -> HttpResponse:
        text = bodies.vllm_metrics_text(self.engine)
        return HttpResponse(200, [(b"content-type", METRICS_TYPE)], text.encode())

    async def _kv_event_sources(self, request: HttpRequest) -> HttpResponse:
        return _json(200, bodies.kv_event_sources_body(self.engine))

    async def _flush(self, request: HttpRequest) -> HttpResponse:
        if self.engine.flush_cache():
            return HttpResponse(200, [(b"content-type", b"text/plain")], b"Cache flushed.\n")
        return HttpResponse(
            400,
            [(b"content-type", b"text/plain")],
            b"Cache not flushed. Please check if there are running requests or waiting requests.\n",
        )

    async def _faults(self, request: HttpRequest) -> HttpResponse:
        if request.method == b"POST":
            self.engine.faults.update(request_fields.json_body(request))
        return _json(200, self.engine.faults.as_dict())


# ---------------------------------------------------------------- body helpers


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


def _json(status: int, payload: object) -> HttpResponse:
    return json_response(status, msgspec.json.encode(payload))
