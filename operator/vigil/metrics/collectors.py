"""The counts of Vigil's own metrics that are derived rather than incremented where they
happen: gauges read at scrape time from counts the caches keep as they change (`StateCollector`:
the jobs by phase from the view's tally, the arrays' tasks by state from the same, the queues'
numbers from the queue book, O(queues), never a walk over every job; `PoolCollector`: each
VigilWorkerPool's workers from the pool controller's pods and its load from the leader's lease
state, O(pools and their workers)), and the counters a job's status write moves
(`count_transition`, from the status before and after, purely)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any, get_args

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from vigil import api
from vigil.core import fields
from vigil.core.pools import PoolLoad, has_ended, is_ready
from vigil.metrics import Metrics

# The counts of an array's status.tasks, and the `state` label each is exported under (vigil_tasks).
TASK_STATES = {
    "pending": "Pending",
    "running": "Running",
    "backingOff": "BackingOff",
    "succeeded": "Succeeded",
    "deadLettered": "DeadLettered",
}


class StateCollector(Collector):
    """Gauges read from counts kept as the work happens: jobs by phase, attempts Uncertain, queues,
    and, given `tasks` (the status.tasks counts of every array held, summed: {"pending": n, ...}),
    the arrays' tasks by state."""

    def __init__(
        self,
        phases: Callable[[], Mapping[str, int]],
        queues: Callable[[], Iterable[tuple[str, str, Mapping[str, int]]]],
        tasks: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        self.phases, self.queues, self.tasks = phases, queues, tasks

    def collect(self) -> Iterator[GaugeMetricFamily]:
        phases = self.phases()
        by_phase = GaugeMetricFamily("vigil_jobs", "VigilJobs the operator holds, by phase.", labels=["phase"])
        for phase in ("New", *get_args(api.Phase)):  # every phase, zeros included: absent is not zero
            by_phase.add_metric([phase], phases.get(phase, 0))
        yield by_phase
        uncertain = GaugeMetricFamily("vigil_uncertain_attempts", "Attempts Uncertain now.")
        uncertain.add_metric([], phases.get("Uncertain", 0))
        yield uncertain
        if self.tasks is not None:
            counts = self.tasks()
            by_state = GaugeMetricFamily(
                "vigil_tasks", "Tasks of the arrays (spec.tasks) the operator holds, by state.", labels=["state"]
            )
            for field, state in TASK_STATES.items():  # every state, zeros included
                by_state.add_metric([state], counts.get(field, 0))
            yield by_state
        families = {
            "queued": GaugeMetricFamily(
                "vigil_queue_depth", "Jobs (and tasks of arrays) waiting to start.", labels=["namespace", "queue"]
            ),
            "running": GaugeMetricFamily(
                "vigil_queue_running", "Attempts running (a task's included).", labels=["namespace", "queue"]
            ),
            "backingOff": GaugeMetricFamily(
                "vigil_queue_backing_off", "Jobs (and tasks of arrays) in backoff.", labels=["namespace", "queue"]
            ),
            "oldestQueuedSeconds": GaugeMetricFamily(
                "vigil_queue_oldest_wait_seconds", "Wait of the first job in line.", labels=["namespace", "queue"]
            ),
            "maxRunning": GaugeMetricFamily(
                "vigil_queue_max_running", "The queue's spec.maxRunning.", labels=["namespace", "queue"]
            ),
        }
        for namespace, queue, numbers in self.queues():
            for field, family in families.items():
                if field in numbers:
                    family.add_metric([namespace, queue], numbers[field])
        yield from families.values()


# The gauges of each VigilWorkerPool, labelled {namespace, pool} (pools are chosen by people, as
# queues are): the key of `pool_numbers`, the family's name and its help.
POOL_GAUGES = (
    (
        "workers",
        "vigil_pool_workers",
        "Worker pods of the VigilWorkerPool that exist, are not being deleted and have not ended.",
    ),
    ("workersReady", "vigil_pool_workers_ready", "Worker pods of the VigilWorkerPool that are Ready."),
    (
        "slots",
        "vigil_pool_slots",
        "Tasks the pool's Ready workers can run at once: Ready workers x spec.slotsPerWorker.",
    ),
    ("slotsUsed", "vigil_pool_slots_used", "Tasks leased to the pool's workers (running)."),
    ("backlog", "vigil_pool_backlog", "Tasks offered to the pool's workers and not claimed yet."),
    ("desiredWorkers", "vigil_pool_desired_workers", "The workers the pool wants now (status.desiredReplicas)."),
    ("maxWorkers", "vigil_pool_max_workers", "The most workers the pool keeps (spec.maxReplicas)."),
)
_POOL_SPEC = api.VigilWorkerPoolSpec.model_fields


def _count(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _worker_of(pod: Mapping[str, Any], uid: str | None) -> bool:
    """Whether the pod's controller reference is the pool of that UID (a pod of an older pool of
    the same name, going with it, is not this one's)."""
    refs = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("controller") is True and ref.get("uid") == uid for ref in refs)


def pool_numbers(pool: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], load: PoolLoad | None) -> dict[str, int]:
    """A pool's gauges (the keys of POOL_GAUGES), from the pool as held, its pods as the watch has
    them and its load from the lease state, None where there is none (a replica standing by):
    then the tasks leased and waiting are the pool's status as the leader last wrote it, absent
    before its first write. desiredWorkers is the status's (the leader's figure, its scale-down
    window included), absent before the first write."""
    spec, status = fields.spec(pool), fields.status(pool)
    uid = (pool.get("metadata") or {}).get("uid")
    live = [
        pod
        for pod in pods
        if _worker_of(pod, uid) and not (pod.get("metadata") or {}).get("deletionTimestamp") and not has_ended(pod)
    ]
    ready = sum(1 for pod in live if is_ready(pod))
    slots_per_worker = _count(spec.get("slotsPerWorker"), _POOL_SPEC["slots_per_worker"].default)
    numbers = {
        "workers": len(live),
        "workersReady": ready,
        "slots": ready * slots_per_worker,
        "maxWorkers": _count(spec.get("maxReplicas"), _POOL_SPEC["max_replicas"].default),
    }
    if load is not None:
        numbers["slotsUsed"], numbers["backlog"] = max(0, load.running), max(0, load.queued)
    else:
        for key in ("slotsUsed", "backlog"):
            if isinstance(status.get(key), int):
                numbers[key] = status[key]
    if isinstance(status.get("desiredReplicas"), int):
        numbers["desiredWorkers"] = status["desiredReplicas"]
    return numbers


class PoolCollector(Collector):
    """Gauges of every VigilWorkerPool held (POOL_GAUGES), read at each scrape: `pools` gives the
    pools by (namespace, name), as the pool controller holds them (a deleted pool, and its
    series, are gone at once); `pods(namespace, name)` that pool's pods, as the pool controller
    holds them; `load(namespace, name)` its load from the leader's lease state, None on a replica
    that holds none."""

    def __init__(
        self,
        pools: Callable[[], Mapping[tuple[str, str], Mapping[str, Any]]],
        pods: Callable[[str, str], Iterable[Mapping[str, Any]]],
        load: Callable[[str, str], PoolLoad | None],
    ) -> None:
        self.pools, self.pods, self.load = pools, pods, load

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = {key: GaugeMetricFamily(name, text, labels=["namespace", "pool"]) for key, name, text in POOL_GAUGES}
        for (namespace, name), pool in sorted(self.pools().items()):
            numbers = pool_numbers(pool, self.pods(namespace, name), self.load(namespace, name))
            for key, family in families.items():
                if key in numbers:
                    family.add_metric([namespace, name], numbers[key])
        yield from families.values()


class MemoryLimitCollector(Collector):
    """`vigil_memory_limit_bytes`: the container's memory limit, read from its cgroup at each
    scrape (a pod resized in place shows its new one), beside process_resident_memory_bytes;
    nothing where the process has no limit."""

    def __init__(self, read: Callable[[], int | None]) -> None:
        self.read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        limit = self.read()
        if limit is not None:
            yield GaugeMetricFamily(
                "vigil_memory_limit_bytes",
                "The memory limit of the operator's container (its cgroup's memory.max); absent without one.",
                value=limit,
            )

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # registered without a first read: the family may be absent


def _started_at(status: Mapping[str, Any], number: int) -> Any:
    current = status.get("currentAttempt") or {}
    if current.get("number") == number:
        return current.get("startedAt")
    return next((r.get("startedAt") for r in status.get("history") or [] if r.get("number") == number), None)


def count_transition(
    metrics: Metrics,
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    *,
    queue: tuple[str, str],
    created: Any,
    now: datetime,
) -> None:
    """Counts what a status write did to a job: attempts started and finished, retries, Lost,
    Uncertain, dead letters, the queue wait of a start. `before` and `after` are statuses;
    `created` is the job's creationTimestamp (a first attempt could start from then on)."""
    if after.get("tasks") is not None:
        count_task_transitions(metrics, before, after)
    started = int(after.get("attempts") or 0) - int(before.get("attempts") or 0)
    if started > 0:
        metrics.attempts_started.inc(started)
        metrics.queue_starts.labels(*queue).inc(started)
        ready = before.get("nextAttemptAt") or (created if not before.get("attempts") else None)
        if ready:
            # Until the attempt began: its pod may have come first, and this write found it.
            began = _started_at(after, int(before.get("attempts") or 0) + 1)
            until = min(now, _time(began)) if began else now
            metrics.queue_wait.labels(*queue).observe(max(0.0, (until - _time(ready)).total_seconds()))
    known = {record.get("number") for record in before.get("history") or []}
    for record in after.get("history") or []:
        if record.get("number") in known:
            continue
        outcome = record.get("outcome") or "Unknown"
        metrics.attempts_finished.labels(outcome).inc()
        if record.get("startedAt") and record.get("finishedAt"):
            seconds = (_time(record["finishedAt"]) - _time(record["startedAt"])).total_seconds()
            metrics.attempt_duration.labels(outcome).observe(max(0.0, seconds))
        if outcome == "Lost":
            metrics.lost.labels(record.get("reason") or "Unknown").inc()
    phase, was = after.get("phase"), before.get("phase")
    if phase == was:
        return
    if phase == "BackingOff" and after.get("history"):
        metrics.retries.labels(after["history"][-1].get("outcome") or "Unknown").inc()
    elif phase == "Uncertain":
        metrics.uncertain.inc()
    elif phase == "DeadLettered":
        metrics.dead_letters.labels(after.get("reason") or "Unknown").inc()


def count_task_transitions(metrics: Metrics, before: Mapping[str, Any], after: Mapping[str, Any]) -> None:
    """What a task array's status write did to its tasks' attempts (`status.tasks`, before and
    after), counted as a job's are: each active task's newly finished attempt (its `last`) by
    outcome, with its duration and a Lost's reason; each task newly Uncertain; each newly backing
    off, as a retry; each task that succeeded, as a finished attempt (its record leaves `active`)."""
    was = {task.get("index"): task for task in (before.get("tasks") or {}).get("active") or []}
    for task in (after.get("tasks") or {}).get("active") or []:
        old = was.get(task.get("index")) or {}
        last = task.get("last") or {}
        if last and last.get("number") != (old.get("last") or {}).get("number"):
            outcome = last.get("outcome") or "Unknown"
            metrics.attempts_finished.labels(outcome).inc()
            if last.get("startedAt") and last.get("finishedAt"):
                seconds = (_time(last["finishedAt"]) - _time(last["startedAt"])).total_seconds()
                metrics.attempt_duration.labels(outcome).observe(max(0.0, seconds))
            if outcome == "Lost":
                metrics.lost.labels(last.get("reason") or "Unknown").inc()
        phase = task.get("phase")
        if phase == old.get("phase"):
            continue
        if phase == "Uncertain":
            metrics.uncertain.inc()
        elif phase == "BackingOff" and last:
            metrics.retries.labels(last.get("outcome") or "Unknown").inc()
    succeeded = int((after.get("tasks") or {}).get("succeeded") or 0) - int(
        (before.get("tasks") or {}).get("succeeded") or 0
    )
    if succeeded > 0:
        metrics.attempts_finished.labels("Succeeded").inc(succeeded)


def _time(value: Any) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
