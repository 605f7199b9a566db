"""What replica sync costs per routed request: messages, bytes, and the CPU of both ends.

One ``ReplicaSync`` (the sender) and one peer (the receiver) over real loopback ZeroMQ, each
in front of a pool of 8 workers with a ledger target each (no engines: the pools are what
sync touches). ``--requests`` requests are routed through the sender's pending work, as the
gateway does (``PendingWork.hold``: enter, prefill done, exit), each carrying ``--new-blocks``
new prompt block keys; the receiver applies what it hears. Events go out in batches, one per
event-loop tick (``cortex.replicas.sync``): here ``--per-tick`` requests are routed in one tick,
their prefills end in the next and they finish in the one after (1: every event its own
batch, the worst case; a loaded gateway's ticks hold many). Reported: events, batches and
bytes sent per request; the CPU per request of both ends together (process CPU: the three
announcements, each batch's encode and non-blocking send, ZeroMQ's I/O threads, the
receiver's decode and apply to its pending work — what each of two processes pays per request,
for its own requests and for hearing the other's), against the same holds untold; and the
heartbeat's size with ``--in-flight`` requests open.

Usage: ``python -m perf.bench_replica_sync [--requests 20000] [--new-blocks 64]
[--per-tick 1]``.
"""

from __future__ import annotations

import argparse
import json
import time
from array import array

import trio
import trio.lowlevel

from cortex.replicas import wire
from cortex.replicas.settings import ReplicaSettings
from cortex.replicas.sync import ReplicaSync
from cortex.scheduling.inflight import PendingWork
from perf.benchkit import machine_info

WORKERS = [f"w{i}" for i in range(8)]


class FakePool:  # what sync reads of a pool: its pending work and its workers' targets
    def __init__(self) -> None:
        self.pending = PendingWork()
        self.targets = {worker: (i + 1,) for i, worker in enumerate(WORKERS)}


async def run(requests: int, new_blocks: int, in_flight: int, per_tick: int) -> dict:
    sender_pool, receiver_pool = FakePool(), FakePool()
    sender = ReplicaSync(ReplicaSettings(listen="tcp://127.0.0.1:*"), {"m": sender_pool})
    out: dict[str, object] = {"requests": requests, "new_blocks": new_blocks,
                              "per_tick": per_tick}
    async with trio.open_nursery() as nursery:
        sender_endpoint = await nursery.start(sender.run)
        receiver = ReplicaSync(ReplicaSettings(listen="tcp://127.0.0.1:*",
                                               peers=sender_endpoint), {"m": receiver_pool})
        await nursery.start(receiver.run)
        # a joined SUB gets messages only once connected: wait for the first heartbeat
        while receiver.figures().peers == 0:
            await trio.sleep(0.01)
        pending = sender_pool.pending
        keys = array("Q", range(1, new_blocks + 1))
        announce, pending.announce = pending.announce, None  # the same holds, untold: the base
        start = time.process_time()
        for i in range(requests):
            hold = pending.hold(WORKERS[i % 8], 1000, (1 + i % 8, keys, 0))
            with hold:
                hold.prefill_done()
        base_cpu = time.process_time() - start
        pending.announce = announce
        sent_before = sender.counters.sent
        received_before = receiver.counters.received
        batches = 0
        start = time.process_time()
        for chunk in range(0, requests, per_tick):
            holds = []
            for step in range(3):  # routed, prefill done, finished: each in its own tick
                for i in range(chunk, min(chunk + per_tick, requests)):
                    if step == 0:
                        holds.append(hold := pending.hold(WORKERS[i % 8], 1000,
                                                          (1 + i % 8, keys, 0)))
                        hold.open()
                    elif step == 1:
                        holds[i - chunk].prefill_done()
                    else:
                        holds[i - chunk].close()
                batches += 1
                await trio.lowlevel.checkpoint()  # the flusher sends the tick's batch
                await trio.lowlevel.checkpoint()
        sent = sender.counters.sent - sent_before
        while receiver.counters.received - received_before < sent:
            await trio.sleep(0.001)
        total_cpu = time.process_time() - start
        routed = wire.encode([wire.Routed("m", 1, "w0", wire.NO_RANK, 1000,
                                          wire.keys_bytes(keys, 0))])
        beat = wire.encode([wire.Heartbeat({"m": list(range(1, in_flight + 1))})])
        out.update({
            "events_per_request": round(sent / requests, 2),
            "batches_per_request": round(batches / requests, 3),
            "bytes_per_request": len(routed) + 2 * len(wire.encode([wire.Finished("m", 1)])),
            "routed_bytes": len(routed),
            "both_ends_us_per_request": round(total_cpu / requests * 1e6, 2),
            "untold_us_per_request": round(base_cpu / requests * 1e6, 2),
            "dropped": sender.counters.dropped, "invalid": receiver.counters.invalid,
            "receiver_left_in_flight": receiver.figures().peer_requests,
            f"heartbeat_bytes_{in_flight}_in_flight": len(beat),
        })
        nursery.cancel_scope.cancel()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--new-blocks", type=int, default=64)
    parser.add_argument("--in-flight", type=int, default=256)
    parser.add_argument("--per-tick", type=int, default=1)
    args = parser.parse_args()
    result = {"benchmark": "replica_sync",
              **trio.run(run, args.requests, args.new_blocks, args.in_flight, args.per_tick),
              "machine": machine_info()}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
