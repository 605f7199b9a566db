"""What Cortex's ``/metrics`` really exposes, and the metric names a PromQL expression uses.

``exposed_series()`` builds a ``CortexMetrics`` with every scrape-time source registered and every
request-path method called once, renders it, and returns each series name (``_bucket``,
``_count`` ... included) with its label names. ``promql_names(expr)`` returns the metric names an
expression selects, and the label names it matches or groups on, so the packaged dashboard and
alert rules can be checked against the exposition (a renamed metric fails a test instead of
silently drawing an empty panel).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from cortex.events.counters import IngestCounters
from cortex.ledger.book import LedgerBook
from cortex.metrics.cortex_metrics import CortexMetrics, ledger_figures
from cortex.scheduling.decision import Decision, Mode
from cortex.scheduling.view import WorkerView
from cortex.upstream.connection_pool import PoolStats
from cortex.workers.health import WorkerCounters

# Labels Prometheus adds at scrape time, and histogram buckets' own.
SCRAPE_LABELS = frozenset({"job", "instance", "le"})

FUNCTIONS = frozenset(["abs", "absent", "absent_over_time", "avg_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min", "count_over_time", "day_of_month", "day_of_week", "delta", "deriv", "exp", "floor", "histogram_quantile", "holt_winters", "hour", "idelta", "increase", "irate", "label_join", "label_replace", "last_over_time", "ln", "log10", "log2", "max_over_time", "min_over_time", "minute", "month", "predict_linear", "quantile_over_time", "rate", "resets", "round", "scalar", "sgn", "sort", "sort_desc", "sqrt", "stddev_over_time", "stdvar_over_time", "sum_over_time", "time", "timestamp", "vector", "year", "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset", "inf", "nan"])


@dataclass
class _Http:
    connections_opened: int = 1
    connections_open: int = 1
    requests: int = 1
    bad_requests: int = 0
    too_large: int = 0
    header_timeouts: int = 0
    body_timeouts: int = 0
    client_gone: int = 0
    handler_errors: int = 0
    responses_by_status: dict[int, int] = field(default_factory=lambda: {200: 1})
    bad_requests_by_reason: dict[str, int] = field(default_factory=dict)


@dataclass
class _Pd:
    served: int = 1
    bypassed: int = 0
    retried_prefill: int = 0
    retried_decode: int = 0
    fallback_both: int = 0
    failed: int = 0


@dataclass
class _Admission:
    waited: int = 1
    admitted_after_wait: int = 1
    rejected_queue_full: int = 0
    timed_out: int = 0


def exposed_series() -> dict[str, frozenset[str]]:
    """Series name -> label names, from a real render with every source registered."""
    metrics = CortexMetrics()
    book = LedgerBook()
    from cortex.ledger.kv_events import EngineFamily

    book.register("w0", 0, EngineFamily.SGLANG, "m")
    metrics.watch_ingest(lambda: [("w0", 0, IngestCounters())])
    metrics.watch_ledger(lambda: ledger_figures(book))
    metrics.watch_workers(lambda: [WorkerView("w0", engine_queue=1, kv_usage=0.5)])
    metrics.watch_http(_Http)
    metrics.watch_probes(lambda: [("w0", WorkerCounters())])
    metrics.watch_upstream_pool(lambda: [("w0", PoolStats(0, 0, 0, 0, 0, 0))])
    metrics.watch_models(lambda: [("m", None)])
    metrics.watch_pd(_Pd)
    metrics.watch_admission(lambda: [("m", _Admission())])
    metrics.observe_route(Mode.EXACT_KV_EVENTS, 1e-4)
    metrics.observe_tokenize(1e-3)
    metrics.observe_hash(1e-5)
    metrics.record_decision("m", Decision(worker="w0", mode=Mode.EXACT_KV_EVENTS,
                                          reason="longest hit"))
    metrics.record_no_worker("m")
    metrics.record_cached_tokens("m", 16, 16, 32)
    metrics.record_upstream_error("w0", "connect")
    metrics.record_retry("connect")
    metrics.record_unpredicted("m", "prompt_too_long")
    series: dict[str, set[str]] = {}
    for line in metrics.render().decode().splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s", line)
        assert match, line
        labels = re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', match.group(2) or "")
        series.setdefault(match.group(1), set()).update(labels)
    return {name: frozenset(labels) for name, labels in series.items()}


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_MATCHERS = re.compile(r"\{([^}]*)\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_IDENT = re.compile(r"(?<![\w.$])([a-zA-Z_:][a-zA-Z0-9_:]*)")


def promql_names(expr: str) -> tuple[set[str], set[str]]:
    """(metric names selected, label names matched or grouped on) of a PromQL expression
    (Grafana's ``$variables`` allowed)."""
    labels: set[str] = set()
    for group in _GROUPING.finditer(expr):
        labels.update(name.strip() for name in group.group(2).split(",") if name.strip())
    text = _GROUPING.sub(" ", expr)
    for block in _MATCHERS.finditer(_STRING.sub('""', text)):
        labels.update(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", block.group(1)))
    text = _RANGE.sub(" ", _MATCHERS.sub(" ", _STRING.sub(" ", text)))
    text = re.sub(r"\b\d+(\.\d+)?(e[-+]?\d+)?\b", " ", text)
    names = {name for name in _IDENT.findall(text) if name not in FUNCTIONS}
    return names, labels
