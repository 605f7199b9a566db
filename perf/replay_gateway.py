"""The gateway process of a trace replay: Cortex with a chosen routing policy, and its ledger.

``python -m perf.replay_gateway SPEC.json`` starts ``cortex.app.run_gateway`` in front of the
workers named in the spec, switches the model's pool to the spec's policy (``cortex``,
``round_robin``, ``p2c``, ``consistent_hash``, or a reference router of
``perf/reference_policies.py``: ``dynamo-ref``, ``llmd-ref``, given the ledger's matches as
``cortex`` is; every policy runs through the same gateway, so the gateway's own cost is the
same for all), waits until every worker is live and every ledger READY, then prints
``ready <data_port>`` and answers commands on stdin, one per line:

* ``report`` -> one JSON line: the ledger's view of the engines' caches (it equals the engines'
  truth when no event is lost, which the replay checks through the predictions): blocks held
  per worker, the union over workers, and ``duplicated_blocks`` = held - union (a block cached
  on two workers counts once as duplicated), the same per role (``by_role``: a PD cluster's
  prefill pool, and its decode pool, whose vLLM engines cache every prompt they receive), and
  the PD orchestrator's counters; replica sync's figures and the requests still counted in
  flight (none should be: the replay asks once every answer has ended);
* EOF or ``quit`` -> exit.

Workers carry ``role`` (both, prefill, decode) and ``bootstrap_port``: a spec with prefill and
decode workers makes Cortex orchestrate both legs of every request (``cortex.pd``).

PD measurement tap (``tap_prefill_answers``): the prefill leg's answer never reaches the client
(Cortex drains it), yet its ``cached_tokens`` is the prefix-cache hit of the engine that
computed the prefill. This process reads it from the answer Cortex drains
(``cortex.pd.orchestrate._read_rest``, wrapped) and adds it to the client's response as
``x-replay-prefill-cached-tokens`` (the prefill leg of the pair that served, after any retry);
the gateway's routing and proxying are untouched.

It also serves as a ledger observer for routers that are not Cortex (sglang-router): the
replay then sends no traffic through it.
"""

from __future__ import annotations

import contextvars
import json
import random
import re
import sys
from dataclasses import asdict

import trio

from cortex.app import Running, run_gateway
from cortex.config.tree import (
    ControlConfig,
    CortexConfig,
    HealthConfig,
    ModelConfig,
    SchedulerConfig,
    ServerConfig,
)
from cortex.pd import orchestrate
from cortex.replicas.settings import ReplicaSettings
from cortex.scheduling import Role
from cortex.scheduling.cost import CostConfig
from cortex.workers.spec import WorkerSpec
from perf.reference_policies import REFERENCE_POLICIES
from tests.gateway_cluster import all_ready, wait_for


def config_from(spec: dict) -> CortexConfig:
    model = ModelConfig(name=spec["model"], tokenizer=spec["tokenizer"],
                        block_size=spec["block_size"], chat_template=spec["template"],
                        bos_token=spec["bos"], eos_token=spec["eos"])
    workers = tuple(WorkerSpec(w["name"], w["url"], engine=w["engine"], model=spec["model"],
                               events=w["events"], replay=w.get("replay"),
                               role=Role(w.get("role", "both")),
                               bootstrap_port=w.get("bootstrap_port"))
                    for w in spec["workers"])
    cost = spec.get("cost") or {"default_prefill_tokens_per_s": spec["prefill_tokens_per_s"]}
    return CortexConfig(
        # replicas of one host share a port (the replay's --replicas): SO_REUSEPORT
        server=ServerConfig(host="127.0.0.1", port=spec.get("port", 0),
                            reuse_port=spec.get("reuse_port", False)),
        control=ControlConfig(host="127.0.0.1", port=0),
        models=(model,), workers=workers,
        # The operator states the engines' prefill speed: the cost model's TTFT is in seconds.
        scheduler=SchedulerConfig(cost=CostConfig(**cost)),
        # replicas telling each other their requests in flight (the replay's --replica-sync)
        replicas=ReplicaSettings(listen=spec.get("sync_listen", ""),
                                 peers=",".join(spec.get("sync_peers", ()))),
        health=HealthConfig(interval_s=0.5, timeout_s=5.0, load_interval_s=0.25))


def set_policy(running: Running, model: str, policy: str) -> None:
    """Switch a started pool to a comparison policy: a pool's own (``PoolPolicy``), or a
    reference router (``REFERENCE_POLICIES``) given the ledger's matches as ``cortex`` is."""
    pool = running.pools[model]
    if policy in REFERENCE_POLICIES:
        pool.use_policy(REFERENCE_POLICIES[policy](random.Random()))
    elif policy != pool.policy:
        pool.use_policy(policy)  # type: ignore[arg-type]


_CACHED = re.compile(rb'"cached_tokens":\s*(\d+)')
_PREFILL_CACHED: contextvars.ContextVar[list[int]] = contextvars.ContextVar("prefill_cached")
PREFILL_CACHED_HEADER = b"x-replay-prefill-cached-tokens"


def tap_prefill_answers(running: Running) -> None:
    """Add each PD request's prefill ``cached_tokens`` to its response (module docstring).
    A request is served in one trio task, and both flavors read the prefill answer in that
    task before the response is returned: a context variable set by ``serve`` collects what
    ``_read_rest`` read."""
    read_rest = orchestrate._read_rest
    if getattr(read_rest, "replay_tap", False):
        return

    async def tapped_read_rest(leg):
        answer = await read_rest(leg)
        found = _PREFILL_CACHED.get(None)
        if found is not None:
            hits = _CACHED.findall(answer)
            if hits:
                found.append(int(hits[-1]))
        return answer

    tapped_read_rest.replay_tap = True  # type: ignore[attr-defined]
    orchestrate._read_rest = tapped_read_rest
    pd = running.gateway.pd  # type: ignore[attr-defined]
    serve = pd.serve

    async def tapped_serve(*args, **kwargs):
        found: list[int] = []
        token = _PREFILL_CACHED.set(found)
        try:
            response = await serve(*args, **kwargs)
        finally:
            _PREFILL_CACHED.reset(token)
        if found:  # the last answer read: the prefill of the pair that served (a decode's
            # answer is read this way only for a JSON answer with logprobs; the replay asks none)
            response.headers.append((PREFILL_CACHED_HEADER, str(found[-1]).encode()))
        return response

    pd.serve = tapped_serve


def ledger_report(running: Running, roles: dict[str, str]) -> dict:
    """The ledger's blocks per worker, duplicated blocks over all workers and per role."""
    book = running.book
    keys_of: dict[str, set[int]] = {}
    states = {}
    for target in sorted(book.states()):
        info = book.info(target)
        keys = keys_of.setdefault(info.worker, set())
        for tree_keys in book.target_keys(target).values():
            keys |= tree_keys
        states[f"{info.worker}/{info.rank}"] = book.state(target).value

    def held_unique(workers: list[str]) -> tuple[int, int]:
        union: set[int] = set()
        for worker in workers:
            union |= keys_of.get(worker, set())
        return sum(len(keys_of.get(w, ())) for w in workers), len(union)

    per_worker = {worker: len(keys) for worker, keys in keys_of.items()}
    held, unique = held_unique(list(keys_of))
    by_role = {}
    for role in sorted(set(roles.values())):
        role_held, role_unique = held_unique([w for w, r in roles.items() if r == role])
        by_role[role] = {"blocks_held": role_held, "duplicated_blocks": role_held - role_unique}
    pd = running.gateway.pd.counters  # type: ignore[attr-defined]
    sync = running.replica_sync
    return {"replica_sync": None if sync is None else asdict(sync.figures()),
            # every request has ended when the replay asks: what is still counted is a leak
            "in_flight_at_end": sum(view.in_flight for pool in running.pools.values()
                                    for view in pool.views()),"blocks_per_worker": per_worker, "blocks_held": held, "blocks_unique": unique,
            "duplicated_blocks": held - unique, "by_role": by_role, "states": states,
            "pd": {"served": pd.served, "bypassed": pd.bypassed,
                   "retried_prefill": pd.retried_prefill, "retried_decode": pd.retried_decode,
                   "fallback_both": pd.fallback_both, "failed": pd.failed}}


async def main(spec: dict) -> None:
    config = config_from(spec)
    async with trio.open_nursery() as nursery:
        running: Running = await nursery.start(run_gateway, config)
        set_policy(running, spec["model"], spec["policy"])
        roles = {w["name"]: w.get("role", "both") for w in spec["workers"]}
        if set(roles.values()) - {"both"}:
            tap_prefill_answers(running)
        await wait_for(running, lambda: all_ready(running), 60.0)
        print(f"ready {running.data_port}", flush=True)
        stdin = trio.lowlevel.FdStream(sys.stdin.fileno())
        buffer = b""
        while True:
            data = await stdin.receive_some(4096)
            if not data:
                break
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                command = line.decode().strip()
                if command == "report":
                    print(json.dumps(ledger_report(running, roles)), flush=True)
                elif command == "quit":
                    nursery.cancel_scope.cancel()
                    return
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        trio.run(main, json.load(f))
