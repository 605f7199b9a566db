"""The control plane's ASGI app driven in-process: routes, auth, admin bodies, errors, logs."""

from __future__ import annotations

import json
import logging

import pytest

from cortex.control.admin import WorkerHostPolicy, spec_as_json
from cortex.control.app import ControlApp
from cortex.control.auth import BearerAuth
from cortex.control.readiness import Readiness
from cortex.errors import ConfigError, NotFound
from cortex.ledger.state import TargetState
from cortex.metrics.cortex_metrics import CortexMetrics, LedgerFigures, TargetFigures
from cortex.workers.spec import WorkerSpec

TOKEN = "tok-0123456789abcdef"
AUTH = [(b"authorization", b"Bearer " + TOKEN.encode())]
GOOD = {"name": "w1", "url": "http://127.0.0.1:30001", "engine": "sglang"}


class MemoryAdmin:
    """An in-test AdminOps: a dict of specs plus a draining set."""

    def __init__(self) -> None:
        self.specs: dict[str, WorkerSpec] = {}
        self.draining: set[str] = set()

    def list_workers(self) -> list[dict[str, object]]:
        return [{**spec_as_json(s), "draining": s.name in self.draining}
                for s in self.specs.values()]

    def add(self, spec: WorkerSpec) -> None:
        if spec.name in self.specs:
            raise ConfigError([f"worker {spec.name} already registered"])
        self.specs[spec.name] = spec

    def drain(self, name: str) -> None:
        if name not in self.specs:
            raise NotFound(f"no worker {name}")
        self.draining.add(name)

    def remove(self, name: str) -> None:
        if self.specs.pop(name, None) is None:
            raise NotFound(f"no worker {name}")
        self.draining.discard(name)


def make_app(token: str | None = TOKEN, readiness: Readiness = Readiness(True), **kw):
    metrics = CortexMetrics()
    admin = MemoryAdmin()
    state = {"readiness": readiness}
    figures = LedgerFigures((TargetFigures("w1", 0, TargetState.SYNCING, "registered", 0),),
                            0, 0, 0)
    app = ControlApp(metrics=metrics, readiness=lambda: state["readiness"],
                     auth=BearerAuth(token), admin=admin, ledger=lambda: figures, **kw)
    return app, admin, metrics, state


async def call(app, method: str, path: str, headers=(), body: bytes = b"", chunk: int = 0):
    """One request through the ASGI callable; the body arrives in ``chunk``-byte pieces."""
    pieces = [body[i:i + chunk] for i in range(0, len(body), chunk)] if chunk and body else [body]
    messages = [{"type": "http.request", "body": p, "more_body": i < len(pieces) - 1}
                for i, p in enumerate(pieces)]
    sent = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": list(headers),
             "query_string": b"", "http_version": "1.1"}
    await app(scope, receive, send)
    start, end = sent
    assert start["type"] == "http.response.start" and end["type"] == "http.response.body"
    head = dict(start["headers"])
    assert int(head[b"content-length"]) == len(end["body"])
    return start["status"], head, end["body"]


async def test_lifespan_completes():
    app, *_ = make_app()
    inbox = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent = []

    async def receive():
        return inbox.pop(0)

    async def send(message):
        sent.append(message["type"])

    await app({"type": "lifespan"}, receive, send)
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


async def test_metrics_text():
    app, _, metrics, _ = make_app()
    metrics.record_no_worker("m")
    status, head, body = await call(app, "GET", "/metrics")
    assert status == 200 and head[b"content-type"] == b"text/plain; version=0.0.4; charset=utf-8"
    assert b'cortex_no_worker_total{model="m"} 1\n' in body
    assert b"# HELP cortex_no_worker_total " in body


async def test_health_live_and_readiness_states():
    app, _, _, state = make_app()
    status, _, body = await call(app, "GET", "/health/live")
    assert status == 200
    assert (await call(app, "GET", "/health/ready"))[0] == 200
    state["readiness"] = Readiness(True, True, ("worker w1: ledger syncing",))
    status, _, body = await call(app, "GET", "/health/ready")
    assert status == 200
    assert json.loads(body) == {"status": "degraded", "ready": True, "degraded": True,
                                "reasons": ["worker w1: ledger syncing"]}
    state["readiness"] = Readiness(False, reasons=("no healthy worker",))
    status, _, body = await call(app, "GET", "/health/ready")
    assert status == 503 and json.loads(body)["reasons"] == ["no healthy worker"]


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/admin/workers"), ("POST", "/admin/workers"), ("POST", "/admin/workers/w1/drain"),
    ("DELETE", "/admin/workers/w1"), ("GET", "/debug/ledger"), ("GET", "/admin/nothing"),
])
async def test_protected_routes_need_the_token(method, path):
    app, *_ = make_app()
    status, head, body = await call(app, method, path)
    assert status == 401 and head[b"www-authenticate"].startswith(b"Bearer")
    assert json.loads(body)["error"]["type"] == "Unauthorized"
    status, _, _ = await call(app, method, path, [(b"authorization", b"Bearer nope")])
    assert status == 401
    disabled, *_ = make_app(token=None)
    status, _, body = await call(disabled, method, path, AUTH)
    assert status == 403 and json.loads(body)["error"]["message"] == "admin API disabled"


async def test_open_routes_need_no_token_even_when_admin_is_disabled():
    app, *_ = make_app(token=None)
    for path in ("/metrics", "/health/live", "/health/ready"):
        assert (await call(app, "GET", path))[0] == 200


async def test_debug_ledger():
    app, *_ = make_app()
    status, _, body = await call(app, "GET", "/debug/ledger", AUTH)
    assert status == 200
    assert json.loads(body)["targets"] == [
        {"worker": "w1", "rank": 0, "state": "syncing", "reason": "registered", "entries": 0}]


async def test_admin_add_list_drain_remove():
    app, admin, _, _ = make_app()
    status, _, body = await call(app, "POST", "/admin/workers", AUTH, json.dumps(GOOD).encode(),
                                 chunk=7)
    assert status == 201 and json.loads(body)["worker"]["name"] == "w1"
    assert admin.specs["w1"].url == GOOD["url"]
    status, _, body = await call(app, "POST", "/admin/workers", AUTH, json.dumps(GOOD).encode())
    assert status == 400
    assert json.loads(body)["error"]["problems"] == ["worker w1 already registered"]
    status, _, body = await call(app, "GET", "/admin/workers", AUTH)
    assert [w["name"] for w in json.loads(body)["workers"]] == ["w1"]
    assert (await call(app, "POST", "/admin/workers/w1/drain", AUTH))[0] == 202
    assert admin.draining == {"w1"}
    assert (await call(app, "DELETE", "/admin/workers/w1", AUTH))[0] == 200
    assert admin.specs == {}
    status, _, body = await call(app, "DELETE", "/admin/workers/w1", AUTH)
    assert status == 404 and json.loads(body)["error"]["type"] == "NotFound"
    assert (await call(app, "POST", "/admin/workers/ghost/drain", AUTH))[0] == 404


async def test_admin_add_invalid_lists_every_problem():
    app, admin, _, _ = make_app()
    bad = {"name": "", "url": "ftp://h", "dp_size": 0, "engine": "tgi", "colour": 1}
    status, _, body = await call(app, "POST", "/admin/workers", AUTH, json.dumps(bad).encode())
    assert status == 400
    error = json.loads(body)["error"]
    assert error["code"] == 400 and error["type"] == "ConfigError"
    problems = error["problems"]
    assert len(problems) == 5, problems  # colour, name, url, engine, dp_size
    assert problems[0] == "unknown field 'colour'"
    assert any("engine must be" in p for p in problems)
    assert admin.specs == {}


async def test_admin_add_outside_allowed_hosts_refused():
    app, admin, _, _ = make_app(worker_hosts=WorkerHostPolicy.parse(["10.0.0.0/8"]))
    status, _, body = await call(app, "POST", "/admin/workers", AUTH, json.dumps(GOOD).encode())
    assert status == 400 and "not in the allowed worker hosts" in body.decode()
    assert admin.specs == {}


async def test_admin_body_limit():
    app, *_ = make_app(max_body_bytes=1024)
    big = json.dumps({**GOOD, "model": "x" * 2000}).encode()
    status, _, _ = await call(app, "POST", "/admin/workers", AUTH, big, chunk=100)
    assert status == 413
    status, _, _ = await call(app, "POST", "/admin/workers",
                              [*AUTH, (b"content-length", b"%d" % len(big))], big)
    assert status == 413


async def test_unknown_route_and_wrong_method():
    app, *_ = make_app()
    assert (await call(app, "GET", "/nope"))[0] == 404
    status, head, _ = await call(app, "POST", "/metrics")
    assert status == 405 and head[b"allow"] == b"GET"
    status, head, _ = await call(app, "PUT", "/admin/workers", AUTH)
    assert status == 405 and head[b"allow"] == b"GET, POST"


async def test_a_bug_is_a_500_and_logged(caplog):
    def broken() -> Readiness:
        raise RuntimeError("bug")

    metrics = CortexMetrics()
    app = ControlApp(metrics=metrics, readiness=broken, auth=BearerAuth(TOKEN))
    with caplog.at_level(logging.ERROR, logger="cortex.control.app"):
        status, _, body = await call(app, "GET", "/health/ready")
    assert status == 500 and b"bug" not in body
    assert "bug while serving GET /health/ready" in caplog.text


async def test_token_never_logged(caplog):
    app, *_ = make_app()
    with caplog.at_level(logging.DEBUG):
        await call(app, "POST", "/admin/workers", AUTH, json.dumps(GOOD).encode())
        await call(app, "GET", "/admin/workers", [(b"authorization", b"Bearer " + b"x" * 8)])
        await call(app, "DELETE", "/admin/workers/w1", AUTH)
    assert "admin: worker w1 added" in caplog.text
    assert "control plane: 401 for GET /admin/workers" in caplog.text  # who, never what
    assert TOKEN not in caplog.text and "x" * 8 not in caplog.text
