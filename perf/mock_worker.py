"""A fast mock inference worker for the gateway benchmark: answers at once, no tokenization.

Runs in its own process on Cortex's lean server (``cortex.front.server.HttpServer``), prints
its bound port on stdout once it listens, and serves until killed:

* ``POST /v1/chat/completions`` (also ``/v1/completions``, ``/generate``): a small fixed OpenAI
  chat completion with ``usage``; with ``"stream": true`` in the body an SSE stream — the first
  event at once, then ``STREAM_EVENTS - 1`` more, a final usage event and ``data: [DONE]``.
  The body is not parsed as JSON: only the bytes ``"stream": true`` / ``"stream":true`` are
  looked for, so the mock costs the same for a 100-token and a 4k-token body.
* ``GET /health``, ``/health_generate``, ``/v1/models``, ``/get_server_info``,
  ``/server_info``, ``/get_model_info``, ``/model_info``, ``/get_load``, ``/v1/loads``,
  ``/metrics``: what routers probe at start and while running (sglang-router, Cortex's
  monitor). Loads are always zero.
* Anything else: 404 (and, with ``--log-paths``, every request line goes to stderr, which is
  how the probes of a peer router are found).
* ``--kv-events``: a KV-event publisher as an SGLang engine binds it (an XPUB and a replay
  ROUTER, ``cortex.sim.publisher``) that never publishes: an engine whose cache is still
  empty. A subscriber's replay from 0 gets only the end marker, so Cortex's ledgers of this
  worker are READY (and empty) and it routes on its KV path (``load_aware`` without hits), as
  it does in service, instead of the fallback chain it uses without events. The endpoints
  follow the port on the first stdout line: ``PORT EVENTS REPLAY``.

Usage: ``python -m perf.mock_worker [--port 0] [--model NAME] [--log-paths] [--kv-events]``.
"""

from __future__ import annotations

import argparse
import sys

import trio
import zmq

from cortex.front.messages import HttpRequest, HttpResponse, json_response
from cortex.front.server import HttpServer
from cortex.sim.publisher import EventPublisher, bind_rank_sockets
from cortex.sim.wire import profile_named

HOST = "127.0.0.1"
STREAM_EVENTS = 4  # content events per SSE stream


def _completion(model: str) -> bytes:
    return (
        '{"id":"chatcmpl-mock","object":"chat.completion","created":1700000000,'
        f'"model":"{model}","choices":[{{"index":0,"message":{{"role":"assistant",'
        '"content":"ok ok ok ok"},"finish_reason":"stop"}],'
        '"usage":{"prompt_tokens":100,"completion_tokens":4,"total_tokens":104,'
        '"prompt_tokens_details":{"cached_tokens":0}}}'
    ).encode()


def _events(model: str) -> list[bytes]:
    head = ('{"id":"chatcmpl-mock","object":"chat.completion.chunk","created":1700000000,'
            f'"model":"{model}","choices":[{{"index":0,"delta":')
    events = [f'data: {head}{{"role":"assistant","content":"ok"}},"finish_reason":null}}]}}\n\n']
    events += [f'data: {head}{{"content":" ok"}},"finish_reason":null}}]}}\n\n'
               for _ in range(STREAM_EVENTS - 1)]
    events.append(f'data: {head}{{}},"finish_reason":"stop"}}],'
                  '"usage":{"prompt_tokens":100,"completion_tokens":4,"total_tokens":104,'
                  '"prompt_tokens_details":{"cached_tokens":0}}}\n\n')
    events.append("data: [DONE]\n\n")
    return [event.encode() for event in events]


def _info_routes(model: str) -> dict[bytes, bytes]:
    models = (f'{{"object":"list","data":[{{"id":"{model}","object":"model",'
              f'"created":1700000000,"owned_by":"mock","root":"{model}",'
              '"max_model_len":32768}]}').encode()
    server_info = (f'{{"model_path":"{model}","tokenizer_path":"{model}","served_model_name":'
                   f'"{model}","dp_size":1,"tp_size":1,"page_size":16,"max_total_num_tokens":'
                   '1000000,"version":"mock","internal_states":[{"last_gen_throughput":0.0}]}'
                   ).encode()
    model_info = (f'{{"model_path":"{model}","tokenizer_path":"{model}",'
                  '"is_generation":true,"model_type":"mock","architectures":["Mock"]}').encode()
    loads = b'{"loads":[{"dp_rank":0,"num_reqs":0,"num_waiting_reqs":0,"num_tokens":0}]}'
    return {
        b"/health": b"{}", b"/health_generate": b"{}", b"/v1/models": models,
        b"/get_server_info": server_info, b"/server_info": server_info,
        b"/get_model_info": model_info, b"/model_info": model_info,
        b"/get_load": b'[{"dp_rank":0,"num_reqs":0,"num_waiting_reqs":0,"num_tokens":0}]',
        b"/v1/loads": loads,
    }


_METRICS = (b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n"
            b"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n"
            b"# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 0\n"
            b"# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs 0\n")
_GENERATE_PATHS = (b"/v1/chat/completions", b"/v1/completions", b"/generate")
_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


def make_handler(model: str, log_paths: bool = False):
    completion = _completion(model)
    events = _events(model)
    info = _info_routes(model)

    async def stream():
        for event in events:
            yield event

    async def handler(request: HttpRequest) -> HttpResponse:
        if log_paths:
            print(request.method.decode(), request.target.decode(), file=sys.stderr, flush=True)
        path = request.path
        if request.method == b"POST" and path in _GENERATE_PATHS:
            body = request.body
            if b'"stream": true' in body or b'"stream":true' in body:
                return HttpResponse(200, list(_SSE_HEADERS), stream())
            return json_response(200, completion)
        if request.method == b"GET":
            payload = info.get(path)
            if payload is not None:
                return json_response(200, payload)
            if path == b"/metrics":
                return HttpResponse(200, [(b"content-type", b"text/plain; version=0.0.4")],
                                    _METRICS)
        return json_response(404, b'{"error":"not found"}')

    return handler


async def serve(port: int, model: str, log_paths: bool, kv_events: bool = False) -> None:
    server = HttpServer(make_handler(model, log_paths), server_header=b"mock")
    async with trio.open_nursery() as nursery:
        endpoints = ""
        if kv_events:
            sockets, base, replay_base = bind_rank_sockets(zmq.Context.instance(), 1, host=HOST)
            publisher = EventPublisher(
                sockets[0].pub, sockets[0].router, topic=b"",
                replay_generation=profile_named("sglang-0.5.23").replay_generation)
            await nursery.start(publisher.run)
            endpoints = f" tcp://{HOST}:{base} tcp://{HOST}:{replay_base}"
        _, bound = await nursery.start(server.serve, HOST, port)
        print(f"{bound}{endpoints}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model", default="mock-model")
    parser.add_argument("--log-paths", action="store_true", help="request lines to stderr")
    parser.add_argument("--kv-events", action="store_true",
                        help="bind an (empty) SGLang KV-event publisher with replay")
    args = parser.parse_args()
    try:
        trio.run(serve, args.port, args.model, args.log_paths, args.kv_events)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
