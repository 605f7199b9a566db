"""Lean metric families and the Prometheus text exposition (format 0.0.4), written directly.

Why not ``prometheus_client``'s metric objects: on this machine its ``Counter.labels().inc()``
and ``Histogram.observe()`` cost 2–5 µs each (a lock and a child lookup per call) and its
exposition ~16 µs per sample (a 128-target scrape stalls the event loop ~50 ms). Everything
here runs on one thread (the trio thread that owns the request path and serves ``/metrics``),
so a family is a plain dict and a sample is one f-string: ~0.3 µs per record, ~1 µs per
exposed sample.

Why not its custom-collector interface either (the scrape-time form, zero cost per request):
a ``Collector`` whose ``collect()`` builds ``CounterMetricFamily``/``GaugeMetricFamily``/
``HistogramMetricFamily`` from the same live counters, rendered by ``generate_latest``, takes
26.2 ms p50 for a 64-worker scrape (3,577 samples) against 3.9 ms here: 6.8x, over the 2x the
switch was allowed (issue 25; ``python -m perf.bench_scrape``, 2026-12-02, 2 busy cores, both
timed in one run). Building the families alone costs 6.6 ms (a ``Sample`` and a label dict per
sample); ``generate_latest`` then sorts and escapes every sample's labels. It would also drop
the ``_count`` of a histogram with a negative bound (``cortex_cached_tokens_error``) together
with its ``_sum``.

Rules:

* A family has a name (with its unit and, for counters, ``_total``), a HELP text, label names
  fixed at creation, and a type. Label values are passed as a tuple in label-name order.
* Histograms follow Prometheus semantics: bucket ``le=b`` counts observations ``<= b``
  (cumulative in the exposition), plus ``+Inf``, ``_count`` and ``_sum`` — except when a bucket
  bound is negative, where ``_sum`` is omitted (OpenMetrics forbids it; it would not be
  monotonic).
* ``TextWriter`` writes one family's HELP/TYPE header once, then its samples; label values are
  escaped (backslash, double quote, newline). Values: ints as ints, floats by ``repr``,
  infinities as ``+Inf``/``-Inf``, NaN as ``NaN``.

Single-threaded by contract; no I/O.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Labels = tuple[str, ...]


def _escape_label(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def _number(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(value)


def format_labels(names: Sequence[str], values: Sequence[str]) -> str:
    if not names:
        return ""
    return "{" + ",".join(f'{n}="{_escape_label(v)}"' for n, v in zip(names, values)) + "}"


class TextWriter:
    __slots__ = ("_parts",)

    def __init__(self) -> None:
        self._parts: list[str] = []

    def header(self, name: str, kind: str, help_text: str) -> None:
        text = help_text.replace("\\", "\\\\").replace("\n", "\\n")
        self._parts.append(f"# HELP {name} {text}\n# TYPE {name} {kind}\n")

    def sample(self, name: str, labels: str, value: float) -> None:
        self._parts.append(f"{name}{labels} {_number(value)}\n")

    def text(self) -> str:
        return "".join(self._parts)


class CounterFamily:
    __slots__ = ("help", "labelnames", "name", "values")
    kind = "counter"

    def __init__(self, name: str, help_text: str, labelnames: Labels = ()) -> None:
        if not name.endswith("_total"):
            raise ValueError(f"counter {name} must end in _total")
        self.name, self.help, self.labelnames = name, help_text, labelnames
        self.values: dict[Labels, float] = {}

    def inc(self, labels: Labels = (), amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        values = self.values
        values[labels] = values.get(labels, 0) + amount

    def get(self, labels: Labels = ()) -> float:
        return self.values.get(labels, 0)

    def remove(self, labels: Labels) -> None:
        self.values.pop(labels, None)

    def write(self, out: TextWriter) -> None:
        out.header(self.name, self.kind, self.help)
        for labels, value in self.values.items():
            out.sample(self.name, format_labels(self.labelnames, labels), value)


class GaugeFamily(CounterFamily):
    __slots__ = ()
    kind = "gauge"

    def __init__(self, name: str, help_text: str, labelnames: Labels = ()) -> None:
        self.name, self.help, self.labelnames = name, help_text, labelnames
        self.values = {}

    def set(self, labels: Labels, value: float) -> None:
        self.values[labels] = value


class HistogramFamily:
    __slots__ = ("_le", "bounds", "help", "labelnames", "name", "values")
    kind = "histogram"

    def __init__(self, name: str, help_text: str, bounds: Sequence[float],
                 labelnames: Labels = ()) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError(f"histogram {name}: bucket bounds must be strictly increasing")
        self.name, self.help, self.labelnames = name, help_text, labelnames
        self.bounds = tuple(float(b) for b in bounds)
        self._le = [repr(b) for b in self.bounds] + ["+Inf"]
        # labels -> [per-bucket counts (last = above every bound), sum, count]
        self.values: dict[Labels, list] = {}

    def observe(self, labels: Labels, value: float) -> None:
        record = self.values.get(labels)
        if record is None:
            record = self.values[labels] = [[0] * (len(self.bounds) + 1), 0.0, 0]
        record[0][bisect_left(self.bounds, value)] += 1
        record[1] += value
        record[2] += 1

    def count(self, labels: Labels = ()) -> int:
        record = self.values.get(labels)
        return 0 if record is None else record[2]

    def write(self, out: TextWriter) -> None:
        out.header(self.name, self.kind, self.help)
        with_sum = self.bounds[0] >= 0
        names = (*self.labelnames, "le")
        for labels, (buckets, total, count) in self.values.items():
            running = 0
            for le, n in zip(self._le, buckets):
                running += n
                out.sample(self.name + "_bucket", format_labels(names, (*labels, le)), running)
            plain = format_labels(self.labelnames, labels)
            out.sample(self.name + "_count", plain, count)
            if with_sum:
                out.sample(self.name + "_sum", plain, total)
