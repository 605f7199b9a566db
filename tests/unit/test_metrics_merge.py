"""``cortex.metrics.merge``: several processes' expositions as one, each sample labelled with its
process, each family once — checked by parsing the result as Prometheus does."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from cortex.metrics.cortex_metrics import CortexMetrics
from cortex.metrics.merge import labelled, merge_expositions

A = b"""# HELP cortex_requests_total Requests
# TYPE cortex_requests_total counter
cortex_requests_total{model="m",code="200"} 3
# HELP cortex_up Up
# TYPE cortex_up gauge
cortex_up 1
# HELP cortex_seconds Latency
# TYPE cortex_seconds histogram
cortex_seconds_bucket{le="0.1"} 1
cortex_seconds_bucket{le="+Inf"} 2
cortex_seconds_count 2
cortex_seconds_sum 0.5
"""
B = b"""# HELP cortex_requests_total Requests
# TYPE cortex_requests_total counter
cortex_requests_total{model="m",code="200"} 4
# HELP cortex_only_here Only in the second
# TYPE cortex_only_here gauge
cortex_only_here{worker="w"} 7
# HELP cortex_up Up
# TYPE cortex_up gauge
cortex_up 1
"""


def parsed(text: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {family.name: [(sample.labels, sample.value) for sample in family.samples]
            for family in text_string_to_metric_families(text.decode())}


def test_each_family_once_every_sample_with_its_process():
    merged = merge_expositions([("0", A), ("1", B)])
    assert merged.count(b"# HELP cortex_requests_total") == 1
    assert merged.count(b"# TYPE cortex_up gauge") == 1
    families = parsed(merged)
    assert families["cortex_requests"] == [
        ({"process": "0", "model": "m", "code": "200"}, 3.0),
        ({"process": "1", "model": "m", "code": "200"}, 4.0)]
    assert families["cortex_up"] == [({"process": "0"}, 1.0), ({"process": "1"}, 1.0)]
    assert families["cortex_only_here"] == [({"process": "1", "worker": "w"}, 7.0)]
    assert ({"process": "0", "le": "+Inf"}, 2.0) in families["cortex_seconds"]


def test_a_real_exposition_merges_into_one_that_parses():
    own = CortexMetrics().render()
    merged = merge_expositions([("0", own), ("1", own), ("2", b"")])
    assert len(parsed(merged)) == len(parsed(own))
    assert merge_expositions([]) == b""


def test_a_cut_exposition_keeps_its_whole_lines():
    merged = merge_expositions([("0", A), ("1", B[:60])])
    assert parsed(merged)["cortex_requests"] == [
        ({"process": "0", "model": "m", "code": "200"}, 3.0)]


def test_labelled():
    label = b'process="1"'
    assert labelled(b'a{x="y z"} 1', label) == b'a{process="1",x="y z"} 1'
    assert labelled(b"a{} 1", label) == b'a{process="1"} 1'
    assert labelled(b"a 1", label) == b'a{process="1"} 1'
