"""DNS discovery's pure part: records -> worker specs, and the add / drain / replace decision."""

import pytest

from cortex.scheduling.view import Role
from cortex.workers.discovery import DnsService, Endpoint, nameserver_address, reconcile, spec_for


def service(**changes) -> DnsService:
    return DnsService(**{"service": "sglang.llm.svc", "http_port": 30000, **changes})


def test_an_address_becomes_a_named_worker_with_the_template():
    spec = spec_for(service(engine="vllm", model="m", role=Role.DECODE, dp_size=2,
                            events_port=5557, replay_port=5567, weight=2.0),
                    Endpoint("10.1.2.3", 30000))
    assert spec.name == "sglang.llm.svc-10.1.2.3-30000"
    assert spec.url == "http://10.1.2.3:30000"
    assert (spec.engine, spec.model, spec.role, spec.dp_size, spec.weight) == (
        "vllm", "m", Role.DECODE, 2, 2.0)
    assert spec.events == "tcp://10.1.2.3:5557" and spec.replay == "tcp://10.1.2.3:5567"
    assert spec.validate() == []


def test_offsets_follow_each_srv_port_and_ipv6_keeps_brackets():
    template = service(record="SRV", http_port=None, events_offset=100, replay_offset=200,
                       name_prefix="pool")
    first, second = (spec_for(template, Endpoint("fd00::7", port)) for port in (30000, 30001))
    assert first.name == "pool-fd00::7-30000" and first.url == "http://[fd00::7]:30000"
    assert (first.events, second.events) == ("tcp://[fd00::7]:30100", "tcp://[fd00::7]:30101")
    assert second.replay == "tcp://[fd00::7]:30201"


def test_no_event_port_means_no_events():
    spec = spec_for(service(), Endpoint("10.0.0.9", 30000))
    assert spec.events is None and spec.replay is None


def test_validate_lists_every_problem():
    problems = DnsService("", record="A", events_port=5557, events_offset=1, replay_offset=3,
                          interval_s=0, nameserver="dns.local", dp_size=0).validate()
    joined = " | ".join(problems)
    for part in ("service must not be empty", "A records need http_port",
                 "events_port or events_offset", "interval_s and timeout_s must be > 0",
                 "nameserver 'dns.local'", "dp_size must be in [1, 1024]"):
        assert part in joined
    assert DnsService("x.svc", record="SRV", replay_port=1).validate() == [
        "discovery x.svc: worker x.svc-10.0.0.1-1: a replay endpoint needs an events endpoint"]
    assert service(events_port=5557, replay_port=5567).validate() == []


@pytest.mark.parametrize(("text", "parsed"), [
    ("10.0.0.2", ("10.0.0.2", 53)), ("127.0.0.1:5353", ("127.0.0.1", 5353)),
    ("::1", ("::1", 53)), ("[::1]:5353", ("::1", 5353))])
def test_nameserver_spellings(text, parsed):
    assert nameserver_address(text) == parsed


@pytest.mark.parametrize("text", ["dns:53", "10.0.0.2:x", "[::1]5353", "10.0.0.2:70000"])
def test_bad_nameservers(text):
    with pytest.raises(ValueError):
        nameserver_address(text)


def specs(*addresses: str):
    return [spec_for(service(), Endpoint(address, 30000)) for address in addresses]


def test_new_addresses_are_added_and_vanished_ones_drained():
    a, b, c = specs("10.0.0.1", "10.0.0.2", "10.0.0.3")
    registered = {a.name: (a, False), b.name: (b, False)}
    changes = reconcile([b, c], {a.name, b.name}, registered)
    assert changes.add == (c,) and changes.drain == (a.name,)
    assert changes.replace == () and changes.conflicts == ()


def test_same_answer_changes_nothing():
    a, b = specs("10.0.0.1", "10.0.0.2")
    changes = reconcile([a, b], {a.name, b.name}, {a.name: (a, False), b.name: (b, False)})
    assert not changes


def test_draining_is_not_asked_twice_and_a_returning_address_is_taken_back():
    a, b = specs("10.0.0.1", "10.0.0.2")
    registered = {a.name: (a, True), b.name: (b, True)}
    changes = reconcile([b], {a.name, b.name}, registered)
    assert changes.drain == () and changes.replace == (b,)


def test_a_changed_template_replaces_the_worker():
    (a,) = specs("10.0.0.1")
    edited = spec_for(service(events_port=5557), Endpoint("10.0.0.1", 30000))
    assert reconcile([edited], {a.name}, {a.name: (a, False)}).replace == (edited,)


def test_workers_of_others_are_never_touched():
    a, b = specs("10.0.0.1", "10.0.0.2")
    registered = {a.name: (a, False), "static": (b, False)}
    changes = reconcile([], set(), registered)  # discovery owns nothing: drains nothing
    assert not changes
    changes = reconcile([a], set(), registered)  # same name added by the admin API
    assert changes.conflicts == (a.name,) and not changes


def test_owned_names_gone_from_the_registry_are_forgotten():
    (a,) = specs("10.0.0.1")
    assert reconcile([], {a.name}, {}).drain == ()
    assert reconcile([a], {a.name}, {}).add == (a,)
