"""Event sources of a worker: DP-rank port offsets (kv-events.md §1.2) and settings checks."""

from __future__ import annotations

import pytest

from cortex.errors import ConfigError
from cortex.events.counters import IngestCounters
from cortex.events.source import (
    EventSource,
    IngestSettings,
    rank_endpoint,
    tcp_endpoint,
    worker_sources,
)
from cortex.ledger.kv_events import EngineFamily


def test_ranks_get_base_port_plus_rank_for_events_and_replay():
    sources = worker_sources(
        "gpu-a",
        host="10.0.0.7",
        port=5557,
        dp_size=4,
        family=EngineFamily.VLLM,
        model="llama",
        replay_port=5657,
        topic=b"kv",
    )
    assert [s.endpoint for s in sources] == [f"tcp://10.0.0.7:{p}" for p in (5557, 5558, 5559, 5560)]
    assert [s.replay_endpoint for s in sources] == [
        f"tcp://10.0.0.7:{p}" for p in (5657, 5658, 5659, 5660)
    ]
    assert [s.rank for s in sources] == [0, 1, 2, 3]
    assert sources[2] == EventSource(
        "gpu-a", 2, EngineFamily.VLLM, "llama", "tcp://10.0.0.7:5559", "tcp://10.0.0.7:5659", b"kv"
    )


def test_without_replay_port_sources_have_no_replay_endpoint():
    (source,) = worker_sources(
        "w", host="h", port=6000, dp_size=1, family=EngineFamily.SGLANG, model="m"
    )
    assert source.replay_endpoint is None and source.topic == b""


def test_ipv6_hosts_are_bracketed():
    assert tcp_endpoint("fd00::1", 5557) == "tcp://[fd00::1]:5557"
    assert tcp_endpoint("[fd00::1]", 5557) == "tcp://[fd00::1]:5557"


def test_overlapping_replay_range_and_other_problems_are_reported_together():
    with pytest.raises(ConfigError) as err:
        worker_sources(
            "w", host="*", port=5557, dp_size=4, family=EngineFamily.VLLM, model="m",
            replay_port=5558,
        )
    problems = err.value.problems
    assert len(problems) == 2
    assert any("overlap" in p for p in problems)
    assert any("wildcard" in p for p in problems)


def test_port_range_must_fit():
    with pytest.raises(ConfigError):
        worker_sources("w", host="h", port=65535, dp_size=2, family=EngineFamily.VLLM, model="m")
    with pytest.raises(ConfigError):
        worker_sources("w", host="h", port=5557, dp_size=0, family=EngineFamily.VLLM, model="m")


def test_rank_endpoint_offsets_like_the_engines():
    assert rank_endpoint("tcp://host:5557", 0) == "tcp://host:5557"
    assert rank_endpoint("tcp://host:5557", 3) == "tcp://host:5560"
    assert rank_endpoint("tcp://[::1]:5557", 1) == "tcp://[::1]:5558"
    assert rank_endpoint("inproc://kv", 2) == "inproc://kv_dp2"
    for bad in ("tcp://host", "ipc:///tmp/kv", "tcp://host:65535"):
        with pytest.raises(ConfigError):
            rank_endpoint(bad, 1)
    with pytest.raises(ConfigError):
        rank_endpoint("tcp://host:5557", -1)


def test_settings_report_every_problem():
    IngestSettings()
    with pytest.raises(ConfigError) as err:
        IngestSettings(max_messages_per_turn=0, replay_timeout_s=0, replay_max_items=0)
    assert len(err.value.problems) == 3


def test_counters_add_and_total():
    a = IngestCounters(messages=2, gaps=1)
    b = IngestCounters(messages=3, restarts=1)
    total = IngestCounters.total([a, b])
    assert (total.messages, total.gaps, total.restarts) == (5, 1, 1)
    assert a.messages == 2  # inputs untouched
    a.add(b)
    assert a.as_dict()["messages"] == 5
