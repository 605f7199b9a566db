"""JSON, SSE and Prometheus bodies of a simulated engine, in the shapes the real engines use.

Pure builders (plain dicts and bytes) over a ``SimEngineView`` (``cortex.sim.engine_view``);
``cortex.sim.http_engine`` serves them. Shapes:
``shared/protocols/engine-endpoints.md`` and the OpenAI API.

* OpenAI ``usage`` always carries ``prompt_tokens_details.cached_tokens`` (vLLM with
  ``--enable-prompt-tokens-details``, SGLang with ``--enable-cache-report``).
* SSE events are ``data: <json>\\n\\n``; chat chunks are ``chat.completion.chunk``, completion
  chunks ``text_completion``; the usage event has ``choices: []``.
* SGLang ``/generate``: ``finish_reason`` is ``{"type": "length", "length": N}`` on the last
  event and null before; streamed ``text``/``output_ids`` are cumulative (SGLang's default,
  ``--stream-output`` off). ``return_logprob`` adds ``meta_info.input_token_logprobs``; a PD
  decode engine returns an empty list there (it did not compute the prompt: the gateway
  prepends the prefill's, protocols/pd-disaggregation.md §1.3 step 7).
* vLLM metrics carry the labels ``model_name`` and ``engine`` (the DP rank).
* Load (running, waiting, KV usage: vLLM ``num_requests_running``/``_waiting`` and
  ``kv_cache_usage_perc``, SGLang ``num_running_reqs``/``num_waiting_reqs`` and
  ``token_usage``/``num_used_tokens``) is the engine's ``load(rank)``, whichever timing model
  runs it: KV usage counts what requests hold, as the engines do (evictable cached blocks are
  free space); the cache fill is ``num_cached_tokens`` in ``/v1/loads`` (a simulator extra).
* ``vllm:num_preemptions_total``: requests the batching model preempted (0 on the fixed
  model, which never preempts).
"""

from __future__ import annotations

import datetime
import itertools
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from cortex.sim.engine_view import SimEngineView
from cortex.sim.generation import TokenStream

_PREFIX = {"chat": "chatcmpl", "completion": "cmpl", "generate": "gen"}
_OBJECT = {"chat": "chat.completion", "completion": "text_completion"}
_CHUNK_OBJECT = {"chat": "chat.completion.chunk", "completion": "text_completion"}
_counter = itertools.count(1)


def response_id(kind: str, engine_name: str) -> str:
    """A unique, readable id: ``chatcmpl-<engine>-<n>``."""
    return f"{_PREFIX[kind]}-{engine_name}-{next(_counter)}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def sse(payload: object) -> bytes:
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


@dataclass(slots=True)
class OpenAIShape:
    """Bodies of one OpenAI chat (``kind="chat"``) or completions (``"completion"``) answer."""

    kind: str
    model: str
    id: str
    created: int = field(default_factory=lambda: int(time.time()))

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def full(self, text: str, prompt: int, completion: int, cached: int) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0}
        if self.kind == "chat":
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice.update(logprobs=None, finish_reason="length")
        return {**self._head(_OBJECT[self.kind]), "choices": [choice],
                "usage": usage(prompt, completion, cached)}

    def role_event(self) -> bytes:
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                  "finish_reason": None}
        return sse({**self._head(_CHUNK_OBJECT["chat"]), "choices": [choice]})

    def token_event(self, text: str, *, last: bool) -> bytes:
        choice: dict[str, Any] = {"index": 0}
        if self.kind == "chat":
            choice["delta"] = {"content": text}
        else:
            choice["text"] = text
        choice.update(logprobs=None, finish_reason="length" if last else None)
        return sse({**self._head(_CHUNK_OBJECT[self.kind]), "choices": [choice]})

    def usage_event(self, prompt: int, completion: int, cached: int) -> bytes:
        return sse({**self._head(_CHUNK_OBJECT[self.kind]), "choices": [],
                    "usage": usage(prompt, completion, cached)})


def input_logprobs(token_ids: Sequence[int]) -> list[list[Any]]:
    """SGLang ``meta_info.input_token_logprobs``: ``[logprob, token_id, None]`` per prompt
    token, the first without a logprob (stand-in values, stable per token id)."""
    return [[None if i == 0 else -0.1 - (tid % 7) / 10, tid, None]
            for i, tid in enumerate(token_ids)]


def generate_body(
    rid: str, gen: TokenStream, pieces: Sequence[tuple[str, int]], e2e_s: float, *, done: bool,
    logprobs: list[list[Any]] | None = None,
) -> dict[str, Any]:
    """SGLang ``/generate`` answer (or streamed event) after ``pieces`` output tokens; with
    ``logprobs`` (``return_logprob``) ``meta_info.input_token_logprobs`` is that list."""
    body = {
        "text": "".join(text for text, _ in pieces),
        "output_ids": [tid for _, tid in pieces],
        "meta_info": {
            "id": rid,
            "finish_reason": {"type": "length", "length": len(pieces)} if done else None,
            "prompt_tokens": gen.prompt_tokens,
            "completion_tokens": len(pieces),
            "cached_tokens": gen.cached_tokens,
            "e2e_latency": e2e_s,
        },
    }
    if logprobs is not None:
        body["meta_info"]["input_token_logprobs"] = logprobs
    return body


def models_body(engine: SimEngineView) -> dict[str, Any]:
    owner = engine.family.value
    created = int(time.time())
    base = {"object": "model", "created": created, "owned_by": owner,
            "max_model_len": engine.max_model_len}
    data = [{"id": engine.served_model_name, **base, "root": engine.served_model_name,
             "parent": None}]
    for lora in sorted(engine.lora_names):
        data.append({"id": lora, **base, "root": lora, "parent": engine.served_model_name})
    return {"object": "list", "data": data}


def _load_fields(engine: SimEngineView, rank: int) -> dict[str, Any]:
    load, counters = engine.load(rank), engine.counters[rank]
    total = engine.kv.capacity_blocks * engine.block_size
    used = round(load.kv_usage * total)
    hit_rate = counters.cached_tokens / counters.prompt_tokens if counters.prompt_tokens else 0.0
    return {
        "dp_rank": rank,
        "num_running_reqs": load.running,
        "num_waiting_reqs": load.waiting,
        "num_waiting_uncached_tokens": 0,
        "num_used_tokens": used,
        "num_total_tokens": total,
        "num_cached_tokens": engine.kv.used_blocks(rank) * engine.block_size,
        "max_total_num_tokens": total,
        "max_running_requests": load.max_running,
        "token_usage": used / total if total else 0.0,
        "gen_throughput": 0.0,
        "cache_hit_rate": hit_rate,
        "utilization": load.running / load.max_running,
    }


def loads_body(engine: SimEngineView, ranks: Iterable[int]) -> dict[str, Any]:
    now = datetime.datetime.now(datetime.UTC).isoformat()
    return {
        "timestamp": now,
        "version": engine.version,
        "accelerator": "sim",
        "num_accelerators": engine.dp_size,
        "loads": [{"timestamp": now, **_load_fields(engine, r)} for r in ranks],
    }


def _kv_host(engine: SimEngineView) -> str:
    return engine.kv.endpoint_config.host


def server_info_body(engine: SimEngineView) -> dict[str, Any]:
    kv = engine.kv
    config = kv.endpoint_config
    kv_events: dict[str, Any] | None = None
    events_config: dict[str, Any] | None = None
    if kv.base_port is not None:
        kv_events = {
            "publisher": "zmq",
            "endpoint_host": _kv_host(engine),
            "endpoint_port_base": kv.base_port,
            "topic": kv.topic,
            "block_size": engine.block_size,
            "dp_size": engine.dp_size,
            "replay_endpoint_port_base": kv.replay_base_port,
        }
        events_config = {
            "publisher": "zmq",
            "endpoint": f"tcp://{config.host}:{kv.base_port}",
            "replay_endpoint": None if kv.replay_base_port is None
            else f"tcp://{config.host}:{kv.replay_base_port}",
            "buffer_steps": config.buffer_steps,
            "hwm": config.hwm,
            "topic": kv.topic,
        }
    total = kv.capacity_blocks * engine.block_size
    return {
        "model_path": engine.served_model_name,
        "tokenizer_path": engine.served_model_name,
        "served_model_name": engine.served_model_name,
        "tp_size": 1,
        "dp_size": engine.dp_size,
        "page_size": engine.block_size,
        "disable_radix_cache": False,
        "disaggregation_mode": "null" if engine.pd is None else engine.pd.role,
        "disaggregation_bootstrap_port": None if engine.pd is None
        else engine.pd.bootstrap_port,
        "max_running_requests": engine.load(0).max_running,
        "max_total_num_tokens": total,
        "context_length": engine.max_model_len,
        "kv_events_config": None if events_config is None else json.dumps(events_config),
        "kv_events": kv_events,
        "internal_states": [
            {"dp_rank": r, "memory_usage": {"token_usage": _load_fields(engine, r)["token_usage"]},
             "effective_max_running_requests_per_dp": engine.load(r).max_running}
            for r in range(engine.dp_size)
        ],
        "status": "ready",
        "version": engine.version,
    }


def kv_event_sources_body(engine: SimEngineView) -> dict[str, Any]:
    kv = engine.kv
    if kv.base_port is None:
        return {}
    config = kv.endpoint_config
    out = {}
    for rank in range(engine.dp_size):
        endpoints = kv.endpoints(rank)
        out[str(rank)] = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": endpoints.pub,
            "replay_endpoint": endpoints.replay,
            "buffer_steps": config.buffer_steps,
            "hwm": config.hwm,
            "max_queue_size": 100_000,
            "topic": kv.topic,
        }
    return out


_GAUGES = (
    ("vllm:num_requests_running", "Number of requests in model execution batches."),
    ("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
    ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
)
_COUNTERS = (
    ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."),
    ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
    ("vllm:prompt_tokens", "Number of prefill tokens processed."),
    ("vllm:generation_tokens", "Number of generation tokens processed."),
    ("vllm:num_preemptions", "Cumulative number of preemption from the engine."),
)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def vllm_metrics_text(engine: SimEngineView) -> str:
    """The Prometheus text exposition of the gauges and counters a gateway reads."""
    model = _label(engine.served_model_name)
    lines = []
    per_rank = []
    for rank in range(engine.dp_size):
        load, counters = engine.load(rank), engine.counters[rank]
        per_rank.append((
            f'{{engine="{rank}",model_name="{model}"}}',
            (load.running, load.waiting, load.kv_usage),
            (counters.prompt_tokens, counters.cached_tokens, counters.prompt_tokens,
             counters.generation_tokens, counters.preemptions),
        ))
    for i, (name, help_text) in enumerate(_GAUGES):
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        lines += [f"{name}{labels} {float(gauges[i])}" for labels, gauges, _ in per_rank]
    for i, (name, help_text) in enumerate(_COUNTERS):
        lines += [f"# HELP {name}_total {help_text}", f"# TYPE {name}_total counter"]
        lines += [f"{name}_total{labels} {float(counts[i])}" for labels, _, counts in per_rank]
    lines += [("# HELP process_start_time_seconds Start time of the process since unix epoch "
               "in seconds."), "# TYPE process_start_time_seconds gauge",
              f"process_start_time_seconds {engine.started_at}"]
    info = (f'block_size="{engine.block_size}",enable_prefix_caching="True",'
            f'num_gpu_blocks="{engine.kv.capacity_blocks + 1}",'  # vLLM's null block too
            f'prefix_caching_hash_algo="{engine.kv.hashing.algo}"')
    lines += ["# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
              "# TYPE vllm:cache_config_info gauge"]
    lines += [f"vllm:cache_config_info{{{info},engine=\"{r}\",model_name=\"{model}\"}} 1.0"
              for r in range(engine.dp_size)]
    return "\n".join(lines) + "\n"
