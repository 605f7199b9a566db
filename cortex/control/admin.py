"""The admin API's contract: what it asks of the worker registry, and how it reads a worker.

Rules:

* ``AdminOps`` is everything the control plane may do to workers. The application implements
  it over the worker registry; it runs on the trio thread that owns the registry, so its
  methods are plain calls. ``add`` raises ``ConfigError`` with every problem (duplicate name,
  invalid spec); ``drain`` and ``remove`` raise ``NotFound`` for an unknown name.
* ``parse_worker_spec(body)`` reads a JSON object whose keys are ``WorkerSpec`` fields and
  returns the spec or **every** problem at once: bad JSON, unknown keys, missing required
  keys, wrong types, then the spec's own ``validate()`` problems and the host policy's.
* ``WorkerHostPolicy`` (issue 7: no SSRF through the admin API): when configured, a worker's
  URL, event and replay endpoints must name a host in the allowed networks (CIDR or a single
  address) or one of the allowed host names, compared literally — no DNS lookup, so a name
  cannot be rebound to another address after the check. ``ipc://`` endpoints are refused
  under a policy. Without a policy any host is accepted (static configuration, tests).

Pure: no I/O.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable
from dataclasses import MISSING, dataclass, fields
from typing import Protocol
from urllib.parse import urlsplit

from cortex.errors import ConfigError
from cortex.scheduling.view import Role
from cortex.workers.spec import WorkerSpec

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class AdminOps(Protocol):
    def list_workers(self) -> list[dict[str, object]]:
        """Every worker as a JSON-ready object (``spec_as_json`` plus its status)."""
        ...

    def add(self, spec: WorkerSpec) -> None: ...

    def drain(self, name: str) -> None: ...

    def remove(self, name: str) -> None: ...


@dataclass(frozen=True, slots=True)
class WorkerHostPolicy:
    networks: tuple[_Network, ...] = ()
    hostnames: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> WorkerHostPolicy:
        """Entries are CIDRs, addresses or host names; raises ``ConfigError`` listing bad ones."""
        networks: list[_Network] = []
        names: set[str] = set()
        problems = []
        for entry in entries:
            text = entry.strip()
            try:
                networks.append(ipaddress.ip_network(text, strict=False))
                continue
            except ValueError:
                pass
            if not text or "/" in text or ":" in text or " " in text:
                problems.append(f"worker host allow-list: {entry!r} is neither a network nor "
                                "a host name")
            else:
                names.add(text.lower().rstrip("."))
        if problems:
            raise ConfigError(problems)
        return cls(tuple(networks), frozenset(names))

    def allows(self, host: str) -> bool:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return host.lower().rstrip(".") in self.hostnames
        return any(address in network for network in self.networks)

    def problems(self, spec: WorkerSpec) -> list[str]:
        found = []
        for field_name in ("url", "events", "replay"):
            value = getattr(spec, field_name)
            if value is None:
                continue
            if value.startswith("ipc://"):
                found.append(f"worker {spec.name}: {field_name}: ipc endpoints cannot be "
                             "registered through the admin API")
                continue
            try:
                host = urlsplit(value).hostname
            except ValueError:
                continue  # validate() already reports it
            if host and not self.allows(host):
                found.append(f"worker {spec.name}: {field_name} host {host!r} is not in the "
                             "allowed worker hosts")
        return found


_OPTIONAL_STR = ("model", "events", "replay")


def _type_problem(name: str, value: object) -> str | None:
    """Why ``value`` cannot be WorkerSpec field ``name``, or None."""
    if name in ("name", "url", "engine", "topic"):
        ok = isinstance(value, str)
        want = "a string"
    elif name in _OPTIONAL_STR:
        ok = value is None or isinstance(value, str)
        want = "a string or null"
    elif name == "role":
        ok = isinstance(value, str) and value in {r.value for r in Role}
        want = "one of " + ", ".join(r.value for r in Role)
    elif name == "dp_size":
        ok = isinstance(value, int) and not isinstance(value, bool)
        want = "an integer"
    elif name == "bootstrap_port":
        ok = value is None or isinstance(value, int) and not isinstance(value, bool)
        want = "an integer or null"
    elif name == "weight":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        want = "a number"
    else:  # a WorkerSpec field this reader does not know yet: refuse rather than guess
        return f"{name}: cannot be set through the admin API"
    return None if ok else f"{name}: must be {want}, not {json.dumps(value)[:60]}"


def parse_worker_spec(
    body: bytes, policy: WorkerHostPolicy | None = None
) -> tuple[WorkerSpec | None, list[str]]:
    """``(spec, [])`` or ``(None, every problem)`` for a JSON worker description."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as error:
        return None, [f"body is not JSON: {error}"]
    if not isinstance(data, dict):
        return None, ["body must be a JSON object of worker fields"]
    known = {f.name: f for f in fields(WorkerSpec)}
    unknown = [f"unknown field {key!r}" for key in data if key not in known]
    problems = [f"{name}: required" for name, f in known.items()
                if f.default is MISSING and name not in data]
    for key, value in data.items():
        if key in known:
            problem = _type_problem(key, value)
            if problem:
                problems.append(problem)
    if problems:  # the spec cannot be built: its own checks cannot run
        return None, unknown + problems
    values = {key: value for key, value in data.items() if key in known}
    if "role" in values:
        values["role"] = Role(values["role"])
    spec = WorkerSpec(**values)
    problems = unknown + spec.validate()
    if policy is not None:
        problems += policy.problems(spec)
    return (None, problems) if problems else (spec, [])


def spec_as_json(spec: WorkerSpec) -> dict[str, object]:
    """A spec as the JSON object ``parse_worker_spec`` reads back."""
    out: dict[str, object] = {f.name: getattr(spec, f.name) for f in fields(WorkerSpec)}
    out["role"] = spec.role.value
    return out
