"""Cost of one ``/metrics`` scrape: Cortex's hand-written exposition against the same families
built by a ``prometheus_client`` custom collector (issue 25, item 2).

State: one ``CortexMetrics`` as the gateway wires it (``cortex.app``), for ``--workers`` workers
of ``--ranks`` DP ranks each: every ``watch_*`` source registered (ingest counters per
worker/rank, a real ``LedgerBook`` read by ``ledger_figures``, worker views, the server's
``ServerCounters``, monitor and pool figures per worker, PD and admission counters, models), and
the request-path families filled through the public recording methods (route/tokenize/hash
histograms, decisions per model/mode/reason, cached-token accuracy, upstream errors, retries).

Timed, interleaved in one loop so both see the same machine (ratios are what count):

* ``today``: ``CortexMetrics.render()`` — ``metrics_text``'s plain families and ``TextWriter``;
* ``library``: ``generate_latest`` on a private ``CollectorRegistry`` holding one custom
  collector whose ``collect()`` builds ``CounterMetricFamily``/``GaugeMetricFamily``/
  ``HistogramMetricFamily`` at scrape time from the same live objects (zero cost per request);
* ``library_collect_only``: that collector's ``collect()`` alone (family building, no text);
* ``registry_view``: today's compatibility path (``CortexMetrics(registry)``: render, parse,
  ``generate_latest``), every tenth repetition.

Equivalence: both texts are parsed with ``text_string_to_metric_families``; samples (name,
labels, value), family types and HELP texts are compared and every difference is listed
(``cortex_process_*`` values move between two scrapes: only their presence is compared).

Usage: ``python -m perf.bench_scrape`` (64 workers, 400 repetitions), ``--quick`` smoke run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from cortex.dispatch.admission import AdmissionCounters
from cortex.events.counters import IngestCounters
from cortex.front.shared import ServerCounters
from cortex.ledger.book import LedgerBook
from cortex.ledger.kv_events import BlockStored, EngineFamily, EventBatch
from cortex.ledger.state import TargetState
from cortex.metrics.cortex_metrics import PHASES, RETRY_PHASES, CortexMetrics, ledger_figures
from cortex.metrics.sources import (
    _ADMISSION_COUNTERS,
    _HTTP_FIGURES,
    _PD_COUNTERS,
    _POOL_FIGURES,
    _PROBE_COUNTERS,
    _STARTED_AT,
    _WORKER_GAUGES,
    INGEST_HELP,
)
from cortex.metrics.text import CounterFamily, HistogramFamily
from cortex.pd.orchestrate import PdCounters
from cortex.scheduling.decision import Decision, Mode
from cortex.scheduling.view import WorkerView
from cortex.upstream.connection_pool import PoolStats
from cortex.workers.health import WorkerCounters
from perf.benchkit import machine_info, percentiles_us

MODELS = ("llama-3.1-8b", "qwen2.5-7b", "mistral-7b")
DECISIONS = (
    Decision("w", Mode.EXACT_KV_EVENTS, "longest hit: 3 of 4 blocks on w"),
    Decision("w", Mode.EXACT_KV_EVENTS, "1 of 4 blocks cached on w; the longest hit costs more"),
    Decision("w", Mode.EXACT_KV_EVENTS, "no hit on w but every holder is above the load cap"),
    Decision("w", Mode.LOAD_AWARE, "no worker holds the prefix; w has the least"),
    Decision("w", Mode.FALLBACK_P2C, "ledger not trusted everywhere; drew w and v"),
    Decision("w", Mode.CONSISTENT_HASH, "ring point of the first 4 blocks"),
)
BLOCK = 16


class State:
    """A 64-worker gateway's metrics and the live objects its sources read."""

    def __init__(self, workers: int, ranks: int, observations: int, seed: int = 1) -> None:
        rng = random.Random(seed)
        names = [f"worker-{i:02d}" for i in range(workers)]
        self.book = book = LedgerBook()
        self.ingest: list[tuple[str, int, IngestCounters]] = []
        next_hash = 1
        for n, name in enumerate(names):
            for rank in range(ranks):
                target = book.register(name, rank, EngineFamily.VLLM, MODELS[n % len(MODELS)])
                blocks = rng.randint(4, 64)
                hashes = list(range(next_hash, next_hash + blocks))
                next_hash += blocks
                book.apply(target, EventBatch(0.0, (BlockStored(
                    hashes, None, list(range(blocks * BLOCK)), BLOCK),), rank))
                state = (TargetState.READY if n % 16 else
                         (TargetState.STALE, TargetState.SYNCING)[rank % 2])
                book.set_state(target, state, "replayed from 0")
                counters = IngestCounters()
                for field in INGEST_HELP:
                    setattr(counters, field, rng.randint(0, 100_000) if rng.random() < 0.6
                            else 0)
                self.ingest.append((name, rank, counters))
        self.views = [WorkerView(name, in_flight=rng.randint(0, 40),
                                 queued_prefill_tokens=rng.randint(0, 50_000),
                                 healthy=n % 31 != 5,
                                 engine_queue=rng.randint(0, 8) if n % 4 else None,
                                 kv_usage=rng.random() if n % 4 else None)
                      for n, name in enumerate(names)]
        self.probes = [(name, WorkerCounters(*(rng.randint(0, 10_000) for _ in range(7))))
                       for name in names]
        self.pools = [(name, PoolStats(*(rng.randint(0, 100_000) for _ in range(6))))
                      for name in names]
        self.server = ServerCounters(*(rng.randint(0, 1_000_000) for _ in range(9)))
        for status in (200, 400, 404, 413, 429, 500, 502, 503):
            self.server.responses_by_status[status] = rng.randint(1, 1_000_000)
        for reason in ("malformed_http", "invalid_json", "invalid_field"):
            self.server.bad_requests_by_reason[reason] = rng.randint(1, 100_000)
        self.pd = PdCounters(*(rng.randint(0, 1000) for _ in range(6)))
        self.admissions = [(model, AdmissionCounters(*(rng.randint(0, 1000) for _ in range(4))))
                           for model in MODELS]
        self.models = [(model, None if i else "profile not loaded")
                       for i, model in enumerate(MODELS)]

        self.metrics = m = CortexMetrics()
        m.watch_ledger(lambda: ledger_figures(self.book))
        m.watch_workers(lambda: self.views)
        m.watch_ingest(lambda: self.ingest)
        m.watch_http(lambda: self.server)
        m.watch_probes(lambda: self.probes)
        m.watch_upstream_pool(lambda: self.pools)
        m.watch_models(lambda: self.models)
        m.watch_pd(lambda: self.pd)
        m.watch_admission(lambda: self.admissions)
        for _ in range(observations):
            model = rng.choice(MODELS)
            decision = rng.choice(DECISIONS)
            m.record_decision(model, decision)
            m.observe_route(decision.mode, rng.lognormvariate(-9, 1.0))
            m.observe_tokenize(rng.lognormvariate(-7, 1.0))
            m.observe_hash(rng.lognormvariate(-11, 1.0))
            predicted = rng.choice((0, 64, 128, 256, 1024))
            m.record_cached_tokens(model, predicted, max(0, predicted - rng.choice((0, 0, 16))),
                                   predicted + rng.randint(1, 2000))
        m.observe_route("none", 1e-4)
        m.record_no_worker(MODELS[0])
        m.record_unpredicted(MODELS[1], "template_failed")
        for name in names:
            for _ in range(rng.randint(0, 4)):
                phase = rng.choice(PHASES)
                m.record_upstream_error(name, phase, rng.choice((None, 429, 502, 503)))
        for phase in RETRY_PHASES:
            m.record_retry(phase)


class LibraryCollector:
    """The same families as ``CortexMetrics.render()``, as ``prometheus_client`` families built
    at scrape time from the same live objects (what a switch would register)."""

    def __init__(self, state: State) -> None:
        self.state = state
        self._le = {}
        for family in state.metrics._families:
            if isinstance(family, HistogramFamily):
                self._le[family.name] = [floatToGoString(b) for b in family.bounds] + ["+Inf"]

    def describe(self) -> list:
        return []

    def collect(self):  # type: ignore[no-untyped-def]
        state = self.state
        for family in state.metrics._families:
            yield from self._family(family)
        ingest = [([worker, str(rank)], counters) for worker, rank, counters in state.ingest]
        for field, text in INGEST_HELP.items():
            out = CounterMetricFamily(f"cortex_events_{field}_total", text,
                                      labels=("worker", "rank"))
            for labels, counters in ingest:
                out.add_metric(labels, getattr(counters, field))
            yield out
        yield from self._ledger(ledger_figures(state.book))
        yield from _table([([v.worker], v) for v in state.views], ("worker",), _WORKER_GAUGES)
        server = state.server
        yield from _table([([], server)], (), _HTTP_FIGURES)
        responses = CounterMetricFamily("cortex_http_responses_total",
                                        "Responses sent, by status code", labels=("code",))
        for code, count in sorted(server.responses_by_status.items()):
            responses.add_metric([str(code)], count)
        yield responses
        bad = CounterMetricFamily("cortex_http_bad_requests_total",
                                  "Requests Cortex answered 400 itself, by reason (malformed "
                                  "HTTP, body or fields: cortex.errors.BAD_REQUEST_REASONS)",
                                  labels=("reason",))
        for reason, count in sorted(server.bad_requests_by_reason.items()):
            bad.add_metric([reason], count)
        yield bad
        yield from _table([([w], c) for w, c in state.probes], ("worker",), _PROBE_COUNTERS)
        yield from _table([([w], p) for w, p in state.pools], ("worker",), _POOL_FIGURES)
        exact = GaugeMetricFamily("cortex_model_exact_routing",
                                  "1 if exact KV routing is on for the model, 0 if it is off "
                                  "(the reason is in /health/ready and the logs)",
                                  labels=("model",))
        for model, off_reason in state.models:
            exact.add_metric([model], 0 if off_reason else 1)
        yield exact
        yield from _table([([], state.pd)], (), _PD_COUNTERS)
        yield from _table([([m], a) for m, a in state.admissions], ("model",),
                          _ADMISSION_COUNTERS)
        yield from _process()

    def _family(self, family):  # type: ignore[no-untyped-def]
        if isinstance(family, HistogramFamily):
            out = HistogramMetricFamily(family.name, family.help, labels=family.labelnames)
            le = self._le[family.name]
            with_sum = family.bounds[0] >= 0
            for labels, (buckets, total, _count) in family.values.items():
                running, cumulative = 0, []
                for bound, n in zip(le, buckets):
                    running += n
                    cumulative.append((bound, running))
                out.add_metric(labels, cumulative, total if with_sum else None)
            yield out
            return
        kind = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
        assert isinstance(family, CounterFamily)
        out = kind(family.name, family.help, labels=family.labelnames)
        for labels, value in family.values.items():
            out.add_metric(labels, value)
        yield out

    @staticmethod
    def _ledger(figures):  # type: ignore[no-untyped-def]
        state = GaugeMetricFamily("cortex_ledger_state", "Trust state of a worker rank's ledger "
                                  "(1 for the current state)", labels=("worker", "rank", "state"))
        entries = GaugeMetricFamily("cortex_ledger_target_entries",
                                    "Ledger entries of a worker rank", labels=("worker", "rank"))
        for t in figures.targets:
            rank = str(t.rank)
            for each in TargetState:
                state.add_metric([t.worker, rank, each.value], 1 if each is t.state else 0)
            entries.add_metric([t.worker, rank], t.entries)
        yield state
        yield entries
        yield GaugeMetricFamily("cortex_ledger_entries", "Ledger entries (block, worker rank)",
                                value=figures.entries)
        yield GaugeMetricFamily("cortex_ledger_nodes", "Ledger tree nodes (distinct blocks)",
                                value=figures.nodes)
        yield GaugeMetricFamily("cortex_ledger_memory_bytes", "Memory held by the ledger trees",
                                value=figures.memory_bytes)
        yield GaugeMetricFamily("cortex_ledger_fold_tokens", "Tokens the fold of SGLang's "
                                "one-token pages remembers (all models)",
                                value=figures.fold_tokens)
        yield GaugeMetricFamily("cortex_ledger_fold_memory_bytes", "Memory held by the fold of "
                                "SGLang's one-token pages", value=figures.fold_memory_bytes)
        yield CounterMetricFamily("cortex_ledger_fold_forgotten_total",
                                  "Tokens the page fold forgot with an old generation (stores "
                                  "continuing them are then skipped: misses only)",
                                  value=figures.fold_forgotten)
        yield CounterMetricFamily("cortex_ledger_fold_conflicts_total",
                                  "Page-size-1 stores refused: a token met at another position "
                                  "than its path says", value=figures.fold_conflicts)
        yield CounterMetricFamily("cortex_ledger_evicted_entries_total",
                                  "Ledger entries evicted by the entry budget (least recently "
                                  "touched first)", value=figures.evicted_entries)
        yield CounterMetricFamily("cortex_ledger_warm_start_failures_total",
                                  "Peer ledger snapshots that could not be fetched or read at "
                                  "start", value=figures.warm_start_failures)


def _table(rows, labelnames, table):  # type: ignore[no-untyped-def]
    for attr, name, kind, text in table:
        family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
            name, text, labels=labelnames)
        for labels, obj in rows:
            value = getattr(obj, attr)
            if value is not None:
                family.add_metric(labels, value)
        yield family


def _process():  # type: ignore[no-untyped-def]
    with open("/proc/self/statm", "rb") as handle:
        resident = int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    fds = len(os.listdir("/proc/self/fd"))
    times = os.times()
    yield CounterMetricFamily("cortex_process_cpu_seconds_total", "CPU time (user + system)",
                              value=times.user + times.system)
    yield GaugeMetricFamily("cortex_process_resident_memory_bytes", "Resident set size",
                            value=resident)
    yield GaugeMetricFamily("cortex_process_open_fds", "Open file descriptors", value=fds)
    yield GaugeMetricFamily("cortex_process_start_time_seconds",
                            "When Cortex's metrics were loaded (about the process start), "
                            "Unix time", value=_STARTED_AT)


def parsed(text: str) -> tuple[dict, dict]:
    """(sample name, sorted labels) -> value, and family name -> (type, HELP)."""
    samples, families = {}, {}
    for family in text_string_to_metric_families(text):
        families[family.name] = (family.type, family.documentation)
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, families


def differences(today: str, library: str, limit: int = 10) -> dict[str, object]:
    a, fa = parsed(today)
    b, fb = parsed(library)

    def show(keys):  # type: ignore[no-untyped-def]
        keys = sorted(keys)
        return {"count": len(keys),
                "first": [name + "{" + ",".join(f"{k}={v}" for k, v in labels) + "}"
                          for name, labels in keys[:limit]],
                "names": sorted({name for name, _ in keys})}

    volatile = {k for k in a.keys() & b.keys() if k[0].startswith("cortex_process_")}
    value = [k for k in a.keys() & b.keys() - volatile if a[k] != b[k]]
    return {
        "only_today": show(a.keys() - b.keys()),
        "only_library": show(b.keys() - a.keys()),
        "value": show(value),
        "type_or_help": sorted(name for name in fa.keys() | fb.keys()
                               if fa.get(name) != fb.get(name)),
        "volatile_not_compared": sorted({name for name, _ in volatile}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--observations", type=int, default=20_000,
                        help="requests recorded through the request-path methods")
    parser.add_argument("--repetitions", type=int, default=400)
    parser.add_argument("--quick", action="store_true", help="smoke run (a few seconds)")
    args = parser.parse_args()
    if args.quick:
        args.repetitions, args.observations = 20, 2_000

    state = State(args.workers, args.ranks, args.observations)
    registry = CollectorRegistry(auto_describe=False)
    collector = LibraryCollector(state)
    registry.register(collector)
    compat_registry = CollectorRegistry(auto_describe=False)
    compat = CortexMetrics(compat_registry)
    compat._families, compat._writers = state.metrics._families, state.metrics._writers

    today_text = state.metrics.render().decode()
    library_text = generate_latest(registry).decode()
    found = differences(today_text, library_text)
    samples_today = sum(len(f.samples) for f in text_string_to_metric_families(today_text))
    samples_library = sum(len(f.samples) for f in text_string_to_metric_families(library_text))

    timings: dict[str, list[int]] = {"today": [], "library": [], "library_collect_only": [],
                                     "registry_view": []}
    clock = time.perf_counter_ns
    render, latest = state.metrics.render, generate_latest
    for i in range(args.repetitions):
        t0 = clock()
        render()
        t1 = clock()
        latest(registry)
        t2 = clock()
        list(collector.collect())
        t3 = clock()
        timings["today"].append(t1 - t0)
        timings["library"].append(t2 - t1)
        timings["library_collect_only"].append(t3 - t2)
        if i % 10 == 0:
            t4 = clock()
            latest(compat_registry)
            timings["registry_view"].append(clock() - t4)
    scrape = {name: percentiles_us(samples) for name, samples in timings.items()}
    ratio = round(scrape["library"]["p50"] / scrape["today"]["p50"], 2)
    print(json.dumps({
        "machine": machine_info(),
        "workers": args.workers,
        "ranks": args.ranks,
        "observations": args.observations,
        "repetitions": args.repetitions,
        "samples": {"today": samples_today, "library": samples_library},
        "bytes": {"today": len(today_text), "library": len(library_text)},
        "scrape_us": scrape,
        "us_per_sample_p50": {name: round(figures["p50"] / samples_today, 3)
                              for name, figures in scrape.items()},
        "ratio_library_vs_today_p50": ratio,
        "ratio_registry_view_vs_today_p50": round(
            scrape["registry_view"]["p50"] / scrape["today"]["p50"], 2),
        "within_2x": ratio <= 2,
        "differences": found,
    }, indent=2))


if __name__ == "__main__":
    main()
