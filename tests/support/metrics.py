"""The metrics Vigil exports, and the metric names a PromQL expression reads: for the tests of
the alerting rules and of the Grafana dashboard."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry

from vigil.core.pools import PoolLoad
from vigil.metrics import Metrics
from vigil.metrics.collectors import MemoryLimitCollector, PoolCollector, StateCollector

# Metrics every Prometheus has for a target, besides what Vigil exports.
STANDARD_METRICS = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}

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
    (given one job, one queue and an array's tasks, one worker pool, and a memory limit, so that
    every family shows; the process collector's on Linux). Counters end in _total, histograms
    give _bucket, _count and _sum."""
    metrics = Metrics(CollectorRegistry())
    numbers = {"queued": 1, "running": 1, "backingOff": 0, "oldestQueuedSeconds": 3, "maxRunning": 2}
    tasks = {"pending": 1, "running": 1}  # the arrays' tasks by state (vigil_tasks)
    metrics.collect_from(StateCollector(lambda: {"Running": 1}, lambda: [("ns", "q", numbers)], lambda: tasks))
    metrics.collect_from(MemoryLimitCollector(lambda: 512 * 2**20))  # in a container with a limit
    pools = {("ns", "p"): {"metadata": {"uid": "u"}, "spec": {}, "status": {"desiredReplicas": 1}}}  # one pool
    metrics.collect_from(PoolCollector(lambda: pools, lambda ns, name: [], lambda ns, name: PoolLoad(queued=1)))
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
