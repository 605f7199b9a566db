"""Workers discovered from DNS: what a record means and what changes it asks for. Pure.

Rules:

* A ``DnsService`` is one headless service name plus a worker template. Its A or AAAA records
  are workers on ``http_port``; its SRV records carry their own port (``http_port`` unused) and
  a target host whose addresses are the workers (one worker per address and SRV port).
* A resolved ``Endpoint(address, port)`` becomes ``WorkerSpec`` named
  ``<name_prefix or service>-<address>-<port>``: the same address and port always give the
  same name, so a refresh that returns the same records changes nothing.
* The KV-event endpoint of DP rank 0 is ``tcp://<address>:<events_port>`` or, when several
  engines share an address (SRV), ``<http port> + events_offset``; likewise the replay socket.
  Neither set: the engine publishes no events (its pool is routed without a ledger).
* ``reconcile`` is the whole lifecycle decision, the same one SIGHUP applies to the config's
  list: a name discovery owns that is no longer resolved is **drained** (it leaves after its
  last request, never cut); a new name is **added**; a name resolved again while draining, or
  whose spec changed (template edited), is **replaced** (removed and added). A name registered
  by someone else (static config, admin API) is never touched: it is reported as a conflict.
* Only a successful answer is reconciled. "No such name" and "no records" are answers (zero
  workers: all drained); a timeout or server failure is not, and changes nothing.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from cortex.host_literal import url_host
from cortex.scheduling.view import Role
from cortex.workers.spec import Engine, WorkerSpec

Record = Literal["A", "AAAA", "SRV"]


@dataclass(frozen=True, slots=True)
class DnsService:
    """One ``[[discovery]]`` entry: a DNS name to watch and the template of its workers."""

    service: str  # DNS name of the headless service, e.g. sglang.llm.svc.cluster.local
    record: Record = "A"
    nameserver: str = ""  # "host" or "host:port"; "": the system resolver (/etc/resolv.conf)
    interval_s: float = 10.0
    timeout_s: float = 3.0
    name_prefix: str = ""  # "": the service name
    http_port: int | None = None  # A/AAAA records: the engines' HTTP port (required)
    engine: Engine = "sglang"
    model: str | None = None
    role: Role = Role.BOTH
    dp_size: int = 1
    events_port: int | None = None
    events_offset: int | None = None
    replay_port: int | None = None
    replay_offset: int | None = None
    topic: str = ""
    bootstrap_port: int | None = None
    weight: float = 1.0

    def validate(self) -> list[str]:
        label = f"discovery {self.service or '?'}"
        problems = [] if self.service.strip() else ["discovery: service must not be empty"]
        if self.record != "SRV" and self.http_port is None:
            problems.append(f"{label}: {self.record} records need http_port")
        if self.http_port is not None and not 0 < self.http_port < 65536:
            problems.append(f"{label}: http_port out of range")
        for kind in ("events", "replay"):
            port, offset = getattr(self, f"{kind}_port"), getattr(self, f"{kind}_offset")
            if port is not None and offset is not None:
                problems.append(f"{label}: set {kind}_port or {kind}_offset, not both")
            if port is not None and not 0 < port < 65536:
                problems.append(f"{label}: {kind}_port out of range")
        if not self.interval_s > 0 or not self.timeout_s > 0:
            problems.append(f"{label}: interval_s and timeout_s must be > 0")
        if self.nameserver:
            try:
                nameserver_address(self.nameserver)
            except ValueError as error:
                problems.append(f"{label}: nameserver {self.nameserver!r}: {error}")
        problems += [f"{label}: {problem}" for problem in
                     spec_for(self, Endpoint("10.0.0.1", self.http_port or 1)).validate()]
        return problems


@dataclass(frozen=True, slots=True, order=True)
class Endpoint:
    """One resolved engine: an IP address (no brackets) and its HTTP port."""

    address: str
    port: int


def nameserver_address(text: str) -> tuple[str, int]:
    """``"10.0.0.2"``, ``"10.0.0.2:5353"``, ``"[::1]:5353"`` or ``"::1"`` -> (ip, port)."""
    host, port = text.strip(), 53
    if host.startswith("["):
        host, _, rest = host[1:].partition("]")
        if rest:
            if not rest.startswith(":") or not rest[1:].isdigit():
                raise ValueError("expected [ip]:port")
            port = int(rest[1:])
    elif host.count(":") == 1:
        host, _, digits = host.partition(":")
        if not digits.isdigit():
            raise ValueError("port must be a number")
        port = int(digits)
    ipaddress.ip_address(host)  # a name server is an address (no resolver to resolve it)
    if not 0 < port < 65536:
        raise ValueError("port out of range")
    return host, port


def _port(base: int, port: int | None, offset: int | None) -> int | None:
    if port is not None:
        return port
    return None if offset is None else base + offset


def spec_for(service: DnsService, endpoint: Endpoint) -> WorkerSpec:
    """The worker a resolved endpoint stands for (rules at the top)."""
    host = url_host(endpoint.address)
    events = _port(endpoint.port, service.events_port, service.events_offset)
    replay = _port(endpoint.port, service.replay_port, service.replay_offset)
    return WorkerSpec(
        name=f"{service.name_prefix or service.service}-{endpoint.address}-{endpoint.port}",
        url=f"http://{host}:{endpoint.port}", engine=service.engine, model=service.model,
        role=service.role, dp_size=service.dp_size,
        events=None if events is None else f"tcp://{host}:{events}",
        replay=None if replay is None else f"tcp://{host}:{replay}",
        topic=service.topic, bootstrap_port=service.bootstrap_port, weight=service.weight)


# ---------------------------------------------------------------------- the lifecycle decision


@dataclass(frozen=True, slots=True)
class Changes:
    add: tuple[WorkerSpec, ...] = ()
    replace: tuple[WorkerSpec, ...] = ()  # remove the registered one, add this
    drain: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()  # resolved names registered by someone else

    def __bool__(self) -> bool:
        return bool(self.add or self.replace or self.drain)


def reconcile(wanted: Iterable[WorkerSpec], owned: Iterable[str],
              registered: Mapping[str, tuple[WorkerSpec, bool]]) -> Changes:
    """What to do so that the registry holds ``wanted``.

    ``owned``: the names this discovery added (and has not seen leave); ``registered``: every
    registered worker's (spec, draining). Owned names no longer registered are simply gone
    (drained out, or removed through the admin API)."""
    wanted_by_name = {spec.name: spec for spec in wanted}
    owned_now = {name for name in owned if name in registered}
    add, replace, drain, conflicts = [], [], [], []
    for name in sorted(owned_now - wanted_by_name.keys()):
        if not registered[name][1]:
            drain.append(name)
    for name, spec in sorted(wanted_by_name.items()):
        current = registered.get(name)
        if current is None:
            add.append(spec)
        elif name not in owned_now:
            conflicts.append(name)
        elif current[1] or current[0] != spec:
            replace.append(spec)
    return Changes(tuple(add), tuple(replace), tuple(drain), tuple(conflicts))
