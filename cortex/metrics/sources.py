"""Scrape-time sources of ``CortexMetrics``: what Cortex already counts elsewhere, read when
``/metrics`` is scraped and written as text families.

Rules:

* Read at scrape time, never mirrored: a source is a zero-argument callable returning the live
  objects — event-stream counters (``IngestCounters`` per worker/rank), ledger state and sizes
  (``LedgerFigures``), worker load (``WorkerView``s, i.e. ``PendingWork.views``), the data
  plane's ``ServerCounters``, the worker monitor's counters, the upstream pool's stats, the PD
  orchestrator's and admission's counters; and the process's own RSS, CPU time and open
  descriptors (``cortex_process_*``, from ``/proc``).
* Each ``*_writer(source)`` wraps a source in a ``Writer`` without calling it; the source is
  called when the writer runs, at scrape time. Names carry their unit, counters end in
  ``_total``, every family has a HELP line; a per-worker figure that is ``None`` (an engine
  figure not reported) is absent, never 0.
* Label values are configured names (worker, model) and ranks, so cardinality stays bounded.
* Single thread: sources and writers run on the trio thread that owns the request path. No
  trio here; the only I/O is reading ``/proc/self``.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from cortex.events.counters import IngestCounters
from cortex.ledger.book import LedgerBook
from cortex.ledger.state import TargetState
from cortex.metrics.text import TextWriter, format_labels
from cortex.scheduling.view import WorkerView

__all__ = ["INGEST_HELP", "HttpFigures", "HttpSource", "IngestSource", "LedgerFigures",
           "LedgerSource", "ModelSource", "PoolFigures", "PoolSource", "ProbeFigures",
           "ProbeSource", "TargetFigures", "WorkerSource", "Writer", "admission_writer",
           "chat_render_writer", "http_writer", "ingest_writer", "ledger_figures",
           "ledger_writer", "model_writer", "pd_writer", "pool_writer", "probe_writer",
           "replica_writer", "tokenizer_writer", "worker_writer", "write_process"]

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
    # SGLang's one-token pages folded into blocks (cortex.ledger.page_fold), all models:
    fold_tokens: int = 0  # tokens the fold index remembers
    fold_memory_bytes: int = 0
    fold_forgotten: int = 0  # tokens dropped with an old generation since start
    fold_conflicts: int = 0  # stores refused: a token found at another position than its path's

    def as_json(self) -> dict[str, object]:
        return {
            "nodes": self.nodes, "entries": self.entries, "memory_bytes": self.memory_bytes,
            "evicted_entries": self.evicted_entries,
            "warm_start_failures": self.warm_start_failures,
            "fold_tokens": self.fold_tokens, "fold_memory_bytes": self.fold_memory_bytes,
            "fold_forgotten": self.fold_forgotten, "fold_conflicts": self.fold_conflicts,
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
    folds = book.folds.values()
    return LedgerFigures(tuple(targets), book.nodes, book.entries, book.memory_bytes,
                         book.evicted_entries, book.warm_start_failures,
                         sum(f.entries for f in folds), sum(f.memory_bytes for f in folds),
                         sum(f.forgotten for f in folds), sum(f.conflicts for f in folds))


class HttpFigures(Protocol):
    """What the data plane's server counts (its ``ServerCounters``), read at scrape time."""

    connections_opened: int
    connections_open: int
    requests: int
    bad_requests_by_reason: Mapping[str, int]
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


def ingest_writer(source: IngestSource) -> Writer:
    def write(out: TextWriter) -> None:
        rows = [(format_labels(("worker", "rank"), (worker, str(rank))), counters)
                for worker, rank, counters in source()]
        for field, text in INGEST_HELP.items():
            name = f"cortex_events_{field}_total"
            out.header(name, "counter", text)
            for labels, counters in rows:
                out.sample(name, labels, getattr(counters, field))
    return write


def ledger_writer(source: LedgerSource) -> Writer:
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
                 figures.memory_bytes),
                ("cortex_ledger_fold_tokens", ("Tokens the fold of SGLang's one-token pages "
                 "remembers (all models)"), figures.fold_tokens),
                ("cortex_ledger_fold_memory_bytes", ("Memory held by the fold of SGLang's "
                 "one-token pages"), figures.fold_memory_bytes)):
            out.header(name, "gauge", text)
            out.sample(name, "", value)
        for name, text, value in (
                ("cortex_ledger_fold_forgotten_total", ("Tokens the page fold forgot with an old "
                 "generation (stores continuing them are then skipped: misses only)"),
                 figures.fold_forgotten),
                ("cortex_ledger_fold_conflicts_total", ("Page-size-1 stores refused: a token met "
                 "at another position than its path says"), figures.fold_conflicts)):
            out.header(name, "counter", text)
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


def worker_writer(source: WorkerSource) -> Writer:
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


def probe_writer(source: ProbeSource) -> Writer:
    """The worker monitor's per-worker counters (probes, breaker, load polls)."""
    return _named_writer(source, _PROBE_COUNTERS)


def pool_writer(source: PoolSource) -> Writer:
    """The upstream pool's per-worker connection figures."""
    return _named_writer(source, _POOL_FIGURES)


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


def _unlabelled_writer(source: Callable[[], object],
                       table: tuple[tuple[str, str, str, str], ...]) -> Writer:
    def write(out: TextWriter) -> None:
        _per_worker([("", source())], out, table)
    return write


def pd_writer(source: Callable[[], object]) -> Writer:
    """The PD orchestrator's outcome counters (``PdCounters``)."""
    return _unlabelled_writer(source, _PD_COUNTERS)


_REPLICA_FIGURES = (
    ("peers", "cortex_replica_peers", "gauge", "Other Cortex replicas in this one's view"),
    ("peer_requests", "cortex_replica_peer_requests", "gauge",
     "Requests other replicas told they have in flight, counted in this one's cost"),
    ("sent", "cortex_replica_messages_sent_total", "counter",
     "Replica-sync messages published (requests routed, prefills done, ends, heartbeats)"),
    ("dropped", "cortex_replica_messages_dropped_total", "counter",
     "Replica-sync messages not published: a peer's queue was full"),
    ("coalesced", "cortex_replica_messages_coalesced_total", "counter",
     "Replica-sync messages not published: the request came and went within one batch"),
    ("received", "cortex_replica_messages_received_total", "counter",
     "Replica-sync messages received from peers"),
    ("invalid", "cortex_replica_messages_invalid_total", "counter",
     "Replica-sync batches that could not be decoded (skipped)"),
    ("foreign", "cortex_replica_messages_foreign_total", "counter",
     "Replica-sync messages about a model this replica does not serve (skipped)"),
)


def replica_writer(source: Callable[[], object]) -> Writer:
    """Replica sync's view and counters (an object with ``_REPLICA_FIGURES``' attributes)."""
    return _unlabelled_writer(source, _REPLICA_FIGURES)


_PROCESS_FIGURES = (
    ("configured", "cortex_processes", "gauge",
     "Processes of this service (server.processes), each a replica on the data-plane port"),
    ("serving", "cortex_processes_serving", "gauge", "Processes of this service serving now"),
    ("restarts", "cortex_process_restarts_total", "counter",
     "Processes started again after they ended or stopped answering"),
    ("scrape_failures", "cortex_process_scrape_failures_total", "counter",
     "Times a process's metrics were left out of /metrics (it did not answer in time)"),
)


def process_writer(source: Callable[[], object]) -> Writer:
    """The processes of ``server.processes`` (``ProcessGroup.figures``)."""
    return _unlabelled_writer(source, _PROCESS_FIGURES)


def admission_writer(source: Callable[[], Iterable[tuple[str, object]]]) -> Writer:
    """Each model's admission counters (``(model, AdmissionCounters)`` pairs)."""
    return _labelled_writer("model", source, _ADMISSION_COUNTERS)


def http_writer(source: HttpSource) -> Writer:
    def write(out: TextWriter) -> None:
        figures = source()
        _per_worker([("", figures)], out, _HTTP_FIGURES)
        out.header("cortex_http_responses_total", "counter", "Responses sent, by status code")
        for code, count in sorted(figures.responses_by_status.items()):
            out.sample("cortex_http_responses_total", f'{{code="{code}"}}', count)
        name = "cortex_http_bad_requests_total"
        out.header(name, "counter", "Requests Cortex answered 400 itself, by reason (malformed "
                   "HTTP, body or fields: cortex.errors.BAD_REQUEST_REASONS)")
        for reason, count in sorted(figures.bad_requests_by_reason.items()):
            out.sample(name, format_labels(("reason",), (reason,)), count)
    return write


def model_writer(source: ModelSource) -> Writer:
    def write(out: TextWriter) -> None:
        name = "cortex_model_exact_routing"
        out.header(name, "gauge", "1 if exact KV routing is on for the model, 0 if it is off "
                   "(the reason is in /health/ready and the logs)")
        for model, off_reason in source():
            out.sample(name, format_labels(("model",), (model,)), 0 if off_reason else 1)
    return write


def tokenizer_writer(source: Callable[[], Iterable[tuple[str, object]]]) -> Writer:
    """Which BPE encodes each model's new text (``(model, ExactBpe)`` pairs)."""
    def write(out: TextWriter) -> None:
        rows = list(source())
        name = "cortex_tokenizer_backend"
        out.header(name, "gauge", "1 for the library that encodes the model's new text: "
                   "fastokens once its start check gave tokenizers' ids on every text, else "
                   "tokenizers (the reason is in the logs)")
        for model, bpe in rows:
            for backend in ("fastokens", "tokenizers"):
                out.sample(name, format_labels(("model", "backend"), (model, backend)),
                           1 if getattr(bpe, "backend", None) == backend else 0)
        name = "cortex_tokenizer_fallbacks_total"
        out.header(name, "counter", "Encodes fastokens failed (a PCRE2 limit on a "
                   "pathological text) and tokenizers did instead")
        for model, bpe in rows:
            out.sample(name, format_labels(("model",), (model,)), getattr(bpe, "fallbacks", 0))
    return write


def chat_render_writer(source: Callable[[], Iterable[tuple[str, object]]]) -> Writer:
    """How each model's chat templates rendered (``(model, ChatTemplate)`` pairs)."""
    def write(out: TextWriter) -> None:
        name = "cortex_chat_renders_total"
        out.header(name, "counter", "Chat renders by kind: same (the conversation seen whole), "
                   "window (only messages not seen before rendered), full (nothing cached to "
                   "start from), short (cheaper whole than through the cache), fallback "
                   "(media, or the cache off), whole (a template not "
                   "shown to render messages locally: the reason is in the logs)")
        totals: dict[tuple[str, str], int] = {}
        for model, template in source():
            cache = getattr(template, "cache", None)
            counts = ({"whole": getattr(template, "renders", 0)} if cache is None
                      else cache.renders)
            for kind, count in counts.items():
                totals[model, kind] = totals.get((model, kind), 0) + count
        for (model, kind), count in sorted(totals.items()):
            out.sample(name, format_labels(("model", "kind"), (model, kind)), count)
    return write


_PAGE_BYTES = resource.getpagesize()
_STARTED_AT = time.time()


def write_process(out: TextWriter) -> None:
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

