"""Every ``cortex_*`` Prometheus metric, in one place.

Rules:

* One ``CortexMetrics`` per process (tests make many); nothing is global, two instances never
  share a value. ``render()`` is the ``/metrics`` body (text format 0.0.4); passing a
  ``prometheus_client.CollectorRegistry`` also exposes the same families through it.
* Names carry their unit (``_seconds``, ``_bytes``, ``_tokens``, ``_ratio``) and counters end in
  ``_total``; every metric has a HELP line.
* What Cortex already counts elsewhere is *read at scrape time*, never mirrored: ``watch_*``
  registers a source (a zero-argument callable returning the live objects) without calling it.
  The sources' shapes and writers live in ``cortex.metrics.sources``; ``LedgerFigures``,
  ``TargetFigures`` and ``ledger_figures`` are re-exported here for the control plane.
* What only the request path knows (decisions, timings, cached-token accuracy, upstream errors,
  retries) is recorded through the methods here, at well under a microsecond each
  (``cortex.metrics.text``: plain dicts, no locks). Label values come from small fixed vocabularies
  (mode, ``REASONS``, ``PHASES``) or configured names (model, worker), so cardinality stays
  bounded; a free sentence never becomes a label.
* Single thread: recording, sources and rendering all run on the trio thread that owns the
  request path (the control plane's ASGI app runs there too). No trio, no I/O here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import get_args

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from cortex import __version__
from cortex.metrics.sources import (
    HttpSource,
    IngestSource,
    LedgerFigures,
    LedgerSource,
    ModelSource,
    PoolSource,
    ProbeSource,
    TargetFigures,
    WorkerSource,
    Writer,
    admission_writer,
    chat_render_writer,
    http_writer,
    ingest_writer,
    ledger_figures,
    ledger_writer,
    model_writer,
    pd_writer,
    pool_writer,
    probe_writer,
    process_writer,
    replica_writer,
    tokenizer_writer,
    worker_writer,
    write_process,
)
from cortex.metrics.text import (
    CONTENT_TYPE,
    CounterFamily,
    GaugeFamily,
    HistogramFamily,
    TextWriter,
)
from cortex.prompt.unrenderable import REASONS as REASONS_UNRENDERABLE
from cortex.scheduling.decision import Decision, Mode
from cortex.upstream.errors import Phase

__all__ = [
    "CONTENT_TYPE",
    "PHASES",
    "REASONS",
    "RETRY_PHASES",
    "CortexMetrics",
    "LedgerFigures",
    "TargetFigures",
    "ledger_figures",
    "reason_code",
]

# Why a decision went where it went: the scheduler's sentence, reduced to a fixed word.
REASONS = ("longest_hit", "least_cost", "over_cap", "no_hit", "p2c", "round_robin", "ring",
           "ring_spill", "other")
# Where an upstream exchange failed (``cortex.upstream.errors.Phase``): waiting for a connection
# slot, connecting, sending, waiting for the response head — all before the first response byte,
# so retryable — or reading the body (never retried).
PHASES: tuple[str, ...] = get_args(Phase)
RETRY_PHASES = tuple(phase for phase in PHASES if phase != "body")
UNPREDICTED_REASONS = REASONS_UNRENDERABLE  # cortex.prompt.unrenderable: every reason's why
_MODE_VALUE = {mode: mode.value for mode in Mode}  # Enum.value is a slow descriptor
_MODE_LABELS = {mode: (mode.value,) for mode in Mode}

_LATENCY_BUCKETS = (25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
                    50e-3, 0.1, 0.25, 1.0)
_TOKENIZE_BUCKETS = (50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3,
                     0.1, 0.25, 1.0)
_HASH_BUCKETS = (1e-6, 2.5e-6, 5e-6, 10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 1e-3, 5e-3)
_TOKEN_ERROR_BUCKETS = (-4096, -1024, -256, -64, -16, -1, 0, 1, 16, 64, 256, 1024, 4096)


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
        self._upstream_errors = CounterFamily(
            "cortex_upstream_errors_total",
            "Failed upstream exchanges by worker, phase and the worker's status (429, 5xx; "
            "none: no status, e.g. refused, timed out, broken)", ("worker", "phase", "status"))
        self._retries = CounterFamily("cortex_retries_total",
                                      "Requests sent to another worker after a failure before "
                                      "the first byte, by the phase that failed", ("phase",))
        self._unpredicted = CounterFamily("cortex_unpredicted_total",
                                          "Requests routed by load without a prediction although "
                                          "their model routes exactly, by model and reason "
                                          f"({', '.join(UNPREDICTED_REASONS)})",
                                          ("model", "reason"))
        self._poisoned = CounterFamily(
            "cortex_poisoned_requests_total",
            "Requests whose failure followed them from worker to worker (two workers answered "
            "a 5xx other than 502/503/504): the engine's answer was relayed, nothing more "
            "retried and no worker's breaker counted it; by model and status",
            ("model", "status"))
        build = GaugeFamily("cortex_build_info", "Cortex build (value is always 1)", ("version",))
        build.set((__version__,), 1)
        self._families = (build, self._route, self._tokenize, self._hash, self._decisions,
                          self._no_worker, self._predicted, self._reported, self._prompt,
                          self._error,
                          self._exact, self._upstream_errors, self._retries,
                          self._poisoned, self._unpredicted)
        self._writers: list[Writer] = [write_process]
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

    def record_upstream_error(self, worker: str, phase: str, status: int | None = None) -> None:
        """``status``: the worker's failing answer (429 or 5xx), ``None`` without one."""
        if phase not in PHASES:
            raise ValueError(f"unknown upstream phase {phase!r}; one of {PHASES}")
        if status is not None and not (status == 429 or 500 <= status <= 599):
            raise ValueError(f"{status} is not a failing status")
        self._upstream_errors.inc((worker, phase, "none" if status is None else str(status)))

    def record_poisoned(self, model: str, status: int) -> None:
        """A request failed with ``status`` (a 5xx) on two workers: its own failure."""
        if not 500 <= status <= 599:
            raise ValueError(f"{status} is not a server error")
        self._poisoned.inc((model, str(status)))

    def record_unpredicted(self, model: str, reason: str) -> None:
        """A request of a model that routes exactly went by load only (``reason``)."""
        if reason not in UNPREDICTED_REASONS:
            raise ValueError(f"unknown reason {reason!r}; one of {UNPREDICTED_REASONS}")
        self._unpredicted.inc((model, reason))

    def record_retry(self, phase: str) -> None:
        if phase not in RETRY_PHASES:
            raise ValueError(f"a retry follows a failure before the first byte, not {phase!r}")
        self._retries.inc((phase,))

    def forget_worker(self, worker: str) -> None:
        """Drop a removed worker's upstream-error series."""
        for labels in [labels for labels in self._upstream_errors.values
                       if labels[0] == worker]:
            self._upstream_errors.remove(labels)

    # ------------------------------------------------------------- scrape-time sources

    def watch_ingest(self, source: IngestSource) -> None:
        """Export ``(worker, rank, IngestCounters)`` triples as ``cortex_events_*_total``."""
        self._writers.append(ingest_writer(source))

    def watch_ledger(self, source: LedgerSource) -> None:
        """Export ledger states per worker/rank and the ledger's sizes."""
        self._writers.append(ledger_writer(source))

    def watch_workers(self, source: WorkerSource) -> None:
        """Export worker load and health from views (e.g. ``PendingWork.views``)."""
        self._writers.append(worker_writer(source))

    def watch_http(self, source: HttpSource) -> None:
        """Export the data plane's server counters."""
        self._writers.append(http_writer(source))

    def watch_probes(self, source: ProbeSource) -> None:
        """Export the worker monitor's per-worker counters (probes, breaker, load polls)."""
        self._writers.append(probe_writer(source))

    def watch_models(self, source: ModelSource) -> None:
        """Export whether exact KV routing is on per model."""
        self._writers.append(model_writer(source))

    def watch_tokenizers(self, source: Callable[[], Iterable[tuple[str, object]]]) -> None:
        """Export which BPE encodes each model's new text (``(model, ExactBpe)`` pairs)."""
        self._writers.append(tokenizer_writer(source))

    def watch_chat_renders(self, source: Callable[[], Iterable[tuple[str, object]]]) -> None:
        """Export how each model's chat templates rendered (``(model, ChatTemplate)`` pairs)."""
        self._writers.append(chat_render_writer(source))

    def watch_pd(self, source: Callable[[], object]) -> None:
        """Export the PD orchestrator's outcome counters (``PdCounters``)."""
        self._writers.append(pd_writer(source))

    def watch_admission(self, source: Callable[[], Iterable[tuple[str, object]]]) -> None:
        """Export each model's admission counters (``(model, AdmissionCounters)`` pairs)."""
        self._writers.append(admission_writer(source))

    def watch_replicas(self, source: Callable[[], object]) -> None:
        """Export replica sync's view and counters (``ReplicaSync.figures``)."""
        self._writers.append(replica_writer(source))

    def watch_processes(self, source: Callable[[], object]) -> None:
        """Export the processes of ``server.processes`` (``ProcessGroup.figures``)."""
        self._writers.append(process_writer(source))

    def watch_upstream_pool(self, source: PoolSource) -> None:
        """Export the upstream pool's per-worker connection figures."""
        self._writers.append(pool_writer(source))
