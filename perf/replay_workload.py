"""What a trace replay sends, and what it can expect: the parameters, the workload, its facts.

* ``Params``: every knob of ``perf/replay.py`` (its command line is generated from them);
* ``workload(p)``: the records to send — a Mooncake trace slice, SGLang's generated shared
  prefix (``gsp``), herds of one new prefix arriving at once (``herd``) or agentic sessions (``agentic``, ``perf/agentic_trace.py``: closed-loop
  turns, ``follows_for(p)`` says which answer each turn waits for). Records longer than
  ``max_blocks`` keep their first blocks (the agentic workload's contexts grow to ~120 blocks:
  give ``--max-blocks`` accordingly);
* offline figures of a slice: its intrinsic reuse and the hit rate of one infinite cache
  (``slice_facts``, ``token_bound``), the cache size per engine (``capacity_per_engine``) and
  the time scale at which round robin would keep the engines a given share busy (``load_for``).

Pure, except for reading trace files.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path

from cortex.sim.step_profiles import load_step_profile
from perf import agentic_trace as at
from perf import trace_text as tt

HERE = Path(__file__).resolve().parent
TRACES = {"conversation": "conversation_trace.jsonl", "synthetic": "synthetic_trace.jsonl"}

@dataclass(frozen=True, slots=True)
class Params:
    trace: str = "conversation"
    start: int = 0
    requests: int = 600
    block_tokens: int = 64
    engine_block: int = 16
    engines: int = 8
    flavors: str = "mixed"  # mixed | vllm | sglang
    capacity: float = 0.5  # share of the unique blocks (see capacity_basis) the cluster holds
    capacity_basis: str = "trace"  # trace: the whole trace file's unique blocks | slice
    capacity_blocks: int = 0  # per engine; overrides --capacity when > 0
    min_capacity_prompts: int = 1  # per engine at least this many of the longest prompt
    prefill_tokens_per_s: float = 2000.0  # 0: solved from --time-scale and --utilization
    decode_ms_per_token: float = 5.0
    max_running: int = 1
    max_output: int = 16
    time_scale: float = 0.0  # 0: from --utilization
    utilization: float = 0.7
    max_blocks: int = 64  # longer records keep their first 64 blocks (tokenization cost)
    gsp: str = "32,8,2048,128"  # groups, prompts per group, system tokens, question tokens
    gsp_rate: float = 4.0
    herd: str = "24,12,4096,128"  # herds, requests per herd, shared new prefix, question tokens
    herd_rate: float = 0.5  # herds per second (Poisson starts; a herd arrives within 5 ms)
    # --trace agentic (perf/agentic_trace.py): closed-loop sessions; --start/--requests unused
    agent_kinds: int = 4
    agent_sessions: int = 48
    agent_system_tokens: int = 8192
    agent_turns: str = "4,12"
    agent_new_tokens: str = "512,4096"
    agent_think_s: float = 3.0
    agent_session_rate: float = 0.5
    seed: int = 0
    affinity_tolerance_s: float = -1.0  # Cortex's exact_kv tolerance; < 0: its default
    tie_band_s: float = -1.0  # Cortex's cost band (scheduler.cost.tie_band_s); < 0: its default
    recompute_weight: float = -1.0  # Cortex's exact_kv recompute charge; < 0: its default
    recompute_charge_max_s: float = -1.0  # the charge's bound; < 0: Cortex's default
    kv_overflow_weight: float = -1.0  # the KV-pressure charge; < 0: Cortex's default
    engine_procs: str = "engine"  # engine: one process per engine | flavor: one per flavor
    # The engines' timing model. batching (default): continuous batching on a step-time profile
    # (cortex/sim/profiles/), each replayed token standing for ``tokens_per_token()`` real ones;
    # prefill_tokens_per_s and decode_ms_per_token are then derived from the profile (compare)
    # and max_running is unused. fixed: the old FIFO model on those three knobs.
    engine_model: str = "batching"
    step_profile: str = "llama-3.1-8b-h100-vllm"
    token_scale: float = 0.0  # real tokens per replayed token; 0: the trace's, 512/block_tokens
    max_num_batched_tokens: int = 8192  # a step's budget in real tokens (vLLM's H100 default)
    max_num_seqs: int = 256
    cost_form: str = "steps"  # Cortex's cost on batching engines: steps | flat (replay.py)
    replicas: int = 1  # gateway processes on one port, SO_REUSEPORT (replay_cluster.py)
    replica_sync: int = 0  # 1: the replicas tell each other their requests in flight
    # CPUs (``taskset -c`` lists; "" = any) of the gateway processes, the engine processes and
    # the client (this process): apart, the engines' speed does not depend on how many
    # gateways run (on a 2-vCPU VM, N gateways otherwise starve the engines)
    # "first": the client's connections all go to the first replica; the others run (ingest
    # every engine's events, poll every engine) but route nothing — one replica's routing at
    # the CPU cost of N (a control for what the machine, not the routing, costs)
    replica_traffic: str = "all"
    # > 0: the last replica is killed (SIGKILL) this far into the trace (a fraction of its
    # span); the report says which requests failed (in flight there, or after) and the hit
    # rate before and after
    kill_replica_at: float = 0.0
    kill_dry: int = 0  # 1: at that time nothing is killed (the same split, for a baseline)
    gateway_cpus: str = ""
    engine_cpus: str = ""
    client_cpus: str = ""

    def tokens_per_token(self) -> float:
        return self.token_scale or tt.TRACE_BLOCK / self.block_tokens

    def step_budget(self) -> int:
        """A step's token budget in replayed tokens (at least one engine block)."""
        return max(self.engine_block, round(self.max_num_batched_tokens / self.tokens_per_token()))

    def engine_slots(self) -> int:
        """Requests an engine computes at once in the busy-time estimate: a batching engine's
        steps are serial GPU time (1), the fixed model runs ``max_running`` side by side."""
        return 1 if self.engine_model == "batching" else self.max_running

    def flavor_list(self) -> list[str]:
        if self.flavors in ("vllm", "sglang"):
            return [self.flavors] * self.engines
        return ["vllm" if i % 2 == 0 else "sglang" for i in range(self.engines)]


QUICK = {"requests": 40, "engines": 4, "block_tokens": 32, "engine_block": 16,
         "prefill_tokens_per_s": 4000.0, "decode_ms_per_token": 2.0, "max_output": 8,
         "max_blocks": 24, "capacity": 0.5, "utilization": 0.5}


# -- workload ----------------------------------------------------------------------------------

def shared_dir() -> Path:
    override = os.environ.get("CORTEX_SHARED_DIR")
    return Path(override) if override else HERE.parent.parent / "shared"


def trace_path(p: Params) -> str:
    name = TRACES.get(p.trace)
    return str(shared_dir() / "data" / "traces" / name) if name else p.trace


def agentic(p: Params) -> tuple[list[tt.TraceRecord], list[tuple[int, float]]]:
    shape = at.AgenticShape(p.agent_kinds, p.agent_sessions, p.agent_system_tokens,
                            turns=at.parse_range(p.agent_turns),
                            new_tokens=at.parse_range(p.agent_new_tokens),
                            think_s=p.agent_think_s, session_rate=p.agent_session_rate)
    return at.sessions(shape, p.seed)


def follows_for(p: Params) -> list[tuple[int, float]] | None:
    """Closed-loop chains (``drive``'s ``follows``): the agentic workload's, else none."""
    return agentic(p)[1] if p.trace == "agentic" else None


def workload(p: Params) -> list[tt.TraceRecord]:
    if p.trace == "agentic":
        records = agentic(p)[0]
    elif p.trace == "gsp":
        groups, per_group, system, question = (int(v) for v in p.gsp.split(","))
        records = list(tt.shared_prefix_records(groups, per_group, system, question, 256,
                                                p.gsp_rate, p.seed))[p.start:p.start + p.requests]
    elif p.trace == "herd":
        herds, per_herd, prefix, question = (int(v) for v in p.herd.split(","))
        records = list(tt.herd_records(herds, per_herd, prefix, question, 256, p.herd_rate,
                                       p.seed))[p.start:p.start + p.requests]
    else:
        records = tt.read_trace(trace_path(p), p.start, p.requests)
    out = []
    for r in records:
        if len(r.hash_ids) > p.max_blocks:
            r = tt.TraceRecord(r.timestamp_ms, p.max_blocks * tt.TRACE_BLOCK, r.output_length,
                               r.hash_ids[:p.max_blocks])
        out.append(r)
    return out


def seen_prefix(ids: tuple[int, ...], seen: set[int] | OrderedDict[int, None]) -> int:
    """How many of ``ids``, from the first, are in ``seen``."""
    hit = 0
    for h in ids:
        if h not in seen:
            break
        hit += 1
    return hit


def slice_facts(records: list[tt.TraceRecord]) -> dict[str, float]:
    """Intrinsic reuse of the slice: 1 - unique/total blocks, and the block hit an infinite
    single cache would get (ids are prefix-chained, so a seen id means its prefix is seen)."""
    seen: set[int] = set()
    total = hits = 0
    for r in records:
        hit = seen_prefix(r.hash_ids, seen)
        hits += hit
        total += len(r.hash_ids)
        seen.update(r.hash_ids)
    return {"blocks": total, "unique_blocks": len(seen),
            "intrinsic_reuse": round(1 - len(seen) / total, 4) if total else 0.0,
            "single_cache_block_hit": round(hits / total, 4) if total else 0.0}


def token_bound(records: list[tt.TraceRecord], text: tt.TraceText, engine_block: int) -> float:
    """The hit rate in prompt tokens of one engine with an infinite cache seeing the whole
    slice: each request's longest earlier-seen id prefix, in whole engine blocks (BOS and the
    message markers included), capped at ``(prompt - 1) // block`` blocks as engines do."""
    seen: set[int] = set()
    cached = prompt = 0
    for r in records:
        hit = seen_prefix(r.hash_ids, seen)
        tokens = text.prompt_tokens(r)
        shared = 1 + hit * text.block_tokens if hit else 0
        cached += min(shared // engine_block, (tokens - 1) // engine_block) * engine_block
        prompt += tokens
        seen.update(r.hash_ids)
    return round(cached / prompt, 4) if prompt else 0.0


def capacity_per_engine(p: Params, unique_blocks: int, longest_prompt_tokens: int = 0) -> int:
    """Engine blocks per engine: ``p.capacity`` of ``unique_blocks`` trace blocks, split, and
    at least ``p.min_capacity_prompts`` of the longest prompt with its answer (vLLM refuses to
    start with a KV pool that cannot hold one request of its longest length)."""
    if p.capacity_blocks > 0:
        return p.capacity_blocks
    per_trace_block = p.block_tokens / p.engine_block
    floor = math.ceil(p.min_capacity_prompts * (longest_prompt_tokens + p.max_output)
                      / p.engine_block)
    return max(8, floor, math.ceil(p.capacity * unique_blocks * per_trace_block / p.engines))


def basis_unique_blocks(p: Params, facts: dict[str, float]) -> int:
    """The unique blocks ``--capacity`` is a share of: the whole trace file's (the issue's
    regimes are stated for the trace) or the replayed slice's."""
    if p.capacity_basis == "slice" or p.trace in ("gsp", "herd", "agentic"):
        return int(facts["unique_blocks"])
    unique: set[int] = set()
    for record in tt.read_trace(trace_path(p)):
        unique.update(record.hash_ids)
    return len(unique)


def round_robin_uncached(records: list[tt.TraceRecord], text: tt.TraceText, engines: int,
                         capacity_trace_blocks: int) -> list[int]:
    """Offline estimate: uncached tokens per request under round robin with LRU caches."""
    caches = [OrderedDict[int, None]() for _ in range(engines)]
    out = []
    for i, r in enumerate(records):
        cache = caches[i % engines]
        hit = seen_prefix(r.hash_ids[:-1], cache)
        for h in r.hash_ids:
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > capacity_trace_blocks:
            cache.popitem(last=False)
        out.append(text.prompt_tokens(r) - hit * text.block_tokens)
    return out


def mean_prompt_tokens(records: list[tt.TraceRecord], text: tt.TraceText) -> float:
    return sum(text.prompt_tokens(r) for r in records) / max(len(records), 1)


def batching_speeds(p: Params, records: list[tt.TraceRecord], text: tt.TraceText) -> Params:
    """``p`` with the batching engines' speeds in the fixed model's terms, from the scaled step
    profile: ``prefill_tokens_per_s`` = prompt tokens per second of back-to-back full-budget
    steps over half a mean prompt of context (what the load estimate and Cortex's cost model
    divide queued prefill work by), ``decode_ms_per_token`` = what one decoding request with a
    mean context adds to a step (Cortex's ``decode_s_per_in_flight``)."""
    profile = load_step_profile(p.step_profile).scaled(p.tokens_per_token())
    mean_prompt = mean_prompt_tokens(records, text)
    rate = profile.prefill_tokens_per_s(p.step_budget(), round(mean_prompt / 2))
    decode_s = profile.decode_seq_cost_s(round(mean_prompt))
    return replace(p, prefill_tokens_per_s=round(rate, 1),
                   decode_ms_per_token=round(decode_s * 1000, 4))


def load_for(p: Params, records: list[tt.TraceRecord], text: tt.TraceText,
             capacity: int) -> tuple[float, float]:
    """``(time_scale, prefill_tokens_per_s)`` at which round robin would keep the engines
    ``p.utilization`` busy (offline estimate): the one of the two left at 0 is solved for."""
    per_trace_block = p.block_tokens / p.engine_block
    uncached = sum(round_robin_uncached(records, text, p.engines,
                                        int(capacity / per_trace_block)))
    decode = sum(max(min(r.output_length, p.max_output) - 1, 0) for r in records) \
        * p.decode_ms_per_token / 1000
    span = max((records[-1].timestamp_ms - records[0].timestamp_ms) / 1000, 1e-3)
    slots = p.utilization * p.engines * p.engine_slots() * span
    if p.prefill_tokens_per_s > 0:
        scale = p.time_scale or slots / (uncached / p.prefill_tokens_per_s + decode)
        return round(scale, 3), p.prefill_tokens_per_s
    if p.time_scale <= 0 or slots / p.time_scale <= decode:
        raise SystemExit("give --time-scale (and a utilization decode time leaves room for)")
    return p.time_scale, round(uncached / (slots / p.time_scale - decode), 1)
