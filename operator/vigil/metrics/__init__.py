"""Prometheus metrics of the operator, with prometheus-client.

Generic controller metrics under the names dashboards for Kubernetes controllers already use
(client-go's workqueue, controller-runtime's reconcile, leader election), and Vigil's own under
`vigil_`. No label ever has unbounded cardinality: never a job or pod name; queues are labelled
by namespace and queue name, VigilWorkerPools by namespace and pool name (a handful per
namespace, chosen by people).

`Metrics` holds every metric on its own registry, so that two operators in one process (tests)
do not collide. Counts that are states (jobs by phase, queue depth) are kept by the caches as
they change and read at scrape time by collectors (never a walk over every job), so they can
never drift from what the operator holds. A queue's series go with the queue (`forget_queue`);
a pool's gauges are read from the pool controller and the lease state (`collectors.PoolCollector`),
so they go with the pool.
Counts of events are incremented where they happen (the outcomes of an array's tasks by
`task_outcome`); `collectors.count_transition` derives them from a job's status before and after
a write, purely. Beside them, `vigil_build_info` (1, labelled with the version) and the process's
own (`process_resident_memory_bytes`, `process_open_fds`, ...). Every name is unique as an
OpenMetrics family too: no gauge is named as another family plus `_total`, `_info`, `_created`,
`_bucket`, `_count` or `_sum`, so a scrape asking for OpenMetrics parses.
"""

from __future__ import annotations

import contextlib
import platform
import time
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.registry import Collector

import vigil

disable_created_metrics()  # the *_created series double what is scraped and no dashboard reads them

CONTROLLER = "vigiljob"  # the job controller's name in the controller-runtime metrics
QUEUE_CONTROLLER = "vigilqueue"
# Seconds: from a hundredth of a second (a watch's latency) to an hour (a long queue wait).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
DURATION_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
GAP_BUCKETS = (0.5, 1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 300)
# Seconds the event loop was held: a millisecond is healthy, a second delays every beat's answer.
STALL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
# How a task of an array (spec.tasks) ended a step of its life: the label `outcome` of
# vigil_task_outcomes_total. Retried: an attempt of the task ended and the task gets another.
TASK_OUTCOMES = ("Succeeded", "DeadLettered", "Retried")


class Metrics:
    """Every metric of one operator, on `registry`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # The process's own (process_resident_memory_bytes against the memory limit the docs
        # size, process_open_fds against process_max_fds, CPU) and python_info: read from
        # /proc/self at scrape time, nothing on the hot path. Absent off Linux.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        # vigil_build_info 1, labelled with what runs: what `vigil --version` and the user agent say.
        self.build_info = Info("vigil_build", "The running Vigil's version and Python's; always 1.", registry=r)
        self.build_info.info({"version": vigil.__version__, "python_version": platform.python_version()})
        # client-go workqueue (label `name`), controller-runtime reconcile (label `controller`)
        self.workqueue_depth = Gauge("workqueue_depth", "Current depth of the work queue.", ["name"], registry=r)
        self.workqueue_adds = Counter("workqueue_adds_total", "Adds handled by the work queue.", ["name"], registry=r)
        self.workqueue_queue_duration = Histogram(
            "workqueue_queue_duration_seconds",
            "How long a key stays in the work queue before it is processed.",
            ["name"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.workqueue_work_duration = Histogram(
            "workqueue_work_duration_seconds",
            "How long processing a key takes.",
            ["name"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.workqueue_retries = Counter(
            "workqueue_retries_total", "Retries (rate-limited re-adds) handled by the work queue.", ["name"], registry=r
        )
        self.reconcile_total = Counter(
            "controller_runtime_reconcile_total",
            "Reconciliations per controller and result (success, error, requeue).",
            ["controller", "result"],
            registry=r,
        )
        self.reconcile_errors = Counter(
            "controller_runtime_reconcile_errors_total", "Reconciliation errors.", ["controller"], registry=r
        )
        self.reconcile_time = Histogram(
            "controller_runtime_reconcile_time_seconds",
            "Time per reconciliation.",
            ["controller"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.worker_crashes = Counter(
            "vigil_worker_crashes_total",
            "Workers that ended by an exception and were restarted, by controller.",
            ["controller"],
            registry=r,
        )
        self.leader = Gauge(
            "leader_election_master_status",
            "1 while this process leads (or runs without election), 0 while it stands by.",
            ["name"],
            registry=r,
        )
        # Vigil's own
        self.attempts_started = Counter("vigil_attempts_started_total", "Attempts started.", registry=r)
        self.attempts_finished = Counter(
            "vigil_attempts_finished_total", "Attempts finished, by outcome.", ["outcome"], registry=r
        )
        self.attempt_duration = Histogram(
            "vigil_attempt_duration_seconds",
            "From an attempt's start to its outcome, by outcome.",
            ["outcome"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.retries = Counter(
            "vigil_retries_total", "Retries scheduled, by the outcome that caused them.", ["reason"], registry=r
        )
        self.uncertain = Counter(
            "vigil_attempts_uncertain_total", "Times an attempt became Uncertain (heartbeats late).", registry=r
        )
        self.lost = Counter("vigil_attempts_lost_total", "Attempts declared Lost, by reason.", ["reason"], registry=r)
        self.dead_letters = Counter(
            "vigil_dead_letters_total", "Jobs dead-lettered, by reason.", ["reason"], registry=r
        )
        self.heartbeats = Counter(
            "vigil_heartbeats_total", "Heartbeats observed (posted to the leader, or annotation values).", registry=r
        )
        # outcome: counted, or why not (bounded: see vigil.servers.beats.OUTCOMES).
        self.heartbeat_posts = Counter(
            "vigil_heartbeat_posts_total", "Heartbeats posted to this operator, by outcome.", ["outcome"], registry=r
        )
        self.heartbeat_gap = Histogram(
            "vigil_heartbeat_gap_seconds",
            "Seconds between two beats of one attempt, on the operator's clock: the leading indicator "
            "of trouble (gaps grow before attempts become Uncertain).",
            buckets=GAP_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "vigil_queue_wait_seconds",
            "From when a job could start (created, or its backoff over) to its attempt's start.",
            ["namespace", "queue"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_starts = Counter(
            "vigil_queue_starts_total", "Starts a queue gave.", ["namespace", "queue"], registry=r
        )
        self.queue_budget_delays = Counter(
            "vigil_queue_retry_budget_delays_total",
            "Looks at a due retry that waited for the queue's retry budget.",
            ["namespace", "queue"],
            registry=r,
        )
        self.task_outcomes = Counter(
            "vigil_task_outcomes_total",
            "Tasks of arrays (spec.tasks) by outcome: Succeeded, DeadLettered, or Retried (an attempt of the "
            "task ended and it gets another), by the array's namespace and queue.",
            ["namespace", "queue", "outcome"],
            registry=r,
        )
        # outcome: answered, or why not (bounded: see vigil.servers.pull.OUTCOMES).
        self.pull_requests = Counter(
            "vigil_pull_requests_total",
            "Requests of pools' workers (POST /v1/pull: beats, claims and results), by outcome.",
            ["outcome"],
            registry=r,
        )
        self.pull_claim_latency = Histogram(
            "vigil_pull_claim_latency_seconds",
            "From a pulled task's offer (its start written) to a worker's claim of it.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_refusals = Counter(
            "vigil_queue_admission_refusals_total",
            "New jobs refused by admission because their queue was full (maxQueued).",
            ["namespace", "queue"],
            registry=r,
        )
        self.api_latency = Histogram(
            "vigil_api_request_duration_seconds",
            "Latency of the operator's requests to the API server, by verb and resource.",
            ["verb", "resource"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.api_errors = Counter(
            "vigil_api_request_errors_total",
            "Requests to the API server that failed, by verb, resource and HTTP code (0: no answer).",
            ["verb", "resource", "code"],
            registry=r,
        )
        self.watch_relists = Counter(
            "vigil_watch_relists_total",
            "Lists after the first, by resource: each a moment the watch was not trusted.",
            ["resource"],
            registry=r,
        )
        self.metrics_requests = Counter(
            "vigil_metrics_requests_total",
            "Scrapes of the secure /metrics by HTTP code: 401 no or a refused token, 403 no permission, "
            "429 too many unknown tokens at once, 503 the API server could not review.",
            ["code"],
            registry=r,
        )
        self.events_dropped = Counter(
            "vigil_events_dropped_total",
            "Kubernetes Events not written (vigil.kube.events), by cause: rate-limit, past a job's budget "
            "(25, then one every 5 minutes); backlog, its namespace's share or the whole backlog taken.",
            ["cause"],
            registry=r,
        )
        self.connections_refused = Counter(
            "vigil_connections_refused_total",
            "Connections a server of this operator closed unanswered (vigil.servers.http), by server (health, "
            "metrics, webhook, beats) and reason: limit (it held its most), source-limit (the address held its "
            "most), slow-handshake (no TLS handshake begun in time), slow-head (a request's headers late), "
            "large-head (over 16 KiB).",
            ["server", "reason"],
            registry=r,
        )
        # Set to read the beat server at scrape time (vigil.servers.http.connection_limit).
        self.beat_connections = Gauge(
            "vigil_beat_connections",
            "Connections this operator holds open for beats to the leader (one per beating pod).",
            registry=r,
        )
        self.beat_connections_limit = Gauge(
            "vigil_beat_connections_limit",
            "The most connections this operator holds for beats (--beat-connections, or half its memory limit "
            "at 64 KiB each); past it, beats on new connections are answered 503 and go by annotation.",
            registry=r,
        )
        # What holds the event loop (vigil.runtime.stalls): how late a timer set every 0.25 s
        # fires, and how long each of the garbage collector's collections takes, by generation.
        self.loop_lag = Histogram(
            "vigil_event_loop_lag_seconds",
            "How late a timer the operator sets every 0.25 s fires: its event loop's lag. Every beat "
            "answered, silence alarm and write waits this long.",
            buckets=STALL_BUCKETS,
            registry=r,
        )
        self.gc_pauses = Histogram(
            "vigil_gc_pause_seconds",
            "Collections of Python's garbage collector by generation (0-2), and how long each held the process.",
            ["generation"],
            buckets=STALL_BUCKETS,
            registry=r,
        )
        for generation in ("0", "1", "2"):
            self.gc_pauses.labels(generation)
        for cause in ("rate-limit", "backlog"):  # both series from the start, so the first drop shows in a rate
            self.events_dropped.labels(cause)

    def task_outcome(self, namespace: str, queue: str, outcome: str, n: int = 1) -> None:
        """Counts `n` tasks of arrays in `namespace`/`queue` that ended so (one of TASK_OUTCOMES).
        The queue's first count makes all three of its series, so a rate shows from the first."""
        if outcome not in TASK_OUTCOMES:
            raise ValueError(f"task outcome {outcome!r} is not one of {', '.join(TASK_OUTCOMES)}")
        if n < 0:
            raise ValueError(f"a count of tasks only grows, not by {n}")
        for each in TASK_OUTCOMES:
            self.task_outcomes.labels(namespace, queue, each)
        if n:
            self.task_outcomes.labels(namespace, queue, outcome).inc(n)

    def forget_queue(self, namespace: str, queue: str) -> None:
        """Removes the series of a deleted VigilQueue (its gauges go with it from the queue book)."""
        for family in (self.queue_wait, self.queue_starts, self.queue_budget_delays, self.queue_refusals):
            with contextlib.suppress(KeyError):  # no series of that queue yet
                family.remove(namespace, queue)
        for outcome in TASK_OUTCOMES:
            with contextlib.suppress(KeyError):
                self.task_outcomes.remove(namespace, queue, outcome)

    def collect_from(self, collector: Collector) -> None:
        self.registry.register(collector)

    def timed_request(self, verb: str, resource: str) -> _Timed:
        """`with metrics.timed_request("patch", "pods"):` times the call and counts its failure."""
        return _Timed(self, verb, resource)


class _Timed:
    def __init__(self, metrics: Metrics, verb: str, resource: str) -> None:
        self.metrics, self.verb, self.resource = metrics, verb, resource

    def __enter__(self) -> _Timed:
        self.began = time.monotonic()  # a real request's latency: the machine's clock, not an injected one
        return self

    def __exit__(self, kind: Any, error: Any, _trace: Any) -> None:
        self.metrics.api_latency.labels(self.verb, self.resource).observe(time.monotonic() - self.began)
        if error is not None:
            code = str(getattr(error, "status", 0) or 0)
            self.metrics.api_errors.labels(self.verb, self.resource, code).inc()
