"""What `kubectl vigil` shows and what its redrive does, decided from objects as the API server
sends them (dicts) and a wall time handed in: no I/O here, so every answer is tested without a
cluster. Field names are the CRDs' (`crds/`); the rows are dicts, rendered by `render`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from vigil.api import ANNOTATION_HEARTBEAT, ANNOTATION_REDRIVE, DEFAULT_QUEUE
from vigil.core import fields

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
    return {
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


# --- dlq, top ---------------------------------------------------------------------------------


def dead_letters(jobs: Iterable[Mapping[str, Any]], now: datetime) -> list[dict[str, Any]]:
    """`kubectl vigil dlq`: one row per dead-lettered job, the longest dead first."""
    rows = []
    for job in jobs:
        meta, status = _meta(job), fields.status(job)
        rows.append(
            {
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "queue": fields.spec(job).get("queue") or DEFAULT_QUEUE,
                "attempts": status.get("attempts", 0),
                "redrives": status.get("redrives", 0),
                "reason": status.get("reason"),
                "message": status.get("message"),
                "deadLetteredAt": status.get("finishedAt"),
                "since": ago(status.get("finishedAt"), now),
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


# --- redrive ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RedriveStep:
    """One job of a redrive: the annotation value to write, or why it is refused (`value` None)."""

    name: str
    namespace: str
    value: str | None
    why: str
    resource_version: str = ""  # the job as read: a write on a job changed since is refused


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
        if phase != "DeadLettered":
            why = f"not dead-lettered (phase {phase}): only a dead-lettered job can be redriven"
        elif pending and pending != status.get("lastRedrive"):
            why = f"a redrive is already pending ({ANNOTATION_REDRIVE}={pending}, not yet honoured by the operator)"
        elif most is not None and planned >= most:
            why = f"over --max {most}: not redriven this time"
        else:
            planned += 1
            value = redrive_value(now, (pending, status.get("lastRedrive")))
            rounds = status.get("redrives", 0) + 1
            steps.append(RedriveStep(name, where, value, f"redrive {rounds}", _meta(job).get("resourceVersion") or ""))
            continue
        steps.append(RedriveStep(name, where, None, why))
    return steps


def redrive_patch(step: RedriveStep) -> dict[str, Any]:
    """The merge patch of one redrive: the annotation, on the job at the version it was planned
    on (a job redriven or changed by someone else meanwhile is refused with a conflict)."""
    metadata: dict[str, Any] = {"annotations": {ANNOTATION_REDRIVE: step.value}}
    if step.resource_version:
        metadata["resourceVersion"] = step.resource_version
    return {"metadata": metadata}
