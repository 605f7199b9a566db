"""The control plane under real hypercorn (trio worker) on loopback, spoken to with h11."""

from __future__ import annotations

import json
import logging
from functools import partial

import h11
import trio
from prometheus_client.parser import text_string_to_metric_families

from cortex.control.admin import spec_as_json
from cortex.control.app import ControlApp
from cortex.control.auth import BearerAuth
from cortex.control.readiness import Readiness, assess
from cortex.control.serve import serve_control
from cortex.errors import ConfigError, NotFound
from cortex.events.counters import IngestCounters
from cortex.ledger.state import TargetState
from cortex.metrics.cortex_metrics import CortexMetrics
from cortex.scheduling.view import WorkerView
from cortex.workers.spec import WorkerSpec

TOKEN = "integration-token-42"
AUTH = [("authorization", f"Bearer {TOKEN}")]
TIMEOUT_S = 30


class Client:
    """One keep-alive HTTP/1.1 connection (h11 over a trio stream)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.CLIENT)

    @classmethod
    async def connect(cls, port: int) -> Client:
        return cls(await trio.open_tcp_stream("127.0.0.1", port))

    async def request(self, method: str, path: str, headers=(), body: bytes = b""):
        if self.conn.our_state is h11.DONE:
            self.conn.start_next_cycle()
        head = [("host", "control"), *headers]
        if body or method in ("POST", "PUT"):
            head.append(("content-length", str(len(body))))
        out = self.conn.send(h11.Request(method=method, target=path, headers=head))
        if body:
            out += self.conn.send(h11.Data(data=body))
        out += self.conn.send(h11.EndOfMessage())
        await self.stream.send_all(out)
        response, chunks = None, []
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(await self.stream.receive_some(65536))
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                assert response is not None
                return response.status_code, dict(response.headers), b"".join(chunks)
            else:
                raise AssertionError(f"unexpected {event!r}")

    async def aclose(self) -> None:
        await self.stream.aclose()


class MemoryAdmin:
    def __init__(self) -> None:
        self.specs: dict[str, WorkerSpec] = {}

    def list_workers(self) -> list[dict[str, object]]:
        return [spec_as_json(spec) for spec in self.specs.values()]

    def add(self, spec: WorkerSpec) -> None:
        if spec.name in self.specs:
            raise ConfigError([f"worker {spec.name} already registered"])
        self.specs[spec.name] = spec

    def drain(self, name: str) -> None:
        if name not in self.specs:
            raise NotFound(f"no worker {name}")

    def remove(self, name: str) -> None:
        if self.specs.pop(name, None) is None:
            raise NotFound(f"no worker {name}")


def build(token: str | None = TOKEN):
    metrics = CortexMetrics()
    views: list[WorkerView] = []
    counters = IngestCounters()
    metrics.watch_workers(lambda: views)
    metrics.watch_ingest(lambda: [(v.worker, 0, counters) for v in views])
    admin = MemoryAdmin()
    app = ControlApp(metrics=metrics, readiness=lambda: assess(views),
                     auth=BearerAuth(token), admin=admin)
    return app, metrics, views, counters, admin


async def test_serves_metrics_health_and_admin_over_loopback(caplog):
    app, _metrics, views, counters, admin = build()
    stop = trio.Event()
    caplog.set_level(logging.DEBUG)
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(partial(serve_control, app, "127.0.0.1", 0,
                                               shutdown=stop))
            assert port > 0
            client = await Client.connect(port)

            status, head, body = await client.request("GET", "/health/ready")
            assert status == 503 and json.loads(body)["reasons"] == ["no workers registered"]
            views.append(WorkerView("w1", ledger_state=TargetState.SYNCING, in_flight=2))
            status, _, body = await client.request("GET", "/health/ready")
            assert status == 200 and json.loads(body)["degraded"] is True
            views[0] = WorkerView("w1", ledger_state=TargetState.READY, in_flight=2)
            status, _, body = await client.request("GET", "/health/ready")
            assert status == 200 and json.loads(body)["status"] == "ready"
            assert (await client.request("GET", "/health/live"))[0] == 200

            counters.gaps = 4
            status, head, body = await client.request("GET", "/metrics")
            assert status == 200
            assert head[b"content-type"] == b"text/plain; version=0.0.4; charset=utf-8"
            text = body.decode()
            assert "# HELP cortex_worker_in_flight " in text
            assert 'cortex_worker_in_flight{worker="w1"} 2\n' in text
            assert 'cortex_events_gaps_total{worker="w1",rank="0"} 4\n' in text
            names = {f.name for f in text_string_to_metric_families(text)}
            assert all(name.startswith("cortex_") for name in names)

            assert (await client.request("GET", "/admin/workers"))[0] == 401
            status, _, _ = await client.request(
                "GET", "/admin/workers", [("authorization", "Bearer wrong")])
            assert status == 401
            bad = {"name": "w2", "url": "http://127.0.0.1:1/x", "dp_size": -1, "role": "boss"}
            status, _, body = await client.request("POST", "/admin/workers", AUTH,
                                                   json.dumps(bad).encode())
            assert status == 400
            problems = json.loads(body)["error"]["problems"]
            assert problems == ['role: must be one of both, prefill, decode, not "boss"']
            del bad["role"]
            status, _, body = await client.request("POST", "/admin/workers", AUTH,
                                                   json.dumps(bad).encode())
            assert status == 400 and len(json.loads(body)["error"]["problems"]) == 2
            good = {"name": "w2", "url": "http://127.0.0.1:30002", "engine": "vllm"}
            status, _, body = await client.request("POST", "/admin/workers", AUTH,
                                                   json.dumps(good).encode())
            assert status == 201 and admin.specs["w2"].engine == "vllm"
            status, _, body = await client.request("GET", "/admin/workers", AUTH)
            assert status == 200 and json.loads(body)["workers"][0]["name"] == "w2"
            assert (await client.request("POST", "/admin/workers/w2/drain", AUTH))[0] == 202
            assert (await client.request("DELETE", "/admin/workers/w2", AUTH))[0] == 200

            huge = b"{" + b" " * (64 * 1024) + b"}"
            status, _, _ = await client.request("POST", "/admin/workers", AUTH, huge)
            assert status == 413
            await client.aclose()
            stop.set()  # graceful shutdown: serve_control returns, the nursery closes
    assert TOKEN not in caplog.text


async def test_admin_disabled_without_token_over_the_wire():
    app, *_ = build(token=None)
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(partial(serve_control, app, "127.0.0.1", 0))
            client = await Client.connect(port)
            status, _, body = await client.request("GET", "/admin/workers", AUTH)
            assert status == 403 and b"admin API disabled" in body
            assert (await client.request("GET", "/metrics"))[0] == 200
            await client.aclose()
            nursery.cancel_scope.cancel()


async def test_two_servers_get_their_own_ports_and_stop_independently():
    app_a, *_ = build()
    app_b, *_ = build()
    stop_a = trio.Event()
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            port_a = await nursery.start(partial(serve_control, app_a, "127.0.0.1", 0,
                                                 shutdown=stop_a))
            port_b = await nursery.start(partial(serve_control, app_b, "127.0.0.1", 0))
            assert port_a != port_b
            stop_a.set()
            client = await Client.connect(port_b)
            assert (await client.request("GET", "/health/live"))[0] == 200
            await client.aclose()
            nursery.cancel_scope.cancel()


async def test_readiness_object_is_served_as_is():
    metrics = CortexMetrics()
    app = ControlApp(metrics=metrics, auth=BearerAuth(TOKEN),
                     readiness=lambda: Readiness(False, reasons=("starting",)))
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(partial(serve_control, app, "127.0.0.1", 0))
            client = await Client.connect(port)
            status, _, body = await client.request("GET", "/health/ready")
            assert status == 503 and json.loads(body)["reasons"] == ["starting"]
            assert (await client.request("GET", "/debug/ledger", AUTH))[0] == 404
            await client.aclose()
            nursery.cancel_scope.cancel()


async def test_a_slowloris_head_is_cut_at_the_idle_timeout():
    app, *_ = build()
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(partial(serve_control, app, "127.0.0.1", 0,
                                               idle_timeout_s=0.5))
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            started = trio.current_time()
            closed_after = None
            try:
                await stream.send_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n")
                for _ in range(200):  # one header line every 50 ms: 10 s if never cut
                    await stream.send_all(b"x-drip: 1\r\n")
                    with trio.move_on_after(0.05):
                        if await stream.receive_some(1024) == b"":
                            closed_after = trio.current_time() - started
                            break
            except trio.BrokenResourceError:
                closed_after = trio.current_time() - started
            assert closed_after is not None and closed_after < 8
            await stream.aclose()
            nursery.cancel_scope.cancel()


async def raw_status_line(port: int, request: bytes) -> bytes:
    """The first line of the answer to ``request``, as sent (no HTTP library between)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    received = b""
    try:
        await stream.send_all(request)
        while b"\r\n" not in received:
            chunk = await stream.receive_some(4096)
            assert chunk, f"closed after {received!r}"
            received += chunk
    finally:
        await stream.aclose()
    return received.split(b"\r\n", 1)[0]


async def test_status_lines_carry_the_standard_reason_phrase():
    app, *_ = build()
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(partial(serve_control, app, "127.0.0.1", 0))
            get = b"GET %s HTTP/1.1\r\nhost: c\r\n\r\n"
            asks = [
                (get % b"/health/live", b"HTTP/1.1 200 OK"),
                (get % b"/health/ready", b"HTTP/1.1 503 Service Unavailable"),  # no workers
                (get % b"/admin/workers", b"HTTP/1.1 401 Unauthorized"),
                (get % b"/nowhere", b"HTTP/1.1 404 Not Found"),
                (b"GET /metrics HTTP/1.1\r\nbroken header\r\n\r\n",  # hypercorn's own answer
                 b"HTTP/1.1 400 Bad Request"),
            ]
            for request, line in asks:
                assert await raw_status_line(port, request) == line
            nursery.cancel_scope.cancel()


async def test_other_h11_users_keep_their_own_reasons():
    """Only hypercorn's HTTP/1.1 module sees the reason-filling view of h11."""
    app, *_ = build()
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(serve_control, app, "127.0.0.1", 0))
            assert h11.Response(status_code=200, headers=[]).reason == b""
            nursery.cancel_scope.cancel()
