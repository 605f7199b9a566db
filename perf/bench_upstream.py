"""The upstream client alone against ``perf.mock_worker``: c=1 round trip and CPU per request.

Measures what the gateway's upstream leg costs per request — ``ConnectionPool.request`` on a
kept-alive connection, the request sent, the head and the whole body read — without the
gateway around it. The mock worker runs in its own process, so the CPU time counted
(``time.process_time`` of the client process) is the client's alone.

``--compare REF`` runs the same measurement with the ``cortex`` package of git revision REF
(extracted with ``git archive`` into a temporary directory), alternating the two clients
round by round so that a change in the machine's load hits both alike; the medians of the
rounds are reported. Each round is a fresh client process.

Usage: ``python -m perf.bench_upstream [--requests 3000] [--rounds 5] [--compare HEAD~1]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BODY = json.dumps({"model": "mock-model", "messages": [
    {"role": "user", "content": "Tell me about the KV cache of a transformer in a few words."}],
    "max_tokens": 16}).encode()
HEADERS = [(b"content-type", b"application/json"), (b"accept", b"application/json"),
           (b"user-agent", b"bench-upstream"), (b"authorization", b"Bearer none")]


def child(port: int, requests: int, kind: str) -> None:
    """One client process: warm up, then ``requests`` sequential requests; JSON on stdout."""
    import trio

    from cortex.upstream.connection_pool import ConnectionPool
    from perf.benchkit import percentile

    origin = f"http://127.0.0.1:{port}"
    body = BODY[:-1] + b',"stream":true}' if kind == "sse" else BODY

    async def one(pool: ConnectionPool) -> int:
        async with pool.request(origin, b"POST", b"/v1/chat/completions", HEADERS,
                                body) as response:
            size = 0
            async for chunk in response.body_chunks():
                size += len(chunk)
            return size

    async def main() -> dict[str, float]:
        pool = ConnectionPool()
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            for _ in range(200):
                await one(pool)
            samples = []
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for _ in range(requests):
                start = time.perf_counter_ns()
                await one(pool)
                samples.append(time.perf_counter_ns() - start)
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            assert pool.stats(origin).created == 1  # every request on one kept-alive conn
            nursery.cancel_scope.cancel()
        return {"rtt_p50_us": percentile(samples, 0.5) / 1000,
                "rtt_mean_us": wall / requests * 1e6, "cpu_us": cpu / requests * 1e6}

    print(json.dumps(trio.run(main)))


def run_child(root: Path, port: int, requests: int, kind: str) -> dict[str, float]:
    # The A/B mechanism: the measured ``cortex`` comes first on the child's sys.path (its
    # working directory, then PYTHONPATH), this checkout after it for ``perf`` (an extracted
    # revision holds ``cortex/`` alone).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(ROOT)]))
    out = subprocess.run([sys.executable, "-m", "perf.bench_upstream", "--child",
                          "--port", str(port), "--requests", str(requests), "--kind", kind],
                         env=env, cwd=root, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def extract(ref: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "cortex"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compare", metavar="REF", help="also measure cortex/ of git REF")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--kind", default="json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.port, args.requests, args.kind)
        return

    from perf.benchkit import machine_info

    worker = subprocess.Popen([sys.executable, "-m", "perf.mock_worker"], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    temp = Path(tempfile.mkdtemp(prefix="bench-upstream-"))
    try:
        assert worker.stdout is not None
        port = int(worker.stdout.readline())
        variants = {"current": ROOT}
        if args.compare:
            variants[args.compare] = extract(args.compare, temp)
        results: dict[str, dict[str, dict[str, float]]] = {}
        for kind in ("json", "sse"):
            rounds: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
            for _ in range(args.rounds):
                for name, root in variants.items():
                    rounds[name].append(run_child(root, port, args.requests, kind))
            for name, runs in rounds.items():
                results.setdefault(name, {})[kind] = {
                    key: round(statistics.median(run[key] for run in runs), 1)
                    for key in runs[0]}
        print(json.dumps({"machine": machine_info(), "load": os.getloadavg(),
                          "requests": args.requests, "rounds": args.rounds,
                          "results": results}, indent=1))
        for name, kinds in results.items():
            for kind, figures in kinds.items():
                print(f"{name:>12} {kind:>4}: rtt p50 {figures['rtt_p50_us']:7.1f} us, "
                      f"mean {figures['rtt_mean_us']:7.1f} us, "
                      f"client CPU {figures['cpu_us']:6.1f} us/request", file=sys.stderr)
    finally:
        worker.kill()
        worker.wait()
        shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    main()
