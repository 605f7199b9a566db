"""Replay a Mooncake trace through a simulated cluster against several routers; compare them.

Every router gets a FRESH cluster (engines with empty caches, ``perf/replay_cluster.py``) and
the same request schedule: the trace's arrival times divided by ``--time-scale``. Each record
becomes a real streaming chat completion over HTTP (keep-alive client, ``perf/trace_text.py``
turns hash ids into text, one message per block), ``max_tokens`` = the record's output length
capped by ``--max-output``. Routers: ``cortex`` (the events chain on the ledger),
``round_robin``, ``p2c``, ``consistent_hash``, and the peers' policies as reference routers
(``perf/reference_policies.py``): ``dynamo-ref`` (NVIDIA Dynamo's KV router cost) and
``llmd-ref`` (llm-d's precise-prefix-cache, KV-utilization and queue scorers), given the
same ledger matches and worker views as ``cortex`` (all of them through the same gateway
process, so its overhead is equal), ``cortex-pd`` (the same gateway and policy in front of a
prefill/decode cluster of the same engine count: per flavor, half the engines, rounded up,
``--pd-role prefill``, the rest ``decode``; Cortex orchestrates both legs of every request)
and ``sglang-router`` (``cache_aware``, its own process; skipped when it is not installed).

Scale: ``--block-tokens`` tokens of text per trace block (the trace's are 512); lower values
keep the reuse structure and cut tokenization (the dominant CPU cost on a 2-vCPU machine) by
the same factor; every token count reported is in these simulated tokens. The engines' KV
block is ``--engine-block`` tokens; ``--capacity`` is the share of the whole trace file's
unique blocks (``--capacity-basis slice``: of the replayed slice's) the cluster can hold, split
evenly across engines, or ``--capacity-blocks`` per engine. Engines run one process each.

Per request: the worker (from the response id ``chatcmpl-<engine>-<n>``), TTFT (request sent
-> first SSE data event), total time, the engine-reported ``cached_tokens`` (usage event) and
Cortex's predicted ``x-cortex-cache-hit-tokens``. Per router (``summarize``): hit rate
(engine-reported cached / prompt tokens), TTFT mean/p50/p99, prefill tokens computed,
duplicated blocks across workers at the end (the gateway's ledger), req/s, load spread
(max/mean requests per worker), utilization (busy slot time / (engines x batch limit x span)),
and the ledger's accuracy (share of exact predictions, total absolute error).

``cortex-pd`` is read per leg (``replay_report``): a request has a prefill worker
(``x-cortex-prefill-worker``) and a decode worker (``x-cortex-decode-worker``, the answer's
id). The decode engine answers, and its ``cached_tokens`` is not the prefill's (SGLang decode
has no prefix cache and reports 0; vLLM decode reports what it held before the transfer), so
the hit rate and the ledger's accuracy use the prefill engine's ``cached_tokens``, which the
replay's gateway process reads from the prefill answer Cortex drains and adds as
``x-replay-prefill-cached-tokens`` (``replay_gateway.py``). A request Cortex served on decode
alone (vLLM bypass: decode held the prefix) has no prefill leg; the decode engine computed its
prefill, so its own report counts. Load spread and utilization are per pool.

``--trace agentic`` replays agent sessions (``perf/agentic_trace.py``, knobs ``--agent-*``):
closed loop, each turn sent a think time after the previous turn's answer has ended; give
``--max-blocks`` above its longest context (~120 blocks).

Usage: ``python -m perf.replay [--quick] [--trace conversation|synthetic|gsp|herd|agentic|PATH]
...``
(JSON on stdout or ``--out``; a table on stderr). ``--capacity-search`` runs each router at
several time scales and reports the highest whose TTFT p99 stays under ``--p99-bound-ms``.
``--utilization U`` sets the load: the time scale (or, with ``--prefill-tokens-per-s 0`` and a
given ``--time-scale``, the engines' prefill speed) at which round robin would keep the engines
U busy, from an offline estimate of its cache hits; the measured figure is in the result.
Cortex's gateway is told the engines' speed (its TTFT cost model is in seconds): on batching
engines the step form's coefficients from the engines' own profile (``--cost-form steps``,
``gateway_cost``), or the flat form (``--cost-form flat``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import trio

from cortex.sim.step_profiles import load_step_profile
from cortex.upstream.connection_pool import ConnectionPool
from cortex.upstream.limits import PoolLimits
from perf import replay_cluster as rc
from perf import trace_text as tt
from perf.benchkit import machine_info
from perf.replay_report import killed_figures, markdown, summarize, table
from perf.replay_workload import (
    QUICK,
    Params,
    basis_unique_blocks,
    batching_speeds,
    capacity_per_engine,
    follows_for,
    load_for,
    mean_prompt_tokens,
    slice_facts,
    token_bound,
    workload,
)
from tests import deepseek_profile as ds

MODEL = "trace-model"
GATEWAY_POLICIES = ("cortex", "round_robin", "p2c", "consistent_hash", "dynamo-ref",
                    "llmd-ref")
LEDGER_ROUTERS = ("cortex", "dynamo-ref", "llmd-ref")  # predict hits from the ledger
PD_ROUTERS = {"cortex-pd": "cortex"}  # router -> the gateway's policy, on a PD cluster
ROUTERS = (*GATEWAY_POLICIES, *PD_ROUTERS, "sglang-router")
_CACHED = re.compile(rb'"cached_tokens":\s*(\d+)')
_PROMPT = re.compile(rb'"prompt_tokens":\s*(\d+)')
_OUTPUT = re.compile(rb'"completion_tokens":\s*(\d+)')
_ENGINE = re.compile(rb'"id":\s*"[a-z]+-([^"]+)-\d+"')


# -- client ------------------------------------------------------------------------------------

@dataclass(slots=True)
class Result:
    index: int
    sent_s: float  # schedule-relative
    late_s: float  # how late the client sent it
    status: int
    worker: str
    ttft_s: float
    total_s: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    predicted: int | None
    mode: str  # x-cortex-match-mode ("" when the router is not Cortex's gateway)
    # PD: the prefill leg's worker ("" when none: aggregated, or decode served alone) and what
    # the answering (decode) engine reported; ``cached_tokens`` is then the prefill engine's.
    prefill_worker: str = ""
    answer_cached_tokens: int = 0
    # gaps between the answer's streamed chunks after the first (each chunk one token here,
    # unless the network coalesced some): the inter-token latencies the client saw
    gaps_s: tuple[float, ...] = ()


def bodies(records: list[tt.TraceRecord], text: tt.TraceText, p: Params) -> list[bytes]:
    return [json.dumps({"model": MODEL, "messages": text.messages(r), "stream": True,
                        "max_tokens": max(1, min(r.output_length, p.max_output)),
                        "stream_options": {"include_usage": True}}).encode()
            for r in records]


async def drive(url: str, records: list[tt.TraceRecord], payloads: list[bytes],
                time_scale: float,
                follows: list[tuple[int, float]] | None = None,
                at: tuple[float, Callable[[], None]] | None = None) -> list[Result]:
    """Send every request at its scheduled time; stream every answer to its end.

    ``follows[i] = (j, think_s)`` with ``j >= 0``: request ``i`` leaves ``think_s /
    time_scale`` after request ``j``'s answer has ended (a session's next turn), not at its
    timestamp. ``at = (seconds, action)``: ``action()`` that far into the schedule."""
    limits = PoolLimits(max_connections_per_worker=4096, max_idle_per_worker=1024,
                        acquire_timeout_s=600.0)
    upstream = ConnectionPool(limits)
    results: list[Result] = []
    headers = [(b"content-type", b"application/json")]
    origin0 = records[0].timestamp_ms
    answered = [trio.Event() for _ in records]

    async def one(i: int, due: float) -> None:
        sent = trio.current_time()
        first = None
        last_chunk = 0.0
        gaps: list[float] = []
        tail = head = b""
        status = 0
        predicted = None
        mode = b""
        prefill_worker = b""
        prefill_cached = None
        try:
            async with upstream.request(url, b"POST", b"/v1/chat/completions", headers,
                                        payloads[i]) as response:
                status = response.status
                value = response.header(b"x-cortex-cache-hit-tokens")
                predicted = int(value) if value is not None else None
                mode = response.header(b"x-cortex-match-mode") or b""
                prefill_worker = response.header(b"x-cortex-prefill-worker") or b""
                value = response.header(b"x-replay-prefill-cached-tokens")
                prefill_cached = int(value) if value is not None else None
                async for chunk in response.body_chunks():
                    now = trio.current_time()
                    if first is None and b"data:" in chunk:
                        first = now
                        head = chunk[:600]
                    elif first is not None and b'"content"' in chunk:  # a token, not usage
                        gaps.append(now - last_chunk)
                    last_chunk = now
                    tail = (tail + chunk)[-2048:]
        except Exception as error:  # noqa: BLE001 - a failed request is a result
            print(f"request {i}: {error!r}", file=sys.stderr)
            status = 0  # not complete, whatever its head said
        end = trio.current_time()
        engine = _ENGINE.search(head)
        cached, prompt, output = (_CACHED.search(tail), _PROMPT.search(tail),
                                  _OUTPUT.search(tail))
        answer_cached = int(cached.group(1)) if cached else 0
        if prefill_worker and prefill_cached is None:
            print(f"request {i}: a PD answer without the prefill's cached tokens",
                  file=sys.stderr)
        results.append(Result(
            i, due - start, sent - due, status, engine.group(1).decode() if engine else "?",
            (first or end) - sent, end - sent, int(prompt.group(1)) if prompt else 0,
            answer_cached if prefill_cached is None else prefill_cached,
            int(output.group(1)) if output else 0, predicted, mode.decode(),
            prefill_worker.decode(), answer_cached, tuple(gaps)))
        answered[i].set()

    async def after(i: int, previous: int, think_s: float) -> None:
        await answered[previous].wait()
        due = trio.current_time() + think_s / time_scale
        await trio.sleep_until(due)
        await one(i, due)

    async def act(seconds: float, action: Callable[[], None]) -> None:
        await trio.sleep_until(start + seconds)
        action()

    async with trio.open_nursery() as nursery:
        await nursery.start(upstream.run)
        async with trio.open_nursery() as requests:
            start = trio.current_time() + 0.2
            if at is not None:
                nursery.start_soon(act, *at)
            for i, r in enumerate(records):
                previous, think_s = follows[i] if follows else (-1, 0.0)
                if previous >= 0:
                    requests.start_soon(after, i, previous, think_s)
                    continue
                due = start + (r.timestamp_ms - origin0) / 1000 / time_scale
                await trio.sleep_until(due)
                requests.start_soon(one, i, due)
        nursery.cancel_scope.cancel()
    results.sort(key=lambda r: r.index)
    return results


# -- one router, all routers --------------------------------------------------------------------

def gateway_cost(p: Params, records: list[tt.TraceRecord], text: tt.TraceText) -> dict:
    """``scheduler.cost`` for the replay's gateway: the operator states the engines' speed
    (the cost model's TTFT is in seconds). On batching engines with ``--cost-form steps``, the
    step form's coefficients read from the same scaled profile the engines run on
    (``StepProfile.router_cost_terms``); ``flat``: the prefill rate under load and one
    decode's share of a step, in the flat form."""
    cost: dict = {"default_prefill_tokens_per_s": p.prefill_tokens_per_s}
    if p.engine_model == "batching":
        cost["decode_s_per_in_flight"] = p.decode_ms_per_token / 1000
        if p.cost_form == "steps":
            mean_prompt = round(mean_prompt_tokens(records, text))
            terms = load_step_profile(p.step_profile).scaled(p.tokens_per_token()) \
                .router_cost_terms(p.step_budget(), mean_prompt, mean_prompt)
            cost.update(step_s=terms["step_s"], step_token_budget=terms["step_token_budget"],
                        default_prefill_tokens_per_s=terms["prefill_tokens_per_s"],
                        decode_s_per_in_flight=terms["decode_s_per_in_flight"])
    if p.affinity_tolerance_s >= 0:
        cost["affinity_tolerance_s"] = p.affinity_tolerance_s
    if p.tie_band_s >= 0:
        cost["tie_band_s"] = p.tie_band_s
    if p.recompute_weight >= 0:
        cost["recompute_weight"] = p.recompute_weight
    if p.recompute_charge_max_s >= 0:
        cost["recompute_charge_max_s"] = p.recompute_charge_max_s
    if p.kv_overflow_weight >= 0:
        cost["kv_overflow_weight"] = p.kv_overflow_weight
    return cost


def run_router(router: str, p: Params, records: list[tt.TraceRecord], payloads: list[bytes],
               capacity: int, time_scale: float, cost: dict,
               keep_results: bool = False) -> dict:
    procs = rc.Procs()
    try:
        settings = rc.EngineSettings(MODEL, p.engine_block, capacity, p.prefill_tokens_per_s,
                                     p.decode_ms_per_token, p.max_running, p.engine_model,
                                     p.step_profile, p.tokens_per_token(), p.step_budget(),
                                     p.max_num_seqs)
        flavors = p.flavor_list()
        roles = rc.pd_roles(flavors) if router in PD_ROUTERS else None
        engines = rc.start_engines(procs, settings, flavors,
                                   per_engine=p.engine_procs == "engine", roles=roles,
                                   cpus=p.engine_cpus)
        policy = router if router in GATEWAY_POLICIES else PD_ROUTERS.get(router, "cortex")
        gateway = rc.start_gateway(procs, engines, policy, MODEL, p.engine_block, cost,
                                   p.replicas, bool(p.replica_sync), p.gateway_cpus,
                                   spread=p.replica_traffic != "first")
        url = rc.start_sglang_router(procs, engines, MODEL) if router == "sglang-router" \
            else gateway.url
        started = time.monotonic()
        if p.client_cpus:
            os.sched_setaffinity(0, parse_cpus(p.client_cpus))
        kill = None
        if p.kill_replica_at > 0 and len(gateway.replicas) > 1:
            span_s = (records[-1].timestamp_ms - records[0].timestamp_ms) / 1000 / time_scale
            kill = (span_s * p.kill_replica_at,
                    (lambda: None) if p.kill_dry else gateway.replicas[-1].process.kill)
        try:
            results = trio.run(drive, url, records, payloads, time_scale, follows_for(p),
                               kill)
        finally:
            os.sched_setaffinity(0, range(os.cpu_count() or 1))
        wall = time.monotonic() - started
        ledger = gateway.ledger_report()
        summary = summarize(results, p, len(engines), ledger,
                            roles={e.name: e.role for e in engines} if roles else None)
        summary["wall_s"] = round(wall, 1)
        summary["preemptions"] = rc.vllm_preemptions(engines)
        summary["ledger_states"] = sorted(set(ledger["states"].values()))
        summary["replica_sync"] = ledger.get("replica_sync")  # the first replica's
        summary["in_flight_at_end"] = ledger.get("in_flight_at_end")
        if kill is not None:
            summary["killed_replica"] = killed_figures(results, kill[0])
        if router not in (*LEDGER_ROUTERS, *PD_ROUTERS):  # the others predict nothing
            summary["ledger"] = {"predicted": 0, "exact_share": None, "over_share": None,
                                 "abs_error_tokens": 0}
        if keep_results:
            summary["results"] = [asdict(r) for r in results]
        return summary
    finally:
        procs.stop()


def parse_cpus(spec: str) -> set[int]:
    """A ``taskset -c`` list ("0", "0,2", "1-3") as CPU numbers."""
    cpus: set[int] = set()
    for part in spec.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def missing(router: str) -> str | None:
    if router == "sglang-router":
        return rc.peers.missing_peers().get("sglang-router")
    return None


def compare(p: Params, routers: list[str], keep_results: bool = False,
            log=print) -> dict:
    records = workload(p)
    text = tt.TraceText(tt.single_token_words(ds.TOKENIZER_JSON), p.block_tokens)
    facts = slice_facts(records)
    facts["single_cache_token_hit"] = token_bound(records, text, p.engine_block)
    basis = basis_unique_blocks(p, facts)
    capacity = capacity_per_engine(p, basis, max(text.prompt_tokens(r) for r in records))
    if p.engine_model == "batching":
        p = batching_speeds(p, records, text)
    scale, prefill = load_for(p, records, text, capacity)
    p = Params(**{**asdict(p), "prefill_tokens_per_s": prefill})
    payloads = bodies(records, text, p)
    cost = gateway_cost(p, records, text)
    out: dict = {"machine": machine_info(), "params": asdict(p), "gateway_cost": cost,
                 "slice": facts,
                 "capacity_blocks_per_engine": capacity, "capacity_basis_blocks": basis,
                 "cluster_share_of_slice": round(
                     capacity * p.engines * p.engine_block / p.block_tokens
                     / max(facts["unique_blocks"], 1), 3),
                 "time_scale": scale,
                 "trace_span_s": (records[-1].timestamp_ms - records[0].timestamp_ms) / 1000,
                 "routers": {}, "skipped": {}}
    for router in routers:
        why = missing(router)
        if why:
            out["skipped"][router] = why
            continue
        log(f"replay: {router} ({len(records)} requests, time scale {scale}) ...")
        out["routers"][router] = run_router(router, p, records, payloads, capacity, scale,
                                            cost, keep_results)
    return out


def capacity_search(p: Params, routers: list[str], scales: list[float], bound_ms: float,
                    log=print) -> dict:
    """Per router, the highest time scale whose TTFT p99 stays under ``bound_ms``."""
    out: dict = {"p99_bound_ms": bound_ms, "scales": scales, "routers": {}}
    for router in routers:
        rows = {}
        best = None
        for scale in scales:
            run = compare(Params(**{**asdict(p), "time_scale": scale, "utilization": 0.0}),
                          [router], log=log)
            row = run["routers"].get(router)
            if row is None:
                break
            rows[scale] = {"ttft_p99_ms": row["ttft_ms"]["p99"], "req_per_s": row["req_per_s"],
                           "hit_rate": row["hit_rate"], "failed": row["failed"]}
            if row["ttft_ms"]["p99"] <= bound_ms and not row["failed"]:
                best = scale
            else:
                break
        out["routers"][router] = {"max_time_scale": best, "runs": rows}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Params()
    for name, value in asdict(defaults).items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    parser.add_argument("--routers", default=",".join(ROUTERS))
    parser.add_argument("--quick", action="store_true", help="CI size; no sglang-router")
    parser.add_argument("--capacity-search", default="",
                        help="comma-separated time scales to try per router")
    parser.add_argument("--p99-bound-ms", type=float, default=2000.0)
    parser.add_argument("--out", default="", help="write the JSON here too")
    parser.add_argument("--keep-results", action="store_true",
                        help="include every request's record in the JSON")
    parser.add_argument("--render", default="", help="print a result file as Markdown, exit")
    if "--quick" in (sys.argv[1:] if argv is None else argv):  # flags given still win
        parser.set_defaults(**QUICK)
    args = parser.parse_args(argv)
    if args.render:
        with open(args.render) as f:
            print(markdown(json.load(f)))
        return 0
    values = {name: getattr(args, name) for name in asdict(defaults)}
    routers = [r for r in args.routers.split(",") if r]
    if args.quick:
        routers = [r for r in routers if r != "sglang-router"]
    p = Params(**values)
    log = lambda message: print(message, file=sys.stderr, flush=True)
    if args.capacity_search:
        scales = [float(s) for s in args.capacity_search.split(",")]
        result = {"machine": machine_info(), "params": asdict(p),
                  "capacity": capacity_search(p, routers, scales, args.p99_bound_ms, log)}
    else:
        result = compare(p, routers, keep_results=args.keep_results, log=log)
        log(table(result))
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
