"""The gateway process of a trace replay: Cortex with a chosen routing policy, and its ledger.

``python perf/replay_gateway.py SPEC.json`` starts ``cortex.app.run_gateway`` in front of the
workers named in the spec, switches the model's pool to the spec's policy (``cortex``,
``round_robin``, ``p2c``, ``consistent_hash``: every policy runs through the same gateway, so
the gateway's own cost is the same for all), waits until every worker is live and every ledger
READY, then prints ``ready <data_port>`` and answers commands on stdin, one per line:

* ``report`` -> one JSON line: the ledger's view of the engines' caches (it equals the engines'
  truth when no event is lost, which the replay checks through the predictions): blocks held
  per worker, the union over workers, and ``duplicated_blocks`` = held - union (a block cached
  on two workers counts once as duplicated);
* EOF or ``quit`` -> exit.

It also serves as a ledger observer for routers that are not Cortex (sglang-router): the
replay then sends no traffic through it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cortex.app import Running, run_gateway  # noqa: E402
from cortex.config.tree import (  # noqa: E402
    ControlConfig,
    CortexConfig,
    HealthConfig,
    ModelConfig,
    SchedulerConfig,
    ServerConfig,
)
from cortex.gateway.pool import ModelPool  # noqa: E402
from cortex.scheduling.cost import CostConfig  # noqa: E402
from cortex.workers.spec import WorkerSpec  # noqa: E402
from tests.gateway_cluster import all_ready, wait_for  # noqa: E402


def config_from(spec: dict) -> CortexConfig:
    model = ModelConfig(name=spec["model"], tokenizer=spec["tokenizer"],
                        block_size=spec["block_size"], chat_template=spec["template"],
                        bos_token=spec["bos"], eos_token=spec["eos"])
    workers = tuple(WorkerSpec(w["name"], w["url"], engine=w["engine"], model=spec["model"],
                               events=w["events"], replay=w.get("replay"))
                    for w in spec["workers"])
    cost = {"default_prefill_tokens_per_s": spec["prefill_tokens_per_s"]}
    if spec.get("affinity_tolerance_s", -1.0) >= 0:
        cost["affinity_tolerance_s"] = spec["affinity_tolerance_s"]
    return CortexConfig(
        server=ServerConfig(host="127.0.0.1", port=0),
        control=ControlConfig(host="127.0.0.1", port=0),
        models=(model,), workers=workers,
        # The operator states the engines' prefill speed: the cost model's TTFT is in seconds.
        scheduler=SchedulerConfig(cost=CostConfig(**cost)),
        health=HealthConfig(interval_s=0.5, timeout_s=5.0, load_interval_s=0.25))


def set_policy(running: Running, config: CortexConfig, model: str, policy: str) -> None:
    """Switch a started pool to a comparison policy (the same objects ``ModelPool`` builds)."""
    pool = running.pools[model]
    if policy == pool.policy:
        return
    twin = ModelPool(model, running.book, profiles=pool.profiles, policy=policy,  # type: ignore
                     cost=config.scheduler.cost, watermarks=config.scheduler.watermarks,
                     bounds=config.scheduler.bounds)
    pool.policy, pool.fixed = twin.policy, twin.fixed


def ledger_report(running: Running) -> dict:
    book = running.book
    per_worker: dict[str, int] = {}
    union: set[int] = set()
    held = 0
    states = {}
    for target in sorted(book.states()):
        info = book.info(target)
        keys: set[int] = set()
        for tree_keys in book.target_keys(target).values():
            keys |= tree_keys
        per_worker[info.worker] = per_worker.get(info.worker, 0) + len(keys)
        held += len(keys)
        union |= keys
        states[f"{info.worker}/{info.rank}"] = book.state(target).value
    return {"blocks_per_worker": per_worker, "blocks_held": held, "blocks_unique": len(union),
            "duplicated_blocks": held - len(union), "states": states}


async def main(spec: dict) -> None:
    config = config_from(spec)
    async with trio.open_nursery() as nursery:
        running: Running = await nursery.start(run_gateway, config)
        set_policy(running, config, spec["model"], spec["policy"])
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
                    print(json.dumps(ledger_report(running)), flush=True)
                elif command == "quit":
                    nursery.cancel_scope.cancel()
                    return
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        trio.run(main, json.load(f))
