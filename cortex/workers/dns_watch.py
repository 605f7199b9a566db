"""The DNS discovery task: resolve a ``DnsService`` every ``interval_s`` and apply the changes.

Rules:

* ``run_dns_discovery(service, ops, registry)`` resolves once, applies, then reports started
  (``nursery.start`` returns once the first answer, or the first failure, is in), then again
  every ``interval_s``. Changes go through ``ops`` (``add`` / ``drain`` / ``remove``: the admin
  API's operations), so a discovered worker has exactly the lifecycle of one added by hand:
  ingestion starts when it is added, routable after its first good probe, drained when its
  record disappears.
* Resolution uses dnspython's asynchronous resolver on trio, with no cache (each refresh asks),
  pointed at ``service.nameserver`` when set, else the system's ``/etc/resolv.conf``. NXDOMAIN
  and an empty answer are answers (zero workers); any other failure is logged and skipped.
* A name conflict or a spec the registry refuses is logged once per name and refresh; it never
  stops the task.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import dns.asyncresolver
import dns.exception
import dns.rdatatype
import dns.resolver
import trio

from cortex.errors import ConfigError
from cortex.workers.discovery import (
    Changes,
    DnsService,
    Endpoint,
    nameserver_address,
    reconcile,
    spec_for,
)
from cortex.workers.registry import WorkerRegistry
from cortex.workers.spec import WorkerSpec

log = logging.getLogger("cortex.discovery")

Resolve = Callable[[], Awaitable[list[Endpoint] | None]]


class WorkerOps(Protocol):
    def add(self, spec: WorkerSpec) -> None: ...
    def drain(self, name: str) -> None: ...
    def remove(self, name: str) -> None: ...


class DnsResolver:
    """Endpoints of one ``DnsService`` from DNS, or ``None`` when DNS did not answer."""

    def __init__(self, service: DnsService) -> None:
        self.service = service
        if service.nameserver:
            host, port = nameserver_address(service.nameserver)
            self._resolver = dns.asyncresolver.Resolver(configure=False)
            self._resolver.nameservers = [host]
            self._resolver.port = port
        else:
            self._resolver = dns.asyncresolver.Resolver()
        self._resolver.cache = None
        self._resolver.lifetime = self._resolver.timeout = service.timeout_s  # one try

    async def __call__(self) -> list[Endpoint] | None:
        service = self.service
        try:
            if service.record == "SRV":
                return await self._srv()
            assert service.http_port is not None  # validated
            return [Endpoint(address, service.http_port)
                    for address in await self._addresses(service.service, service.record)]
        except (dns.exception.DNSException, OSError) as error:
            log.warning("discovery %s: DNS failed, workers unchanged: %s", service.service,
                        error or type(error).__name__)
            return None

    async def _addresses(self, name: str, rdtype: str) -> list[str]:
        try:
            answer = await self._resolver.resolve(name, rdtype)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return []
        return sorted({rdata.address for rdata in answer})

    async def _srv(self) -> list[Endpoint]:
        try:
            answer = await self._resolver.resolve(self.service.service, "SRV")
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return []
        glue: dict[str, set[str]] = {}
        for rrset in answer.response.additional:
            if rrset.rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA):
                glue.setdefault(rrset.name.to_text(), set()).update(r.address for r in rrset)
        endpoints: set[Endpoint] = set()
        for rdata in answer:
            target = rdata.target.to_text()
            addresses = glue.get(target)
            if addresses is None:  # no glue: ask for the target's addresses
                addresses = set(await self._addresses(target, "A")
                                or await self._addresses(target, "AAAA"))
            endpoints.update(Endpoint(address, rdata.port) for address in addresses)
        return sorted(endpoints)


def apply_changes(service: DnsService, changes: Changes, ops: WorkerOps,
                  owned: set[str]) -> list[str]:
    """Carry ``changes`` out through ``ops``; returns what was done, for the log."""
    done: list[str] = []
    for name in changes.drain:
        ops.drain(name)
        done.append(f"draining {name}")
    for spec in changes.replace:
        ops.remove(spec.name)
        owned.discard(spec.name)
    for spec in (*changes.replace, *changes.add):
        try:
            ops.add(spec)
        except ConfigError as error:
            log.error("discovery %s: worker %s not added: %s", service.service, spec.name,
                      "; ".join(error.problems))
            continue
        owned.add(spec.name)
        done.append(f"{'replaced' if spec in changes.replace else 'added'} {spec.name}")
    for name in changes.conflicts:
        log.error("discovery %s: %s is already a worker not discovered here; left alone",
                  service.service, name)
    return done


async def run_dns_discovery(service: DnsService, ops: WorkerOps, registry: WorkerRegistry, *,
                            resolve: Resolve | None = None, owned: set[str] | None = None,
                            task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
                            ) -> None:
    """Keep the registry's workers of ``service`` equal to its DNS records (rules at the top).
    ``owned``: the set this task keeps of the names it added (SIGHUP leaves them alone)."""
    resolve = resolve or DnsResolver(service)
    owned = set() if owned is None else owned  # kept up to date in place
    started = False
    while True:
        endpoints = await resolve()
        if endpoints is not None:
            wanted = [spec_for(service, endpoint) for endpoint in endpoints]
            registered = {spec.name: (spec, registry.status(spec.name).draining)
                          for spec in registry.specs()}
            owned.intersection_update(registered)
            done = apply_changes(service, reconcile(wanted, owned, registered), ops, owned)
            if done:
                log.info("discovery %s: %s", service.service, ", ".join(done))
        if not started:
            started = True
            task_status.started()
        await trio.sleep(service.interval_s)
