"""Every ``cortex_*`` Prometheus metric, in one place.

Rules:

* One ``CortexMetrics`` per process (tests make many): each owns its registry, so nothing is
  registered globally and two instances never collide.
* Names carry their unit (``_seconds``, ``_bytes``, ``_tokens``, ``_ratio``) and counters end in
  ``_total``; every metric has a HELP line.
* What Cortex already counts elsewhere is *read at scrape time* by a custom collector, never
  mirrored: event-stream counters (``IngestCounters`` per worker/rank), ledger state and sizes
  (``LedgerFigures``), worker load (``WorkerView``s, i.e. ``PendingWork.views``) and the data
  plane's HTTP counters. A source is a zero-argument callable returning the live objects; it
  runs on the scraping thread, which is the trio thread that owns them (the control plane's
  ASGI app runs there), so no lock is needed.
* What only the request path knows (decisions, timings, cached-token accuracy, upstream errors,
  retries) is recorded through the methods here. Label values come from small fixed
  vocabularies (mode, ``REASONS``, ``PHASES``) or configured names (model, worker), so
  cardinality stays bounded; a free sentence never becomes a label.
* No trio, no I/O: this module only shapes numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from cortex import __version__
from cortex.events.counters import IngestCounters
from cortex.ledger.book import LedgerBook
from cortex.ledger.state import TargetState
from cortex.scheduling.decision import Decision, Mode
from cortex.scheduling.view import WorkerView

# Why a decision went where it went: the scheduler's sentence, reduced to a fixed word.
REASONS = ("longest_hit", "least_cost", "over_cap", "no_hit", "p2c", "round_robin", "ring",
           "ring_spill", "other")
# Where an upstream exchange failed: before connecting, while sending the request, before the
# response head (all retryable), or after the first byte went to the client (never retried).
PHASES = ("connect", "request", "response_head", "stream")

_LATENCY_BUCKETS = (25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
                    50e-3, 0.1, 0.25, 1.0)
_TOKENIZE_BUCKETS = (50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3,
                     0.1, 0.25, 1.0)
_HASH_BUCKETS = (1e-6, 2.5e-6, 5e-6, 10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 1e-3, 5e-3)
_TOKEN_ERROR_BUCKETS = (-4096, -1024, -256, -64, -16, -1, 0, 1, 16, 64, 256, 1024, 4096)

# IngestCounters field -> HELP text; every field is exported as cortex_events_<field>_total.
INGEST_HELP: dict[str, str] = {
    "messages": "Live KV-event messages received",
    "malformed_frames": "KV-event messages whose framing could not be parsed",
    "decode_errors": "KV-event payloads that failed to decode (their events are lost)",
    "unknown_events": "KV events with an unknown tag, skipped",
    "unknown_fields": "Unknown keys or trailing elements inside known KV events",
    "topic_mismatch": "KV-event messages whose topic does not match the subscription",
    "rank_mismatch": "Applied batches stamped with another DP rank than their source's",
    "duplicates": "Live batches seen again and dropped",
    "replay_overlap": "Live batches already applied from a replay, dropped",
    "gaps": "Sequence gaps detected in the event stream",
    "gaps_repaired": "Sequence gaps closed by replay",
    "gaps_unrepaired": "Sequence gaps that dropped the target's ledger entries",
    "restarts": "Publisher restarts (sequence number went backwards)",
    "replays": "Replay requests answered or timed out",
    "replay_refused": "Replay requests without any reply before the deadline",
    "replay_truncated": "Replay replies without end marker in time, or not contiguous",
    "replay_unrecoverable": "Replay replies starting after the requested sequence number",
    "batches_applied": "Event batches applied to the ledger",
    "stored_blocks": "Blocks of applied BlockStored events",
    "removed_blocks": "Held blocks removed by BlockRemoved events",
    "unknown_parent": "BlockStored events skipped because their parent was not held",
    "unknown_removal": "Removed block hashes the target did not hold",
    "duplicate_store": "Stores of a block hash the target already held",
    "skipped_non_main": "Stores of KV-cache groups that are not prefix blocks",
    "hash_conflict": "Held block hashes stored again with another key",
    "invalid_events": "Events the ledger could not use",
}


def reason_code(decision: Decision) -> str:
    """The fixed word (one of ``REASONS``) for a decision's mode and sentence."""
    mode, text = decision.mode, decision.reason
    if mode is Mode.EXACT_KV_EVENTS:
        if text.startswith("longest hit"):
            return "longest_hit"
        if "above the load cap" in text:
            return "over_cap"
        return "least_cost"
    if mode is Mode.LOAD_AWARE:
        return "no_hit"
    if mode is Mode.FALLBACK_P2C:
        return "p2c"
    if mode is Mode.FALLBACK_ROUND_ROBIN:
        return "round_robin"
    if mode is Mode.CONSISTENT_HASH:
        return "ring_spill" if "spilled" in text else "ring"
    return "other"


# ---------------------------------------------------------------------- scrape-time sources


@dataclass(frozen=True, slots=True)
class TargetFigures:
    worker: str
    rank: int
    state: TargetState
    reason: str
    entries: int


@dataclass(frozen=True, slots=True)
class LedgerFigures:
    """The ledger's sizes and per-(worker, rank) trust states at one instant."""

    targets: tuple[TargetFigures, ...]
    nodes: int
    entries: int
    memory_bytes: int

    def as_json(self) -> dict[str, object]:
        return {
            "nodes": self.nodes, "entries": self.entries, "memory_bytes": self.memory_bytes,
            "targets": [{"worker": t.worker, "rank": t.rank, "state": t.state.value,
                         "reason": t.reason, "entries": t.entries} for t in self.targets],
        }


def ledger_figures(book: LedgerBook) -> LedgerFigures:
    """Read a ``LedgerBook``'s figures (O(targets + trees))."""
    targets = []
    for target, state in sorted(book.states().items()):
        info = book.info(target)
        targets.append(TargetFigures(info.worker, info.rank, state, book.reason(target),
                                     book.target_entries(target)))
    targets.sort(key=lambda t: (t.worker, t.rank))
    return LedgerFigures(tuple(targets), book.nodes, book.entries, book.memory_bytes)


class HttpFigures(Protocol):
    """What the data plane's server counts (its ``ServerCounters``), read at scrape time."""

    connections_opened: int
    connections_open: int
    requests: int
    bad_requests: int
    too_large: int
    header_timeouts: int
    body_timeouts: int
    client_gone: int
    handler_errors: int
    responses_by_status: Mapping[int, int]


IngestSource = Callable[[], Iterable[tuple[str, int, IngestCounters]]]
LedgerSource = Callable[[], LedgerFigures]
WorkerSource = Callable[[], Iterable[WorkerView]]
HttpSource = Callable[[], HttpFigures]


class _SourceCollector:
    """A collector built from one source and a function turning it into metric families."""

    def __init__(self, build: Callable[[bool], list[Metric]]) -> None:
        self._build = build

    def describe(self) -> list[Metric]:
        return self._build(False)  # families without samples: registering reads no source

    def collect(self) -> list[Metric]:
        return self._build(True)


def _ingest_families(source: IngestSource, read: bool) -> list[Metric]:
    families = {name: CounterMetricFamily(f"cortex_events_{name}", text,
                                          labels=("worker", "rank"))
                for name, text in INGEST_HELP.items()}
    if read:
        for worker, rank, counters in source():
            labels = (worker, str(rank))
            for name, family in families.items():
                family.add_metric(labels, getattr(counters, name))
    return list(families.values())


def _ledger_families(source: LedgerSource, read: bool) -> list[Metric]:
    state = GaugeMetricFamily("cortex_ledger_state",
                              "Trust state of a worker rank's ledger (1 for the current state)",
                              labels=("worker", "rank", "state"))
    target_entries = GaugeMetricFamily("cortex_ledger_target_entries",
                                       "Ledger entries held by a worker rank",
                                       labels=("worker", "rank"))
    entries = GaugeMetricFamily("cortex_ledger_entries", "Ledger entries (block, worker rank)")
    nodes = GaugeMetricFamily("cortex_ledger_nodes", "Ledger tree nodes (distinct blocks)")
    memory = GaugeMetricFamily("cortex_ledger_memory_bytes", "Memory held by the ledger trees")
    if read:
        figures = source()
        for t in figures.targets:
            rank = str(t.rank)
            for each in TargetState:
                state.add_metric((t.worker, rank, each.value), 1 if each is t.state else 0)
            target_entries.add_metric((t.worker, rank), t.entries)
        entries.add_metric((), figures.entries)
        nodes.add_metric((), figures.nodes)
        memory.add_metric((), figures.memory_bytes)
    return [state, target_entries, entries, nodes, memory]


def _worker_families(source: WorkerSource, read: bool) -> list[Metric]:
    labels = ("worker",)
    in_flight = GaugeMetricFamily("cortex_worker_in_flight",
                                  "Requests Cortex has in flight on the worker", labels=labels)
    queued = GaugeMetricFamily("cortex_worker_queued_prefill_tokens",
                               "Uncached prompt tokens Cortex sent and the worker has not "
                               "prefilled yet", labels=labels)
    healthy = GaugeMetricFamily("cortex_worker_healthy", "1 if the worker is healthy",
                                labels=labels)
    engine_queue = GaugeMetricFamily("cortex_worker_engine_queue",
                                     "Requests the engine reports waiting (absent if unknown)",
                                     labels=labels)
    kv_usage = GaugeMetricFamily("cortex_worker_kv_usage_ratio",
                                 "KV-cache usage the engine reports, 0..1 (absent if unknown)",
                                 labels=labels)
    if read:
        for view in source():
            name = (view.worker,)
            in_flight.add_metric(name, view.in_flight)
            queued.add_metric(name, view.queued_prefill_tokens)
            healthy.add_metric(name, 1 if view.healthy else 0)
            if view.engine_queue is not None:
                engine_queue.add_metric(name, view.engine_queue)
            if view.kv_usage is not None:
                kv_usage.add_metric(name, view.kv_usage)
    return [in_flight, queued, healthy, engine_queue, kv_usage]


_HTTP_COUNTERS = (
    ("connections_opened", "cortex_http_connections_opened", "Client connections accepted"),
    ("requests", "cortex_http_requests", "Requests read completely"),
    ("bad_requests", "cortex_http_bad_requests", "Malformed requests answered 400"),
    ("too_large", "cortex_http_too_large", "Requests refused for their size (413/431)"),
    ("header_timeouts", "cortex_http_header_timeouts", "Connections closed waiting for a head"),
    ("body_timeouts", "cortex_http_body_timeouts", "Connections closed waiting for a body"),
    ("client_gone", "cortex_http_client_disconnects", "Clients gone before their response ended"),
    ("handler_errors", "cortex_http_handler_errors", "Requests answered 500 because of a bug"),
)


def _http_families(source: HttpSource, read: bool) -> list[Metric]:
    counters = [(attr, CounterMetricFamily(name, text)) for attr, name, text in _HTTP_COUNTERS]
    open_now = GaugeMetricFamily("cortex_http_connections_open", "Client connections open")
    responses = CounterMetricFamily("cortex_http_responses", "Responses sent, by status code",
                                    labels=("code",))
    if read:
        figures = source()
        for attr, family in counters:
            family.add_metric((), getattr(figures, attr))
        open_now.add_metric((), figures.connections_open)
        for code, count in sorted(figures.responses_by_status.items()):
            responses.add_metric((str(code),), count)
    return [family for _, family in counters] + [open_now, responses]


# ---------------------------------------------------------------------- the metrics


class CortexMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        Gauge("cortex_build_info", "Cortex build (value is always 1)", ("version",),
              registry=r).labels(__version__).set(1)
        self._route = Histogram("cortex_route_seconds",
                                "Time from parsed request to routing decision, by mode",
                                ("mode",), buckets=_LATENCY_BUCKETS, registry=r)
        self._tokenize = Histogram("cortex_tokenize_seconds",
                                   "Time to render and tokenize one prompt",
                                   buckets=_TOKENIZE_BUCKETS, registry=r)
        self._hash = Histogram("cortex_hash_seconds", "Time to compute one prompt's block keys",
                               buckets=_HASH_BUCKETS, registry=r)
        self._decisions = Counter("cortex_decisions_total",
                                  "Routing decisions by model, mode and reason",
                                  ("model", "mode", "reason"), registry=r)
        self._no_worker = Counter("cortex_no_worker_total",
                                  "Requests refused because no worker could take them",
                                  ("model",), registry=r)
        self._predicted = Counter("cortex_cached_tokens_predicted_total",
                                  "Prompt tokens the ledger predicted cached, for requests "
                                  "whose engine reported cached tokens", ("model",), registry=r)
        self._reported = Counter("cortex_cached_tokens_reported_total",
                                 "Prompt tokens the engines reported cached", ("model",),
                                 registry=r)
        self._error = Histogram("cortex_cached_tokens_error",
                                "Predicted minus engine-reported cached tokens, per request "
                                "(no _sum: the bias is predicted_total - reported_total)",
                                ("model",), buckets=_TOKEN_ERROR_BUCKETS, registry=r)
        self._exact = Counter("cortex_cached_tokens_exact_total",
                              "Requests whose predicted cached tokens equal the reported ones",
                              ("model",), registry=r)
        self._upstream_errors = Counter("cortex_upstream_errors_total",
                                        "Failed upstream exchanges by worker and phase",
                                        ("worker", "phase"), registry=r)
        self._retries = Counter("cortex_retries_total",
                                "Requests sent to another worker after a failure before the "
                                "first byte, by the phase that failed", ("phase",), registry=r)
        self._children: dict[tuple[object, ...], object] = {}

    # ------------------------------------------------------------- request path

    def observe_route(self, mode: Mode | str, seconds: float) -> None:
        """Decision latency; ``mode`` is the decision's mode, or ``"none"`` if none was found."""
        label = mode.value if isinstance(mode, Mode) else mode
        self._child(("route", label), self._route, label).observe(seconds)

    def observe_tokenize(self, seconds: float) -> None:
        self._tokenize.observe(seconds)

    def observe_hash(self, seconds: float) -> None:
        self._hash.observe(seconds)

    def record_decision(self, model: str, decision: Decision) -> None:
        mode, reason = decision.mode.value, reason_code(decision)
        self._child(("decision", model, mode, reason), self._decisions, model, mode,
                    reason).inc()

    def record_no_worker(self, model: str) -> None:
        self._no_worker.labels(model).inc()

    def record_cached_tokens(self, model: str, predicted: int, reported: int) -> None:
        """One request whose engine reported its cached prompt tokens."""
        self._predicted.labels(model).inc(predicted)
        self._reported.labels(model).inc(reported)
        self._error.labels(model).observe(predicted - reported)
        if predicted == reported:
            self._exact.labels(model).inc()

    def record_upstream_error(self, worker: str, phase: str) -> None:
        if phase not in PHASES:
            raise ValueError(f"unknown upstream phase {phase!r}; one of {PHASES}")
        self._upstream_errors.labels(worker, phase).inc()

    def record_retry(self, phase: str) -> None:
        if phase not in PHASES[:3]:
            raise ValueError(f"a retry follows a failure before the first byte, not {phase!r}")
        self._retries.labels(phase).inc()

    def forget_worker(self, worker: str) -> None:
        """Drop a removed worker's upstream-error series."""
        for phase in PHASES:
            try:
                self._upstream_errors.remove(worker, phase)
            except KeyError:
                pass

    def _child(self, key: tuple[object, ...], metric, *labels: str):  # type: ignore[no-untyped-def]
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    # ------------------------------------------------------------- scrape-time sources

    def watch_ingest(self, source: IngestSource) -> None:
        """Export ``(worker, rank, IngestCounters)`` triples as ``cortex_events_*_total``."""
        self.registry.register(_SourceCollector(lambda read: _ingest_families(source, read)))

    def watch_ledger(self, source: LedgerSource) -> None:
        """Export ledger states per worker/rank and the ledger's sizes."""
        self.registry.register(_SourceCollector(lambda read: _ledger_families(source, read)))

    def watch_workers(self, source: WorkerSource) -> None:
        """Export worker load and health from views (e.g. ``PendingWork.views``)."""
        self.registry.register(_SourceCollector(lambda read: _worker_families(source, read)))

    def watch_http(self, source: HttpSource) -> None:
        """Export the data plane's server counters."""
        self.registry.register(_SourceCollector(lambda read: _http_families(source, read)))

