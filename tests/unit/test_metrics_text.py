"""Lean families and the text exposition: Prometheus semantics, escaping, parser agreement."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cortex.events.counters import IngestCounters
from cortex.metrics.cortex_metrics import CortexMetrics
from cortex.metrics.text import CounterFamily, GaugeFamily, HistogramFamily, TextWriter
from cortex.scheduling.view import WorkerView


def render(*families) -> str:
    out = TextWriter()
    for family in families:
        family.write(out)
    return out.text()


def parsed(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_counter_and_gauge():
    c = CounterFamily("x_total", "xs", ("a",))
    c.inc(("1",))
    c.inc(("1",), 2.5)
    c.inc(("2",))
    g = GaugeFamily("y", "ys")
    g.set((), True)
    text = render(c, g)
    assert "# HELP x_total xs\n# TYPE x_total counter\n" in text
    assert parsed(text) == {("x_total", (("a", "1"),)): 3.5, ("x_total", (("a", "2"),)): 1,
                            ("y", ()): 1}
    with pytest.raises(ValueError):
        c.inc(("1",), -1)
    with pytest.raises(ValueError):
        CounterFamily("x", "no _total")


def test_histogram_buckets_are_cumulative_le_inclusive():
    h = HistogramFamily("t_seconds", "t", (0.1, 1.0), ("m",))
    for v in (0.05, 0.1, 0.5, 1.0, 3.0):
        h.observe(("a",), v)
    got = parsed(render(h))
    assert got[("t_seconds_bucket", (("le", "0.1"), ("m", "a")))] == 2
    assert got[("t_seconds_bucket", (("le", "1.0"), ("m", "a")))] == 4
    assert got[("t_seconds_bucket", (("le", "+Inf"), ("m", "a")))] == 5
    assert got[("t_seconds_count", (("m", "a"),))] == 5
    assert got[("t_seconds_sum", (("m", "a"),))] == pytest.approx(4.65)
    assert h.count(("a",)) == 5


def test_histogram_with_negative_bounds_has_no_sum():
    h = HistogramFamily("e", "e", (-1, 0, 1))
    h.observe((), -5)
    h.observe((), 0)
    text = render(h)
    assert "e_sum" not in text
    assert parsed(text)[("e_bucket", (("le", "-1.0"),))] == 1
    with pytest.raises(ValueError):
        HistogramFamily("bad", "b", (1, 1))


def test_label_values_and_help_escaped():
    c = CounterFamily("z_total", "line one\nback\\slash", ("w",))
    c.inc(('we"ird\\na\nme',))
    text = render(c)
    assert "# HELP z_total line one\\nback\\\\slash\n" in text
    (family,) = text_string_to_metric_families(text)
    assert family.samples[0].labels == {"w": 'we"ird\\na\nme'}


def test_whole_render_parses_with_hostile_worker_names():
    m = CortexMetrics()
    counters = IngestCounters(gaps=1)
    names = ['w"1', "w\\2", "w\n3"]
    m.watch_ingest(lambda: [(n, 0, counters) for n in names])
    m.watch_workers(lambda: [WorkerView(n, engine_queue=1, kv_usage=0.25) for n in names])
    families = list(text_string_to_metric_families(m.render().decode()))
    gaps = next(f for f in families if f.name == "cortex_events_gaps")
    assert sorted(s.labels["worker"] for s in gaps.samples) == sorted(names)


def test_exposed_through_a_prometheus_client_registry():
    registry = CollectorRegistry()
    m = CortexMetrics(registry)
    m.record_no_worker("m")
    text = generate_latest(registry).decode()
    assert 'cortex_no_worker_total{model="m"} 1.0' in text
    assert "# HELP cortex_route_seconds " in text
