"""The alerting rules (charts/vigil/files/prometheus-rules.yaml): promtool checks them and runs their
unit tests (tests/alerts/), every alert has a firing and a quiet case, every metric an expression
reads is one Vigil exports, every runbook link lands on a section of docs/alerts.md, and the chart
wraps exactly these groups in a PrometheusRule.

promtool and helm come from testbed/build.sh (~/.cache/vigil/bin, or $VIGIL_CACHE/bin); without
them these tests fail, they do not skip: the rules would go untested.
"""

from __future__ import annotations

import re
from collections import defaultdict
from urllib.parse import urlparse

import pytest
import yaml

from tests.support.charts import CHART, ROOT, helm_template, run, tool
from tests.support.metrics import STANDARD_METRICS, exported_metric_names, metric_names

pytestmark = pytest.mark.unit

RULES = CHART / "files" / "prometheus-rules.yaml"
ALERT_TESTS = sorted((ROOT / "tests" / "alerts").glob("*.yaml"))
RUNBOOK = ROOT / "docs" / "alerts.md"

# Labels a rule may aggregate by (and so alert on): none of unbounded cardinality, never a job's,
# pod's or instance's. (Joins may match on instance: that names no alert.)
BOUNDED_LABELS = {
    "job",
    "namespace",
    "queue",
    "pool",
    "reason",
    "outcome",
    "phase",
    "verb",
    "resource",
    "code",
    "name",
    "le",
}


def rule_groups() -> list[dict]:
    return yaml.safe_load(RULES.read_text())["groups"]


def alerts() -> dict[str, dict]:
    return {rule["alert"]: rule for group in rule_groups() for rule in group["rules"] if "alert" in rule}


def test_metric_names_reads_promql_as_the_rules_and_the_dashboard_write_it():
    assert metric_names('sum by (job, le) (rate(vigil_heartbeat_gap_seconds_bucket{job=~"a|b"}[10m])) > 20') == {
        "vigil_heartbeat_gap_seconds_bucket"
    }
    assert metric_names("max by (job) (a_total offset 1h) and on (job, instance) b or absent(c)") == {
        "a_total",
        "b",
        "c",
    }
    assert metric_names(
        'histogram_quantile(0.99, sum by (le) (rate(x_bucket{namespace=~"$namespace"}[$__rate_interval])))'
    ) == {"x_bucket"}
    assert "workqueue_depth" in exported_metric_names()
    assert {"vigil_queue_depth", "vigil_retries_total", "vigil_heartbeat_gap_seconds_bucket"} <= exported_metric_names()


# --- the rule file --------------------------------------------------------------------------------


def test_promtool_check_rules_accepts_the_rule_file():
    result = run(tool("promtool"), "check", "rules", RULES)
    assert result.returncode == 0, f"promtool check rules failed:\n{result.stdout}\n{result.stderr}"


def test_promtool_unit_tests_of_every_alert_pass():
    assert ALERT_TESTS, "no promtool tests in tests/alerts/"
    result = run(tool("promtool"), "test", "rules", *ALERT_TESTS)
    assert result.returncode == 0, f"promtool test rules failed:\n{result.stdout}\n{result.stderr}"


def test_every_alert_has_a_firing_case_and_a_quiet_case_at_the_same_time():
    firing: dict[str, set[str]] = defaultdict(set)
    quiet: dict[str, set[str]] = defaultdict(set)
    for path in ALERT_TESTS:
        document = yaml.safe_load(path.read_text())
        assert document["rule_files"] == ["../../charts/vigil/files/prometheus-rules.yaml"], path
        for group in document["tests"]:
            for case in group.get("alert_rule_test") or []:
                (firing if case.get("exp_alerts") else quiet)[case["alertname"]].add(case["eval_time"])
    for name in alerts():
        assert firing[name], f"{name} has no test where it fires"
        assert firing[name] & quiet[name], f"{name} has no quiet case at the time of a firing one ({firing[name]})"
    assert set(firing) <= set(alerts()), f"tests of alerts that do not exist: {set(firing) - set(alerts())}"


def test_every_alert_says_what_it_means_how_bad_and_where_the_runbook_is():
    anchors = {_anchor(line.lstrip("#").strip()) for line in RUNBOOK.read_text().splitlines() if line.startswith("#")}
    for name, rule in alerts().items():
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert rule.get("for"), f"{name} has no for:"
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"]), name
        url = urlparse(rule["annotations"]["runbook_url"])
        assert url.path.endswith("/docs/alerts.md"), f"{name}: {url.geturl()}"
        assert url.fragment == name.lower(), f"{name}: the anchor should be the alert's name"
        assert url.fragment in anchors, f"{name}: docs/alerts.md has no section #{url.fragment}"


def test_every_metric_the_rules_read_is_one_vigil_exports():
    exported = exported_metric_names() | STANDARD_METRICS
    for name, rule in alerts().items():
        used = metric_names(rule["expr"])
        assert used, f"{name}: no metric found in its expr"
        assert used <= exported, f"{name} reads metrics Vigil does not export: {sorted(used - exported)}"


def test_no_rule_groups_by_a_label_of_unbounded_cardinality():
    for name, rule in alerts().items():
        for labels in re.findall(r"\bby\s*\(([^)]*)\)", rule["expr"]):
            used = {label.strip() for label in labels.split(",") if label.strip()}
            assert used <= BOUNDED_LABELS, f"{name} groups by {sorted(used - BOUNDED_LABELS)}"


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


# --- the chart ------------------------------------------------------------------------------------


def test_the_chart_renders_no_prometheus_rule_unless_asked():
    assert not [doc for doc in helm_template() if doc["kind"] == "PrometheusRule"]


def test_the_chart_wraps_exactly_the_rule_files_groups_in_a_prometheus_rule():
    docs = helm_template("prometheusRule.enabled=true", "prometheusRule.labels.release=kube-prometheus-stack")
    (rule,) = [doc for doc in docs if doc["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == "vigil-system"
    labels = rule["metadata"]["labels"]
    assert labels["release"] == "kube-prometheus-stack", "prometheusRule.labels are added"
    assert labels["app.kubernetes.io/name"] == "vigil" and labels["app.kubernetes.io/instance"] == "vigil"
    assert rule["spec"]["groups"] == rule_groups(), "the groups differ from files/prometheus-rules.yaml"
    backlog = next(
        r for g in rule["spec"]["groups"] for r in g["rules"] if r.get("alert") == "VigilQueueBacklogGrowing"
    )
    assert "{{ $labels.namespace }}/{{ $labels.queue }}" in backlog["annotations"]["summary"], "Helm templated it"
    assert '{{ $value | printf "%.0f" }}' in backlog["annotations"]["description"]
