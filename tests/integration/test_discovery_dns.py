"""DNS discovery against a real DNS server on loopback (UDP, dnspython's wire format).

The server answers from a zone the test edits between refreshes; Cortex's gateway (the real
``run_gateway``) adds the workers it finds and drains those whose records vanish.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable

import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest
import trio

from cortex.app import run_gateway
from cortex.config.tree import ControlConfig, CortexConfig, ServerConfig
from cortex.workers.discovery import DnsService, Endpoint
from cortex.workers.dns_watch import DnsResolver
from cortex.workers.health import HealthSettings
from tests.integration.test_dist_binary import BINARY, _skip_reason

SERVICE = "sglang.llm.test."


class Zone:
    """name -> rdtype -> record texts; ``silent`` drops every query (a dead server)."""

    def __init__(self) -> None:
        self.records: dict[str, dict[str, list[str]]] = {}
        self.silent = False
        self.queries = 0
        self.asked = trio.Event()

    def set(self, name: str, rdtype: str, *texts: str) -> None:
        self.records.setdefault(name, {})[rdtype] = list(texts)

    async def queried(self, count: int) -> None:
        """Return once ``count`` queries in all have arrived."""
        while self.queries < count:
            self.asked = trio.Event()
            await self.asked.wait()

    def answer(self, wire: bytes) -> bytes | None:
        query = dns.message.from_wire(wire)
        self.queries += 1
        self.asked.set()
        if self.silent:
            return None
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA
        question = query.question[0]
        name, rdtype = question.name.to_text(), dns.rdatatype.to_text(question.rdtype)
        if name not in self.records:
            response.set_rcode(dns.rcode.NXDOMAIN)
        elif texts := self.records[name].get(rdtype):
            response.answer.append(dns.rrset.from_text_list(name, 5, "IN", rdtype, texts))
            if rdtype == "SRV":  # glue for the targets this zone knows
                for text in texts:
                    target = text.split()[-1]
                    for glue in self.records.get(target, {}).get("A", []):
                        response.additional.append(
                            dns.rrset.from_text_list(target, 5, "IN", "A", [glue]))
        return response.to_wire()


async def serve_dns(zone: Zone, *, task_status: trio.TaskStatus[int]) -> None:
    with trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM) as sock:
        await sock.bind(("127.0.0.1", 0))
        task_status.started(sock.getsockname()[1])
        while True:
            data, peer = await sock.recvfrom(4096)
            reply = zone.answer(data)
            if reply is not None:
                await sock.sendto(reply, peer)


def watch(registry, condition: Callable[[], bool]) -> trio.Event:
    done = trio.Event()

    def check(*_: object) -> None:
        if condition():
            done.set()

    registry.on_change(check)
    check()
    return done


async def test_workers_follow_the_records_added_and_drained(nursery):
    zone = Zone()
    zone.set(SERVICE, "A", "10.0.0.11", "10.0.0.12")
    port = await nursery.start(serve_dns, zone)
    service = DnsService(SERVICE, nameserver=f"127.0.0.1:{port}", interval_s=0.05,
                         timeout_s=2.0, http_port=30000, events_port=5557, engine="vllm",
                         name_prefix="pool")
    config = CortexConfig(server=ServerConfig(host="127.0.0.1", port=0),
                          control=ControlConfig(host="127.0.0.1", port=0),
                          health=HealthSettings(interval_s=60.0),
                          discovery=(service,))
    with trio.fail_after(30):
        running = await nursery.start(run_gateway, config)
        registry = running.registry
        names = lambda: sorted(spec.name for spec in registry.specs())
        # the first answer is applied before the gateway reports started
        assert names() == ["pool-10.0.0.11-30000", "pool-10.0.0.12-30000"]
        spec = registry.spec("pool-10.0.0.11-30000")
        assert (spec.url, spec.events, spec.engine) == (
            "http://10.0.0.11:30000", "tcp://10.0.0.11:5557", "vllm")

        seen: list[tuple[str, str]] = []
        registry.on_change(lambda kind, name: seen.append((kind, name)))
        zone.set(SERVICE, "A", "10.0.0.12", "10.0.0.13")
        await watch(registry, lambda: names() == ["pool-10.0.0.12-30000",
                                                  "pool-10.0.0.13-30000"]).wait()
        gone = "pool-10.0.0.11-30000"
        assert seen.index(("draining", gone)) < seen.index(("removed", gone))  # drained
        assert ("added", "pool-10.0.0.13-30000") in seen

        # the server stops answering: nothing changes (a failure is not an empty answer);
        # one query per refresh, so the second query means the first refresh failed
        zone.silent = True
        await zone.queried(zone.queries + 2)
        assert names() == ["pool-10.0.0.12-30000", "pool-10.0.0.13-30000"]

        # NXDOMAIN is an answer: every discovered worker is drained away
        zone.silent = False
        del zone.records[SERVICE]
        await watch(registry, lambda: names() == []).wait()


async def test_srv_records_with_and_without_glue_and_aaaa(nursery):
    zone = Zone()
    zone.set("_http._tcp.engines.test.", "SRV", "0 0 30000 pod-a.engines.test.",
             "0 0 30001 pod-a.engines.test.", "0 0 30000 pod-b.engines.test.")
    zone.set("pod-a.engines.test.", "A", "10.0.0.21")
    zone.set("pod-b.engines.test.", "AAAA", "fd00::22")  # no A: asked for AAAA, no glue
    zone.set("v6.engines.test.", "AAAA", "fd00::31", "fd00::32")
    port = await nursery.start(serve_dns, zone)
    with trio.fail_after(20):
        srv = DnsResolver(DnsService("_http._tcp.engines.test.", record="SRV",
                                     nameserver=f"127.0.0.1:{port}"))
        assert await srv() == [Endpoint("10.0.0.21", 30000), Endpoint("10.0.0.21", 30001),
                               Endpoint("fd00::22", 30000)]
        aaaa = DnsResolver(DnsService("v6.engines.test.", record="AAAA", http_port=8000,
                                      nameserver=f"127.0.0.1:{port}"))
        assert await aaaa() == [Endpoint("fd00::31", 8000), Endpoint("fd00::32", 8000)]
        empty = DnsResolver(DnsService("v6.engines.test.", record="A", http_port=8000,
                                       nameserver=f"127.0.0.1:{port}"))
        assert await empty() == []  # NOERROR without A records: zero workers
        zone.silent = True
        dead = DnsResolver(DnsService("v6.engines.test.", record="AAAA", http_port=8000,
                                      nameserver=f"127.0.0.1:{port}", timeout_s=0.3))
        assert await dead() is None


@pytest.fixture
def binary() -> str:
    """The one-file binary, skipped (or failed) like the dist smoke test when not fresh."""
    reason = _skip_reason()
    if reason is not None:
        if os.environ.get("CORTEX_DIST_REQUIRED") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return str(BINARY)


async def test_the_one_file_binary_discovers_workers(nursery, binary):
    """dnspython inside the PyInstaller binary: its trio backend loads (it needs trio's
    metadata) and a vanished record is drained."""
    zone = Zone()
    zone.set("engines.test.", "A", "10.0.0.41", "10.0.0.42")
    port = await nursery.start(serve_dns, zone)
    process = await trio.lowlevel.open_process(
        [binary, "serve", "--server-host", "127.0.0.1", "--server-port", "0",
         "--control-port", "0", "--log-level", "info", "--log-json", "false", "--discover",
         f"engines.test.,http_port=30000,nameserver=127.0.0.1:{port},interval_s=0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd="/")
    output = b""
    try:
        with trio.fail_after(120):
            async for chunk in process.stdout:
                output += chunk
                if b"added engines.test.-10.0.0.42-30000" in output:
                    zone.set("engines.test.", "A", "10.0.0.42")
                if b"draining engines.test.-10.0.0.41-30000" in output:
                    break
            else:
                raise AssertionError(output.decode(errors="replace"))
    finally:
        process.terminate()
        with trio.move_on_after(30):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()
