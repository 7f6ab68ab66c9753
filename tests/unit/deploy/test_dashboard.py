"""The Grafana dashboard (charts/vigil/files/grafana-dashboard.json): it parses, every query reads
only metrics Vigil exports (or `up`) through the `${datasource}` variable, it has the panels an
on-call person looks at first, and the chart ships it in a ConfigMap for Grafana's sidecar."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.charts import CHART, helm_template, run, tool
from tests.support.metrics import STANDARD_METRICS, exported_metric_names, metric_names

pytestmark = pytest.mark.unit

DASHBOARD = CHART / "files" / "grafana-dashboard.json"


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def all_panels(panels: list[dict]) -> Iterator[dict]:
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels") or [])


def queries() -> Iterator[tuple[str, str]]:
    for panel in all_panels(dashboard()["panels"]):
        for target in panel.get("targets") or []:
            yield panel["title"], target["expr"]


def test_the_dashboard_is_grafana_json_with_a_datasource_and_namespace_queue_pool_variables():
    board = dashboard()
    assert board["uid"] == "vigil-overview" and board["title"] == "Vigil"
    assert board["schemaVersion"] >= 36
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert {"namespace", "queue", "pool"} <= set(variables)
    ids = [panel["id"] for panel in all_panels(board["panels"])]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in all_panels(board["panels"]):
        position = panel["gridPos"]
        assert position["x"] + position["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert panel["targets"], f"{panel['title']} has no query"
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_every_query_reads_only_metrics_vigil_exports():
    exported = exported_metric_names() | STANDARD_METRICS
    # label_values(<series selector>, <label>): the selector is PromQL, the label is not a metric
    variables = [v["definition"] for v in dashboard()["templating"]["list"] if v["type"] == "query"]
    selectors = [("variable", v.removeprefix("label_values(").rsplit(",", 1)[0]) for v in variables]
    for title, expr in [*queries(), *selectors]:
        used = metric_names(expr)
        assert used, f"{title}: no metric in {expr}"
        assert used <= exported, f"{title} reads metrics Vigil does not export: {sorted(used - exported)}"


def test_every_query_is_promql_that_promtool_parses(tmp_path: Path):
    """promtool has no command for a bare expression, so each query goes into a rule file as a
    recording rule, with Grafana's variables replaced by values, and `promtool check rules` parses it."""

    def concrete(expr: str) -> str:
        expr = expr.replace("$__rate_interval", "1m")
        return re.sub(r"\$\{?\w+\}?", ".*", expr)

    rules = [{"record": f"dashboard:query_{i}", "expr": concrete(expr)} for i, (_, expr) in enumerate(queries())]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = run(tool("promtool"), "check", "rules", path)
    assert result.returncode == 0, f"promtool could not parse a dashboard query:\n{result.stdout}\n{result.stderr}"


def test_the_queue_panels_follow_the_namespace_and_queue_variables():
    for title, expr in queries():
        if "vigil_queue_" in expr or "vigil_task_outcomes_" in expr:
            assert 'namespace=~"$namespace"' in expr and 'queue=~"$queue"' in expr, title


def test_the_pool_panels_follow_the_namespace_and_pool_variables():
    pool_queries = [(title, expr) for title, expr in queries() if "vigil_pool_" in expr]
    assert pool_queries, "no panel shows the pools"
    for title, expr in pool_queries:
        assert 'namespace=~"$namespace"' in expr and 'pool=~"$pool"' in expr, title
        assert "by (namespace, pool)" in expr, f"{title}: the replicas' gauges are maxed per pool"


def test_the_dashboard_has_the_panels_on_call_looks_at_first():
    used = set().union(*(metric_names(expr) for _, expr in queries()))
    first_looks = {
        "vigil_jobs",  # jobs by phase
        "vigil_queue_depth",
        "vigil_queue_running",
        "vigil_queue_max_running",
        "vigil_queue_oldest_wait_seconds",
        "vigil_queue_starts_total",
        "vigil_retries_total",
        "vigil_uncertain_attempts",
        "vigil_attempts_lost_total",
        "vigil_dead_letters_total",
        "vigil_heartbeat_gap_seconds_bucket",
        "controller_runtime_reconcile_total",
        "controller_runtime_reconcile_time_seconds_bucket",
        "workqueue_depth",
        "vigil_api_request_duration_seconds_bucket",
        "vigil_api_request_errors_total",
        "leader_election_master_status",
        "vigil_watch_relists_total",
        "process_resident_memory_bytes",  # against vigil_memory_limit_bytes: the sizing of capacity-planning.md
        "vigil_memory_limit_bytes",
        "vigil_task_outcomes_total",  # the arrays' tasks: outcomes and dead letters by queue
        "vigil_tasks",  # and by state
        # the worker pools: workers against desired and max, slots used against slots, the backlog
        "vigil_pool_workers",
        "vigil_pool_workers_ready",
        "vigil_pool_desired_workers",
        "vigil_pool_max_workers",
        "vigil_pool_slots",
        "vigil_pool_slots_used",
        "vigil_pool_backlog",
        "vigil_pull_claim_latency_seconds_bucket",
        "vigil_pull_requests_total",
    }
    assert first_looks <= used, f"no panel shows {sorted(first_looks - used)}"


def test_the_chart_ships_no_dashboard_unless_asked():
    assert not [doc for doc in helm_template() if doc["kind"] == "ConfigMap" and "vigil.json" in doc.get("data", {})]


def test_the_chart_ships_the_dashboard_in_a_configmap_for_grafanas_sidecar():
    docs = helm_template(
        "grafanaDashboard.enabled=true",
        "grafanaDashboard.annotations.grafana_folder=Vigil",
        strings=("grafanaDashboard.labels.grafana_dashboard=1",),
    )
    (config_map,) = [doc for doc in docs if doc["kind"] == "ConfigMap" and "vigil.json" in doc.get("data", {})]
    assert config_map["metadata"]["namespace"] == "vigil-system"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["labels"]["app.kubernetes.io/name"] == "vigil"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Vigil"}
    assert json.loads(config_map["data"]["vigil.json"]) == dashboard(), "the ConfigMap holds the file as it is"
    assert "{{namespace}}/{{queue}}" in config_map["data"]["vigil.json"], "Helm left Grafana's legends alone"
    yaml.safe_dump(config_map)  # a plain object, nothing Helm-specific left
