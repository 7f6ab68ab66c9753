"""Metrics: what a status write counts, and what a scrape shows of the caches."""

from __future__ import annotations

import platform
from datetime import UTC, datetime

import pytest
from prometheus_client import generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

import vigil
from vigil.controllers.jobs.view import ClusterView
from vigil.core.pools import PoolLoad
from vigil.metrics import TASK_OUTCOMES, Metrics
from vigil.metrics.collectors import MemoryLimitCollector, PoolCollector, StateCollector, count_transition

pytestmark = pytest.mark.unit

NOW = datetime(2025, 3, 1, 12, 1, 0, tzinfo=UTC)


def value(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def record(number: int, outcome: str, reason: str = "Error") -> dict:
    return {
        "number": number,
        "outcome": outcome,
        "reason": reason,
        "startedAt": "2025-03-01T12:00:00+00:00",
        "finishedAt": "2025-03-01T12:00:30+00:00",
    }


def test_a_task_arrays_uncertain_lost_retried_and_succeeded_tasks_are_counted_as_a_jobs_attempts():
    m = Metrics()
    queue = {"queue": ("ns", "batch"), "created": "2025-03-01T12:00:50+00:00", "now": NOW}

    def array(succeeded: int, *active: dict) -> dict:
        return {
            "attempts": 3,
            "phase": "Running",
            "tasks": {"total": 9, "succeeded": succeeded, "active": list(active)},
        }

    running = array(0, {"index": 0, "phase": "Running"}, {"index": 1, "phase": "Running"})
    doubtful = array(0, {"index": 0, "phase": "Uncertain"}, {"index": 1, "phase": "Running"})
    count_transition(m, running, doubtful, **queue)
    count_transition(m, doubtful, doubtful, **queue)  # the same again: nothing new
    assert value(m, "vigil_attempts_uncertain_total") == 1
    lost = array(1, {"index": 0, "phase": "BackingOff", "last": record(1, "Lost", "HeartbeatLost")})
    count_transition(m, doubtful, lost, **queue)
    count_transition(m, lost, lost, **queue)
    assert value(m, "vigil_attempts_lost_total", reason="HeartbeatLost") == 1
    assert value(m, "vigil_attempts_finished_total", outcome="Lost") == 1
    assert value(m, "vigil_retries_total", reason="Lost") == 1
    assert value(m, "vigil_attempts_finished_total", outcome="Succeeded") == 1  # task 1 left active, succeeded


def test_a_start_a_failure_a_retry_and_a_dead_letter_are_counted_once_each():
    m = Metrics()
    queue = {"queue": ("ns", "batch"), "created": "2025-03-01T12:00:50+00:00", "now": NOW}
    count_transition(m, {}, {"attempts": 1, "phase": "Starting"}, **queue)
    assert value(m, "vigil_attempts_started_total") == 1
    assert value(m, "vigil_queue_wait_seconds_sum", namespace="ns", queue="batch") == 10.0
    failed = {"attempts": 1, "phase": "BackingOff", "history": [record(1, "Failed")]}
    count_transition(m, {"attempts": 1, "phase": "Running"}, failed, **queue)
    lost = {
        "attempts": 2,
        "phase": "DeadLettered",
        "reason": "AttemptsExhausted",
        "history": [record(1, "Failed"), record(2, "Lost", "HeartbeatLost")],
    }
    count_transition(m, {**failed, "attempts": 2, "phase": "Running"}, lost, **queue)
    assert value(m, "vigil_attempts_finished_total", outcome="Failed") == 1, "a record is counted when it appears"
    assert value(m, "vigil_attempts_finished_total", outcome="Lost") == 1
    assert value(m, "vigil_attempts_lost_total", reason="HeartbeatLost") == 1
    assert value(m, "vigil_retries_total", reason="Failed") == 1
    assert value(m, "vigil_dead_letters_total", reason="AttemptsExhausted") == 1
    assert value(m, "vigil_attempt_duration_seconds_sum", outcome="Lost") == 30.0


def test_a_start_recorded_after_its_pod_waited_until_the_pod_began_not_until_the_write():
    m = Metrics()
    queue = {"queue": ("ns", "batch"), "created": "2025-03-01T12:00:50+00:00", "now": NOW}  # NOW is 12:01:00
    # The pod came first, at 12:00:52; the look that found it ended and closed it at 12:01:00.
    found = {
        "attempts": 1,
        "phase": "BackingOff",
        "history": [{**record(1, "Failed"), "startedAt": "2025-03-01T12:00:52+00:00"}],
    }
    count_transition(m, {}, found, **queue)
    assert value(m, "vigil_attempts_started_total") == 1
    assert value(m, "vigil_queue_wait_seconds_sum", namespace="ns", queue="batch") == 2.0


def _job(i: int, phase: str | None, rv: str = "1") -> dict:
    status = {"phase": phase} if phase else {}
    meta = {"name": f"secret-job-{i}", "namespace": "ns", "uid": f"u{i}", "resourceVersion": rv}
    return {"metadata": meta, "status": status}


def test_a_scrape_shows_jobs_by_phase_and_queues_without_any_job_name():
    m = Metrics()
    view = ClusterView()
    for i, phase in enumerate(["Running", "Running", "Uncertain", "Queued"]):
        view.take(_job(i, phase))
    m.collect_from(
        StateCollector(lambda: view.phases, lambda: [("ns", "batch", {"queued": 4, "running": 2, "maxRunning": 2})])
    )
    assert value(m, "vigil_jobs", phase="Running") == 2
    assert value(m, "vigil_jobs", phase="DeadLettered") == 0, "every phase is shown, zeros included"
    assert value(m, "vigil_uncertain_attempts") == 1
    assert value(m, "vigil_queue_depth", namespace="ns", queue="batch") == 4
    assert value(m, "vigil_queue_max_running", namespace="ns", queue="batch") == 2
    assert b"secret-job" not in generate_latest(m.registry), "never labelled by job"


def test_jobs_by_phase_are_counted_as_versions_come_and_go_not_walked_at_scrape_time():
    view = ClusterView()
    view.take(_job(1, None))
    view.take(_job(2, "Running"))
    assert view.phases == {"New": 1, "Running": 1}
    view.take(_job(1, "Queued", rv="2"))
    view.take(_job(1, None, rv="1"))  # an older version is not taken, nor counted
    view.take(_job(2, "Succeeded", rv="2"))
    assert view.phases == {"Queued": 1, "Succeeded": 1}
    view.drop(("ns", "secret-job-2"))
    view.drop(("ns", "secret-job-2"))  # twice: counted once
    assert view.phases == {"Queued": 1}
    m = Metrics()
    m.collect_from(StateCollector(lambda: view.phases, list))
    assert value(m, "vigil_jobs", phase="Queued") == 1 and value(m, "vigil_jobs", phase="Succeeded") == 0


def test_a_deleted_queues_series_are_removed():
    m = Metrics()
    m.queue_starts.labels("ns", "batch").inc()
    m.queue_wait.labels("ns", "batch").observe(1.0)
    m.task_outcome("ns", "batch", "Succeeded", 3)
    m.queue_starts.labels("ns", "other").inc()
    m.task_outcome("ns", "other", "Retried")
    m.forget_queue("ns", "batch")
    m.forget_queue("ns", "never-had-series")
    text = generate_latest(m.registry)
    assert b'queue="batch"' not in text and b'queue="other"' in text
    assert value(m, "vigil_task_outcomes_total", namespace="ns", queue="other", outcome="Retried") == 1


def test_task_outcomes_are_counted_by_queue_and_outcome_every_outcome_shown_from_the_first():
    m = Metrics()
    m.task_outcome("ns", "batch", "Succeeded", 979)
    m.task_outcome("ns", "batch", "Retried", 2)
    m.task_outcome("ns", "batch", "DeadLettered")
    m.task_outcome("ns", "batch", "Succeeded", 0)  # nothing to count: nothing changes
    m.task_outcome("other", "default", "Succeeded")
    assert value(m, "vigil_task_outcomes_total", namespace="ns", queue="batch", outcome="Succeeded") == 979
    assert value(m, "vigil_task_outcomes_total", namespace="ns", queue="batch", outcome="Retried") == 2
    assert value(m, "vigil_task_outcomes_total", namespace="ns", queue="batch", outcome="DeadLettered") == 1
    # The other queue's first count made its three series, so a rate of dead letters shows from 0.
    samples = {
        (s.labels["queue"], s.labels["outcome"]): s.value
        for family in m.registry.collect()
        if family.name == "vigil_task_outcomes"
        for s in family.samples
        if s.name == "vigil_task_outcomes_total"
    }
    assert samples[("default", "DeadLettered")] == 0 and samples[("default", "Retried")] == 0
    assert {outcome for _, outcome in samples} == set(TASK_OUTCOMES) == {"Succeeded", "DeadLettered", "Retried"}


@pytest.mark.parametrize(("outcome", "n"), [("Failed", 1), ("succeeded", 1), ("Succeeded", -1)])
def test_a_task_outcome_outside_the_three_or_a_negative_count_is_refused(outcome: str, n: int):
    m = Metrics()
    with pytest.raises(ValueError):
        m.task_outcome("ns", "batch", outcome, n)
    assert b"vigil_task_outcomes_total{" not in generate_latest(m.registry), "no series made by a refused count"


def test_a_scrape_shows_the_arrays_tasks_by_state_from_the_tally_every_state_included():
    tally = {"pending": 10, "running": 10, "succeeded": 979, "deadLettered": 1}
    m = Metrics()
    m.collect_from(StateCollector(lambda: {"Running": 1}, list, lambda: tally))
    assert value(m, "vigil_tasks", state="Pending") == 10
    assert value(m, "vigil_tasks", state="Running") == 10
    assert value(m, "vigil_tasks", state="Succeeded") == 979
    assert value(m, "vigil_tasks", state="DeadLettered") == 1
    assert m.registry.get_sample_value("vigil_tasks", {"state": "BackingOff"}) == 0, "absent is not zero"
    tally["succeeded"] += 10  # read at each scrape
    assert value(m, "vigil_tasks", state="Succeeded") == 989
    without = Metrics()
    without.collect_from(StateCollector(lambda: {}, list))
    assert b"vigil_tasks" not in generate_latest(without.registry), "no tally given, no family"


def test_api_calls_are_timed_and_failures_counted_by_code():
    m = Metrics()

    class Refused(Exception):
        status = 403

    with pytest.raises(Refused), m.timed_request("create", "pods"):
        raise Refused()
    with m.timed_request("get", "pods"):
        pass
    assert value(m, "vigil_api_request_errors_total", verb="create", resource="pods", code="403") == 1
    assert value(m, "vigil_api_request_duration_seconds_count", verb="get", resource="pods") == 1


def every_series(m: Metrics) -> Metrics:
    """`m` with a series in every family (a labelled family shows no sample until one is made)
    and the state collector's, so a scrape shows every name the operator can export."""
    for metric in vars(m).values():
        if isinstance(metric, MetricWrapperBase) and metric._labelnames:
            child = metric.labels(*["x"] * len(metric._labelnames))
            (child.observe if hasattr(child, "observe") else child.inc)(1)
    numbers = {"queued": 1, "running": 1, "backingOff": 0, "oldestQueuedSeconds": 3, "maxRunning": 2}
    m.collect_from(StateCollector(lambda: {"Uncertain": 1}, lambda: [("ns", "q", numbers)], lambda: {"running": 1}))
    m.collect_from(MemoryLimitCollector(lambda: 512 * 2**20))
    pools = {("ns", "p"): {"metadata": {"uid": "u"}, "spec": {}, "status": {"desiredReplicas": 1}}}
    m.collect_from(PoolCollector(lambda: pools, lambda ns, name: [], lambda ns, name: PoolLoad(queued=1)))
    return m


def test_the_exposition_is_valid_openmetrics_each_family_named_once():
    # OpenMetrics names a counter's family without `_total`: a gauge vigil_attempts_uncertain
    # beside the counter vigil_attempts_uncertain_total was one family twice, and the parser
    # (Prometheus' too, scraping with the OpenMetrics Accept header) refused the whole scrape.
    text = generate_openmetrics(every_series(Metrics()).registry).decode()
    assert text.endswith("# EOF\n")
    families = list(parse_openmetrics(text))  # strict: a clash, a bad suffix or a bad type raises
    names = [family.name for family in families]
    assert len(names) == len(set(names))
    kinds = {family.name: family.type for family in families}
    assert kinds["vigil_uncertain_attempts"] == "gauge" and kinds["vigil_attempts_uncertain"] == "counter"
    assert kinds["vigil_build"] == "info" and kinds["process_resident_memory_bytes"] == "gauge"
    assert kinds["vigil_tasks"] == "gauge" and kinds["vigil_task_outcomes"] == "counter"
    assert kinds["vigil_pool_workers"] == "gauge" and kinds["vigil_pool_workers_ready"] == "gauge"


def test_build_info_names_the_running_version_once():
    m = Metrics()
    labels = {"version": vigil.__version__, "python_version": platform.python_version()}
    assert value(m, "vigil_build_info", **labels) == 1
    series = [s for f in m.registry.collect() for s in f.samples if s.name == "vigil_build_info"]
    assert len(series) == 1, "one series, whatever else the scrape shows"


def test_the_process_memory_the_docs_size_is_exported():
    # docs/capacity-planning.md sizes the memory limit; this is how an installation watches it.
    m = Metrics()
    assert value(m, "process_resident_memory_bytes") > 10 * 2**20, "this Python's RSS, read from /proc"
    assert value(m, "process_open_fds") > 0 and value(m, "process_max_fds") > 0
    assert value(m, "process_cpu_seconds_total") > 0


def test_the_containers_memory_limit_is_read_at_each_scrape_and_absent_without_one():
    limit: list[int | None] = [512 * 2**20]
    m = Metrics()
    m.collect_from(MemoryLimitCollector(lambda: limit[0]))
    assert value(m, "vigil_memory_limit_bytes") == 512 * 2**20
    limit[0] = 1024 * 2**20  # the pod resized in place
    assert value(m, "vigil_memory_limit_bytes") == 1024 * 2**20
    limit[0] = None  # no limit: no series, rather than a number a ratio would divide by
    assert b"vigil_memory_limit_bytes " not in generate_latest(m.registry)
