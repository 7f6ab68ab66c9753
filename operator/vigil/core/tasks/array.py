"""The decision of a task array (spec.tasks): given the job, its pods, the time and how many
starts its queue gives it, what should happen next.

Each task that has started and not finished is projected onto a job of its own, named
`<job>-<index>`, whose status is the task's record in `status.tasks.active`, and decided by the
single-job lifecycle (`vigil.core.lifecycle.decide_parsed`): retries, backoff, non-retryable
exit codes, Uncertain and Lost, NoOverlap, checkpoints, attempt deadlines and late successes
mean for a task exactly what they mean for a job. What this module adds is the array around
them, pure as the lifecycle is:

- The tasks that have not started, or have finished, cost no record: they are index ranges
  (`ranges.IndexSet`), so status grows with the active tasks (at most `parallelism`) and the
  gaps between the ranges, not with the tasks. The attempts used by a dead-lettered task are
  kept grouped by number (`priorAttempts`), so that a redriven task's attempt numbers, its
  fencing tokens, go on from there.
- A task's start is written in the array's status before its pod is created (the decision's
  status write is its fence), not left to the look that finds the pod as a job's is: one write
  records the starts of many tasks.
- New tasks start in index order, while the array has room under `parallelism` and its queue
  gives it starts; a retry or a resumed task takes a start too.
- The whole array stops (its tasks are cancelled as by suspend) on spec.suspend, on its
  activeDeadlineSeconds, and once more than maxDeadLetteredTasks are dead-lettered; a redrive
  (vigil.dev/redrive for every dead-lettered task, vigil.dev/redrive-tasks for some) goes on.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from vigil import api
from vigil.api import (
    AttemptGroup,
    JobMeta,
    TaskFailure,
    TaskSpec,
    TaskState,
    TaskStatus,
    VigilJob,
    VigilJobStatus,
)
from vigil.api.job import item_json
from vigil.core import fields, podstate
from vigil.core.actions import (
    Action,
    AnnotatePod,
    ConfirmVersion,
    CreatePod,
    Decision,
    DeleteJob,
    DeletePod,
    EmitEvent,
    PatchStatus,
    ReleasePod,
    RequeueAfter,
    SetDeadLetterLabel,
)
from vigil.core.draft import wire
from vigil.core.jobconditions import job_conditions
from vigil.core.lifecycle import decide_parsed
from vigil.core.liveness import Liveness
from vigil.core.manifest import BeatChannel, TaskRef, task_name
from vigil.core.tasks.ranges import IndexSet

# Reasons of an array's phase.
REASON_RUNNING = "TasksRunning"
REASON_SUCCEEDED = "AllTasksSucceeded"
REASON_DEAD_LETTERED = "TasksDeadLettered"
REASON_TOO_MANY = "TooManyDeadLetteredTasks"
REASON_INVALID = "InvalidTasks"
REASON_INVALID_TEMPLATE = "InvalidPodTemplate"
STOP_REASONS = frozenset({REASON_TOO_MANY, "DeadlineExceeded", REASON_INVALID, REASON_INVALID_TEMPLATE})
# A task's message kept in status.tasks.failed, at most this long.
FAILURE_MESSAGE_CHARS = 300
# Task phases that hold a place under parallelism: every active task but a cancelled one.
_IDLE = frozenset({"Suspended"})


@dataclass
class ArrayDecision:
    """An array's decision, and what it did with its queue's starts."""

    decision: Decision
    starts_used: int = 0  # attempts reserved (each a start the queue gave)
    outcomes: dict[str, int] = field(default_factory=dict)  # tasks that Succeeded, DeadLettered, Retried


def is_array(job: Mapping[str, Any]) -> bool:
    return bool(fields.spec(job).get("tasks"))


def wants_now(job: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], now: datetime) -> int:
    """How many starts the array could use at this look, as far as its status and pods say: its
    room under parallelism (counting the tasks whose pod has ended as room), capped by the tasks
    left, plus its tasks waiting for a start (redriven, resumed, or a retry whose backoff is over).
    An estimate, to ask the queue for (`QueueBook.top_up`); the decision takes what it can."""
    spec_tasks = fields.spec(job).get("tasks") or {}
    tasks = fields.status(job).get("tasks") or {}
    if fields.spec(job).get("suspend") or fields.status(job).get("phase") in api.TERMINAL_PHASES:
        return 0
    total = int(tasks.get("total") or spec_tasks.get("count") or len(spec_tasks.get("items") or ()))
    active = tasks.get("active") or []
    ended = {fields.name(pod) for pod in pods if podstate.is_finished(pod)}
    occupied = freed = due = 0
    for task in active:
        if task.get("phase") == "Suspended":
            continue
        occupied += 1
        current = task.get("currentAttempt") or {}
        if current.get("podName") in ended:
            freed += 1
        elif task.get("phase") == "Queued":
            due += 1
        elif task.get("phase") == "BackingOff":
            at = task.get("nextAttemptAt")
            if at is None or datetime.fromisoformat(str(at).replace("Z", "+00:00")) <= now:
                due += 1
    done = int(tasks.get("succeeded") or 0) + int(tasks.get("deadLettered") or 0)
    fresh = max(0, total - done - len(active))
    room = max(0, int(spec_tasks.get("parallelism") or api.DEFAULT_TASK_PARALLELISM) - occupied + freed)
    return min(room, fresh) + due


def decide_array(
    job: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]],
    now: datetime,
    *,
    rng: random.Random,
    starts: int,
    waiting: tuple[str, str] | None = None,
    liveness: Mapping[str, Liveness] | None = None,
    beat_channel: BeatChannel | None = None,
    agent_image: str | None = None,
) -> ArrayDecision:
    """The actions that move the array `job` on.

    job: the VigilJob as read from the API server, with spec.tasks.
    pods: its pods as observed (any order, duplicates and stale snapshots allowed), plus pods of
        other owners that bear a task's attempt name (strangers, never adopted).
    starts: how many attempts its queue lets it start now (0: none; a large number: unlimited).
    waiting: (reason, message) saying why the queue holds it back, shown while nothing runs.
    liveness: the failure detector's verdicts by pod UID.
    """
    raw_status = dict(fields.status(job))
    tasks_raw = raw_status.pop("tasks", None)
    try:
        parsed = VigilJob.model_validate({**job, "status": raw_status})
    except ValidationError as err:
        return _invalid(job, "; ".join(_said(e) for e in err.errors()), now)
    spec_tasks = parsed.spec.tasks
    assert spec_tasks is not None
    try:
        tasks = TaskStatus.model_validate(tasks_raw) if tasks_raw else TaskStatus(total=spec_tasks.total)
    except ValueError:
        tasks = TaskStatus(total=spec_tasks.total)  # a status Vigil did not write: start again from the pods
    array = _Array(parsed, tasks, spec_tasks, now, rng, liveness or {}, beat_channel, agent_image)
    array.observe(pods)
    if parsed.metadata.deletion_timestamp is not None:
        return ArrayDecision(array.release_all())
    array.honour_redrives()
    array.check_stops()
    array.decide_active(starts)
    array.start_new(starts)
    array.settle_idle_pods()
    array.sum_up(waiting)
    return ArrayDecision(array.decision(), array.starts_used, array.outcomes)


def reject_array_pod(job: Mapping[str, Any], pod_name: str, message: str, now: datetime) -> Decision:
    """The actions after the API server refused a task's pod as invalid (422): every task's pod is
    made of the same immutable template, so no task can ever start; the array is dead-lettered
    (reason InvalidPodTemplate) with the API server's message, instead of retrying in a loop. Its
    tasks already started go on being followed by the next looks (they are cancelled as by a stop)."""
    status = fields.status(job)
    if status.get("phase") == "DeadLettered" and status.get("reason") == REASON_INVALID_TEMPLATE:
        return Decision()
    text = (
        f"dead-lettered: the API server refused pod {pod_name}: {message}. spec.template is immutable: "
        "fix it in a new VigilJob"
    )[: api.MAX_CONDITION_MESSAGE]
    patch = {"phase": "DeadLettered", "reason": REASON_INVALID_TEMPLATE, "message": text}
    if not status.get("finishedAt"):
        patch["finishedAt"] = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return Decision(
        (
            PatchStatus(patch, fields.resource_version(job)),
            SetDeadLetterLabel(True),
            EmitEvent("Warning", REASON_INVALID_TEMPLATE, text),
        )
    )


def _said(error: Any) -> str:
    """One of pydantic's errors as the API server would say it: the path, then what is wrong."""
    if error["type"] == "value_error":
        return str(error["ctx"]["error"])
    return ".".join(map(str, error["loc"])) + f": {error['msg']}"


def _invalid(job: Mapping[str, Any], problem: str, now: datetime) -> ArrayDecision:
    """A job whose spec the core cannot read (count and items both or neither, items too large):
    dead-lettered once, saying what to fix."""
    status = fields.status(job)
    if status.get("phase") == "DeadLettered" and status.get("reason") == REASON_INVALID:
        return ArrayDecision(Decision())
    message = f"spec.tasks cannot be run: {problem}"[: api.MAX_CONDITION_MESSAGE]
    patch = {
        "phase": "DeadLettered",
        "reason": REASON_INVALID,
        "message": message,
        "finishedAt": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    return ArrayDecision(
        Decision(
            (
                PatchStatus(patch, fields.resource_version(job)),
                SetDeadLetterLabel(True),
                EmitEvent("Warning", REASON_INVALID, message),
            )
        )
    )


class _Array:
    """The array's decision being built."""

    def __init__(
        self,
        job: VigilJob,
        tasks: TaskStatus,
        spec: TaskSpec,
        now: datetime,
        rng: random.Random,
        liveness: Mapping[str, Liveness],
        beat_channel: BeatChannel | None,
        agent_image: str | None,
    ) -> None:
        self.job, self.before, self.spec, self.now, self.rng = job, tasks, spec, now, rng
        self.liveness, self.beat_channel, self.agent_image = liveness, beat_channel, agent_image
        self.total = tasks.total or spec.total  # fixed at the first look (items have no CEL rule)
        self.status: VigilJobStatus = job.status
        self.succeeded = IndexSet.parse(tasks.succeeded_indexes)
        self.dead = IndexSet.parse(tasks.dead_lettered_indexes)
        self.prior: dict[int, IndexSet] = {g.attempts: IndexSet.parse(g.indexes) for g in tasks.prior_attempts}
        self.active: dict[int, TaskState] = {t.index: t for t in tasks.active}
        self.failed: list[TaskFailure] = list(tasks.failed)
        self.redrives, self.last_redrive = tasks.redrives, tasks.last_redrive
        self.stopped: str | None = None  # why the whole array stops (a reason), if it does
        self.pods_of: dict[int, list[Mapping[str, Any]]] = {}
        self.strangers: dict[str, Mapping[str, Any]] = {}
        self.stops: list[Action] = []
        self.releases: list[ReleasePod] = []
        self.creations: list[CreatePod] = []
        self.events: list[EmitEvent] = []
        self.requeue: list[float] = []
        self.starts_used = 0
        self.outcomes: dict[str, int] = {}
        self._spec_made: tuple[bool, api.VigilJobSpec] | None = None

    # --- what is observed ---------------------------------------------------------------------

    def observe(self, pods: Iterable[Mapping[str, Any]]) -> None:
        meta = self.job.metadata
        for pod in podstate.freshest_by_uid(pods):
            if fields.metadata(pod).get("namespace", meta.namespace) != meta.namespace:
                continue
            index = podstate.task_of(pod)
            if (
                index is not None
                and index not in self.active
                and (index in self.succeeded or index in self.dead)
                and not podstate.is_tracked(pod)
                and podstate.is_finished(pod)
            ):
                # The pod of a task that ended, released: nothing is left to do with it, whoever
                # owns it. Most of a large array's pods, skipped before the dearer checks.
                continue
            if not podstate.belongs_to(pod, meta.namespace, meta.uid):
                self.strangers[fields.name(pod)] = pod
                continue
            if index is None or podstate.attempt_of(pod) is None or index >= self.total:
                continue  # not a task's pod Vigil made
            self.pods_of.setdefault(index, []).append(pod)

    def release_all(self) -> Decision:
        releases = [
            ReleasePod(fields.name(pod), fields.uid(pod))
            for pods in self.pods_of.values()
            for pod in pods
            if podstate.is_tracked(pod)
        ]
        if not releases:
            return Decision()
        return Decision((ConfirmVersion(self.job.metadata.resource_version), *releases))

    # --- redrives and stops -------------------------------------------------------------------

    def honour_redrives(self) -> None:
        """vigil.dev/redrive on a dead-lettered array redrives every dead-lettered task (and goes
        on with those its stop cancelled); vigil.dev/redrive-tasks redrives the dead-lettered ones
        it names, in any phase. Each value is honoured once."""
        annotations = self.job.metadata.annotations
        whole = annotations.get(api.ANNOTATION_REDRIVE)
        if whole and whole != self.status.last_redrive:
            self.status = self.status.model_copy(update={"last_redrive": whole})
            if self.status.phase == "DeadLettered":
                self._redrive(self.dead, f"{api.ANNOTATION_REDRIVE}={whole}")
                self.status = self.status.model_copy(
                    update={"redrives": self.status.redrives + 1, "finished_at": None, "started_at": None}
                )
                self._set_phase("Running", "Redriven", "redriven: its dead-lettered and stopped tasks go on")
            else:
                self.events.append(
                    EmitEvent(
                        "Warning",
                        "RedriveIgnored",
                        f"{api.ANNOTATION_REDRIVE}={whole} ignored: only a dead-lettered array is redriven "
                        f"whole, and this one is {self.status.phase or 'new'}; "
                        f"{api.ANNOTATION_REDRIVE_TASKS} redrives some of its tasks",
                    )
                )
        value = annotations.get(api.ANNOTATION_REDRIVE_TASKS)
        if not value or value == self.last_redrive:
            return
        self.last_redrive = value
        text = value.rsplit("@", 1)[0]
        try:
            wanted = IndexSet.parse(text)
        except ValueError as err:
            self.events.append(
                EmitEvent("Warning", "RedriveIgnored", f"{api.ANNOTATION_REDRIVE_TASKS}={value[:100]} ignored: {err}")
            )
            return
        chosen = wanted & self.dead
        others = wanted - self.dead
        if others:
            self.events.append(
                EmitEvent(
                    "Warning",
                    "RedriveIgnored",
                    f"tasks {_short(others)} of {api.ANNOTATION_REDRIVE_TASKS}={value[:100]} are not dead-lettered: "
                    "ignored",
                )
            )
        if chosen:
            self._redrive(chosen, f"{api.ANNOTATION_REDRIVE_TASKS}={value[:100]}")
            if self.status.phase == "DeadLettered" and self.status.reason == REASON_DEAD_LETTERED:
                self.status = self.status.model_copy(update={"finished_at": None})
                self._set_phase("Running", "Redriven", f"tasks {_short(chosen)} redriven")

    def _redrive(self, chosen: IndexSet, why: str) -> None:
        if not chosen and not any(t.phase == "Suspended" for t in self.active.values()):
            return
        self.dead = self.dead - chosen
        self.failed = [f for f in self.failed if f.index not in chosen]
        self.redrives += 1
        if chosen:
            self.events.append(
                EmitEvent("Normal", "TasksRedriven", f"{why}: tasks {_short(chosen)} get a new round of attempts")
            )

    def check_stops(self) -> None:
        """Whether the whole array stops (or stays stopped): its tasks are then cancelled."""
        status, spec = self.status, self.job.spec
        if status.phase == "DeadLettered" and status.reason in STOP_REASONS:
            self.stopped = status.reason
            return
        limit = self.spec.max_dead_lettered_tasks
        if limit is not None and len(self.dead) > limit:
            self.stopped = REASON_TOO_MANY
        active_limit, started = spec.active_deadline_seconds, status.started_at
        if active_limit is not None and started is not None and status.phase not in ("Suspended",):
            due = started + timedelta(seconds=active_limit)
            if self.now >= due:
                self.stopped = "DeadlineExceeded"
            elif not status.is_terminal:
                self.requeue.append((due - self.now).total_seconds())

    # --- the tasks ----------------------------------------------------------------------------

    def decide_active(self, starts: int) -> None:
        """Each active task decided as a job of its own; a task that has pods but no record (its
        start was made by a look whose status write was lost, or it was redriven) is adopted."""
        candidates = set(self.active)
        for index, pods in self.pods_of.items():
            if index in self.active or index in self.succeeded or index in self.dead:
                continue
            newest = max(podstate.attempt_of(pod) or 0 for pod in pods)
            if newest > self._prior_attempts(index):
                candidates.add(index)
        for index in sorted(candidates):
            record = self.active.get(index) or self._fresh(index)
            may_start = self.starts_used < starts and not self._halted()
            self._decide_task(index, record, may_start)

    def start_new(self, starts: int) -> None:
        """New tasks, lowest index first, while the array has room and starts."""
        limit = self.spec.max_dead_lettered_tasks
        if self.stopped is None and limit is not None and len(self.dead) > limit:
            self.stopped = REASON_TOO_MANY  # by this look's outcomes: the next look cancels the rest
            self.requeue.append(0.0)
        if self._halted():
            return
        room = self.job.spec.tasks.parallelism - sum(1 for t in self.active.values() if t.phase not in _IDLE)  # type: ignore[union-attr]
        room = min(room, starts - self.starts_used)
        if room <= 0:
            return
        pending = IndexSet.span(0, self.total) - self.succeeded - self.dead - IndexSet.of(self.active)
        for index in pending.first(room):
            self._decide_task(index, self._fresh(index), True)

    def _halted(self) -> bool:
        return self.job.spec.suspend or self.stopped is not None or self.status.phase == "Succeeded"

    def _fresh(self, index: int) -> TaskState:
        """A task about to start its round: a new one, or one redriven (its attempts go on)."""
        return TaskState(index=index, phase="Queued", attempts=self._prior_attempts(index))

    def _prior_attempts(self, index: int) -> int:
        for attempts, indexes in self.prior.items():
            if index in indexes:
                return attempts
        return 0

    def _decide_task(self, index: int, record: TaskState, may_start: bool) -> None:
        job, meta = self.job, self.job.metadata
        name = task_name(meta.name, index)
        virtual = job.model_copy(
            update={
                "metadata": JobMeta(
                    name=name,
                    namespace=meta.namespace,
                    uid=meta.uid,
                    generation=meta.generation,
                    resource_version=meta.resource_version,
                ),
                "spec": self._task_spec(),
                "status": _as_job_status(record),
            }
        )
        item = item_json(self.spec.items[index]) if self.spec.items is not None else None
        pods = list(self.pods_of.get(index, ()))
        pods += [pod for pod_name, pod in self.strangers.items() if pod_name.startswith(name + "-")]
        decision = decide_parsed(
            virtual,
            pods,
            self.now,
            rng=self.rng,
            may_start=may_start,
            waiting=("WaitingForQueue", "it waits for a start from its queue"),
            liveness=self.liveness,
            beat_channel=self.beat_channel,
            agent_image=self.agent_image,
            task=TaskRef(meta.name, index, self.total, item),
        )
        after = _as_task(index, decision.status) if decision.status is not None else record
        for action in decision.actions:
            if isinstance(action, PatchStatus):
                after = _as_task(index, VigilJobStatus.model_validate(action.status))
            elif isinstance(action, (DeletePod, AnnotatePod)):
                self.stops.append(action)
            elif isinstance(action, ReleasePod):
                self.releases.append(action)
            elif isinstance(action, CreatePod):
                self.creations.append(action)
            elif isinstance(action, EmitEvent):
                # Normal events of each task (starts, successes) would be a write per task: the
                # array's counts say them. Warnings are kept (the recorder aggregates them).
                if action.type == "Warning" and action.reason != "DeadLettered":
                    self.events.append(EmitEvent("Warning", action.reason, f"task {index}: {action.message}"))
            elif isinstance(action, RequeueAfter):
                self.requeue.append(action.seconds)
            # ConfirmVersion: the array's own fence covers it; SetDeadLetterLabel, DeleteJob: the array's
        if after.attempts > record.attempts:
            self.starts_used += after.attempts - record.attempts
        self._file(index, record, after)

    def _task_spec(self) -> api.VigilJobSpec:
        """The spec of the job each task is projected onto: the array's, without what is the
        whole array's (its tasks, deadline, TTL), suspended when the array stops. Made once per
        look (and again if the array stops during it): it is the same for every task."""
        suspend = self.job.spec.suspend or self.stopped is not None
        if self._spec_made is None or self._spec_made[0] != suspend:
            spec = self.job.spec.model_copy(
                update={
                    "tasks": None,
                    "active_deadline_seconds": None,
                    "ttl_seconds_after_finished": None,
                    "suspend": suspend,
                }
            )
            self._spec_made = (suspend, spec)
        return self._spec_made[1]

    def _file(self, index: int, before: TaskState, after: TaskState) -> None:
        """Puts the task where its new state says: active, succeeded or dead-lettered."""
        started = after.attempts > self._prior_attempts(index)
        if after.attempts > before.attempts:
            self.status = self.status.model_copy(
                update={
                    "attempts": self.status.attempts + after.attempts - before.attempts,
                    "started_at": self.status.started_at or self.now,
                }
            )
            if before.attempts > 0 and index in self.active:
                self._count("Retried")
        if after.phase == "Succeeded":
            self.active.pop(index, None)
            self.succeeded = self.succeeded | IndexSet.of([index])
            self._forget_prior(index)
            self._count("Succeeded")
        elif after.phase == "DeadLettered":
            self.active.pop(index, None)
            self.dead = self.dead | IndexSet.of([index])
            self._forget_prior(index)
            self.prior[after.attempts] = self.prior.get(after.attempts, IndexSet()) | IndexSet.of([index])
            self._describe_failure(index, after)
            self._count("DeadLettered")
        elif started or index in self.active:
            self.active[index] = after
            if started:
                self._forget_prior(index)

    def _describe_failure(self, index: int, after: TaskState) -> None:
        last = after.last
        why = after.reason or "DeadLettered"
        message = (
            f"task {index} dead-lettered ({why}) after {after.attempts} attempts"
            + (f"; its last attempt {last.outcome}" if last else "")
            + (f" with exit code {last.exit_code}" if last and last.exit_code is not None else "")
        )
        failure = TaskFailure(
            index=index,
            attempts=after.attempts,
            outcome=last.outcome if last else None,
            reason=why,
            exit_code=last.exit_code if last else None,
            finished_at=self.now,
            message=message[:FAILURE_MESSAGE_CHARS],
        )
        self.failed = ([f for f in self.failed if f.index != index] + [failure])[-api.TASK_FAILURE_DETAILS :]
        self.events.append(
            EmitEvent(
                "Warning",
                "TaskDeadLettered",
                f"{message}. To run it again: kubectl vigil redrive {self.job.metadata.name} --tasks {index}",
            )
        )

    def _forget_prior(self, index: int) -> None:
        one = IndexSet.of([index])
        for attempts in [a for a, s in self.prior.items() if index in s]:
            rest = self.prior[attempts] - one
            if rest:
                self.prior[attempts] = rest
            else:
                del self.prior[attempts]

    def _count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def settle_idle_pods(self) -> None:
        """Pods of tasks that are not active: released once finished (their task's end is in
        status), deleted while they still run (a task that finished has nothing more to run)."""
        for index, pods in self.pods_of.items():
            if index in self.active:
                continue
            for pod in pods:
                finished = podstate.is_finished(pod) or podstate.is_force_deleted(pod)
                if podstate.is_tracked(pod) and finished:
                    self.releases.append(ReleasePod(fields.name(pod), fields.uid(pod)))
                elif not finished and not podstate.is_deleting(pod) and (index in self.succeeded or index in self.dead):
                    self.stops.append(DeletePod(fields.name(pod), fields.uid(pod)))

    # --- the array's own status -------------------------------------------------------------------

    def sum_up(self, waiting: tuple[str, str] | None) -> None:
        active = self.active.values()
        running = sum(1 for t in active if t.current_attempt is not None)
        backing_off = sum(1 for t in active if t.phase == "BackingOff")
        done = len(self.succeeded) + len(self.dead)
        tasks = TaskStatus(
            total=self.total,
            pending=self.total - done - running - backing_off,
            running=running,
            backing_off=backing_off,
            succeeded=len(self.succeeded),
            dead_lettered=len(self.dead),
            progress=f"{len(self.succeeded)}/{self.total}",
            succeeded_indexes=str(self.succeeded),
            dead_lettered_indexes=str(self.dead),
            prior_attempts=[
                AttemptGroup(attempts=attempts, indexes=str(indexes))
                for attempts, indexes in sorted(self.prior.items())
            ],
            failed=self.failed,
            active=[self.active[i] for i in sorted(self.active)],
            redrives=self.redrives,
            last_redrive=self.last_redrive,
        )
        self.status = self.status.model_copy(update={"tasks": tasks, "current_attempt": None})
        counts = (
            f"{tasks.succeeded}/{tasks.total} succeeded, {tasks.running} running, {tasks.backing_off} backing off, "
            f"{tasks.dead_lettered} dead-lettered, {tasks.pending} not started"
        )
        if self.stopped is not None:
            why = {
                REASON_TOO_MANY: f"more than maxDeadLetteredTasks ({self.spec.max_dead_lettered_tasks}) tasks "
                "are dead-lettered",
                "DeadlineExceeded": f"the array ran longer than activeDeadlineSeconds "
                f"({self.job.spec.active_deadline_seconds}s)",
            }.get(self.stopped, self.stopped)
            if not (self.status.phase == "DeadLettered" and self.status.reason == self.stopped):
                self._dead_letter(self.stopped, f"{why}: its tasks are stopped")
        elif done == self.total:
            if not self.dead:
                if self.status.phase != "Succeeded":
                    self.status = self.status.model_copy(update={"finished_at": self.now})
                    self._set_phase("Succeeded", REASON_SUCCEEDED, f"all {self.total} tasks succeeded")
                    self.events.append(EmitEvent("Normal", REASON_SUCCEEDED, f"all {self.total} tasks succeeded"))
            else:
                self._dead_letter(
                    REASON_DEAD_LETTERED,
                    f"{len(self.dead)} of {self.total} tasks were dead-lettered ({_short(self.dead)})",
                )
        elif self.job.spec.suspend:
            self._set_phase("Suspended", "Suspended", f"spec.suspend is true: no task runs ({counts})")
        elif tasks.running or tasks.backing_off or any(t.phase not in _IDLE for t in active):
            self._set_phase("Running", REASON_RUNNING, counts)
        else:
            reason, why = waiting or ("WaitingForQueue", "its tasks wait for their queue")
            self._set_phase("Queued", reason, f"{why} ({counts})")

    def _dead_message(self, why: str) -> str:
        name = self.job.metadata.name
        return (
            f"dead-lettered: {why}. To run them again: kubectl vigil redrive {name} (every dead-lettered task), "
            f"or kubectl vigil redrive {name} --tasks RANGES"
        )

    def _dead_letter(self, reason: str, why: str) -> None:
        message = self._dead_message(why)
        first = self.status.phase != "DeadLettered" or self.status.reason != reason
        if not first and self.status.message == message:
            return
        self.status = self.status.model_copy(update={"finished_at": self.status.finished_at or self.now})
        self._set_phase("DeadLettered", reason, message)
        if first:
            self.events.append(EmitEvent("Warning", "DeadLettered", message))

    def _set_phase(self, phase: api.Phase, reason: str, message: str) -> None:
        self.status = self.status.model_copy(update={"phase": phase, "reason": reason, "message": message})

    def decision(self) -> Decision:
        conditions = job_conditions(
            self.status, {}, heartbeat_required=False, now=self.now, generation=self.job.metadata.generation
        )
        if conditions is not None:
            self.status = self.status.model_copy(
                update={"conditions": conditions, "observed_generation": self.job.metadata.generation}
            )
        if not self.status.is_terminal and self.status.finished_at is not None:
            self.status = self.status.model_copy(update={"finished_at": None})
        # A task that ended in this look is released by its own decision and is then idle: once.
        releases = list(dict.fromkeys(self.releases))
        mutations: list[Action] = [*self.stops, *releases, *self.creations]
        dead_lettered, dead_tasks = self.status.phase == "DeadLettered", bool(self.dead)
        labels = self.job.metadata.labels
        if dead_lettered != (labels.get(api.LABEL_DEAD_LETTER) == "true") or dead_tasks != (
            labels.get(api.LABEL_DEAD_TASKS) == "true"
        ):
            mutations.append(SetDeadLetterLabel(dead_lettered, dead_tasks))
        ttl = self.job.spec.ttl_seconds_after_finished
        delete = False
        if ttl is not None and self.status.is_terminal and self.status.finished_at is not None:
            due = self.status.finished_at + timedelta(seconds=ttl)
            if self.now >= due:
                mutations.append(DeleteJob(self.job.metadata.uid))
                delete = True
            else:
                self.requeue.append((due - self.now).total_seconds())
        new_status = _wire(self.status)
        actions: list[Action] = []
        if new_status != _wire(self.job.status, self.before):
            actions.append(PatchStatus(new_status, self.job.metadata.resource_version))
        elif mutations or self.events:
            actions.append(ConfirmVersion(self.job.metadata.resource_version))
        actions += mutations
        actions += self.events
        if self.requeue and not delete:
            actions.append(RequeueAfter(max(0.0, min(self.requeue))))
        return Decision(tuple(actions))


def _wire(status: VigilJobStatus, tasks: TaskStatus | None = None) -> dict[str, Any]:
    if tasks is not None:
        status = status.model_copy(update={"tasks": tasks})
    return wire(status)


def _as_job_status(task: TaskState) -> VigilJobStatus:
    """A task's record as the status of the job it is projected onto."""
    return VigilJobStatus(
        phase=task.phase,
        reason=task.reason,
        attempts=task.attempts,
        round_attempts=task.round_attempts,
        current_attempt=task.current_attempt,
        next_attempt_at=task.next_attempt_at,
        started_at=task.started_at,
        last_checkpoint=task.last_checkpoint,
        history=[task.last] if task.last is not None else [],
    )


def _as_task(index: int, status: VigilJobStatus) -> TaskState:
    """The record kept of a task whose projected job has `status` (messages, conditions and all
    but the last finished attempt are not kept: they would grow status with the tasks)."""
    return TaskState(
        index=index,
        phase=status.phase or "Queued",
        reason=status.reason,
        attempts=status.attempts,
        round_attempts=status.round_attempts,
        current_attempt=status.current_attempt,
        next_attempt_at=status.next_attempt_at,
        started_at=status.started_at,
        last_checkpoint=status.last_checkpoint,
        last=status.history[-1] if status.history else None,
    )


def _short(indexes: IndexSet, chars: int = 80) -> str:
    text = str(indexes)
    return text if len(text) <= chars else text[: chars - 3].rsplit(",", 1)[0] + ",..."
