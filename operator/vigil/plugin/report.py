"""What `kubectl vigil` shows and what its redrive does, decided from objects as the API server
sends them (dicts) and a wall time handed in: no I/O here, so every answer is tested without a
cluster. Field names are the CRDs' (`crds/`); the rows are dicts, rendered by `render`.

A task array (a job with `spec.tasks`) adds its tasks to what `status` shows (their counts, the
index ranges succeeded and dead-lettered, the dead-lettered tasks' details, the active ones),
stands in the dead-letter queue as soon as one of its tasks is dead-lettered, and has its
dead-lettered tasks redriven by index (`vigil.dev/redrive-tasks`); a job without tasks shows and
redrives as it always did. `top` shows the VigilWorkerPools beside the queues (`pool_rows`), from
their status as Vigil writes it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from vigil.api import (
    ANNOTATION_HEARTBEAT,
    ANNOTATION_REDRIVE,
    ANNOTATION_REDRIVE_TASKS,
    DEFAULT_QUEUE,
    DEFAULT_TASK_PARALLELISM,
    LABEL_DEAD_LETTER,
)
from vigil.core import fields
from vigil.core.tasks.ranges import IndexSet

RECENT_ATTEMPTS = 5  # the history `status` shows; status keeps up to 20
# Conditions at a value that says something holds the job back or went wrong; the others
# (Succeeded, Running, Reconciling, Stalled...) repeat what the phase says already.
TROUBLE = {
    "ReconcileError": ("True",),
    "HeartbeatHealthy": ("False", "Unknown"),
    "CheckpointAccepted": ("False",),
}
# Phases in which the job's own reason is why it does not run (Running's is how it runs).
WAITING = ("Queued", "Starting", "BackingOff", "Uncertain", "Suspended")
ACTIVE_SHOWN = 10  # the active tasks of an array `status` lists in a table (-o json has them all)


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    """metadata, {} when missing: what is shown reads whatever it is given (`fields.metadata`
    requires it)."""
    return obj.get("metadata") or {}


def parse_time(stamp: str | None) -> datetime | None:
    """An RFC 3339 time as the API server writes it; None for none or a malformed one."""
    if not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None


def ago(stamp: str | None, now: datetime) -> str:
    """How long ago, as kubectl's AGE column says it ("45s", "3m", "2h", "4d"); "-" for none."""
    when = parse_time(stamp)
    return "-" if when is None else duration((now - when).total_seconds())


def duration(seconds: float | None) -> str:
    """Whole seconds up to 2 minutes, then minutes up to 2 hours, hours up to 2 days, days."""
    if seconds is None:
        return "-"
    whole = max(0, int(seconds))
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if whole >= 2 * size:
            return f"{whole // size}{unit}"
    return f"{whole}s"


def condition(obj: Mapping[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in fields.status(obj).get("conditions") or [] if c.get("type") == type_), None)


# --- status JOB -------------------------------------------------------------------------------


def why_it_waits(job: Mapping[str, Any]) -> list[dict[str, str]]:
    """What holds the job back, each once: its phase's reason and message while it does not run
    (QueueSaturated, RetryBudgetExhausted, a backoff's end...), then every condition in trouble
    (ReconcileError, heartbeats not healthy, a checkpoint refused)."""
    status = fields.status(job)
    found: list[dict[str, str]] = []
    if status.get("phase") in WAITING and status.get("reason"):
        found.append({"source": "phase", "reason": status["reason"], "message": status.get("message") or ""})
    for item in status.get("conditions") or []:
        if item.get("status") in TROUBLE.get(item.get("type", ""), ()):
            entry = {"source": item["type"], "reason": item.get("reason", ""), "message": item.get("message", "")}
            if not any(e["reason"] == entry["reason"] and e["message"] == entry["message"] for e in found):
                found.append(entry)
    return found


def beat_sequence(pod: Mapping[str, Any] | None) -> int | None:
    """The number of the last beat the agent wrote on the pod ("<sequence>:<hex>"), or None."""
    value = (_meta(pod or {}).get("annotations") or {}).get(ANNOTATION_HEARTBEAT)
    head = (value or "").partition(":")[0]
    return int(head) if head.isdigit() else None


def job_status(job: Mapping[str, Any], now: datetime, pod: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`kubectl vigil status JOB`: the job's phase, attempts, why it waits, its beats, its last
    checkpoint and recent attempts. `pod`: the current attempt's pod, if it could be read, for
    the beats the agent has sent (status records the time of a beat only every few minutes)."""
    meta, spec, status = _meta(job), fields.spec(job), fields.status(job)
    current = status.get("currentAttempt")
    healthy = condition(job, "HeartbeatHealthy")
    required = (spec.get("heartbeat") or {}).get("required", True)
    attempt = None
    if current:
        attempt = {
            "number": current.get("number"),
            "pod": current.get("podName"),
            "phase": current.get("phase"),
            "node": current.get("nodeName"),
            "startedAt": current.get("startedAt"),
            "lastHeartbeatAt": current.get("lastHeartbeatAt"),
            "beatsSent": beat_sequence(pod),
        }
    history = list(status.get("history") or [])[-RECENT_ATTEMPTS:]
    summary = {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "queue": spec.get("queue") or DEFAULT_QUEUE,
        "phase": status.get("phase") or "New",
        "reason": status.get("reason"),
        "message": status.get("message"),
        "attempts": status.get("attempts", 0),
        "roundAttempts": status.get("roundAttempts", 0),
        "maxAttempts": (spec.get("retry") or {}).get("maxAttempts"),
        "redrives": status.get("redrives", 0),
        "age": ago(meta.get("creationTimestamp"), now),
        "waiting": why_it_waits(job),
        "nextAttemptAt": status.get("nextAttemptAt"),
        "heartbeat": {
            "required": required,
            "healthy": (healthy or {}).get("status"),
            "reason": (healthy or {}).get("reason"),
        },
        "currentAttempt": attempt,
        "lastCheckpoint": status.get("lastCheckpoint"),
        "recentAttempts": [
            {
                "number": item.get("number"),
                "pod": item.get("podName"),
                "outcome": item.get("outcome"),
                "reason": item.get("reason"),
                "exitCode": item.get("exitCode"),
                "node": item.get("nodeName"),
                "startedAt": item.get("startedAt"),
                "finishedAt": item.get("finishedAt"),
            }
            for item in reversed(history)  # newest first
        ],
    }
    tasks = task_summary(job)
    if tasks is not None:  # a job without tasks shows what it always did, and no more
        summary["tasks"] = tasks
    return summary


# --- task arrays ------------------------------------------------------------------------------


def parse_tasks(text: str) -> IndexSet:
    """`--tasks RANGES`: the indexes as batch/v1 writes completedIndexes ("5,7-9"), at least
    one; ValueError saying what was typed and what is wrong with it."""
    try:
        indexes = IndexSet.parse(text.strip())
    except ValueError as err:
        raise ValueError(f"--tasks {text!r}: {err}") from None
    if not len(indexes):
        raise ValueError(f"--tasks {text!r}: no index given (index ranges, e.g. --tasks 5,7-9)")
    return indexes


def _indexes(text: str | None) -> IndexSet:
    """Index ranges as status writes them; none for none."""
    return IndexSet.parse(text or "")


def task_total(job: Mapping[str, Any]) -> int | None:
    """How many tasks the array has: status's count, else the spec's (None for a job without
    tasks)."""
    spec_tasks = fields.spec(job).get("tasks")
    if not spec_tasks:
        return None
    total = (fields.status(job).get("tasks") or {}).get("total")
    if total is None:
        total = spec_tasks.get("count")
    if total is None:
        total = len(spec_tasks.get("items") or [])
    return int(total)


def _task_failure(item: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "index": item.get("index"),
        "attempts": item.get("attempts"),
        "outcome": item.get("outcome"),
        "reason": item.get("reason"),
        "exitCode": item.get("exitCode"),
        "finishedAt": item.get("finishedAt"),
        "message": item.get("message"),
    }


def _active_task(item: Mapping[str, Any]) -> dict[str, Any]:
    """An active task in brief: its phase, its newest attempt and that attempt's pod."""
    current = item.get("currentAttempt") or {}
    last = item.get("last") or {}
    return {
        "index": item.get("index"),
        "phase": item.get("phase"),
        "reason": item.get("reason"),
        "attempt": item.get("attempts"),
        "pod": current.get("podName"),
        "node": current.get("nodeName"),
        "startedAt": current.get("startedAt") or item.get("startedAt"),
        "nextAttemptAt": item.get("nextAttemptAt"),
        "lastCheckpoint": item.get("lastCheckpoint"),
        "lastOutcome": last.get("outcome"),
        "lastExitCode": last.get("exitCode"),
    }


def task_summary(job: Mapping[str, Any]) -> dict[str, Any] | None:
    """An array's tasks as `status` shows them; None for a job without tasks. Before the
    operator first writes `status.tasks`, every task is pending."""
    total = task_total(job)
    if total is None:
        return None
    spec_tasks = fields.spec(job).get("tasks") or {}
    written = fields.status(job).get("tasks")
    tasks = written or {}
    succeeded = tasks.get("succeeded", 0)
    return {
        "total": total,
        "parallelism": spec_tasks.get("parallelism", DEFAULT_TASK_PARALLELISM),
        "maxDeadLetteredTasks": spec_tasks.get("maxDeadLetteredTasks"),
        "pending": tasks.get("pending", 0) if written else total,
        "running": tasks.get("running", 0),
        "backingOff": tasks.get("backingOff", 0),
        "succeeded": succeeded,
        "deadLettered": tasks.get("deadLettered", 0),
        "progress": tasks.get("progress") or f"{succeeded}/{total}",
        "succeededIndexes": tasks.get("succeededIndexes") or "",
        "deadLetteredIndexes": tasks.get("deadLetteredIndexes") or "",
        # the attempts used by the tasks dead-lettered or redriven and not started again, by number
        "priorAttempts": list(tasks.get("priorAttempts") or []),
        "failed": [_task_failure(item) for item in reversed(tasks.get("failed") or [])],  # newest first
        "active": [_active_task(item) for item in tasks.get("active") or []],  # by index
        "redrives": tasks.get("redrives", 0),
        "lastRedrive": tasks.get("lastRedrive"),
    }


# --- dlq, top ---------------------------------------------------------------------------------


def dead_lettered_tasks(job: Mapping[str, Any]) -> int:
    """How many of an array's tasks are dead-lettered (0 for a job without tasks)."""
    if not fields.spec(job).get("tasks"):
        return 0
    return int((fields.status(job).get("tasks") or {}).get("deadLettered") or 0)


def in_dead_letter_queue(job: Mapping[str, Any]) -> bool:
    """Whether `dlq` lists the job: dead-lettered (labelled so by Vigil), or an array with a
    dead-lettered task, whatever its phase (an array runs on past its dead tasks)."""
    return (_meta(job).get("labels") or {}).get(LABEL_DEAD_LETTER) == "true" or dead_lettered_tasks(job) > 0


def dead_letters(jobs: Iterable[Mapping[str, Any]], now: datetime) -> list[dict[str, Any]]:
    """`kubectl vigil dlq`: one row per dead-lettered job or array with dead-lettered tasks, the
    longest dead first. An array's row adds its progress, how many tasks are dead-lettered,
    their index ranges and the newest ones' details (status keeps 20); one still running has
    been in the queue since its first dead-lettered task of those (its finishedAt is unset)."""
    rows = []
    for job in jobs:
        meta, status = _meta(job), fields.status(job)
        since = status.get("finishedAt")
        tasks = task_summary(job)
        if tasks is not None and not since and tasks["failed"]:
            since = min((item["finishedAt"] for item in tasks["failed"] if item["finishedAt"]), default=None)
        rows.append(
            {
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "queue": fields.spec(job).get("queue") or DEFAULT_QUEUE,
                "phase": status.get("phase") or "New",
                "attempts": status.get("attempts", 0),
                "redrives": status.get("redrives", 0),
                "reason": status.get("reason"),
                "message": status.get("message"),
                "deadLetteredAt": since,
                "since": ago(since, now),
                "tasks": tasks["progress"] if tasks else None,
                "deadLetteredTasks": tasks["deadLettered"] if tasks else None,
                "deadLetteredIndexes": tasks["deadLetteredIndexes"] if tasks else None,
                "failedTasks": tasks["failed"] if tasks else None,
            }
        )
    return sorted(rows, key=lambda row: (row["deadLetteredAt"] or "", row["namespace"] or "", row["name"] or ""))


def budget_state(queue: Mapping[str, Any]) -> str:
    """The retry budget in a word or two: off (retryBudget 1), its share and whether it is spent."""
    share = fields.spec(queue).get("retryBudget", 0.2)
    if share >= 1:
        return "off"
    exhausted = (condition(queue, "RetryBudgetExhausted") or {}).get("status") == "True"
    return f"{share:g} {'exhausted' if exhausted else 'ok'}"


def queue_rows(queues: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`kubectl vigil top`: each queue at a glance, from its spec and the status Vigil writes
    (at most every 2 s); a queue Vigil has not written yet shows no counts."""
    rows = []
    for queue in queues:
        meta, spec, status = _meta(queue), fields.spec(queue), fields.status(queue)
        rows.append(
            {
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "paused": bool(spec.get("paused", False)),
                "queued": status.get("queued"),
                "running": status.get("running"),
                "maxRunning": spec.get("maxRunning"),
                "backingOff": status.get("backingOff"),
                "deadLettered": status.get("deadLettered"),
                "oldestWaitSeconds": status.get("oldestQueuedSeconds"),
                "retryBudget": budget_state(queue),
                "saturated": (condition(queue, "Saturated") or {}).get("status"),
                "headOfLine": list(status.get("headOfLine") or []),
            }
        )
    return sorted(rows, key=lambda row: (row["namespace"] or "", row["name"] or ""))


# The conditions of a VigilWorkerPool `top` shows, at the values that say something is wrong or
# limits it: not Ready (workers missing, a pod not created, no pull endpoint), or at its maximum
# (the backlog asks for more workers than maxReplicas).
POOL_TROUBLE = {"Ready": ("False", "Unknown"), "AtMaximum": ("True",)}
POOL_DEFAULTS = {"minReplicas": 1, "maxReplicas": 10, "slotsPerWorker": 1}  # the CRD's defaults


def pool_conditions(pool: Mapping[str, Any]) -> list[dict[str, str]]:
    """The pool's conditions in trouble (POOL_TROUBLE), in the order status has them."""
    return [
        {
            "type": item["type"],
            "status": item.get("status", ""),
            "reason": item.get("reason", ""),
            "message": item.get("message", ""),
        }
        for item in fields.status(pool).get("conditions") or []
        if item.get("status") in POOL_TROUBLE.get(item.get("type", ""), ())
    ]


def pool_rows(pools: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`kubectl vigil top`: each VigilWorkerPool at a glance, from its spec and the status Vigil
    writes when it changes (workers, slots, backlog: the leader's figures as of its last look, at
    most a few seconds old); a pool Vigil has not written yet shows no counts."""
    rows = []
    for pool in pools:
        meta, spec, status = _meta(pool), fields.spec(pool), fields.status(pool)
        rows.append(
            {
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "replicas": status.get("replicas"),
                "readyReplicas": status.get("readyReplicas"),
                "desiredReplicas": status.get("desiredReplicas"),
                "minReplicas": spec.get("minReplicas", POOL_DEFAULTS["minReplicas"]),
                "maxReplicas": spec.get("maxReplicas", POOL_DEFAULTS["maxReplicas"]),
                "scaledBy": "spec.replicas" if spec.get("replicas") is not None else "backlog",
                "slotsPerWorker": spec.get("slotsPerWorker", POOL_DEFAULTS["slotsPerWorker"]),
                "slots": status.get("slots"),
                "slotsUsed": status.get("slotsUsed"),
                "backlog": status.get("backlog"),
                "ready": (condition(pool, "Ready") or {}).get("status"),
                "conditions": pool_conditions(pool),
            }
        )
    return sorted(rows, key=lambda row: (row["namespace"] or "", row["name"] or ""))


# --- redrive ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RedriveStep:
    """One job of a redrive: the annotation value to write, or why it is refused (`value` None)."""

    name: str
    namespace: str
    value: str | None
    why: str
    resource_version: str = ""  # the job as read: a write on a job changed since is refused
    annotation: str = ANNOTATION_REDRIVE  # vigil.dev/redrive-tasks for some of an array's tasks


def redrive_value(now: datetime, taken: Iterable[str | None]) -> str:
    """What `kubectl annotate vj X vigil.dev/redrive="$(date +%s)" --overwrite` writes: the
    Unix time in seconds; one second on if that value was used already (a redrive within the
    same second as the last), since the operator honours only a value new to `lastRedrive`."""
    used = {value for value in taken if value}
    value = int(now.timestamp())
    while str(value) in used:
        value += 1
    return str(value)


def plan_redrive(
    requested: Sequence[tuple[str, Mapping[str, Any] | None]],
    namespace: str,
    now: datetime,
    most: int | None = None,
) -> list[RedriveStep]:
    """The redrive of each (name, job as read, None if not found), in order, each name once:
    only a dead-lettered job is redriven (the operator records and ignores the annotation on any
    other); one whose redrive is written but not yet honoured is left alone; past `most`
    redrives the rest are refused, to be redriven by a later run."""
    steps: list[RedriveStep] = []
    seen: set[str] = set()
    planned = 0
    for name, job in requested:
        if name in seen:
            continue
        seen.add(name)
        if job is None:
            steps.append(RedriveStep(name, namespace, None, f"vigiljob {name} not found in namespace {namespace}"))
            continue
        status = fields.status(job)
        pending = (_meta(job).get("annotations") or {}).get(ANNOTATION_REDRIVE)
        phase = status.get("phase") or "New"
        where = _meta(job).get("namespace") or namespace
        dead_tasks = (status.get("tasks") or {}).get("deadLetteredIndexes") if dead_lettered_tasks(job) else None
        if phase != "DeadLettered":
            why = f"not dead-lettered (phase {phase}): only a dead-lettered job can be redriven"
            if dead_tasks:  # an array running on past some dead tasks: those can be
                why += f"; its dead-lettered tasks can, by index: --tasks {dead_tasks}"
        elif pending and pending != status.get("lastRedrive"):
            why = f"a redrive is already pending ({ANNOTATION_REDRIVE}={pending}, not yet honoured by the operator)"
        elif most is not None and planned >= most:
            why = f"over --max {most}: not redriven this time"
        else:
            planned += 1
            value = redrive_value(now, (pending, status.get("lastRedrive")))
            rounds = status.get("redrives", 0) + 1
            what = f"redrive {rounds}" + (f", every dead-lettered task ({dead_tasks})" if dead_tasks else "")
            steps.append(RedriveStep(name, where, value, what, _meta(job).get("resourceVersion") or ""))
            continue
        steps.append(RedriveStep(name, where, None, why))
    return steps


def _token(value: str | None) -> str | None:
    """The token of a `vigil.dev/redrive-tasks` value ("<ranges>@<token>")."""
    return value.rpartition("@")[2] if value else None


def plan_task_redrive(
    name: str, job: Mapping[str, Any] | None, namespace: str, wanted: IndexSet, now: datetime
) -> RedriveStep:
    """The redrive of some of an array's tasks by index (`redrive JOB --tasks RANGES`): the
    value "<ranges>@<token>" of `vigil.dev/redrive-tasks`, the token as a whole redrive's (the
    Unix time, never one the array used last), or why not: the job is not there or is no array,
    an index is beyond its tasks, or not dead-lettered (the operator would ignore those, with a
    Warning event: refused here saying which, and which of those asked are), or a task redrive
    written before is not yet honoured. Any phase: an array redrives its dead tasks running."""
    if job is None:
        return RedriveStep(name, namespace, None, f"vigiljob {name} not found in namespace {namespace}")
    where = _meta(job).get("namespace") or namespace
    total = task_total(job)
    if total is None:
        return RedriveStep(name, where, None, "not a task array (no spec.tasks): redrive it without --tasks")
    tasks = fields.status(job).get("tasks") or {}
    pending = (_meta(job).get("annotations") or {}).get(ANNOTATION_REDRIVE_TASKS)
    beyond = wanted - IndexSet.span(0, total)
    dead = _indexes(tasks.get("deadLetteredIndexes")) if dead_lettered_tasks(job) else _indexes("")
    alive = wanted - beyond - dead
    if len(beyond):
        indexes = _plural(len(beyond), "index", "indexes")
        why = f"{indexes} {beyond} out of range: the array has {total} tasks (0-{total - 1})"
    elif len(alive):
        asked_dead = wanted - alive
        why = f"{_plural(len(alive), 'task', 'tasks')} {alive} not dead-lettered"
        if len(asked_dead):
            why += f" (of those asked, these are: {asked_dead})"
        else:
            why += f" (the array's dead-lettered tasks: {dead if len(dead) else 'none'})"
    elif pending and pending != tasks.get("lastRedrive"):
        why = (
            f"a task redrive is already pending ({ANNOTATION_REDRIVE_TASKS}={pending}, "
            "not yet honoured by the operator)"
        )
    else:
        token = redrive_value(now, (_token(pending), _token(tasks.get("lastRedrive"))))
        value = f"{wanted}@{token}"
        what = f"{_plural(len(wanted), 'dead-lettered task', 'dead-lettered tasks')} {wanted}"
        return RedriveStep(name, where, value, what, _meta(job).get("resourceVersion") or "", ANNOTATION_REDRIVE_TASKS)
    return RedriveStep(name, where, None, why, annotation=ANNOTATION_REDRIVE_TASKS)


def _plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def redrive_patch(step: RedriveStep) -> dict[str, Any]:
    """The merge patch of one redrive: the annotation, on the job at the version it was planned
    on (a job redriven or changed by someone else meanwhile is refused with a conflict)."""
    metadata: dict[str, Any] = {"annotations": {step.annotation: step.value}}
    if step.resource_version:
        metadata["resourceVersion"] = step.resource_version
    return {"metadata": metadata}
