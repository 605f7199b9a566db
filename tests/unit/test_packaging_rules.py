"""The packaged Grafana dashboard and Prometheus alert rules use only what Cortex exposes.

``promtool check rules`` validates the rule file when promtool is installed (Debian package
``prometheus``), and ``promtool test rules`` fires the alerts on synthetic series.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.cortex_exposition import SCRAPE_LABELS, exposed_series, promql_names

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "packaging" / "grafana" / "cortex.json"
RULES = REPO / "packaging" / "prometheus" / "cortex-rules.yml"
GRAFANA_VARIABLES = {"job", "instance", "model"}


@pytest.fixture(scope="module")
def series() -> dict[str, frozenset[str]]:
    return exposed_series()


def check_expr(expr: str, series: dict[str, frozenset[str]]) -> None:
    names, labels = promql_names(expr)
    assert names, f"no metric in {expr!r}"
    unknown = names - series.keys()
    assert not unknown, f"{expr!r} uses {sorted(unknown)}: not in Cortex's /metrics"
    known_labels = set().union(*(series[name] for name in names)) | SCRAPE_LABELS
    assert labels <= known_labels, f"{expr!r}: labels {sorted(labels - known_labels)} unknown"


def test_the_exposition_helper_sees_every_family(series):
    for name in ("cortex_prompt_tokens_total", "cortex_route_seconds_bucket",
                 "cortex_ledger_state", "cortex_events_gaps_total", "cortex_pd_served_total",
                 "cortex_admission_rejected_total", "cortex_worker_kv_usage_ratio",
                 "cortex_cached_tokens_error_count", "cortex_process_resident_memory_bytes"):
        assert name in series
    assert series["cortex_ledger_state"] == {"worker", "rank", "state"}


def test_promql_names_ignores_functions_strings_and_grouping():
    names, labels = promql_names(
        'histogram_quantile(0.99, sum by (le, model) (rate(x_bucket{job=~"$job",a!="b c"}'
        '[$__rate_interval]))) / on (model) group_left() (y > 0) and z offset 1h')
    assert names == {"x_bucket", "y", "z"}
    assert labels == {"le", "model", "job", "a"}


def dashboard_panels() -> list[dict]:
    model = json.loads(DASHBOARD.read_text())
    return [panel for panel in model["panels"] if panel["type"] != "row"]


def test_dashboard_loads_with_a_prometheus_datasource_variable():
    model = json.loads(DASHBOARD.read_text())
    variables = {var["name"]: var for var in model["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert GRAFANA_VARIABLES <= variables.keys()
    ids = [panel["id"] for panel in model["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard_panels():
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"], panel["title"]


def test_dashboard_has_the_operators_panels():
    titles = " | ".join(panel["title"].lower() for panel in dashboard_panels())
    for part in ("real cache hit rate", "predicted vs engine-reported", "exact predictions",
                 "routing gain", "decisions by mode", "decisions by reason", "load bias",
                 "ledger state", "ledger entries", "ledger memory", "gaps, replays and errors",
                 "route latency", "upstream errors", "admission", "pd outcomes"):
        assert part in titles, part


def test_every_dashboard_expression_uses_exposed_metrics(series):
    for panel in dashboard_panels():
        for target in panel["targets"]:
            check_expr(target["expr"], series)
    model = json.loads(DASHBOARD.read_text())
    for var in model["templating"]["list"]:
        if var["type"] == "query":
            metric = var["definition"].split("(", 1)[1].split(",")[0].split("{")[0].strip()
            assert metric in series


def rules() -> list[dict]:
    yaml = pytest.importorskip("yaml")
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_alert_rules_cover_the_operators_cases_and_use_exposed_metrics(series):
    by_name = {rule["alert"]: rule for rule in rules()}
    for alert in ("CortexLedgerStale", "CortexEventStreamSilent", "CortexCacheHitRateCollapse",
                  "CortexWorkerHotSpot", "CortexUpstreamErrorRatio", "CortexAdmissionRejecting",
                  "CortexNoHealthyWorker"):
        assert alert in by_name
    for rule in by_name.values():
        check_expr(rule["expr"], series)
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"]


PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")


@needs_promtool
def test_promtool_checks_the_rules():
    result = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


UNIT_TESTS = """
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'cortex_ledger_state{{job="c",instance="i",worker="w0",rank="0",state="stale"}}'
        values: '0 1x10'
      - series: 'cortex_worker_healthy{{job="c",instance="i",worker="w0"}}'
        values: '1 1 0x10'
      - series: 'cortex_worker_in_flight{{job="c",instance="i",worker="w0"}}'
        values: '40x40'
      - series: 'cortex_worker_in_flight{{job="c",instance="i",worker="w1"}}'
        values: '1x40'
      - series: 'cortex_worker_in_flight{{job="c",instance="i",worker="w2"}}'
        values: '1x40'
      - series: 'cortex_worker_in_flight{{job="c",instance="i",worker="w3"}}'
        values: '1x40'
      - series: 'cortex_events_messages_total{{job="c",instance="i",worker="w0",rank="0"}}'
        values: '5x40'
      - series: 'cortex_admission_rejected_total{{job="c",instance="i",model="m"}}'
        values: '0+3x20'
      - series: 'cortex_admission_timed_out_total{{job="c",instance="i",model="m"}}'
        values: '0x20'
    alert_rule_test:
      - eval_time: 1m
        alertname: CortexLedgerStale
        exp_alerts: []
      - eval_time: 5m
        alertname: CortexLedgerStale
        exp_alerts:
          - exp_labels: {{severity: warning, job: c, instance: i, worker: w0, rank: "0"}}
      - eval_time: 5m
        alertname: CortexNoHealthyWorker
        exp_alerts:
          - exp_labels: {{severity: critical, job: c, instance: i}}
      - eval_time: 30m
        alertname: CortexWorkerHotSpot
        exp_alerts:
          - exp_labels: {{severity: warning, job: c, instance: i}}
      - eval_time: 30m
        alertname: CortexEventStreamSilent
        exp_alerts:
          - exp_labels: {{severity: critical, job: c, instance: i, worker: w0}}
      - eval_time: 15m
        alertname: CortexAdmissionRejecting
        exp_alerts:
          - exp_labels: {{severity: warning, job: c, instance: i, model: m}}
"""


@needs_promtool
def test_promtool_fires_the_alerts_on_synthetic_series(tmp_path):
    yaml = pytest.importorskip("yaml")
    plain = yaml.safe_load(RULES.read_text())
    for group in plain["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations")  # the expected alerts list labels only
    bare = tmp_path / "cortex-rules.yml"
    bare.write_text(yaml.safe_dump(plain))
    tests = tmp_path / "cortex-rules.test.yml"
    tests.write_text(textwrap.dedent(UNIT_TESTS.format(rules=json.dumps(str(bare)))))
    result = subprocess.run([PROMTOOL, "test", "rules", str(tests)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
