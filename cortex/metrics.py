"""Every ``cortex_*`` Prometheus metric, in one place.

Rules:

* One ``CortexMetrics`` per process (tests make many); nothing is global, two instances never
  share a value. ``render()`` is the ``/metrics`` body (text format 0.0.4); passing a
  ``prometheus_client.CollectorRegistry`` also exposes the same families through it.
* Names carry their unit (``_seconds``, ``_bytes``, ``_tokens``, ``_ratio``) and counters end in
  ``_total``; every metric has a HELP line.
* What Cortex already counts elsewhere is *read at scrape time*, never mirrored: event-stream
  counters (``IngestCounters`` per worker/rank), ledger state and sizes (``LedgerFigures``),
  worker load (``WorkerView``s, i.e. ``PendingWork.views``), the data plane's ``ServerCounters``,
  the worker monitor's counters and the upstream pool's stats; and the process's own RSS, CPU
  time and open descriptors (``cortex_process_*``, from ``/proc``). A source is a zero-argument
  callable returning the live objects; ``watch_*`` registers it without calling it.
* What only the request path knows (decisions, timings, cached-token accuracy, upstream errors,
  retries) is recorded through the methods here, at well under a microsecond each
  (``metrics_text``: plain dicts, no locks). Label values come from small fixed vocabularies
  (mode, ``REASONS``, ``PHASES``) or configured names (model, worker), so cardinality stays
  bounded; a free sentence never becomes a label.
* Single thread: recording, sources and rendering all run on the trio thread that owns the
  request path (the control plane's ASGI app runs there too). No trio, no I/O here.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, get_args

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from cortex import __version__
from cortex.events.counters import IngestCounters
from cortex.ledger.book import LedgerBook
from cortex.ledger.state import TargetState
from cortex.metrics_text import (
    CONTENT_TYPE,
    CounterFamily,
    GaugeFamily,
    HistogramFamily,
    TextWriter,
    format_labels,
)
from cortex.scheduling.decision import Decision, Mode
from cortex.scheduling.view import WorkerView
from cortex.upstream.errors import Phase

__all__ = ["CONTENT_TYPE", "CortexMetrics", "LedgerFigures", "TargetFigures", "ledger_figures",
           "reason_code", "REASONS", "PHASES", "RETRY_PHASES"]

# Why a decision went where it went: the scheduler's sentence, reduced to a fixed word.
REASONS = ("longest_hit", "least_cost", "over_cap", "no_hit", "p2c", "round_robin", "ring",
           "ring_spill", "other")
# Where an upstream exchange failed (``cortex.upstream.errors.Phase``): waiting for a connection
# slot, connecting, sending, waiting for the response head — all before the first response byte,
# so retryable — or reading the body (never retried).
PHASES: tuple[str, ...] = get_args(Phase)
RETRY_PHASES = tuple(phase for phase in PHASES if phase != "body")
_MODE_VALUE = {mode: mode.value for mode in Mode}  # Enum.value is a slow descriptor
_MODE_LABELS = {mode: (mode.value,) for mode in Mode}

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
    "snapshot_continued": "Warm starts whose peer snapshot the engine's replay continued",
    "snapshot_discarded": "Warm starts whose peer snapshot could not be proved continuous",
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


_EXACT, _RING = Mode.EXACT_KV_EVENTS, Mode.CONSISTENT_HASH
_MODE_REASON = {Mode.LOAD_AWARE: "no_hit", Mode.FALLBACK_P2C: "p2c",
                Mode.FALLBACK_ROUND_ROBIN: "round_robin"}


def reason_code(decision: Decision) -> str:
    """The fixed word (one of ``REASONS``) for a decision's mode and sentence."""
    mode = decision.mode
    fixed = _MODE_REASON.get(mode)
    if fixed is not None:
        return fixed
    text = decision.reason
    if mode is _EXACT:
        if text.startswith("longest hit"):
            return "longest_hit"
        return "over_cap" if text.endswith("above the load cap") else "least_cost"
    if mode is _RING:
        return "ring_spill" if text.endswith("spilled") else "ring"
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
    evicted_entries: int = 0  # dropped by the entry budget since start (least recently touched)
    warm_start_failures: int = 0  # peer snapshots that could not be fetched or read

    def as_json(self) -> dict[str, object]:
        return {
            "nodes": self.nodes, "entries": self.entries, "memory_bytes": self.memory_bytes,
            "evicted_entries": self.evicted_entries,
            "warm_start_failures": self.warm_start_failures,
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
    return LedgerFigures(tuple(targets), book.nodes, book.entries, book.memory_bytes,
                         book.evicted_entries, book.warm_start_failures)


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


class ProbeFigures(Protocol):
    """What the worker monitor counts per worker (its ``WorkerCounters``)."""

    probes: int
    probe_failures: int
    upstream_failures: int
    breaker_opens: int
    load_polls: int
    load_failures: int
    load_parse_errors: int


class PoolFigures(Protocol):
    """The upstream pool's figures for one worker (its ``PoolStats``)."""

    open: int
    idle: int
    busy: int
    created: int
    reused: int
    discarded: int


IngestSource = Callable[[], Iterable[tuple[str, int, IngestCounters]]]
LedgerSource = Callable[[], LedgerFigures]
WorkerSource = Callable[[], Iterable[WorkerView]]
HttpSource = Callable[[], HttpFigures]
ProbeSource = Callable[[], Iterable[tuple[str, ProbeFigures]]]
PoolSource = Callable[[], Iterable[tuple[str, PoolFigures]]]
# (model, why exact routing is off or None) — e.g. ``ProfileSet.exact_routing_off`` per model
ModelSource = Callable[[], Iterable[tuple[str, str | None]]]


Writer = Callable[[TextWriter], None]


def _ingest_writer(source: IngestSource) -> Writer:
    def write(out: TextWriter) -> None:
        rows = [(format_labels(("worker", "rank"), (worker, str(rank))), counters)
                for worker, rank, counters in source()]
        for field, text in INGEST_HELP.items():
            name = f"cortex_events_{field}_total"
            out.header(name, "counter", text)
            for labels, counters in rows:
                out.sample(name, labels, getattr(counters, field))
    return write


def _ledger_writer(source: LedgerSource) -> Writer:
    def write(out: TextWriter) -> None:
        figures = source()
        out.header("cortex_ledger_state", "gauge",
                   "Trust state of a worker rank's ledger (1 for the current state)")
        for t in figures.targets:
            for each in TargetState:
                out.sample("cortex_ledger_state", format_labels(
                    ("worker", "rank", "state"), (t.worker, str(t.rank), each.value)),
                    1 if each is t.state else 0)
        out.header("cortex_ledger_target_entries", "gauge", "Ledger entries of a worker rank")
        for t in figures.targets:
            out.sample("cortex_ledger_target_entries",
                       format_labels(("worker", "rank"), (t.worker, str(t.rank))), t.entries)
        for name, text, value in (
                ("cortex_ledger_entries", "Ledger entries (block, worker rank)", figures.entries),
                ("cortex_ledger_nodes", "Ledger tree nodes (distinct blocks)", figures.nodes),
                ("cortex_ledger_memory_bytes", "Memory held by the ledger trees",
                 figures.memory_bytes)):
            out.header(name, "gauge", text)
            out.sample(name, "", value)
        out.header("cortex_ledger_evicted_entries_total", "counter",
                   "Ledger entries evicted by the entry budget (least recently touched first)")
        out.sample("cortex_ledger_evicted_entries_total", "", figures.evicted_entries)
        out.header("cortex_ledger_warm_start_failures_total", "counter",
                   "Peer ledger snapshots that could not be fetched or read at start")
        out.sample("cortex_ledger_warm_start_failures_total", "", figures.warm_start_failures)
    return write


def _per_worker(rows: list[tuple[str, object]], out: TextWriter,
                table: tuple[tuple[str, str, str, str], ...]) -> None:
    for attr, name, kind, text in table:
        out.header(name, kind, text)
        for labels, obj in rows:
            value = getattr(obj, attr)
            if value is not None:  # an engine figure not reported is absent, never 0
                out.sample(name, labels, value)


_WORKER_GAUGES = (
    ("in_flight", "cortex_worker_in_flight", "gauge", "Requests Cortex has in flight on it"),
    ("queued_prefill_tokens", "cortex_worker_queued_prefill_tokens", "gauge",
     "Uncached prompt tokens Cortex sent it that are not prefilled yet"),
    ("healthy", "cortex_worker_healthy", "gauge", "1 if the worker is healthy"),
    ("engine_queue", "cortex_worker_engine_queue", "gauge",
     "Requests the engine reports waiting (absent if unknown)"),
    ("kv_usage", "cortex_worker_kv_usage_ratio", "gauge",
     "KV-cache usage the engine reports, 0..1 (absent if unknown)"),
)
_PROBE_COUNTERS = (
    ("probes", "cortex_worker_probes_total", "counter", "Health probes finished"),
    ("probe_failures", "cortex_worker_probe_failures_total", "counter",
     "Health probes that failed"),
    ("upstream_failures", "cortex_worker_connect_failures_total", "counter",
     "Upstream connections to the worker that could not be opened"),
    ("breaker_opens", "cortex_worker_breaker_opens_total", "counter",
     "Times the worker's circuit breaker opened"),
    ("load_polls", "cortex_worker_load_polls_total", "counter", "Load polls finished"),
    ("load_failures", "cortex_worker_load_poll_failures_total", "counter",
     "Load polls whose request failed"),
    ("load_parse_errors", "cortex_worker_load_parse_errors_total", "counter",
     "Load reports that did not parse"),
)
_POOL_FIGURES = (
    ("open", "cortex_upstream_connections_open", "gauge",
     "Upstream connections open (idle + busy)"),
    ("idle", "cortex_upstream_connections_idle", "gauge", "Idle keep-alive upstream connections"),
    ("busy", "cortex_upstream_connections_busy", "gauge",
     "Upstream connections carrying an exchange"),
    ("created", "cortex_upstream_connections_created_total", "counter",
     "Upstream connections opened"),
    ("reused", "cortex_upstream_connections_reused_total", "counter",
     "Exchanges that ran on an already used connection"),
    ("discarded", "cortex_upstream_connections_discarded_total", "counter",
     "Upstream connections closed by the pool (broken, incomplete, reaped, over cap)"),
)
_HTTP_FIGURES = (
    ("connections_opened", "cortex_http_connections_opened_total", "counter",
     "Client connections accepted"),
    ("connections_open", "cortex_http_connections_open", "gauge", "Client connections open"),
    ("requests", "cortex_http_requests_total", "counter", "Requests read completely"),
    ("bad_requests", "cortex_http_bad_requests_total", "counter",
     "Malformed requests answered 400"),
    ("too_large", "cortex_http_too_large_total", "counter",
     "Requests refused for their size (413/431)"),
    ("header_timeouts", "cortex_http_header_timeouts_total", "counter",
     "Connections closed waiting for a request head"),
    ("body_timeouts", "cortex_http_body_timeouts_total", "counter",
     "Connections closed waiting for a request body"),
    ("client_gone", "cortex_http_client_disconnects_total", "counter",
     "Clients gone before their response ended"),
    ("handler_errors", "cortex_http_handler_errors_total", "counter",
     "Requests answered 500 because of a bug"),
)


def _worker_writer(source: WorkerSource) -> Writer:
    def write(out: TextWriter) -> None:
        rows = [(format_labels(("worker",), (v.worker,)), v) for v in source()]
        _per_worker(rows, out, _WORKER_GAUGES)
    return write


def _named_writer(source: Callable[[], Iterable[tuple[str, object]]],
                  table: tuple[tuple[str, str, str, str], ...]) -> Writer:
    def write(out: TextWriter) -> None:
        rows = [(format_labels(("worker",), (worker,)), obj) for worker, obj in source()]
        _per_worker(rows, out, table)
    return write


_PD_COUNTERS = (
    ("served", "cortex_pd_served_total", "counter",
     "Requests answered through a prefill/decode pair"),
    ("bypassed", "cortex_pd_bypassed_total", "counter",
     "PD requests served by decode alone because it held the prefix"),
    ("retried_prefill", "cortex_pd_prefill_failures_total", "counter",
     "Prefill legs that failed before the first byte (the pair was retried or fell back)"),
    ("retried_decode", "cortex_pd_decode_failures_total", "counter",
     "Decode legs that failed before the first byte (the pair was retried or fell back)"),
    ("fallback_both", "cortex_pd_fallback_both_total", "counter",
     "PD requests served by a `both` worker after the PD legs failed"),
    ("failed", "cortex_pd_failed_total", "counter",
     "PD requests that ended with an error before their first byte"),
)
_ADMISSION_COUNTERS = (
    ("waited", "cortex_admission_waited_total", "counter",
     "Requests that found every worker above a watermark and waited for capacity"),
    ("admitted_after_wait", "cortex_admission_admitted_total", "counter",
     "Waiting requests that got capacity before their deadline"),
    ("rejected_queue_full", "cortex_admission_rejected_total", "counter",
     "Requests refused with 429: the admission queue was full"),
    ("timed_out", "cortex_admission_timed_out_total", "counter",
     "Requests refused with 503 after waiting out their deadline"),
)


def _labelled_writer(label: str, source: Callable[[], Iterable[tuple[str, object]]],
                     table: tuple[tuple[str, str, str, str], ...]) -> Writer:
    def write(out: TextWriter) -> None:
        rows = [(format_labels((label,), (name,)), obj) for name, obj in source()]
        _per_worker(rows, out, table)
    return write


def _http_writer(source: HttpSource) -> Writer:
    def write(out: TextWriter) -> None:
        figures = source()
        _per_worker([("", figures)], out, _HTTP_FIGURES)
        out.header("cortex_http_responses_total", "counter", "Responses sent, by status code")
        for code, count in sorted(figures.responses_by_status.items()):
            out.sample("cortex_http_responses_total", f'{{code="{code}"}}', count)
    return write


def _model_writer(source: ModelSource) -> Writer:
    def write(out: TextWriter) -> None:
        name = "cortex_model_exact_routing"
        out.header(name, "gauge", "1 if exact KV routing is on for the model, 0 if it is off "
                   "(the reason is in /health/ready and the logs)")
        for model, off_reason in source():
            out.sample(name, format_labels(("model",), (model,)), 0 if off_reason else 1)
    return write


_PAGE_BYTES = resource.getpagesize()
_STARTED_AT = time.time()


def _write_process(out: TextWriter) -> None:
    """Resident memory, CPU time, open descriptors (Linux ``/proc``; absent elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as handle:
            resident = int(handle.read().split()[1]) * _PAGE_BYTES
        fds = len(os.listdir("/proc/self/fd"))
    except (OSError, ValueError, IndexError):
        resident = fds = None
    times = os.times()
    rows = (("cortex_process_cpu_seconds_total", "counter", "CPU time (user + system)",
             times.user + times.system),
            ("cortex_process_resident_memory_bytes", "gauge", "Resident set size", resident),
            ("cortex_process_open_fds", "gauge", "Open file descriptors", fds),
            ("cortex_process_start_time_seconds", "gauge",
             "When Cortex's metrics were loaded (about the process start), Unix time",
             _STARTED_AT))
    for name, kind, text, value in rows:
        if value is not None:
            out.header(name, kind, text)
            out.sample(name, "", value)


class _RegistryView:
    """Exposes a ``CortexMetrics`` through a ``prometheus_client`` registry (compatibility)."""

    def __init__(self, metrics: CortexMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> list:
        return []  # registering reads nothing

    def collect(self):  # type: ignore[no-untyped-def]
        return text_string_to_metric_families(self._metrics.render().decode())


# ---------------------------------------------------------------------- the metrics


class CortexMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self._route = HistogramFamily("cortex_route_seconds",
                                      "Time from parsed request to routing decision, by mode",
                                      _LATENCY_BUCKETS, ("mode",))
        self._tokenize = HistogramFamily("cortex_tokenize_seconds",
                                         "Time to render and tokenize one prompt",
                                         _TOKENIZE_BUCKETS)
        self._hash = HistogramFamily("cortex_hash_seconds",
                                     "Time to compute one prompt's block keys", _HASH_BUCKETS)
        self._decisions = CounterFamily("cortex_decisions_total",
                                        "Routing decisions by model, mode and reason",
                                        ("model", "mode", "reason"))
        self._no_worker = CounterFamily("cortex_no_worker_total",
                                        "Requests refused because no worker could take them",
                                        ("model",))
        self._predicted = CounterFamily("cortex_cached_tokens_predicted_total",
                                        "Prompt tokens the ledger predicted cached, for "
                                        "requests whose engine reported cached tokens",
                                        ("model",))
        self._reported = CounterFamily("cortex_cached_tokens_reported_total",
                                       "Prompt tokens the engines reported cached", ("model",))
        self._error = HistogramFamily("cortex_cached_tokens_error",
                                      "Predicted minus engine-reported cached tokens, per "
                                      "request (no _sum: the bias is predicted_total - "
                                      "reported_total)", _TOKEN_ERROR_BUCKETS, ("model",))
        self._prompt = CounterFamily("cortex_prompt_tokens_total",
                                     "Prompt tokens (Cortex's count) of the requests whose "
                                     "engine reported cached tokens: the real hit rate is "
                                     "cached_tokens_reported_total / this, per model",
                                     ("model",))
        self._exact = CounterFamily("cortex_cached_tokens_exact_total",
                                    "Requests whose predicted cached tokens equal the reported",
                                    ("model",))
        self._upstream_errors = CounterFamily("cortex_upstream_errors_total",
                                              "Failed upstream exchanges by worker and phase",
                                              ("worker", "phase"))
        self._retries = CounterFamily("cortex_retries_total",
                                      "Requests sent to another worker after a failure before "
                                      "the first byte, by the phase that failed", ("phase",))
        build = GaugeFamily("cortex_build_info", "Cortex build (value is always 1)", ("version",))
        build.set((__version__,), 1)
        self._families = (build, self._route, self._tokenize, self._hash, self._decisions,
                          self._no_worker, self._predicted, self._reported, self._prompt,
                          self._error,
                          self._exact, self._upstream_errors, self._retries)
        self._writers: list[Writer] = [_write_process]
        if registry is not None:
            registry.register(_RegistryView(self))

    def render(self) -> bytes:
        """The ``/metrics`` body, text format 0.0.4 (``CONTENT_TYPE``)."""
        out = TextWriter()
        for family in self._families:
            family.write(out)
        for write in self._writers:
            write(out)
        return out.text().encode()

    # ------------------------------------------------------------- request path

    def observe_route(self, mode: Mode | str, seconds: float) -> None:
        """Decision latency; ``mode`` is the decision's mode, or ``"none"`` if none was found."""
        labels = _MODE_LABELS.get(mode)  # type: ignore[call-overload]
        self._route.observe(labels if labels is not None else (mode,), seconds)

    def observe_tokenize(self, seconds: float) -> None:
        self._tokenize.observe((), seconds)

    def observe_hash(self, seconds: float) -> None:
        self._hash.observe((), seconds)

    def record_decision(self, model: str, decision: Decision) -> None:
        self._decisions.inc((model, _MODE_VALUE[decision.mode], reason_code(decision)))

    def record_no_worker(self, model: str) -> None:
        self._no_worker.inc((model,))

    def record_cached_tokens(self, model: str, predicted: int, reported: int,
                             prompt_tokens: int | None = None) -> None:
        """One request whose engine reported its cached prompt tokens (``prompt_tokens``:
        Cortex's count of the prompt, ``None`` when it was not tokenized)."""
        labels = (model,)
        self._predicted.inc(labels, predicted)
        self._reported.inc(labels, reported)
        if prompt_tokens is not None:
            self._prompt.inc(labels, prompt_tokens)
        self._error.observe(labels, predicted - reported)
        if predicted == reported:
            self._exact.inc(labels)

    def record_upstream_error(self, worker: str, phase: str) -> None:
        if phase not in PHASES:
            raise ValueError(f"unknown upstream phase {phase!r}; one of {PHASES}")
        self._upstream_errors.inc((worker, phase))

    def record_retry(self, phase: str) -> None:
        if phase not in RETRY_PHASES:
            raise ValueError(f"a retry follows a failure before the first byte, not {phase!r}")
        self._retries.inc((phase,))

    def forget_worker(self, worker: str) -> None:
        """Drop a removed worker's upstream-error series."""
        for phase in PHASES:
            self._upstream_errors.remove((worker, phase))

    # ------------------------------------------------------------- scrape-time sources

    def watch_ingest(self, source: IngestSource) -> None:
        """Export ``(worker, rank, IngestCounters)`` triples as ``cortex_events_*_total``."""
        self._writers.append(_ingest_writer(source))

    def watch_ledger(self, source: LedgerSource) -> None:
        """Export ledger states per worker/rank and the ledger's sizes."""
        self._writers.append(_ledger_writer(source))

    def watch_workers(self, source: WorkerSource) -> None:
        """Export worker load and health from views (e.g. ``PendingWork.views``)."""
        self._writers.append(_worker_writer(source))

    def watch_http(self, source: HttpSource) -> None:
        """Export the data plane's server counters."""
        self._writers.append(_http_writer(source))

    def watch_probes(self, source: ProbeSource) -> None:
        """Export the worker monitor's per-worker counters (probes, breaker, load polls)."""
        self._writers.append(_named_writer(source, _PROBE_COUNTERS))

    def watch_models(self, source: ModelSource) -> None:
        """Export whether exact KV routing is on per model."""
        self._writers.append(_model_writer(source))

    def watch_pd(self, source: Callable[[], object]) -> None:
        """Export the PD orchestrator's outcome counters (``PdCounters``)."""
        def write(out: TextWriter) -> None:
            _per_worker([("", source())], out, _PD_COUNTERS)
        self._writers.append(write)

    def watch_admission(self, source: Callable[[], Iterable[tuple[str, object]]]) -> None:
        """Export each model's admission counters (``(model, AdmissionCounters)`` pairs)."""
        self._writers.append(_labelled_writer("model", source, _ADMISSION_COUNTERS))

    def watch_upstream_pool(self, source: PoolSource) -> None:
        """Export the upstream pool's per-worker connection figures."""
        self._writers.append(_named_writer(source, _POOL_FIGURES))
