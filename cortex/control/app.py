"""The control plane: a plain ASGI application (no framework) served by hypercorn's trio worker.

Routes:

* ``GET /metrics`` — Prometheus text exposition (0.0.4) of ``CortexMetrics``.
* ``GET /health/live`` — 200 while the process runs.
* ``GET /health/ready`` — from the injected readiness callable: 200 ready, 200 with
  ``"degraded": true`` and its reasons, or 503 not ready (``readiness.Readiness``).
* ``GET /debug/ledger`` — per worker/rank ledger state and sizes (``LedgerFigures``).
* ``GET /admin/ledger/snapshot`` — the ledger of every READY target for a peer's warm start
  (msgpack, ``cortex.ledger.snapshot``).
* ``GET /admin/workers``, ``POST /admin/workers`` (JSON ``WorkerSpec`` fields; 400 lists every
  problem), ``POST /admin/workers/{name}/drain``, ``DELETE /admin/workers/{name}``.

Rules:

* ``/admin/*`` and ``/debug/*`` need the bearer token (``auth.BearerAuth``: 403 when no token is
  configured, 401 when it is wrong or missing), checked before anything else about the request
  — an unauthenticated caller learns nothing but that. ``/metrics`` and ``/health/*`` are open:
  the control plane listens on loopback unless configured otherwise.
* Admin request bodies are limited (64 KiB by default): a larger ``content-length`` is refused
  before reading, a body that grows past the limit while being read likewise (413).
* Errors are ``CortexError`` leaves mapped to JSON in one place (``_error``): ``{"error":
  {"message", "type", "code"[, "problems"]}}``. Any other exception is a bug: logged, 500.
  Cancellation is never caught.
* Nothing here logs a request header, so the token never reaches a log.
* With ``siblings`` (the other processes of ``server.processes``, ``cortex.processes``):
  ``/metrics`` is every process's, merged; an ``/admin/workers`` change applied here is then
  applied by each of them, and one that fails there is answered 502 naming the process (the
  change stays applied where it succeeded: the operator retries or reverts it).
* Everything runs on the trio thread that owns the registry, ledger and counters; metrics
  collectors and ``AdminOps`` read them directly.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

from cortex.control.admin import AdminOps, WorkerHostPolicy, parse_worker_spec, spec_as_json
from cortex.control.auth import BearerAuth
from cortex.control.readiness import Readiness
from cortex.errors import (
    BadRequest,
    ConfigError,
    CortexError,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    UpstreamError,
)
from cortex.metrics.cortex_metrics import CONTENT_TYPE, CortexMetrics, LedgerFigures

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

ADMIN_MAX_BODY_BYTES = 64 * 1024
_JSON = (b"content-type", b"application/json")
_METRICS_TYPE = CONTENT_TYPE.encode()


class _Reply:
    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, body: bytes, headers: Headers | None = None) -> None:
        self.status, self.body, self.headers = status, body, headers or [_JSON]


def _json(status: int, payload: object) -> _Reply:
    return _Reply(status, json.dumps(payload, separators=(",", ":")).encode())


def _error(error: CortexError) -> _Reply:
    status = 400 if isinstance(error, ConfigError) else error.http_status
    body: dict[str, object] = {"message": str(error), "type": type(error).__name__,
                               "code": status}
    problems = getattr(error, "problems", None)
    if problems is not None:
        body["problems"] = list(problems)
    reply = _json(status, {"error": body})
    if status == 401:
        reply.headers.append((b"www-authenticate", b'Bearer realm="cortex-admin"'))
    if isinstance(error, MethodNotAllowed):
        reply.headers.append((b"allow", ", ".join(error.allow).encode()))
    return reply


class Siblings(Protocol):
    """The other processes this control plane speaks for (``cortex.processes.ProcessGroup``)."""

    async def metrics(self, own: bytes) -> bytes: ...

    async def forward(self, method: bytes, path: str, body: bytes) -> list[str]: ...


class ControlApp:
    def __init__(
        self,
        *,
        metrics: CortexMetrics,
        readiness: Callable[[], Readiness],
        auth: BearerAuth,
        admin: AdminOps | None = None,
        ledger: Callable[[], LedgerFigures] | None = None,
        worker_hosts: WorkerHostPolicy | None = None,
        max_body_bytes: int = ADMIN_MAX_BODY_BYTES,
        snapshot: Callable[[], bytes] | None = None,
        siblings: Siblings | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.siblings = siblings
        self.metrics = metrics
        self.readiness = readiness
        self.auth = auth
        self.admin = admin
        self.ledger = ledger
        self.worker_hosts = worker_hosts
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            raise RuntimeError(f"unsupported ASGI scope {scope['type']!r}")
        try:
            reply = await self._route(scope, receive)
        except CortexError as error:
            reply = _error(error)
            if reply.status == 401:  # who knocks without the token, never the token itself
                client = scope.get("client")
                log.warning("control plane: 401 for %s %s from %s", scope["method"],
                            scope["path"], f"{client[0]}:{client[1]}" if client else "?")
        except Exception:
            log.exception("control plane: bug while serving %s %s", scope["method"],
                          scope["path"])
            reply = _json(500, {"error": {"message": "internal error", "type": "InternalError",
                                          "code": 500}})
        await send({"type": "http.response.start", "status": reply.status,
                    "headers": [*reply.headers, (b"cache-control", b"no-store"),
                                (b"content-length", b"%d" % len(reply.body))]})
        await send({"type": "http.response.body", "body": reply.body})

    async def _route(self, scope: Scope, receive: Receive) -> _Reply:
        method, path = scope["method"], scope["path"]
        parts = path.strip("/").split("/")
        if parts[0] in ("admin", "debug"):
            self.auth.check(_header(scope, b"authorization"))
        if path == "/metrics":
            _allow(method, "GET")
            body = self.metrics.render()
            if self.siblings is not None:
                body = await self.siblings.metrics(body)
            return _Reply(200, body, [(b"content-type", _METRICS_TYPE)])
        if path == "/health/live":
            _allow(method, "GET")
            return _json(200, {"status": "live"})
        if path == "/health/ready":
            _allow(method, "GET")
            readiness = self.readiness()
            return _json(readiness.http_status, readiness.as_json())
        if path == "/debug/ledger" and self.ledger is not None:
            _allow(method, "GET")
            return _json(200, self.ledger().as_json())
        if path == "/admin/ledger/snapshot" and self.snapshot is not None:
            _allow(method, "GET")
            return _Reply(200, self.snapshot(), [(b"content-type", b"application/msgpack")])
        if parts[0] == "admin" and self.admin is not None:
            reply, body = await self._admin(self.admin, method, parts[1:], scope, receive)
            if self.siblings is not None and method != "GET":
                problems = await self.siblings.forward(method.encode(), path, body)
                if problems:
                    log.error("admin: %s %s applied by process 0, not by every other process: "
                              "%s", method, path, "; ".join(problems))
                    raise UpstreamError(f"applied by process 0, not by every other process: "
                                        f"{'; '.join(problems)}")
            return reply
        raise NotFound(f"no route {path}")

    async def _admin(
        self, ops: AdminOps, method: str, parts: list[str], scope: Scope, receive: Receive
    ) -> tuple[_Reply, bytes]:
        """The reply and the request body it applied."""
        if parts == ["workers"]:
            _allow(method, "GET", "POST")
            if method == "GET":
                return _json(200, {"workers": ops.list_workers()}), b""
            body = await self._body(scope, receive)
            spec, problems = parse_worker_spec(body, self.worker_hosts)
            if spec is None:
                raise ConfigError(problems)
            ops.add(spec)
            log.info("admin: worker %s added (%s)", spec.name, spec.url)
            return _json(201, {"worker": spec_as_json(spec)}), body
        if len(parts) == 3 and parts[0] == "workers" and parts[2] == "drain" and parts[1]:
            _allow(method, "POST")
            ops.drain(parts[1])
            log.info("admin: worker %s draining", parts[1])
            return _json(202, {"worker": parts[1], "status": "draining"}), b""
        if len(parts) == 2 and parts[0] == "workers" and parts[1]:
            _allow(method, "DELETE")
            ops.remove(parts[1])
            log.info("admin: worker %s removed", parts[1])
            return _json(200, {"worker": parts[1], "status": "removed"}), b""
        raise NotFound(f"no route {scope['path']}")

    async def _body(self, scope: Scope, receive: Receive) -> bytes:
        limit = self.max_body_bytes
        declared = _header(scope, b"content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > limit:
            raise PayloadTooLarge(f"request body over {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise BadRequest("client went away while sending the body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body over {limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _allow(method: str, *allowed: str) -> None:
    if method not in allowed:
        raise MethodNotAllowed(f"method not allowed; allowed: {', '.join(allowed)}",
                               allow=allowed)


def _header(scope: Scope, name: bytes, default: bytes | None = None) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return default


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
