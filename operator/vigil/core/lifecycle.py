"""The decision core: given a job, its pods and the time, what should happen next.

`decide()` is pure: it reads a snapshot and returns actions (`vigil.core.actions`), and the
shell executes them in order. It is level-triggered and built for doubt: the operator may crash
between any two actions, and the snapshot may be stale, duplicated or out of order. The
invariants it keeps (docs/design.md, "Semantics", says why each holds):

- Every decision that mutates anything starts with a fence carrying the resourceVersion it read
  (its PatchStatus, else a ConfirmVersion); the shell drops the rest when the fence fails.
- A decision that only starts attempt N+1 creates its pod and writes no status (the pod first,
  `vigil.core.draft.Draft._only_starts`); the look that finds the pod records the attempt
  (`_adopt_newer_attempt`).
- Attempt numbers only grow; a pod once seen is remembered by UID, and a vanished one is never
  re-created under the same number; a pod of an attempt's name that the job does not own is
  never adopted.
- Liveness comes in as verdicts per pod UID (`vigil.core.liveness`); no verdict is Healthy, never
  Lost. Only Lost replaces an attempt (its pod marked superseded, then deleted, by
  `_stop_stray_pods`, which redoes both after a crash).
- Under NoOverlap no attempt is reserved while a pod of an earlier one may still run.
- A late success of a Lost or Superseded attempt wins; a pod stopped by its deletion is no
  success (`vigil.core.podstate`).
- A pod keeps the attempt-tracking finalizer until status holds its outcome and it can say
  nothing more (`_record_final_states`, `_release_pods`).
- Decided again on what it wrote and the same pods, a decision changes nothing (a property test
  holds it to that): the shell needs no look at its own write.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from vigil import api
from vigil.api import AttemptRecord, CurrentAttempt, Outcome, Phase, VigilJob
from vigil.core import fields, podstate
from vigil.core.actions import ConfirmVersion, Decision, ReleasePod
from vigil.core.backoff import attempt_delay
from vigil.core.conditions import find_condition
from vigil.core.draft import Draft, wire
from vigil.core.jobconditions import CONDITION_CHECKPOINT, CONDITION_HEARTBEAT
from vigil.core.liveness import Liveness
from vigil.core.manifest import BeatChannel, TaskRef, attempt_pod_name

# How often a job blocked by a pod it does not own looks again: that pod's deletion is not an
# event Vigil sees, as the pod does not carry the job's label. Such a job waits for someone to
# delete the pod in its way, so it should start soon after; one GET per job so blocked every 10 s
# is nothing, and such jobs are rare.
POD_NAME_CONFLICT_RECHECK_SECONDS = 10.0

# Outcomes of attempts Vigil replaced while they might still run: their late success counts.
LATE_SUCCESS_OUTCOMES = frozenset({"Lost", "Superseded"})


def decide(
    job: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]],
    now: datetime,
    *,
    rng: random.Random,
    may_start: bool = True,
    waiting: tuple[str, str] | None = None,
    liveness: Mapping[str, Liveness] | None = None,
    beat_channel: BeatChannel | None = None,
    agent_image: str | None = None,
    stamp_floor: float = 0.0,
) -> Decision:
    """The actions that move `job` on, given every pod observed for it at time `now`.

    job: the VigilJob as read from the API server (metadata with uid and resourceVersion, spec,
        status).
    pods: the job's pods as observed, in any order, duplicates and stale snapshots allowed: those
        labelled with the job's UID, plus any pod bearing the name of its current attempt (the
        shell reads it after AlreadyExists), which is reported, never adopted, if not the job's.
    now: the current time, timezone-aware.
    rng: the random source of backoff jitter; the same state gives the same decision.
    may_start: whether the job may start a new attempt now (the queue's say); when False a job
        that would start one stays Queued. Attempts already reserved go on.
    waiting: (reason, message) saying why the queue holds it back (QueueSaturated,
        RetryBudgetExhausted, QueueNotFound, ...), shown in status while may_start is False;
        status and an event change only when the reason does, so a changing count in the
        message costs no write.
    liveness: the failure detector's verdicts by pod UID (only the current attempt's is read).
        None, or a UID missing, means no information: Healthy, never Lost.
    beat_channel, agent_image: how new pods beat (`vigil.core.manifest.attempt_pod_manifest`).
    stamp_floor: the least period of a lastHeartbeatAt written alone, for the attempts the leader
        tracks (`liveness.stamp_floor`).
    """
    return decide_parsed(
        _parse(job),
        pods,
        now,
        rng=rng,
        may_start=may_start,
        waiting=waiting,
        liveness=liveness,
        beat_channel=beat_channel,
        agent_image=agent_image,
        stamp_floor=stamp_floor,
    )


def decide_parsed(
    parsed: VigilJob,
    pods: Iterable[Mapping[str, Any]],
    now: datetime,
    *,
    rng: random.Random,
    may_start: bool = True,
    waiting: tuple[str, str] | None = None,
    liveness: Mapping[str, Liveness] | None = None,
    beat_channel: BeatChannel | None = None,
    agent_image: str | None = None,
    stamp_floor: float = 0.0,
    task: TaskRef | None = None,
) -> Decision:
    """`decide` on a job already parsed; `task`: the job is one task of an array, projected onto a
    job of its own (`vigil.core.tasks.array`)."""
    observed = _ObservedPods.of(parsed.metadata.namespace, parsed.metadata.uid, pods)
    if parsed.metadata.deletion_timestamp is not None:
        return _release_all(parsed, observed)  # the garbage collector deletes the pods
    draft = Draft(
        parsed,
        now,
        liveness=liveness or {},
        beat_channel=beat_channel,
        agent_image=agent_image,
        stamp_floor=stamp_floor,
        task=task,
    )

    _adopt_newer_attempt(draft, observed)
    _honour_redrive(draft)
    _accept_late_success(draft, observed)
    _follow_current_attempt(draft, observed, rng)
    _apply_suspend(draft)
    _enforce_deadlines(draft, rng)
    _run(draft, observed, may_start, waiting)
    _arm_deadlines(draft)
    _expire_after_ttl(draft)
    _stop_stray_pods(draft, observed)
    _record_final_states(draft, observed)
    _release_pods(draft, observed)
    return draft.decision()


def reject_pod(job: Mapping[str, Any], attempt: int, message: str, now: datetime) -> Decision:
    """The actions after the API server refused attempt `attempt`'s pod as invalid (422).

    The template is immutable, so no attempt can ever succeed: the job is dead-lettered with
    reason InvalidPodTemplate and the API server's message, instead of retrying in a loop. The
    attempt is the current one, or the next one if its pod was to come first (it is recorded
    then, to be closed). Does nothing otherwise (the refusal is stale).
    """
    parsed = _parse(job)
    status = parsed.status
    if status.is_terminal:
        return Decision()
    draft = Draft(parsed, now)
    if status.current_attempt is None and attempt == status.attempts + 1:
        _record_start(draft, attempt, attempt_pod_name(parsed.metadata.name, attempt), None, now)
    elif status.current_attempt is None or status.current_attempt.number != attempt:
        return Decision()
    summary = _close_attempt(draft, "Failed", reason="PodRejected", detail=f"could not start: {message}")
    _dead_letter(
        draft,
        "InvalidPodTemplate",
        f"{summary}. spec.template is immutable: fix it in a new VigilJob",
    )
    return draft.decision()


def _parse(job: Mapping[str, Any]) -> VigilJob:
    return VigilJob.model_validate({**job, "status": fields.status(job)})  # a new job has none


def _release_all(job: VigilJob, observed: _ObservedPods) -> Decision:
    """A job being deleted releases every pod that still carries the finalizer, behind a fence
    that writes nothing."""
    releases = [ReleasePod(fields.name(pod), fields.uid(pod)) for pod in observed.ours if podstate.is_tracked(pod)]
    if not releases:
        return Decision()
    return Decision((ConfirmVersion(job.metadata.resource_version), *releases))


# ----------------------------------------------------------------------------- observations


@dataclass(frozen=True)
class _ObservedPods:
    """The job's own pods (freshest snapshot of each), and pods of other owners by name."""

    ours: tuple[fields.Pod, ...]
    strangers: Mapping[str, fields.Pod]

    @classmethod
    def of(cls, namespace: str, job_uid: str, pods: Iterable[fields.Pod]) -> _ObservedPods:
        ours, strangers = [], {}
        for pod in podstate.freshest_by_uid(pods):
            if fields.metadata(pod).get("namespace", namespace) != namespace:
                continue  # another namespace's pod is nobody's here, not even a stranger
            if not podstate.belongs_to(pod, namespace, job_uid):
                strangers[fields.name(pod)] = pod
            elif podstate.attempt_of(pod) is not None:  # else not a pod Vigil made
                ours.append(pod)
        ours.sort(key=lambda pod: (podstate.attempt_of(pod), fields.uid(pod)))  # decisions never depend on order
        return cls(tuple(ours), strangers)

    def of_attempt(self, attempt: CurrentAttempt) -> fields.Pod | None:
        """The attempt's pod: the one seen before if any (by UID), else the one carrying its
        number."""
        candidates = [
            pod
            for pod in self.ours
            if podstate.attempt_of(pod) == attempt.number and attempt.pod_uid in (None, fields.uid(pod))
        ]
        return min(candidates, key=fields.uid, default=None)

    def newest(self) -> fields.Pod | None:
        return max(self.ours, key=lambda pod: podstate.attempt_of(pod) or 0, default=None)


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------------------------ steps


def _adopt_newer_attempt(draft: Draft, observed: _ObservedPods) -> None:
    """A pod of ours with a number above status.attempts is an attempt status does not hold
    yet: take it as the current attempt rather than start another under a number already used.

    Attempt N+1's pod is how an attempt normally starts (the pod first, see the module
    docstring): its start is recorded now, from the pod, with the time the pod says it started.
    A number further on means status was lost (or this snapshot is stale, and the fenced
    write will fail): that is adopted with a warning."""
    newest = observed.newest()
    if newest is None or draft.status.is_terminal:
        return
    number = podstate.attempt_of(newest) or 0
    if number <= draft.status.attempts:
        return
    name, uid = fields.name(newest), fields.uid(newest)
    if number == draft.status.attempts + 1:
        _record_start(draft, number, name, uid, min(draft.now, podstate.started_at(newest) or draft.now))
        return
    _record_start(draft, number, name, uid, draft.now)
    message = f"found pod {name} of attempt {number}, unknown to status"
    draft.set_phase("Starting", "AttemptAdopted", message)
    draft.event("AttemptAdopted", message, warning=True)


def _honour_redrive(draft: Draft) -> None:
    """A new value of the vigil.dev/redrive annotation starts a new round of attempts for a
    dead-lettered job; any other job only records the value as seen, so that it cannot fire
    later by surprise."""
    value = draft.job.metadata.annotations.get(api.ANNOTATION_REDRIVE)
    if not value or value == draft.status.last_redrive:
        return
    draft.update(last_redrive=value)
    if draft.status.phase != "DeadLettered":
        draft.event(
            "RedriveIgnored",
            f"{api.ANNOTATION_REDRIVE}={value} ignored: only a dead-lettered job can be "
            f"redriven, and this one is {draft.status.phase or 'new'}",
            warning=True,
        )
        return
    redrives = draft.status.redrives + 1
    draft.update(
        redrives=redrives,
        round_attempts=0,
        next_attempt_at=None,
        started_at=None,
        finished_at=None,
    )
    message = (
        f"redrive {redrives} ({api.ANNOTATION_REDRIVE}={value}): a new round of up to "
        f"{draft.spec.retry.max_attempts} attempts"
    )
    draft.set_phase("Queued", "Redriven", message)
    draft.event("Redriven", message)


def _accept_late_success(draft: Draft, observed: _ObservedPods) -> None:
    """A pod of an attempt replaced as Lost that reports Succeeded after all (having finished
    before its deletion was requested: see vigil.core.podstate) makes the job Succeeded: its record's
    outcome becomes Succeeded, and the current attempt (its replacement, or a later one) is
    cancelled; _stop_stray_pods deletes that one's pod. Attempt numbers, and so fencing tokens,
    are untouched: they only ever grow."""
    status = draft.status
    if status.is_terminal:  # a dead-lettered job stays so until redriven; then this applies again
        return
    current = status.current_attempt
    records = {record.number: record for record in status.history}
    for pod in observed.ours:  # by attempt number: the earliest late success is the one recorded
        number = podstate.attempt_of(pod) or 0  # every pod of `ours` has a number
        record = records.get(number) if current is None or number != current.number else None
        if record is None or record.outcome not in LATE_SUCCESS_OUTCOMES:
            continue
        report = podstate.read_pod(pod)
        if report.state == "Succeeded":
            break
    else:
        return

    cancelled = ""
    if current is not None:
        own = observed.of_attempt(current)
        own_report = podstate.read_pod(own) if own is not None else None
        if own_report is not None and own_report.state == "Succeeded":
            return  # the current attempt succeeded too: the ordinary path records that
        _close_attempt(
            draft,
            "Cancelled",
            reason="LateSuccess",
            report=own_report,
            detail=f"was cancelled: attempt {record.number} succeeded after all",
        )
        cancelled = f"; attempt {current.number} is cancelled"
    late = record.model_copy(
        update={
            "outcome": "Succeeded",
            "reason": "LateSuccess",
            "exit_code": report.exit_code,
            "node_name": report.node_name or record.node_name,
            "finished_at": draft.now,
        }
    )
    history = sorted([r for r in draft.status.history if r.number != record.number] + [late], key=lambda r: r.number)
    draft.update(history=history[-api.HISTORY_LIMIT :], finished_at=draft.now, next_attempt_at=None)
    message = (
        f"attempt {record.number} (pod {record.pod_name}), replaced as {record.outcome} "
        f"({record.reason}), succeeded after all: a late success wins{cancelled}"
    )
    draft.set_phase("Succeeded", "LateSuccess", message)
    draft.event("LateSuccess", message)


def _follow_current_attempt(draft: Draft, observed: _ObservedPods, rng: random.Random) -> None:
    """Record what the current attempt's pod says: its progress, or how it ended."""
    current = draft.status.current_attempt
    if current is None:
        return
    pod = observed.of_attempt(current)
    if pod is None:
        if current.pod_uid is not None:
            summary = _close_attempt(draft, "Lost", reason="PodVanished", detail="vanished")
            _after_failure(draft, rng, summary)
        return  # not created yet, or not seen yet: _run creates it (idempotently)

    report = podstate.read_pod(pod)
    if report.checkpoint:
        _take_checkpoint(draft, current, report.checkpoint)
    if report.state in ("Pending", "Running", "Unknown"):
        _follow_live_pod(draft, pod, report, rng)
    elif report.state == "Succeeded":
        summary = _close_attempt(draft, "Succeeded", reason=report.reason, report=report, detail="succeeded")
        draft.update(finished_at=draft.now, next_attempt_at=None)
        draft.set_phase("Succeeded", "AttemptSucceeded", summary)
    elif report.state == "Disrupted":
        summary = _close_attempt(
            draft,
            "Disrupted",
            reason=report.reason,
            report=report,
            detail=f"was disrupted ({report.reason})",
        )
        if draft.spec.retry.count_disruptions:
            _after_failure(draft, rng, summary)
        else:  # not the job's fault: the next attempt needs no backoff
            draft.set_phase(
                "Queued",
                "AttemptDisrupted",
                f"{summary}; disruptions do not count against retry.maxAttempts",
            )
    elif report.state == "Failed":
        summary = _close_attempt(
            draft,
            "Failed",
            reason=report.reason,
            report=report,
            detail=f"failed with exit code {report.exit_code} ({report.reason})",
        )
        if report.exit_code in draft.spec.retry.non_retryable_exit_codes:
            _dead_letter(
                draft,
                "NonRetryableExitCode",
                f"{summary}, and {report.exit_code} is in retry.nonRetryableExitCodes",
            )
        else:
            _after_failure(draft, rng, summary)
    elif report.state == "Stopped":  # someone else deleted the pod, and it ended on that
        summary = _close_attempt(
            draft,
            "Lost",
            reason=report.reason,
            report=report,
            detail=f"was stopped by the deletion of its pod (exit code {report.exit_code})",
        )
        _after_failure(draft, rng, summary)
    else:  # Deleted: someone else is deleting the pod; it will not finish its work
        summary = _close_attempt(draft, "Lost", reason=report.reason, report=report, detail="had its pod deleted")
        _after_failure(draft, rng, summary)


def _take_checkpoint(draft: Draft, current: CurrentAttempt, value: str) -> None:
    """Copy the attempt's checkpoint to status.lastCheckpoint (a write only when it changed); a
    bad one is ignored, with one warning per distinct value: the CheckpointAccepted condition's
    message names the value refused last, and the event fires only when that message changes."""
    problem = podstate.checkpoint_problem(value)
    previous = find_condition(draft.status.conditions, CONDITION_CHECKPOINT)
    if problem is None:
        draft.update(last_checkpoint=value)
        if previous is not None:  # say that the trouble is over
            message = f"the checkpoint of attempt {current.number} is in status.lastCheckpoint"
            draft.set_condition_later(CONDITION_CHECKPOINT, "True", "CheckpointAccepted", message)
        return
    message = (
        f"checkpoint {podstate.fingerprint(value)} (sha256) of attempt {current.number} (pod "
        f"{current.pod_name}) is ignored: {problem}; status.lastCheckpoint keeps the last good one"
    )
    if previous is None or previous.status != "False" or previous.message != message:
        draft.event("CheckpointRejected", message, warning=True)
    draft.set_condition_later(CONDITION_CHECKPOINT, "False", "CheckpointRejected", message)


def _follow_live_pod(draft: Draft, pod: fields.Pod, report: podstate.PodReport, rng: random.Random) -> None:
    current = draft.status.current_attempt
    assert current is not None
    if current.pod_uid is None or report.state != "Pending":
        draft.update_attempt(pod_uid=fields.uid(pod), node_name=report.node_name)
    # else the node a Pending pod was bound to waits for the next write (Running, or the outcome):
    # it is for people, and a status write of its own per attempt costs more than it tells.
    verdict = draft.verdict_for(pod)
    who = f"attempt {current.number} (pod {current.pod_name})"
    if verdict.state == "Lost":
        # Only Lost replaces an attempt; _stop_stray_pods marks the pod superseded and deletes it.
        summary = _close_attempt(
            draft, "Lost", reason="HeartbeatLost", report=report, detail=f"is lost: {verdict.detail}"
        )
        draft.set_condition_later(CONDITION_HEARTBEAT, "False", "HeartbeatLost", summary)
        _after_failure(draft, rng, summary)
        return
    if report.state == "Running" and draft.status.phase not in ("Running", "Uncertain"):
        message = f"attempt {current.number} is running in pod {current.pod_name} on node {report.node_name}"
        draft.update_attempt(phase="Running")
        # No event: a look sees a pod running only if it comes before the pod ends, so such an
        # event would come or not by timing; the phase, the Running condition and the attempt's
        # history say it, and the kubelet posts the pod's own Started event.
        draft.set_phase("Running", "AttemptRunning", message)
    elif report.state == "Pending" and draft.status.reason != "AttemptStarting":
        # e.g. after a pod name conflict was cleared: say so instead of the stale reason
        draft.set_phase(
            "Starting",
            "AttemptStarting",
            f"attempt {current.number} is starting in pod {current.pod_name}",
        )

    if draft.status.phase == "Running" and verdict.state == "Uncertain":
        message = f"{who} is uncertain: {verdict.detail}"
        draft.update_attempt(phase="Uncertain")
        draft.set_phase("Uncertain", "HeartbeatUncertain", message)
        draft.event("HeartbeatUncertain", f"{message} (silent for {verdict.silence_seconds:.0f}s)", warning=True)
    elif draft.status.phase == "Uncertain" and verdict.state == "Healthy":
        message = f"{who} is running again: {verdict.detail}"
        draft.update_attempt(phase="Running")
        draft.set_phase("Running", "HeartbeatResumed", message)
        draft.event("HeartbeatResumed", message)
    if draft.spec.heartbeat.required and draft.status.phase in ("Running", "Uncertain"):
        if draft.status.phase == "Running":
            draft.set_condition_later(CONDITION_HEARTBEAT, "True", "HeartbeatHealthy", f"{who}: {verdict.detail}")
        else:
            draft.set_condition_later(CONDITION_HEARTBEAT, "Unknown", "HeartbeatUncertain", f"{who}: {verdict.detail}")
        if verdict.last_beat_at is not None:
            draft.beat = (fields.uid(pod), verdict.last_beat_at)


def _apply_suspend(draft: Draft) -> None:
    """spec.suspend cancels the current attempt (it does not count; _stop_stray_pods deletes
    its pod) and starts no other; setting it back to false resumes where the job was."""
    if draft.status.is_terminal:
        return
    current = draft.status.current_attempt
    if draft.spec.suspend:
        if current is not None:
            _close_attempt(draft, "Cancelled", reason="Suspended", detail="was cancelled by suspend")
        if draft.status.phase != "Suspended":
            message = "spec.suspend is true: no attempt runs until it is set to false"
            draft.set_phase("Suspended", "Suspended", message)
            draft.event("Suspended", message)
    elif draft.status.phase == "Suspended":
        # As in batch/v1: the activeDeadlineSeconds clock restarts on resume.
        draft.update(started_at=None)
        message = "spec.suspend is false: attempts go on"
        draft.set_phase("Queued", "Resumed", message)
        draft.event("Resumed", message)


def _deadlines(draft: Draft) -> tuple[datetime | None, datetime | None]:
    """When the whole job (activeDeadlineSeconds) and its current attempt
    (attemptDeadlineSeconds) run out of time; None where there is no such limit yet."""
    status, spec = draft.status, draft.spec
    active, started = spec.active_deadline_seconds, status.started_at
    current, limit = status.current_attempt, spec.attempt_deadline_seconds
    job_due = started + timedelta(seconds=active) if active is not None and started is not None else None
    attempt_due = current.started_at + timedelta(seconds=limit) if current is not None and limit is not None else None
    return job_due, attempt_due


def _enforce_deadlines(draft: Draft, rng: random.Random) -> None:
    """activeDeadlineSeconds ends the whole job; attemptDeadlineSeconds ends one attempt. The
    attempt is closed here; _stop_stray_pods deletes its pod. The timers for deadlines still to
    come are set by _arm_deadlines, once _run may have started an attempt."""
    status, spec = draft.status, draft.spec
    if status.is_terminal or status.phase == "Suspended":
        return
    job_due, attempt_due = _deadlines(draft)
    if job_due is not None and draft.now >= job_due:
        if status.current_attempt is not None:
            _close_attempt(
                draft,
                "DeadlineExceeded",
                reason="ActiveDeadlineExceeded",
                detail="was stopped by the job's activeDeadlineSeconds",
            )
        _dead_letter(
            draft,
            "DeadlineExceeded",
            f"the job ran longer than activeDeadlineSeconds ({spec.active_deadline_seconds}s)",
        )
    elif attempt_due is not None and draft.now >= attempt_due:
        summary = _close_attempt(
            draft,
            "DeadlineExceeded",
            reason="AttemptDeadlineExceeded",
            detail=f"ran longer than attemptDeadlineSeconds ({spec.attempt_deadline_seconds}s)",
        )
        _after_failure(draft, rng, summary)


def _arm_deadlines(draft: Draft) -> None:
    """A look when the job's or the current attempt's deadline comes, an attempt started by this
    very decision included: the decision is complete, no look at its own write is needed to set
    the timer."""
    if draft.status.is_terminal or draft.status.phase == "Suspended":
        return
    for due in _deadlines(draft):
        if due is not None:
            draft.requeue_at(due)


def _run(draft: Draft, observed: _ObservedPods, may_start: bool, waiting: tuple[str, str] | None) -> None:
    """Make sure the current attempt has its pod, or start the next attempt when it is due."""
    status, retry = draft.status, draft.spec.retry
    if status.is_terminal or status.phase == "Suspended":
        return
    if status.current_attempt is None:
        if status.round_attempts >= retry.max_attempts:
            # Reached when retry.maxAttempts is lowered below the attempts already made.
            _dead_letter(
                draft,
                "AttemptsExhausted",
                f"all {retry.max_attempts} attempts of this round are used",
            )
            return
        if status.next_attempt_at is not None and draft.now < status.next_attempt_at:
            draft.requeue_at(status.next_attempt_at)
            return
        if draft.spec.guarantee == "NoOverlap" and _previous_pod_remains(draft, observed):
            return
        if _agent_image_missing(draft):
            return
        if not may_start:
            reason, why = waiting or ("WaitingForQueue", f"it waits for queue {draft.spec.queue} to admit it")
            if status.reason != reason:
                message = f"attempt {status.attempts + 1} waits: {why}"
                draft.set_phase("Queued", reason, message)
                draft.event(reason, message)
            return
        _reserve_next_attempt(draft)

    current = draft.status.current_attempt
    assert current is not None
    if observed.of_attempt(current) is not None:
        return
    stranger = observed.strangers.get(current.pod_name)
    if stranger is None:
        draft.create_pod(current.number)
        return
    draft.requeue_after.append(POD_NAME_CONFLICT_RECHECK_SECONDS)
    if draft.status.reason != "PodNameConflict":
        message = (
            f"pod {current.pod_name} exists but is not owned by this job, so attempt "
            f"{current.number} cannot use it; Vigil will not adopt it. Delete that pod, or "
            "recreate this job under another name"
        )
        draft.set_phase("Starting", "PodNameConflict", message)
        draft.event("PodNameConflict", message, warning=True)


def _previous_pod_remains(draft: Draft, observed: _ObservedPods) -> bool:
    """Under NoOverlap, whether a pod of an earlier attempt still exists, and if so say so. A
    terminating pod counts: on a partitioned node it may run on for as long as the partition
    lasts, and the job stalls rather than risk two copies (consistency over availability)."""
    # There is no current attempt: every pod of ours is an earlier one. A finished pod can run
    # nothing any more (and is kept for its logs); any other may, even while terminating.
    remaining = [pod for pod in observed.ours if not podstate.is_finished(pod)]
    if not remaining:
        return False
    blocker = remaining[0]
    others = f" (and {len(remaining) - 1} more)" if len(remaining) > 1 else ""
    message = (
        f"attempt {draft.status.attempts + 1} waits until pod {fields.name(blocker)} of attempt "
        f"{podstate.attempt_of(blocker)}{others} is gone: spec.guarantee is NoOverlap, and that pod is "
        f"{'terminating' if podstate.is_deleting(blocker) else 'being deleted'}"
    )
    if draft.status.reason != api.REASON_PREVIOUS_POD:
        draft.event(api.REASON_PREVIOUS_POD, message)
    phase: Phase = draft.status.phase if draft.status.phase in ("BackingOff", "Queued") else "Queued"
    draft.set_phase(phase, api.REASON_PREVIOUS_POD, message)
    return True


def _agent_image_missing(draft: Draft) -> bool:
    """Whether the job asks for the injected agent (heartbeat.agent: Sidecar) of an operator
    that has no agent image, and if so say so. Started, its attempt would never beat and would
    be declared Lost, attempt after attempt; it waits instead, until the operator is given an
    image or the job another agent (either makes a new decision)."""
    heartbeat = draft.spec.heartbeat
    if not heartbeat.required or heartbeat.agent != "Sidecar" or draft.agent_image:
        return False
    message = (
        f"attempt {draft.status.attempts + 1} waits: heartbeat.agent is Sidecar, and this operator has no "
        "agent image to inject (`vigil operator --agent-image`, the chart's heartbeat.injectAgent); give it "
        "one, or set heartbeat.agent to Image and run `vigil-agent -- CMD` in the job's image"
    )
    if draft.status.reason != api.REASON_AGENT_IMAGE_MISSING:
        draft.event(api.REASON_AGENT_IMAGE_MISSING, message, warning=True)
    phase: Phase = draft.status.phase if draft.status.phase in ("BackingOff", "Queued") else "Queued"
    draft.set_phase(phase, api.REASON_AGENT_IMAGE_MISSING, message)
    return True


def _reserve_next_attempt(draft: Draft) -> None:
    """Record attempt N+1 in status; _run then creates its pod, in the same decision. If the
    decision does nothing else, the record is not written: the look that finds the pod makes
    it (see Draft._only_starts)."""
    before = draft.status
    number = before.attempts + 1
    _record_start(draft, number, attempt_pod_name(draft.job.metadata.name, number), None, draft.now)
    draft.event("AttemptStarting", draft.status.message or "")
    if wire(before) == wire(draft.job.status):
        draft.start_alone = draft.status


def _record_start(draft: Draft, number: int, pod_name: str, pod_uid: str | None, started_at: datetime) -> None:
    """Status as it is when attempt `number` starts (reserved, or found in its pod)."""
    draft.update(
        attempts=number,
        round_attempts=min(draft.spec.retry.max_attempts, draft.status.round_attempts + 1),
        current_attempt=CurrentAttempt(
            number=number, pod_name=pod_name, pod_uid=pod_uid, phase="Starting", started_at=started_at
        ),
        next_attempt_at=None,
        started_at=draft.status.started_at or started_at,
    )
    message = f"starting attempt {number} in pod {pod_name} (fencing token {number})"
    draft.set_phase("Starting", "AttemptStarting", message)


def _expire_after_ttl(draft: Draft) -> None:
    ttl, status = draft.spec.ttl_seconds_after_finished, draft.status
    if ttl is None or not status.is_terminal or status.finished_at is None:
        return
    due = status.finished_at + timedelta(seconds=ttl)
    if draft.now >= due:
        draft.delete_job = True
    else:
        draft.requeue_at(due)


def _stop_stray_pods(draft: Draft, observed: _ObservedPods) -> None:
    """Delete our pods that still run but belong to no current attempt: the pod of an attempt
    this decision closed (deadline, suspend, Lost, a late success), or one left by a crash between
    closing an attempt and deleting its pod, or seen late. The pod of a Lost attempt is first
    marked superseded: its agent stops at that even if the deletion is slow to reach it."""
    current = draft.status.current_attempt
    live = observed.of_attempt(current) if current is not None else None
    records = {record.number: record for record in draft.status.history}
    for pod in observed.ours:
        if pod is live or podstate.is_finished(pod) or podstate.is_deleting(pod):
            continue
        record = records.get(podstate.attempt_of(pod) or 0)
        if (
            record is not None
            and record.outcome == "Lost"
            and podstate.annotation_of(pod, api.ANNOTATION_SUPERSEDED) is None
        ):
            draft.annotate_pod(pod, {api.ANNOTATION_SUPERSEDED: record.reason or "Lost"})
        draft.delete_pod(pod)


def _record_final_states(draft: Draft, observed: _ObservedPods) -> None:
    """Add the exit code (and node) of a finished pod to its attempt's record when the attempt
    was closed before the pod ended (Lost, PodDeleted, Cancelled, DeadlineExceeded): the outcome
    stays as recorded, and the exit code is in status before the finalizer goes."""
    history = list(draft.status.history)
    index = {record.number: i for i, record in enumerate(history)}
    for pod in observed.ours:
        i = index.get(podstate.attempt_of(pod) or 0)
        if i is None or history[i].exit_code is not None or not podstate.is_finished(pod):
            continue
        report = podstate.read_pod(pod)
        if report.exit_code is not None:
            record = history[i]
            history[i] = record.model_copy(
                update={"exit_code": report.exit_code, "node_name": record.node_name or report.node_name}
            )
    if history != draft.status.history:
        draft.update(history=history)


def _release_pods(draft: Draft, observed: _ObservedPods) -> None:
    """Release the pods that can say nothing more and whose attempt is closed (the rule is in the
    module docstring). Runs last, on the status this decision writes."""
    current = draft.status.current_attempt
    live = observed.of_attempt(current) if current is not None else None
    for pod in observed.ours:
        if pod is live or not podstate.is_tracked(pod):
            continue
        if podstate.is_finished(pod) or podstate.is_force_deleted(pod):
            draft.release_pod(pod)


# ---------------------------------------------------------------------------- transitions


def _close_attempt(
    draft: Draft,
    outcome: Outcome,
    *,
    reason: str | None,
    detail: str,
    report: podstate.PodReport | None = None,
) -> str:
    """Move the current attempt into history with its outcome; returns what happened, for a
    person: "attempt N (pod P) <detail>"."""
    current = draft.status.current_attempt
    assert current is not None
    record = AttemptRecord(
        number=current.number,
        pod_name=current.pod_name,
        outcome=outcome,
        reason=reason,
        exit_code=report.exit_code if report else None,
        node_name=(report.node_name if report else None) or current.node_name,
        started_at=current.started_at,
        finished_at=draft.now,
    )
    # An attempt counts against maxAttempts from its start; these outcomes give it back.
    refund = outcome == "Cancelled" or (outcome == "Disrupted" and not draft.spec.retry.count_disruptions)
    draft.update(
        current_attempt=None,
        history=[*draft.status.history, record][-api.HISTORY_LIMIT :],
        round_attempts=draft.status.round_attempts - (1 if refund else 0),
    )
    summary = f"attempt {current.number} (pod {current.pod_name}) {detail}"
    draft.event(f"Attempt{outcome}", summary, warning=outcome not in ("Succeeded", "Cancelled"))
    return summary


def _after_failure(draft: Draft, rng: random.Random, summary: str) -> None:
    """After a counted failure: back off before the next attempt, or dead-letter the job if
    the round has no attempts left."""
    last = draft.status.history[-1]
    retry = draft.spec.retry
    if draft.status.round_attempts >= retry.max_attempts:
        _dead_letter(
            draft,
            "AttemptsExhausted",
            f"{summary}, and all {retry.max_attempts} attempts of this round are used",
        )
        return
    delay = attempt_delay(max(1, draft.status.round_attempts), retry.backoff, rng)
    next_attempt_at = draft.now + timedelta(seconds=delay)
    draft.update(next_attempt_at=next_attempt_at)
    message = f"{summary}; attempt {draft.status.attempts + 1} starts in {delay:.1f}s, at {_stamp(next_attempt_at)}"
    draft.set_phase("BackingOff", f"Attempt{last.outcome}", message)
    # The attempt's own event (Warning AttemptFailed, AttemptLost...) says when the next starts,
    # rather than a second event about the same failure.
    draft.say_more(f"Attempt{last.outcome}", message, warning=True)
    draft.requeue_at(next_attempt_at)


def _dead_letter(draft: Draft, reason: str, why: str) -> None:
    name = draft.job.metadata.name
    message = (
        f"dead-lettered: {why}. To run it again: kubectl annotate vj/{name} "
        f"{api.ANNOTATION_REDRIVE}=$(date +%s) --overwrite"
    )
    draft.update(finished_at=draft.now, next_attempt_at=None)
    draft.set_phase("DeadLettered", reason, message)
    draft.event("DeadLettered", message, warning=True)
