"""What replica sync costs per routed request: messages, bytes, and the CPU of both ends.

One ``ReplicaSync`` (the sender) and one peer (the receiver) over real loopback ZeroMQ, each
in front of a pool of 8 workers with a ledger target each (no engines: the pools are what
sync touches). ``--requests`` requests are routed through the sender's pending work, as the
gateway does (``PendingWork.hold``: enter, prefill done, exit), each carrying ``--new-blocks``
new prompt block keys; the receiver applies what it hears. Reported: messages and bytes sent
per request; the sender's CPU per request (the three announcements: encode + non-blocking
send, and ZeroMQ's I/O thread: process CPU), timed around the holds, against the same holds
untold; the receiver's CPU per message (decode + apply to its pending
work), timed over its receive loop; and the heartbeat's size with ``--in-flight`` requests
open.

Usage: ``python perf/bench_replica_sync.py [--requests 20000] [--new-blocks 64]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from array import array
from pathlib import Path

import trio
import trio.lowlevel

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from benchkit import machine_info

from cortex.replicas import wire
from cortex.replicas.settings import ReplicaSettings
from cortex.replicas.sync import ReplicaSync
from cortex.scheduling.inflight import PendingWork

WORKERS = [f"w{i}" for i in range(8)]


class FakePool:  # what sync reads of a pool: its pending work and its workers' targets
    def __init__(self) -> None:
        self.pending = PendingWork()
        self.targets = {worker: (i + 1,) for i, worker in enumerate(WORKERS)}


async def run(requests: int, new_blocks: int, in_flight: int) -> dict:
    sender_pool, receiver_pool = FakePool(), FakePool()
    sender = ReplicaSync(ReplicaSettings(listen="tcp://127.0.0.1:*"), {"m": sender_pool})
    out: dict[str, object] = {"requests": requests, "new_blocks": new_blocks}
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
        start = time.process_time()
        sender_cpu = 0.0
        for chunk in range(0, requests, 256):
            chunk_start = time.process_time()
            for i in range(chunk, min(chunk + 256, requests)):
                hold = pending.hold(WORKERS[i % 8], 1000, (1 + i % 8, keys, 0))
                with hold:
                    hold.prefill_done()
            sender_cpu += time.process_time() - chunk_start
            await trio.lowlevel.checkpoint()  # let the receiver run (same thread)
        sent = sender.counters.sent - sent_before
        while receiver.counters.received - received_before < sent:
            await trio.sleep(0.001)
        total_cpu = time.process_time() - start
        routed = wire.encode(wire.Routed("m", 1, "w0", wire.NO_RANK, 1000,
                                         wire.keys_bytes(keys, 0)))
        beat = wire.encode(wire.Heartbeat({"m": list(range(1, in_flight + 1))}))
        out.update({
            "messages_per_request": round(sent / requests, 2),
            "bytes_per_request": len(routed) + 2 * len(wire.encode(wire.Finished("m", 1))),
            "routed_bytes": len(routed),
            "sender_us_per_request": round(sender_cpu / requests * 1e6, 2),
            "sender_us_per_request_untold": round(base_cpu / requests * 1e6, 2),
            "receiver_us_per_message": round((total_cpu - sender_cpu) / sent * 1e6, 2),
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
    args = parser.parse_args()
    result = {"benchmark": "replica_sync",
              **trio.run(run, args.requests, args.new_blocks, args.in_flight),
              "machine": machine_info()}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
