"""Cortex embedded in a thread: ``run_gateway`` under a ``trio.run`` that is not in the main
thread (an application embedding the gateway, a test harness driving it from hypothesis) must
serve until cancelled, as ``_until_signal``'s docstring promises ("not the main thread: cancel
is the only way out")."""

from __future__ import annotations

import queue
import threading

import trio

from tests.chaos.cluster import chaos_cluster
from tests.fuzz.front_server import exchange


def _serve_in_thread(results: queue.Queue[object]) -> None:
    async def main() -> None:
        async with chaos_cluster(("vllm-0.33",)) as cluster:
            answer = await trio.to_thread.run_sync(
                exchange, cluster.port, b"GET /health/live HTTP/1.1\r\nhost: x\r\n\r\n")
            results.put(answer.status)
            cluster.nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    except BaseException as error:  # noqa: BLE001 reported to the test's thread
        results.put(error)


def test_gateway_serves_off_the_main_thread() -> None:
    results: queue.Queue[object] = queue.Queue()
    thread = threading.Thread(target=_serve_in_thread, args=(results,), daemon=True)
    thread.start()
    thread.join(timeout=60)
    outcome = results.get(timeout=1)
    if isinstance(outcome, BaseException):
        raise outcome
    assert outcome == 200
