"""The monitor against real loopback HTTP servers (h11 over trio sockets on both sides).

Each test starts canned engine servers with ``nursery.start`` and waits for registry changes
(no sleeping for readiness); intervals are small and every wait is bounded generously.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from urllib.parse import urlsplit

import h11
import pytest
import trio

from cortex.errors import UpstreamError
from cortex.workers.breaker import BreakerState
from cortex.workers.health import HealthSettings
from cortex.workers.load import RankLoad
from cortex.workers.monitor import run_monitor
from cortex.workers.registry import WorkerRegistry
from cortex.workers.spec import WorkerSpec

SETTINGS = HealthSettings(interval_s=0.05, timeout_s=0.5, failures_to_open=2, open_s=0.5,
                          load_interval_s=0.05)
WAIT_S = 20.0  # bound on any single wait (2 noisy shared vCPUs)
HANG = object()

VLLM_METRICS = b"""\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:num_requests_waiting{engine="1",model_name="m"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
"""


class CannedEngine:
    """An HTTP/1.1 server on loopback answering each path from ``answers`` (one request per
    connection): ``(status, body)``, or ``HANG`` to read the request and never answer."""

    def __init__(self, answers: dict[str, object]) -> None:
        self.answers = answers
        self.paths: list[str] = []
        self.port = 0
        self._scope = trio.CancelScope()
        self._arrived = trio.Event()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with self._scope:
            await trio.serve_tcp(self._handle, 0, host="127.0.0.1", task_status=task_status)

    async def start(self, nursery: trio.Nursery) -> CannedEngine:
        listeners = await nursery.start(self.run)
        self.port = listeners[0].socket.getsockname()[1]
        return self

    def stop(self) -> None:
        """Close the listener and every connection: the port refuses from now on."""
        self._scope.cancel()

    async def wait_requests(self, count: int) -> None:
        """Wait (bounded) until ``count`` requests in all have been read."""
        with trio.fail_after(WAIT_S):
            while len(self.paths) < count:
                await self._arrived.wait()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, stream: trio.SocketStream) -> None:
        connection = h11.Connection(h11.SERVER)
        target = ""
        async with stream:
            try:
                while True:
                    event = connection.next_event()
                    if event is h11.NEED_DATA:
                        connection.receive_data(await stream.receive_some(65536))
                    elif isinstance(event, h11.Request):
                        target = event.target.decode()
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    elif isinstance(event, h11.ConnectionClosed):
                        return
                self.paths.append(target)
                self._arrived.set()
                self._arrived = trio.Event()
                answer = self.answers.get(target, (404, b'{"detail":"Not Found"}'))
                if answer is HANG:
                    await trio.sleep_forever()
                status, body = answer  # type: ignore[misc]
                head = h11.Response(status_code=status, headers=[
                    ("content-length", str(len(body))), ("connection", "close")])
                await stream.send_all(connection.send(head))
                await stream.send_all(connection.send(h11.Data(data=body)))
                await stream.send_all(connection.send(h11.EndOfMessage()))
            except (h11.ProtocolError, trio.BrokenResourceError):
                return


async def http_get(origin: str, path: str, timeout_s: float) -> tuple[int, bytes]:
    """A minimal fetch for the monitor: one GET per connection. It deliberately ignores
    ``timeout_s``, so only the monitor's own cut can end a hanging probe."""
    parts = urlsplit(origin)
    stream = await trio.open_tcp_stream(parts.hostname, parts.port)  # OSError when refused
    async with stream:
        connection = h11.Connection(h11.CLIENT)
        try:
            request = h11.Request(method="GET", target=path, headers=[
                ("host", parts.netloc), ("connection", "close")])
            await stream.send_all(connection.send(request))
            await stream.send_all(connection.send(h11.EndOfMessage()))
            status, body = 0, bytearray()
            while True:
                event = connection.next_event()
                if event is h11.NEED_DATA:
                    connection.receive_data(await stream.receive_some(65536))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    return status, bytes(body)
        except (h11.ProtocolError, trio.BrokenResourceError) as error:
            raise UpstreamError(f"{origin}{path}: {error!r}") from error


async def until(registry: WorkerRegistry, condition: Callable[[], bool]) -> None:
    """Wait (bounded) for a registry change after which ``condition()`` holds."""
    with trio.fail_after(WAIT_S):
        while not condition():
            changed = trio.Event()
            unsubscribe = registry.on_change(lambda kind, name: changed.set())
            try:
                await changed.wait()
            finally:
                unsubscribe()


@pytest.fixture
def registry() -> WorkerRegistry:
    return WorkerRegistry(SETTINGS, trio.current_time)


async def test_vllm_health_and_load_arrive_in_views(nursery, registry) -> None:
    engine = await CannedEngine({"/health": (200, b""),
                                 "/metrics": (200, VLLM_METRICS)}).start(nursery)
    registry.add(WorkerSpec("v", engine.url, engine="vllm", dp_size=2))
    await nursery.start(run_monitor, registry, http_get, SETTINGS)
    await until(registry, lambda: registry.status("v").loads != {})
    assert registry.status("v").loads == {0: RankLoad(3, 4, 0.25), 1: RankLoad(1, 2, 0.75)}
    [view] = registry.views(lambda name: None, lambda name: (0, 1))
    assert view.healthy and view.engine_queue == 6 and view.kv_usage == 0.75


async def test_health_turning_503_goes_unhealthy_within_the_interval(nursery,
                                                                     registry) -> None:
    engine = await CannedEngine({"/health": (200, b"")}).start(nursery)
    registry.add(WorkerSpec("s", engine.url))
    await nursery.start(run_monitor, registry, http_get, SETTINGS)
    await until(registry, lambda: registry.is_live("s"))
    engine.answers["/health"] = (503, b"")
    turned = trio.current_time()
    await until(registry, lambda: not registry.status("s").healthy)
    took = trio.current_time() - turned
    assert registry.status("s").last_error == "/health answered 503"
    assert took < WAIT_S  # typically one interval (0.05 s) plus a round trip
    print(f"unhealthy {took * 1e3:.1f} ms after /health turned 503")


async def test_hanging_probe_is_cut_then_a_recovered_worker_passes_its_trial(
        nursery, registry) -> None:
    engine = await CannedEngine({"/health": (200, b"")}).start(nursery)
    registry.add(WorkerSpec("s", engine.url))
    await nursery.start(run_monitor, registry, http_get, SETTINGS)
    await until(registry, lambda: registry.is_live("s"))
    moments: dict[str, float] = {}

    def note(kind: str, name: str) -> None:  # runs at the very moment of each change
        status = registry.status(name)
        if status.breaker is BreakerState.OPEN:
            moments.setdefault("opened", trio.current_time())
        if status.live and "opened" in moments:
            moments.setdefault("live", trio.current_time())

    registry.on_change(note)
    engine.answers["/health"] = HANG
    await until(registry, lambda: not registry.status("s").healthy)
    assert registry.status("s").last_error == "/health: no answer within 0.5 s"
    await until(registry, lambda: registry.status("s").breaker is BreakerState.OPEN)
    engine.answers["/health"] = (200, b"")
    probes_before = registry.counters("s").probes
    await until(registry, lambda: registry.is_live("s"))
    assert moments["live"] - moments["opened"] >= SETTINGS.open_s  # no probe while open
    assert registry.counters("s").probes == probes_before + 1  # the one half-open trial
    assert registry.status("s").breaker is BreakerState.CLOSED


async def test_stopped_engine_refuses_and_counts_as_failures(nursery, registry) -> None:
    engine = await CannedEngine({"/health": (200, b"")}).start(nursery)
    registry.add(WorkerSpec("s", engine.url))
    await nursery.start(run_monitor, registry, http_get, SETTINGS)
    await until(registry, lambda: registry.is_live("s"))
    engine.stop()
    await until(registry, lambda: registry.status("s").breaker is BreakerState.OPEN)
    status = registry.status("s")
    assert not status.healthy and status.last_error.startswith("/health: ")
    assert registry.counters("s").probe_failures >= 2


async def test_old_sglang_load_endpoint_is_used_after_a_404(nursery, registry) -> None:
    get_load = [{"dp_rank": 0, "num_reqs": 5, "num_waiting_reqs": 2, "num_tokens": 100},
                {"dp_rank": 1, "num_reqs": 1, "num_waiting_reqs": 0, "num_tokens": 10}]
    old = await CannedEngine({"/health": (200, b""),
                              "/get_load": (200, json.dumps(get_load).encode())}).start(nursery)
    v1_loads = {"loads": [{"dp_rank": 0, "num_running_reqs": 1, "num_waiting_reqs": 7,
                           "num_waiting_uncached_tokens": 900, "token_usage": 0.5}]}
    new = await CannedEngine({"/health": (200, b""),
                              "/v1/loads": (200, json.dumps(v1_loads).encode())}).start(nursery)
    registry.add(WorkerSpec("old", old.url, dp_size=2))
    registry.add(WorkerSpec("new", new.url))
    await nursery.start(run_monitor, registry, http_get, SETTINGS)
    await until(registry, lambda: all(registry.status(n).loads for n in ("old", "new")))
    assert registry.status("old").loads == {0: RankLoad(3, 2), 1: RankLoad(1, 0)}
    assert registry.status("new").loads == {0: RankLoad(1, 7, 0.5, 900)}
    assert old.paths.count("/v1/loads") == 1  # the fallback is remembered
    assert "/get_load" not in new.paths
    views = {v.worker: v for v in registry.views(lambda name: None, lambda name: ())}
    assert (views["old"].engine_queue, views["old"].kv_usage) == (2, None)
    assert (views["new"].engine_queue, views["new"].kv_usage) == (7, 0.5)


async def test_worker_added_and_drained_at_runtime(nursery, registry) -> None:
    engine = await CannedEngine({"/health": (200, b"")}).start(nursery)
    await nursery.start(run_monitor, registry, http_get, SETTINGS)
    registry.add(WorkerSpec("late", engine.url))
    await until(registry, lambda: registry.is_live("late"))
    assert not registry.drain("late", in_flight=1)
    assert not registry.is_live("late")
    assert registry.report_in_flight("late", 0)
    probes = len(engine.paths)
    # Its task is gone: a second worker's probes come and the removed one's do not.
    other = await CannedEngine({"/health": (200, b"")}).start(nursery)
    registry.add(WorkerSpec("other", other.url))
    await until(registry, lambda: registry.is_live("other"))
    await other.wait_requests(5)
    assert len(engine.paths) <= probes + 1  # at most one probe was already on its way
