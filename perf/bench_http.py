"""Lean trio server (llhttp) vs hypercorn (trio worker, minimal ASGI app): trivial JSON response.

Both servers answer ``GET /`` with ``{"ok":true}`` (content-type application/json), each in its
own process, measured in the same run by the same client: a keep-alive h11 client over trio in
this process. ``--post-bytes N`` sends ``POST /`` with an N-byte JSON body instead (the
gateway's requests are POSTs of a few hundred bytes). ``--baseline DIR`` also measures the
lean server of another checkout (say ``git archive <commit> cortex perf`` unpacked in DIR),
in the same run, as ``lean_baseline``: a before/after comparison on the same machine load.

* ``concurrency_1``: one connection, requests one after another; round trip percentiles.
* ``concurrency_16`` / ``concurrency_64``: that many connections (one trio task each) sending
  back to back; requests per second.

Every phase is warmed up for a fifth of its time, then measured for ``--seconds`` (5 s).

For every phase the server's CPU time (from /proc) is reported per request, with its share of
one core over the phase's wall time, and so is the client's: on a 2-vCPU machine the client
shares the CPU, so a server below ~90% of a core while the client is near 100% means the
client is the bottleneck.

Usage: ``python -m perf.bench_http [--quick] [--seconds S] [--post-bytes N] [--baseline DIR]``
(JSON on stdout; the load average at the end is printed too, the VM being shared).
Internal: ``--serve lean|hypercorn`` runs one server and prints its port on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Self

import h11
import trio

from perf.benchkit import machine_info, percentiles_us

REPO = Path(__file__).resolve().parent.parent
PAYLOAD = b'{"ok":true}'
HOST = "127.0.0.1"


# -- servers (child processes) -----------------------------------------------------------------

async def _serve_lean() -> None:
    from cortex.front.messages import json_response
    from cortex.front.server import HttpServer

    async def handler(request):
        return json_response(200, PAYLOAD)

    server = HttpServer(handler)
    async with trio.open_nursery() as nursery:
        _, port = await nursery.start(server.serve, HOST, 0)
        print(port, flush=True)


async def _asgi_app(scope, receive, send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": PAYLOAD})


async def _serve_hypercorn() -> None:
    from hypercorn.config import Config
    from hypercorn.trio import serve

    config = Config()
    config.bind = [f"{HOST}:0"]
    config.accesslog = None
    config.errorlog = None
    config.keep_alive_timeout = 75
    config.keep_alive_max_requests = 1 << 30  # default 1000 would reconnect mid-run
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve, _asgi_app, config)
        print(binds[0].rsplit(":", 1)[1], flush=True)


# -- client ------------------------------------------------------------------------------------

class Client:
    """One keep-alive connection; ``get()`` sends its request (``GET /``, or ``POST /`` with
    ``post_bytes`` of JSON) and reads the whole response."""

    def __init__(self, stream: trio.SocketStream, port: int, post_bytes: int) -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.CLIENT)
        headers = [("host", f"{HOST}:{port}")]
        self.body = b""
        if post_bytes:
            self.body = b'{"pad":"%s"}' % (b"x" * max(0, post_bytes - 10))
            headers += [("content-type", "application/json"),
                        ("content-length", str(len(self.body)))]
        self.request = h11.Request(method="POST" if post_bytes else "GET", target="/",
                                   headers=headers)

    @classmethod
    async def connect(cls, port: int, post_bytes: int = 0) -> Client:
        return cls(await trio.open_tcp_stream(HOST, port), port, post_bytes)

    async def get(self) -> None:
        conn = self.conn
        data = conn.send(self.request)
        if self.body:
            data += conn.send(h11.Data(data=self.body))
        await self.stream.send_all(data + conn.send(h11.EndOfMessage()))
        body = b""
        status = 0
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await self.stream.receive_some(65536))
            elif type(event) is h11.Response:
                status = event.status_code
            elif type(event) is h11.Data:
                body += event.data
            elif type(event) is h11.EndOfMessage:
                break
            else:
                raise RuntimeError(f"unexpected {event!r}")
        if status != 200 or body != PAYLOAD:
            raise RuntimeError(f"bad answer {status} {body!r}")
        conn.start_next_cycle()


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Phase:
    """Wall and CPU time of the server and of this client over one measured phase."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __enter__(self) -> Self:
        self.wall = time.perf_counter()
        self.server_cpu = _cpu_s(self.pid)
        self.client_cpu = _own_cpu_s()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.server_cpu = _cpu_s(self.pid) - self.server_cpu
        self.client_cpu = _own_cpu_s() - self.client_cpu

    def report(self, requests: int) -> dict[str, float]:
        return {
            "server_cpu_us_per_request": round(self.server_cpu / requests * 1e6, 1),
            "server_core_share": round(self.server_cpu / self.wall, 2),
            "client_core_share": round(self.client_cpu / self.wall, 2),
        }


async def _sequential(port: int, pid: int, seconds: float, post_bytes: int
                      ) -> dict[str, object]:
    client = await Client.connect(port, post_bytes)
    await _for(seconds / 5, client)  # warm up
    samples: list[int] = []
    clock = time.perf_counter_ns
    stop = clock() + int(seconds * 1e9)
    with Phase(pid) as phase:
        while (start := clock()) < stop:
            await client.get()
            samples.append(clock() - start)
    await client.stream.aclose()
    return {"round_trip_us": percentiles_us(samples), **phase.report(len(samples))}


async def _for(seconds: float, client: Client) -> int:
    """Requests back to back on one connection for ``seconds``; how many were answered."""
    done = 0
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        await client.get()
        done += 1
    return done


async def _concurrent(port: int, pid: int, connections: int, seconds: float, post_bytes: int
                      ) -> dict[str, object]:
    clients = [await Client.connect(port, post_bytes) for _ in range(connections)]
    counts: list[int] = []

    async def run(client: Client, seconds: float) -> None:
        counts.append(await _for(seconds, client))

    async with trio.open_nursery() as nursery:  # warm up
        for client in clients:
            nursery.start_soon(run, client, seconds / 5)
    counts.clear()
    with Phase(pid) as phase:
        async with trio.open_nursery() as nursery:
            for client in clients:
                nursery.start_soon(run, client, seconds)
    for client in clients:
        await client.stream.aclose()
    total = sum(counts)
    return {"requests": total, "req_per_s": round(total / phase.wall),
            **phase.report(total)}


async def _measure(port: int, pid: int, seconds: float, post_bytes: int
                   ) -> dict[str, object]:
    result: dict[str, object] = {
        "concurrency_1": await _sequential(port, pid, seconds, post_bytes)}
    for connections in (16, 64):
        result[f"concurrency_{connections}"] = await _concurrent(
            port, pid, connections, seconds, post_bytes)
    return result


def _bench(name: str, seconds: float, post_bytes: int, checkout: Path = REPO
           ) -> dict[str, object]:
    """Runs ``python -m perf.bench_http --serve name`` from ``checkout`` (this one, or a
    baseline's) and measures it. The A/B mechanism: the child's working directory comes first
    on its sys.path, so it serves that checkout's ``cortex`` (and runs its ``perf``)."""
    child = subprocess.Popen([sys.executable, "-m", "perf.bench_http", "--serve", name],
                             cwd=checkout, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())  # the child prints its port once it listens
        return trio.run(_measure, port, child.pid, seconds, post_bytes)
    finally:
        child.terminate()
        child.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (0.3 s per phase)")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured time per phase")
    parser.add_argument("--post-bytes", type=int, default=0,
                        help="send POST / with a JSON body of about this size (0: GET /)")
    parser.add_argument("--baseline", type=Path,
                        help="a checkout (cortex/ and perf/) whose lean server is measured too")
    parser.add_argument("--serve", choices=["lean", "hypercorn"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        trio.run(_serve_lean if args.serve == "lean" else _serve_hypercorn)
        return
    seconds = 0.3 if args.quick else args.seconds
    results = {name: _bench(name, seconds, args.post_bytes) for name in ("lean", "hypercorn")}
    lean, hyper = results["lean"], results["hypercorn"]
    baseline_ratios = {}
    if args.baseline is not None:
        base = results["lean_baseline"] = _bench(
            "lean", seconds, args.post_bytes, args.baseline.resolve())
        baseline_ratios = {
            "p50_round_trip_lean_over_baseline": round(
                lean["concurrency_1"]["round_trip_us"]["p50"]
                / base["concurrency_1"]["round_trip_us"]["p50"], 2),
            **{f"server_cpu_per_request_lean_over_baseline_c{c}": round(
                lean[f"concurrency_{c}"]["server_cpu_us_per_request"]
                / base[f"concurrency_{c}"]["server_cpu_us_per_request"], 2) for c in (1, 16, 64)},
            **{f"req_per_s_lean_over_baseline_c{c}": round(
                lean[f"concurrency_{c}"]["req_per_s"] / base[f"concurrency_{c}"]["req_per_s"], 2)
               for c in (16, 64)},
        }
    ratios = {
        "p50_round_trip_hypercorn_over_lean": round(
            hyper["concurrency_1"]["round_trip_us"]["p50"]
            / lean["concurrency_1"]["round_trip_us"]["p50"], 2),
        **{f"req_per_s_lean_over_hypercorn_c{c}": round(
            lean[f"concurrency_{c}"]["req_per_s"] / hyper[f"concurrency_{c}"]["req_per_s"], 2)
           for c in (16, 64)},
        **baseline_ratios,
    }
    print(json.dumps({"machine": machine_info(), "seconds_per_phase": seconds,
                      "load_average": os.getloadavg(), "response": PAYLOAD.decode(),
                      "post_bytes": args.post_bytes, **results, "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
