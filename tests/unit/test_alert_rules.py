"""The alerting rules (charts/vigil/files/prometheus-rules.yaml): promtool checks them and runs their
unit tests (tests/alerts/), every alert has a firing and a quiet case, every metric an expression
reads is one Vigil exports, every runbook link lands on a section of docs/alerts.md, and the chart
wraps exactly these groups in a PrometheusRule.

promtool and helm come from testbed/build.sh (~/.cache/vigil/bin, or $VIGIL_CACHE/bin); without
them these tests fail, they do not skip: the rules would go untested.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections import defaultdict
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from prometheus_client import CollectorRegistry

from vigil.metrics import Metrics
from vigil.metrics.collectors import StateCollector

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "vigil"
RULES = CHART / "files" / "prometheus-rules.yaml"
ALERT_TESTS = sorted((ROOT / "tests" / "alerts").glob("*.yaml"))
RUNBOOK = ROOT / "docs" / "alerts.md"
BIN = Path(os.environ.get("VIGIL_CACHE", Path.home() / ".cache" / "vigil")) / "bin"
KUBE_VERSION = "1.36.3"  # the chart asks for >= 1.30; helm's own default is older

# Metrics every Prometheus has for a target, besides what Vigil exports.
STANDARD_METRICS = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
# Labels a rule may aggregate by (and so alert on): none of unbounded cardinality, never a job's,
# pod's or instance's. (Joins may match on instance: that names no alert.)
BOUNDED_LABELS = {"job", "namespace", "queue", "reason", "outcome", "phase", "verb", "resource", "code", "name", "le"}


def tool(name: str) -> Path:
    path = BIN / name
    if not os.access(path, os.X_OK):
        pytest.fail(f"{name} not found at {path}: run testbed/build.sh (it builds {name} into {BIN})")
    return path


def run(*command: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=300, cwd=ROOT)


def rule_groups() -> list[dict]:
    return yaml.safe_load(RULES.read_text())["groups"]


def alerts() -> dict[str, dict]:
    return {rule["alert"]: rule for group in rule_groups() for rule in group["rules"] if "alert" in rule}


# --- PromQL, read just enough to name the metrics an expression uses -----------------------------

PROMQL_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset", "bool",
    "inf", "nan", "atan2",
    # aggregation operators: followed by by/without rather than a parenthesis
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
    "quantile", "limitk", "limit_ratio",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names in a PromQL expression: identifiers that are not functions (followed by
    a parenthesis), keywords, label names (inside {...} or after by/on/without/ignoring/group_*),
    durations (inside [...]) or strings. Grafana's $variables are dropped first."""
    text = re.sub(r"\$\{[^}]*\}|\$\w+", "", expr)
    text = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'', '""', text)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1 ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in PROMQL_KEYWORDS:
            continue
        names.add(name)
    return names


def exported_metric_names() -> set[str]:
    """Every series name the operator can export, from a fresh Metrics and its state collector
    (given one job and one queue so that every family shows). Counters end in _total, histograms
    give _bucket, _count and _sum."""
    metrics = Metrics(CollectorRegistry())
    numbers = {"queued": 1, "running": 1, "backingOff": 0, "oldestQueuedSeconds": 3, "maxRunning": 2}
    metrics.collect_from(StateCollector(lambda: [{"status": {"phase": "Running"}}], lambda: [("ns", "q", numbers)]))
    names = set()
    for family in metrics.registry.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}{suffix}" for suffix in ("_bucket", "_count", "_sum"))
        else:
            names.add(family.name)
        names.update(sample.name for sample in family.samples)
    return names


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


def helm_template(*sets: str, strings: tuple[str, ...] = ()) -> list[dict]:
    command = [tool("helm"), "template", "vigil", CHART, "--namespace", "vigil-system", "--kube-version", KUBE_VERSION]
    for value in sets:
        command += ["--set", value]
    for value in strings:
        command += ["--set-string", value]
    result = run(*command)
    assert result.returncode == 0, f"helm template failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


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
