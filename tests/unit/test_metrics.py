"""CortexMetrics: names, HELP lines, labels, and collectors that read live objects at scrape."""

from __future__ import annotations

import random
from array import array
from dataclasses import dataclass, field, fields

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cortex.events.counters import IngestCounters
from cortex.ledger.book import LedgerBook
from cortex.ledger.kv_events import BlockStored, EngineFamily, EventBatch
from cortex.ledger.state import TargetState
from cortex.metrics.cortex_metrics import (
    PHASES,
    REASONS,
    CortexMetrics,
    ledger_figures,
    reason_code,
)
from cortex.metrics.sources import INGEST_HELP
from cortex.scheduling.consistent_hash import ConsistentHash
from cortex.scheduling.decision import Decision, Mode
from cortex.scheduling.exact_kv import ExactKv, exact_verdict
from cortex.scheduling.load_aware import LoadAware
from cortex.scheduling.p2c import PowerOfTwo
from cortex.scheduling.round_robin import RoundRobin
from cortex.scheduling.view import RequestFacts, WorkerView
from cortex.upstream.connection_pool import PoolStats
from cortex.workers.health import WorkerCounters


def scrape(metrics: CortexMetrics) -> str:
    return metrics.render().decode()


def samples(metrics: CortexMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(scrape(metrics)):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def value(metrics: CortexMetrics, name: str, **labels: str) -> float | None:
    return samples(metrics).get((name, tuple(sorted(labels.items()))))


@dataclass
class FakeServerCounters:
    connections_opened: int = 0
    connections_open: int = 0
    requests: int = 0
    bad_requests: int = 0
    too_large: int = 0
    header_timeouts: int = 0
    body_timeouts: int = 0
    client_gone: int = 0
    handler_errors: int = 0
    responses_by_status: dict[int, int] = field(default_factory=dict)
    bad_requests_by_reason: dict[str, int] = field(default_factory=dict)


def full_metrics() -> tuple[CortexMetrics, dict]:
    m = CortexMetrics()
    live = {"ingest": IngestCounters(), "server": FakeServerCounters(), "book": LedgerBook()}
    m.watch_ingest(lambda: [("w0", 0, live["ingest"])])
    m.watch_ledger(lambda: ledger_figures(live["book"]))
    m.watch_workers(lambda: [WorkerView("w0")])
    m.watch_http(lambda: live["server"])
    return m, live


def test_every_metric_is_cortex_prefixed_with_help_and_units():
    m, _ = full_metrics()
    text = scrape(m)
    families = list(text_string_to_metric_families(text))
    names = {f.name for f in families}
    assert names and all(name.startswith("cortex_") for name in names)
    for family in families:
        assert f"# HELP {family.name}" in text or f"# HELP {family.name}_total" in text
        assert family.documentation
    for expected in ("cortex_route_seconds", "cortex_tokenize_seconds", "cortex_hash_seconds",
                     "cortex_decisions", "cortex_cached_tokens_predicted",
                     "cortex_cached_tokens_reported", "cortex_cached_tokens_error",
                     "cortex_cached_tokens_exact", "cortex_upstream_errors", "cortex_retries",
                     "cortex_events_gaps", "cortex_events_replays", "cortex_events_decode_errors",
                     "cortex_events_duplicates", "cortex_events_restarts", "cortex_ledger_state",
                     "cortex_ledger_entries", "cortex_ledger_memory_bytes",
                     "cortex_worker_in_flight", "cortex_worker_queued_prefill_tokens",
                     "cortex_worker_healthy", "cortex_http_responses",
                     "cortex_http_client_disconnects"):
        assert expected in names, expected
    assert "# TYPE cortex_decisions_total counter" in text
    assert "# TYPE cortex_route_seconds histogram" in text


def test_instances_have_their_own_registries():
    a, b = CortexMetrics(), CortexMetrics()
    a.record_no_worker("m")
    assert value(a, "cortex_no_worker_total", model="m") == 1
    assert value(b, "cortex_no_worker_total", model="m") is None


def test_route_tokenize_hash_histograms():
    m = CortexMetrics()
    m.observe_route(Mode.EXACT_KV_EVENTS, 80e-6)
    m.observe_route(Mode.EXACT_KV_EVENTS, 2e-3)
    m.observe_route("none", 1e-3)
    m.observe_tokenize(4e-3)
    m.observe_hash(3e-6)
    assert value(m, "cortex_route_seconds_count", mode="exact_kv_events") == 2
    assert value(m, "cortex_route_seconds_bucket", mode="exact_kv_events", le="0.0001") == 1
    assert value(m, "cortex_route_seconds_count", mode="none") == 1
    assert value(m, "cortex_tokenize_seconds_count") == 1
    assert value(m, "cortex_hash_seconds_bucket", le="5e-06") == 1


def _views(*names: str, **kw) -> list[WorkerView]:
    return [WorkerView(name, ledger_state=TargetState.READY, **kw) for name in names]


def _facts(blocks: int = 4, block_size: int = 16) -> RequestFacts:
    return RequestFacts(array("Q", range(1, blocks + 1)), blocks * block_size, block_size)


def test_reason_codes_of_real_policy_decisions():
    views = _views("w0", "w1")
    hit = ExactKv().decide(_facts(), views, {"w0": 3})
    assert hit is not None and reason_code(hit) == "least_cost"
    facts = _facts()
    # every branch of the exact_kv verdict, as the policy and the compiled path word it
    def verdict(cheap_blocks, long, long_cost, long_blocks):
        return reason_code(exact_verdict(facts, 0.1, 0.0, "w1", 1.0, cheap_blocks, 0.0,
                                         long, long_cost, long_blocks))

    assert verdict(0, "w0", 1.05, 3) == "longest_hit"
    assert verdict(1, "w0", 2.0, 3) == "least_cost"
    assert verdict(0, None, 0.0, 0) == "over_cap"
    assert verdict(2, None, 0.0, 0) == "least_cost"
    assert reason_code(LoadAware().decide(_facts(), views, {})) == "no_hit"
    loaded = [WorkerView("w0", engine_queue=1), WorkerView("w1", engine_queue=0)]
    assert reason_code(PowerOfTwo(random.Random(0)).decide(_facts(), loaded, {})) == "p2c"
    ring = ConsistentHash().decide(_facts(), [WorkerView("w0"), WorkerView("w1")], {})
    assert ring is not None and reason_code(ring) == "ring"
    assert reason_code(RoundRobin().decide(_facts(), views, {})) == "round_robin"


@pytest.mark.parametrize(("mode", "sentence", "code"), [
    (Mode.EXACT_KV_EVENTS, "longest hit: 3 of 4 blocks on w0", "longest_hit"),
    (Mode.EXACT_KV_EVENTS, "1 of 4 blocks cached on w1; the longest hit (3 on w0) would cost "
                           "0.200 s more", "least_cost"),
    (Mode.EXACT_KV_EVENTS, "no hit on w1 but every holder is above the load cap", "over_cap"),
    (Mode.FALLBACK_P2C, "ledger not trusted everywhere; drew w0 and w1, w1 less loaded", "p2c"),
    (Mode.CONSISTENT_HASH, "ring point of the first 4 blocks", "ring"),
    (Mode.CONSISTENT_HASH, "ring point of the first 4 blocks; w0 above 3 in flight, spilled",
     "ring_spill"),
])
def test_reason_codes_of_policy_sentences(mode, sentence, code):
    assert reason_code(Decision("w", mode, sentence)) == code
    assert code in REASONS


def test_decisions_counted_by_model_mode_reason():
    m = CortexMetrics()
    decision = Decision("w0", Mode.LOAD_AWARE, "no worker holds the prefix; w0 has the least")
    for _ in range(3):
        m.record_decision("llama", decision)
    assert value(m, "cortex_decisions_total", model="llama", mode="load_aware",
                 reason="no_hit") == 3


def test_cached_tokens_predicted_vs_reported():
    m = CortexMetrics()
    m.record_cached_tokens("m", predicted=64, reported=64)
    m.record_cached_tokens("m", predicted=64, reported=48)
    m.record_cached_tokens("m", predicted=0, reported=16)
    assert value(m, "cortex_cached_tokens_predicted_total", model="m") == 128
    assert value(m, "cortex_cached_tokens_reported_total", model="m") == 128
    assert value(m, "cortex_cached_tokens_exact_total", model="m") == 1
    assert value(m, "cortex_cached_tokens_error_count", model="m") == 3
    # Negative buckets: the exposition carries no _sum (OpenMetrics); the bias is the
    # difference of the two counters.
    assert value(m, "cortex_cached_tokens_error_sum", model="m") is None
    assert value(m, "cortex_cached_tokens_error_bucket", model="m", le="-16.0") == 1
    assert value(m, "cortex_cached_tokens_error_bucket", model="m", le="0.0") == 2


def test_upstream_errors_and_retries_use_fixed_phases_and_failing_statuses():
    m = CortexMetrics()
    m.record_upstream_error("w0", "connect")
    m.record_upstream_error("w0", "body")
    m.record_upstream_error("w0", "head", 503)
    m.record_upstream_error("w0", "head", 429)
    m.record_retry("connect")
    assert value(m, "cortex_upstream_errors_total", worker="w0", phase="connect",
                 status="none") == 1
    assert value(m, "cortex_upstream_errors_total", worker="w0", phase="head",
                 status="503") == 1
    assert value(m, "cortex_retries_total", phase="connect") == 1
    with pytest.raises(ValueError):
        m.record_upstream_error("w0", "connection refused by peer")
    with pytest.raises(ValueError):
        m.record_upstream_error("w0", "head", 200)  # only failing answers are errors
    with pytest.raises(ValueError):
        m.record_retry("body")  # never retried after the first byte
    m.forget_worker("w0")
    assert value(m, "cortex_upstream_errors_total", worker="w0", phase="connect",
                 status="none") is None
    assert value(m, "cortex_upstream_errors_total", worker="w0", phase="head",
                 status="429") is None
    assert set(PHASES) == {"acquire", "connect", "send", "head", "body"}


def test_every_ingest_counter_is_exported():
    assert set(INGEST_HELP) == {f.name for f in fields(IngestCounters)}


def test_ingest_collector_reads_live_counters_without_double_counting():
    m, live = full_metrics()
    counters: IngestCounters = live["ingest"]
    counters.gaps = 2
    counters.decode_errors = 1
    assert value(m, "cortex_events_gaps_total", worker="w0", rank="0") == 2
    counters.gaps = 3
    counters.restarts += 1
    assert value(m, "cortex_events_gaps_total", worker="w0", rank="0") == 3  # not 5
    assert value(m, "cortex_events_restarts_total", worker="w0", rank="0") == 1
    assert value(m, "cortex_events_decode_errors_total", worker="w0", rank="0") == 1


def test_registering_a_source_does_not_read_it():
    m = CortexMetrics()

    def boom():
        raise AssertionError("read at registration")

    m.watch_ingest(boom)
    m.watch_ledger(boom)
    m.watch_workers(boom)
    m.watch_http(boom)
    m.watch_probes(boom)
    m.watch_upstream_pool(boom)
    m.watch_models(boom)


def test_ledger_state_and_sizes_from_a_real_book():
    m, live = full_metrics()
    book: LedgerBook = live["book"]
    t0 = book.register("w0", 0, EngineFamily.VLLM, "m")
    t1 = book.register("w0", 1, EngineFamily.VLLM, "m")
    book.set_state(t0, TargetState.READY, "replayed from 0")
    book.apply(t0, EventBatch(0.0, (BlockStored([11, 12], None, list(range(8)), 4),), 0))
    assert value(m, "cortex_ledger_state", worker="w0", rank="0", state="ready") == 1
    assert value(m, "cortex_ledger_state", worker="w0", rank="0", state="syncing") == 0
    assert value(m, "cortex_ledger_state", worker="w0", rank="1", state="syncing") == 1
    assert value(m, "cortex_ledger_target_entries", worker="w0", rank="0") == 2
    assert value(m, "cortex_ledger_entries") == 2
    assert value(m, "cortex_ledger_memory_bytes") > 0
    assert value(m, "cortex_ledger_fold_tokens") == 0
    assert value(m, "cortex_ledger_fold_forgotten_total") == 0
    book.set_state(t1, TargetState.STALE, "gap 4..6")
    assert value(m, "cortex_ledger_state", worker="w0", rank="1", state="stale") == 1
    figures = ledger_figures(book)
    assert [(t.worker, t.rank, t.state) for t in figures.targets] == [
        ("w0", 0, TargetState.READY), ("w0", 1, TargetState.STALE)]
    assert figures.as_json()["targets"][1]["reason"] == "gap 4..6"


def test_worker_load_figures_and_unknown_engine_figures_absent():
    m = CortexMetrics()
    views = [WorkerView("a", in_flight=3, queued_prefill_tokens=900, engine_queue=2,
                        kv_usage=0.5),
             WorkerView("b", healthy=False)]
    m.watch_workers(lambda: views)
    assert value(m, "cortex_worker_in_flight", worker="a") == 3
    assert value(m, "cortex_worker_queued_prefill_tokens", worker="a") == 900
    assert value(m, "cortex_worker_engine_queue", worker="a") == 2
    assert value(m, "cortex_worker_kv_usage_ratio", worker="a") == 0.5
    assert value(m, "cortex_worker_healthy", worker="b") == 0
    assert value(m, "cortex_worker_engine_queue", worker="b") is None  # unknown, not 0
    views[0] = WorkerView("a", in_flight=4)
    assert value(m, "cortex_worker_in_flight", worker="a") == 4


def test_http_server_counters_read_at_scrape():
    m, live = full_metrics()
    server: FakeServerCounters = live["server"]
    server.responses_by_status[200] = 7
    server.responses_by_status[503] = 1
    server.client_gone = 2
    server.connections_open = 5
    assert value(m, "cortex_http_responses_total", code="200") == 7
    assert value(m, "cortex_http_responses_total", code="503") == 1
    assert value(m, "cortex_http_client_disconnects_total") == 2
    assert value(m, "cortex_http_connections_open") == 5


def test_probe_and_pool_figures_per_worker():
    m = CortexMetrics()
    probes = {"a": WorkerCounters(probes=10, probe_failures=2, breaker_opens=1)}
    pools = {"a": PoolStats(open=3, idle=2, busy=1, created=5, reused=40, discarded=2)}
    m.watch_probes(lambda: probes.items())
    m.watch_upstream_pool(lambda: pools.items())
    assert value(m, "cortex_worker_probes_total", worker="a") == 10
    assert value(m, "cortex_worker_probe_failures_total", worker="a") == 2
    assert value(m, "cortex_worker_breaker_opens_total", worker="a") == 1
    assert value(m, "cortex_upstream_connections_open", worker="a") == 3
    assert value(m, "cortex_upstream_connections_reused_total", worker="a") == 40
    probes["a"].probes = 11
    assert value(m, "cortex_worker_probes_total", worker="a") == 11


def test_every_monitor_and_pool_figure_is_exported():
    from cortex.metrics.sources import _POOL_FIGURES, _PROBE_COUNTERS

    assert {attr for attr, *_ in _PROBE_COUNTERS} == {f.name for f in fields(WorkerCounters)}
    assert {attr for attr, *_ in _POOL_FIGURES} == {f.name for f in fields(PoolStats)}


def test_exact_routing_per_model():
    m = CortexMetrics()
    off = {"llama": None, "qwen": "profile not loaded: tokenizer.json missing"}
    m.watch_models(lambda: off.items())
    assert value(m, "cortex_model_exact_routing", model="llama") == 1
    assert value(m, "cortex_model_exact_routing", model="qwen") == 0
    off["qwen"] = None
    assert value(m, "cortex_model_exact_routing", model="qwen") == 1


def test_process_figures():
    m = CortexMetrics()
    assert value(m, "cortex_process_resident_memory_bytes") > 1 << 20
    assert value(m, "cortex_process_cpu_seconds_total") > 0
    assert value(m, "cortex_process_open_fds") >= 3
