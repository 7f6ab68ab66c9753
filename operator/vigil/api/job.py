"""The VigilJob: its spec (what to run and how hard to try), its status (all of Vigil's memory
of a job) and the whole object as read from the API server."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from vigil.api.names import (
    CHECKPOINT_FILE,
    DEFAULT_TASK_PARALLELISM,
    HISTORY_LIMIT,
    INT32_MAX,
    INT32_MIN,
    LIVENESS_DIR,
    LIVENESS_FILE_PATTERN,
    MAX_ATTEMPTS,
    MAX_BACKOFF_FACTOR,
    MAX_TASK_ITEM_BYTES,
    MAX_TASK_ITEMS_BYTES,
    MAX_TASK_PARALLELISM,
    MAX_TASKS,
    MIN_RETRY_SECONDS,
    RESERVED_PREFIX,
    TASK_FAILURE_DETAILS,
    TERMINAL_PHASES,
    AgentKind,
    AttemptPhase,
    Guarantee,
    Outcome,
    Phase,
)
from vigil.api.wire import Condition, Rule, WireModel, cel_string, nested_field, seconds_field

# ---------------------------------------------------------------------------------------- spec


class Backoff(WireModel):
    """Delay before a retry: min(maxSeconds, initialSeconds * factor^(n-1)), then jittered."""

    initial_seconds: int = seconds_field(
        10, ge=0, description=f"Delay after the first failed attempt; at least {MIN_RETRY_SECONDS}."
    )
    factor: float = Field(
        2.0,
        le=MAX_BACKOFF_FACTOR,
        description=f"Growth of the delay per failed attempt, from 1 to {MAX_BACKOFF_FACTOR:g}.",
    )
    max_seconds: int = seconds_field(600, ge=0, description="Upper bound of the delay.")
    jitter: float = Field(
        0.5,
        description="Share of the delay that is random, in [0, 1]: the delay is drawn from "
        "[base * (1 - jitter), base].",
    )

    cel_rules = (
        Rule(
            f"self.initialSeconds >= {MIN_RETRY_SECONDS}",
            f"retry.backoff.initialSeconds must be at least {MIN_RETRY_SECONDS}: a job waits at least "
            f"{MIN_RETRY_SECONDS} s between attempts (jitter included), so that no job retries as fast as "
            "the API server answers (batch/v1 Job waits 10 s)",
            lambda b: b.initial_seconds >= MIN_RETRY_SECONDS,
            # Jobs stored before the floor are still read; core.backoff applies it to them.
            on_read=False,
        ),
        Rule(
            "self.maxSeconds >= self.initialSeconds",
            "retry.backoff.maxSeconds must be >= retry.backoff.initialSeconds",
            lambda b: b.max_seconds >= b.initial_seconds,
        ),
        Rule(
            "self.factor >= 1.0",
            "retry.backoff.factor must be >= 1 (1 keeps the delay constant)",
            lambda b: b.factor >= 1.0,
        ),
        Rule(
            "self.jitter >= 0.0 && self.jitter <= 1.0",
            "retry.backoff.jitter must be between 0 (no jitter) and 1 (full jitter)",
            lambda b: 0.0 <= b.jitter <= 1.0,
        ),
    )


class Retry(WireModel):
    """How often a job is tried, and which failures end it at once."""

    max_attempts: int = Field(
        6,
        le=MAX_ATTEMPTS,
        description=f"Attempts in all per round, the first included; from 1 to {MAX_ATTEMPTS}.",
    )
    backoff: Backoff = nested_field(Backoff, "Exponential backoff with jitter between attempts.")
    non_retryable_exit_codes: list[Annotated[int, Field(ge=0, le=255)]] = Field(
        default_factory=list,
        max_length=256,
        description="Exit codes that dead-letter the job at once (poison).",
        json_schema_extra={"default": []},  # shown by kubectl like every other default
    )
    count_disruptions: bool = Field(
        False,
        description="Whether evictions, preemptions and node drains use up attempts.",
    )

    cel_rules = (
        Rule(
            "self.maxAttempts >= 1",
            "retry.maxAttempts must be at least 1 (it counts the first attempt)",
            lambda r: r.max_attempts >= 1,
        ),
    )


class Heartbeat(WireModel):
    """Liveness of an attempt, as beaten by the agent in its pod."""

    interval_seconds: int = seconds_field(10, ge=1, description="How often the agent beats.")
    timeout_seconds: int = seconds_field(60, ge=1, description="Silence after which an attempt is Lost.")
    startup_grace_seconds: int = seconds_field(
        120, ge=0, description="Allowance for the first beat after the container starts."
    )
    required: bool = Field(True, description="false: no agent; liveness is the pod phase alone.")
    via: Literal["Leader", "Annotation"] = Field(
        "Leader",
        description=(
            "Leader: the agent posts each beat to the leading operator (no API-server write per beat) and "
            "falls back to its pod's annotation when it cannot reach it. Annotation: every beat patches the "
            "pod's vigil.dev/heartbeat annotation (docs/heartbeats.md)."
        ),
    )

    agent: AgentKind | None = Field(
        None,
        description=(
            "Who beats. Image: `vigil-agent -- CMD` inside the job's image. Sidecar: Vigil injects its own "
            "agent as a native sidecar (container vigil-agent, shareProcessNamespace: true) that beats while "
            "the job's processes run and stops them when fenced; the job's image needs nothing of Vigil. "
            "Unset: Sidecar when the operator was given an agent image (`--agent-image`, the chart's "
            'default), else Image (docs/heartbeats.md, "The injected agent").'
        ),
    )
    liveness_file: str | None = Field(
        None,
        max_length=253,
        description=(
            f"Sidecar only: a file under {LIVENESS_DIR}/ the job touches; the sidecar beats only while its "
            f"mtime is younger than timeoutSeconds. Vigil mounts an emptyDir at {LIVENESS_DIR} in every container "
            f"(where the job may also leave a checkpoint: {CHECKPOINT_FILE})."
        ),
    )
    liveness_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description=(
            "Sidecar only: the sidecar listens on 127.0.0.1:PORT, and a GET or POST /beat from the job counts "
            "as a touch of livenessFile (the same rule: beats only while the last touch is younger than "
            "timeoutSeconds)."
        ),
    )

    cel_rules = (
        Rule(
            "self.timeoutSeconds > self.intervalSeconds",
            "heartbeat.timeoutSeconds must be greater than heartbeat.intervalSeconds, "
            "or every attempt would look lost between two beats",
            lambda h: h.timeout_seconds > h.interval_seconds,
        ),
        Rule(
            f"!has(self.livenessFile) || self.livenessFile.matches({cel_string(LIVENESS_FILE_PATTERN)})",
            f"heartbeat.livenessFile must be a file directly under {LIVENESS_DIR}/ (e.g. {LIVENESS_DIR}/alive; "
            "letters, digits, '.', '_' and '-', not starting with '.'): Vigil mounts a shared emptyDir there",
            lambda h: h.liveness_file is None or re.fullmatch(LIVENESS_FILE_PATTERN, h.liveness_file) is not None,
        ),
        Rule(
            f"!has(self.livenessFile) || self.livenessFile != {cel_string(CHECKPOINT_FILE)}",
            f"heartbeat.livenessFile must not be {CHECKPOINT_FILE}: that is where the job leaves its checkpoint",
            lambda h: h.liveness_file != CHECKPOINT_FILE,
        ),
        Rule(
            "!(has(self.livenessFile) || has(self.livenessPort)) || !has(self.agent) || self.agent == 'Sidecar'",
            "heartbeat.livenessFile and heartbeat.livenessPort are read by the injected agent only: "
            "set heartbeat.agent to Sidecar (or leave it unset), or remove them",
            lambda h: (h.liveness_file is None and h.liveness_port is None) or h.agent in (None, "Sidecar"),
        ),
    )


def _reserved_names(names: Any) -> list[str]:
    return sorted(name for name in names if name.startswith(RESERVED_PREFIX))


def _no_reserved_names(field: str, *, name_one: bool) -> Rule:
    """No key of the map (or item of the list) `field` of the template's metadata may carry
    Vigil's prefix: Vigil's own names on a pod steer it (vigil.dev/superseded stops the attempt).

    `name_one`: the message names one offending entry. The API server prices a message that
    names them all (a join) far beyond its CEL budget, and even one item of an unbounded list
    beyond it, so finalizers get a fixed message.
    """
    refusal = f"spec.template.metadata.{field} must not use the {RESERVED_PREFIX} prefix (Vigil sets those on its pods)"
    prefix = cel_string(RESERVED_PREFIX)
    what = "key" if name_one else "finalizer"
    rule = Rule(
        f"!has(self.{field}) || self.{field}.all(n, !n.startsWith({prefix}))",
        f"{refusal}: remove every {RESERVED_PREFIX} {what} from the template",
        lambda meta: not _reserved_names(getattr(meta, field)),
    )
    if not name_one:
        return rule
    others = f" (and any other {RESERVED_PREFIX} key) from the template"
    return replace(
        rule,
        message_expression=(
            f"{cel_string(refusal + ': remove ')} + self.{field}.filter(n, n.startsWith({prefix}))[0]"
            f" + {cel_string(others)}"
        ),
        explain=lambda meta: f"{refusal}: remove {_reserved_names(getattr(meta, field))[0]}{others}",
    )


class TemplateMeta(WireModel):
    """The metadata of spec.template, as far as Vigil checks it itself. Its schema on the API
    server is Kubernetes' own (see vigil.api.template_schema); these rules are added to it."""

    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    finalizers: list[str] = Field(default_factory=list)

    cel_rules = (
        _no_reserved_names("labels", name_one=True),
        _no_reserved_names("annotations", name_one=True),
        _no_reserved_names("finalizers", name_one=False),
    )


def item_json(item: Any) -> str:
    """A task's item as its pod reads it in VIGIL_TASK_ITEM: a string as is, anything else as
    compact JSON."""
    return item if isinstance(item, str) else json.dumps(item, separators=(",", ":"), sort_keys=True)


class TaskSpec(WireModel):
    """A task array: one VigilJob for many tasks, each with its own attempts (docs/design.md, "Task arrays")."""

    count: int | None = Field(
        None,
        ge=1,
        le=MAX_TASKS,
        description=f"Tasks numbered 0 to count-1 (1 to {MAX_TASKS}); or give items instead.",
        json_schema_extra={
            "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "spec.tasks.count is immutable"}]
        },
    )
    items: list[Any] | None = Field(
        None,
        min_length=1,
        max_length=MAX_TASKS,
        description=f"One task per item, each a JSON value its pod reads in VIGIL_TASK_ITEM (a string as is, "
        f"anything else as JSON); at most {MAX_TASK_ITEM_BYTES} bytes each and {MAX_TASK_ITEMS_BYTES // 1024} KiB "
        "in all. Or give count instead.",
        json_schema_extra={
            "items": {"x-kubernetes-preserve-unknown-fields": True},
        },
    )
    parallelism: int = Field(
        DEFAULT_TASK_PARALLELISM,
        ge=1,
        le=MAX_TASK_PARALLELISM,
        description=f"The most tasks of this job started and not finished at once (1 to {MAX_TASK_PARALLELISM}); "
        "a task waiting out its backoff keeps its place. The queue's maxRunning bounds them too.",
    )
    max_dead_lettered_tasks: int | None = Field(
        None,
        ge=0,
        le=MAX_TASKS,
        description="Once more tasks than this are dead-lettered, the whole job stops (its running tasks are "
        "cancelled) and is dead-lettered (reason TooManyDeadLetteredTasks), as batch/v1's maxFailedIndexes. "
        "Unset: every task runs, and the job is dead-lettered at the end if any task was.",
    )

    # Exactly one of count and items: checked here (the operator dead-letters a job that breaks it,
    # reason InvalidTasks), not in CEL: a list whose items may be any JSON value has no CEL type, so
    # no rule can name it (the API server refuses `has(self.items)` at the CRD's creation).
    @model_validator(mode="after")
    def _count_or_items(self) -> TaskSpec:
        if (self.count is None) == (self.items is None):
            raise ValueError("spec.tasks needs exactly one of count (tasks 0 to count-1) and items (one task per item)")
        return self

    @field_validator("items")
    @classmethod
    def _bound_items(cls, items: list[Any] | None) -> list[Any] | None:
        if items is None:
            return None
        total = 0
        for index, item in enumerate(items):
            size = len(item_json(item).encode())
            if size > MAX_TASK_ITEM_BYTES:
                raise ValueError(
                    f"spec.tasks.items[{index}] is {size} bytes of JSON, more than {MAX_TASK_ITEM_BYTES}: pass a "
                    "reference (a key, a path, a URL) rather than the data"
                )
            total += size
        if total > MAX_TASK_ITEMS_BYTES:
            raise ValueError(
                f"spec.tasks.items hold {total} bytes of JSON, more than {MAX_TASK_ITEMS_BYTES}: split the work "
                "over several VigilJobs, or use count and let each task find its input by VIGIL_TASK_INDEX"
            )
        return items

    @property
    def total(self) -> int:
        return self.count if self.count is not None else len(self.items or ())


class VigilJobSpec(WireModel):
    """What to run and how hard to try."""

    queue: str = Field(
        "default",
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="VigilQueue in the same namespace.",
    )
    priority: int = Field(
        0,
        ge=INT32_MIN,
        le=INT32_MAX,
        description="Higher runs first within a queue; an int32, as Kubernetes' own priorities.",
    )
    template: dict[str, Any] | None = Field(
        None,
        description="A PodTemplateSpec, kept as given except restartPolicy: Never and Vigil's "
        "labels, owner reference and VIGIL_* environment. Immutable. Its labels, annotations and "
        "finalizers must not use the vigil.dev/ prefix, which is Vigil's. Required, except for a task "
        "array on a pool (spec.pool), whose workers run its tasks.",
        json_schema_extra={
            # vigil.api.crd puts Kubernetes' PodTemplateSpec schema here (vigil.api.template_schema), with
            # TemplateMeta's rules on its metadata.
            "x-vigil-schema": "PodTemplateSpec",
            "x-kubernetes-validations": [
                {
                    "rule": "self == oldSelf",
                    "message": "spec.template is immutable: create a new VigilJob instead",
                }
            ],
        },
    )
    retry: Retry = nested_field(Retry, "Attempts, backoff and poison exit codes.")
    heartbeat: Heartbeat = nested_field(Heartbeat, "Liveness of attempts.")
    guarantee: Guarantee = Field(
        "AtLeastOnce",
        description=(
            "NoOverlap: attempt N+1 starts only once attempt N's pod has stopped (phase Succeeded or "
            "Failed) or is gone; a terminating pod that still runs holds it back."
        ),
    )
    attempt_deadline_seconds: int | None = seconds_field(
        None, ge=1, description="One attempt's time limit; the attempt is then retried."
    )
    active_deadline_seconds: int | None = seconds_field(
        None, ge=1, description="The whole job's time limit; the job is then dead-lettered."
    )
    ttl_seconds_after_finished: int | None = seconds_field(
        None, ge=0, description="Delete the job this long after it finishes."
    )
    suspend: bool = Field(False, description="Start no attempts; stop a running one.")
    pool: str | None = Field(
        None,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="A VigilWorkerPool in the same namespace whose workers claim this task array's tasks "
        "(docs/pull.md), instead of a pod per attempt. Needs spec.tasks, and no spec.template. Immutable.",
    )
    tasks: TaskSpec | None = Field(
        None,
        description="Make the job a task array: many tasks of the same template, each with its own attempts, "
        "retries, heartbeats and dead letter (retry, heartbeat, guarantee and attemptDeadlineSeconds apply per "
        "task; activeDeadlineSeconds to the whole array). count and items are immutable.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    # A transition rule: it holds on updates alone (items have no CEL type: the operator
                    # keeps the number of tasks it first saw, status.tasks.total)
                    "rule": "has(self.count) == has(oldSelf.count)",
                    "message": "spec.tasks.count and spec.tasks.items are immutable: create a new VigilJob instead",
                }
            ]
        },
    )

    cel_rules = (
        Rule(
            "has(self.tasks) == has(oldSelf.tasks)",
            "spec.tasks cannot be added to or removed from a VigilJob: create a new VigilJob instead",
            lambda spec: True,  # a transition rule: only the API server sees the old spec
        ),
        Rule(
            "has(self.pool) == has(oldSelf.pool) && (!has(self.pool) || self.pool == oldSelf.pool)",
            "spec.pool is immutable: create a new VigilJob instead",
            lambda spec: True,  # a transition rule
        ),
        Rule(
            "!has(self.pool) || has(self.tasks)",
            "spec.pool needs spec.tasks: a pool's workers run the tasks of task arrays",
            lambda spec: spec.pool is None or spec.tasks is not None,
        ),
        Rule(
            "has(self.pool) != has(self.template)",
            "give spec.template (a pod per attempt) or spec.pool (a pool's workers run the tasks), not both "
            "and not neither",
            lambda spec: (spec.pool is not None) != (spec.template is not None),
        ),
    )

    @field_validator("template")
    @classmethod
    def _check_template_metadata(cls, template: dict[str, Any] | None) -> dict[str, Any] | None:
        if template is None:
            return None
        try:
            TemplateMeta.model_validate(template.get("metadata") or {})
        except ValidationError as err:  # said with the full path, as the API server says it
            raise ValueError("; ".join(_template_meta_error(e) for e in err.errors())) from None
        # The injected agent's container name is refused by the API server alone (vigil.api.crd): a
        # job stored before that rule still parses, and keeps its container (vigil.core.manifest).
        return template


def _template_meta_error(error: Any) -> str:
    if error["type"] == "value_error":  # a rule's own message, which names its field
        return str(error["ctx"]["error"])
    return ".".join(["spec.template.metadata", *map(str, error["loc"])]) + f": {error['msg']}"


# -------------------------------------------------------------------------------------- status


class CurrentAttempt(WireModel):
    """The attempt in flight: recorded from its pod once seen, or reserved before its pod is created."""

    number: int = Field(ge=1, description="Attempt number; also its fencing token.")
    pod_name: str = Field(
        description="Name of the attempt's pod: <job>-<number>, shortened with a hash where too long."
    )
    pod_uid: str | None = Field(
        None,
        alias="podUID",
        description="UID of the attempt's pod once seen: a seen pod that vanishes is Lost, "
        "never created again under the same attempt number.",
    )
    phase: AttemptPhase = Field(
        description="Starting (pod not running yet), Running (its pod runs and, with heartbeat.required, beats "
        "arrive), or Uncertain (beats stopped for a while: doubt, not a verdict; nothing is stopped or started)."
    )
    started_at: datetime = Field(description="When the attempt started: its pod's vigil.dev/started-at.")
    last_heartbeat_at: datetime | None = Field(
        None,
        description="The last beat Vigil heard, as stamped: refreshed at most every max(5m, timeoutSeconds/2) "
        "(longer above 3,000 attempts beating), so it may lag; the phase and HeartbeatHealthy say within "
        "timeoutSeconds whether beats arrive.",
    )
    node_name: str | None = Field(None, description="The node the attempt's pod runs on, once scheduled.")


class AttemptRecord(WireModel):
    """A finished attempt, as kept in status.history."""

    number: int = Field(description="Attempt number; also its fencing token.")
    pod_name: str = Field(description="Name of the attempt's pod.")
    outcome: Outcome = Field(
        description="How it ended: Succeeded, Failed (a non-zero exit), Lost (no beats for timeoutSeconds, or its "
        "pod vanished), DeadlineExceeded (attemptDeadlineSeconds), Disrupted (eviction, preemption, node drain), "
        "Superseded (replaced by a newer attempt), Cancelled (suspend, or the job's deadline)."
    )
    reason: str | None = Field(None, description="Why it ended that way (CamelCase), e.g. PodDeleted, Evicted.")
    exit_code: int | None = Field(None, description="The exit code of the job's container, when it exited.")
    node_name: str | None = Field(None, description="The node its pod ran on.")
    started_at: datetime = Field(description="When the attempt started.")
    finished_at: datetime = Field(description="When Vigil recorded its end.")


class TaskState(WireModel):
    """A task of an array that has started and not finished: its own attempts, as a job's."""

    index: int = Field(ge=0, description="The task's index.")
    phase: Phase = Field(description="As a job's phase, for this task alone.")
    reason: str | None = Field(None, description="Why the task is in its phase (CamelCase).")
    attempts: int = Field(0, description="The task's newest attempt number (its fencing token).")
    round_attempts: int = Field(0, description="The task's attempts of its current round.")
    current_attempt: CurrentAttempt | None = Field(None, description="The task's attempt in flight, if any.")
    next_attempt_at: datetime | None = Field(None, description="While BackingOff: when its next attempt may start.")
    started_at: datetime | None = Field(None, description="When the task's round started.")
    last_checkpoint: str | None = Field(None, description="The newest checkpoint the task's attempts left.")
    last: AttemptRecord | None = Field(None, description="The task's last finished attempt.")


class TaskFailure(WireModel):
    """A dead-lettered task, as status.tasks.failed describes it."""

    index: int = Field(description="The task's index.")
    attempts: int = Field(description="Its attempts, all rounds.")
    outcome: Outcome | None = Field(None, description="How its last attempt ended.")
    reason: str | None = Field(None, description="Why it was dead-lettered (CamelCase), e.g. NonRetryableExitCode.")
    exit_code: int | None = Field(None, description="Its last attempt's exit code, if it exited.")
    finished_at: datetime | None = Field(None, description="When it was dead-lettered.")
    message: str | None = Field(None, description="What happened, for a person.")


class AttemptGroup(WireModel):
    """Tasks not active that used the same number of attempts: a redriven task's attempt
    numbers go on from there, so a fencing token is never reused."""

    attempts: int = Field(description="Attempts used.")
    indexes: str = Field(description="The tasks, as index ranges.")


class TaskStatus(WireModel):
    """An array's tasks, in a form whose size does not grow with their number: counts, index
    ranges, the active tasks (at most parallelism) and the last few failures."""

    total: int = Field(0, description="Tasks in all.")
    pending: int = Field(0, description="Tasks not started (or redriven and not started again).")
    running: int = Field(0, description="Tasks with an attempt Starting, Running or Uncertain.")
    backing_off: int = Field(0, description="Tasks waiting out a retry's backoff.")
    succeeded: int = Field(0, description="Tasks that succeeded.")
    dead_lettered: int = Field(0, description="Tasks dead-lettered.")
    progress: str | None = Field(None, description="succeeded/total, for the TASKS column.")
    succeeded_indexes: str = Field("", description='The tasks that succeeded, as index ranges ("0-99,120").')
    dead_lettered_indexes: str = Field("", description="The tasks dead-lettered, as index ranges.")
    prior_attempts: list[AttemptGroup] = Field(
        default_factory=list,
        description="The attempts used by the tasks that are dead-lettered, or redriven and not started "
        "again, grouped by number: a redriven task's attempt numbers go on from there.",
    )
    failed: list[TaskFailure] = Field(
        default_factory=list,
        max_length=TASK_FAILURE_DETAILS,
        description=f"The last {TASK_FAILURE_DETAILS} tasks dead-lettered, newest last.",
    )
    active: list[TaskState] = Field(
        default_factory=list, description="The tasks started and not finished, by index (at most parallelism)."
    )
    redrives: int = Field(0, description="Redrives of tasks honoured (vigil.dev/redrive-tasks or vigil.dev/redrive).")
    last_redrive: str | None = Field(None, description="The vigil.dev/redrive-tasks value last honoured.")


class VigilJobStatus(WireModel):
    """All of Vigil's memory of a job; written only through the status subresource."""

    phase: Phase | None = Field(
        None,
        description="Queued (waiting for its queue), Starting, Running, Uncertain (beats stopped: doubt, nothing is "
        "stopped or started yet), BackingOff (waiting out a retry's backoff, until nextAttemptAt), Succeeded, "
        "DeadLettered (no more attempts: poison exit code, attempts exhausted, deadline, invalid template), "
        "Suspended. Unset until the operator has seen the job.",
    )
    reason: str | None = Field(None, description="Why the job is in its phase (CamelCase).")
    message: str | None = Field(None, description="The same, for a person.")
    attempts: int = Field(0, description="Attempts started in all rounds: the newest attempt's number.")
    round_attempts: int = Field(
        0,
        description="Attempts of the current round that count against retry.maxAttempts "
        "(disruptions and cancellations do not, unless retry.countDisruptions).",
    )
    current_attempt: CurrentAttempt | None = Field(None, description="The attempt in flight, if any.")
    next_attempt_at: datetime | None = Field(
        None, description="While BackingOff: when the next attempt may start (its queue may still hold it)."
    )
    started_at: datetime | None = Field(
        None,
        description="When the round's first attempt started (reset by redrive and resume); "
        "activeDeadlineSeconds counts from here.",
    )
    finished_at: datetime | None = Field(None, description="When the job reached Succeeded or DeadLettered.")
    redrives: int = Field(0, description="Redrives honoured (vigil.dev/redrive): each starts a new round of attempts.")
    last_redrive: str | None = Field(None, description="The vigil.dev/redrive annotation value last honoured.")
    last_checkpoint: str | None = Field(None, description="The newest checkpoint an attempt left.")
    history: list[AttemptRecord] = Field(
        default_factory=list,
        max_length=HISTORY_LIMIT,
        description=f"The last {HISTORY_LIMIT} finished attempts, oldest first.",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Succeeded, DeadLettered, Running, Reconciling and Stalled (kstatus) follow the phase; "
        "HeartbeatHealthy says whether the current attempt's beats arrive; CheckpointAccepted appears once a "
        "checkpoint was refused; ReconcileError while the operator fails to reconcile the job.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
    observed_generation: int | None = Field(
        None, description="The metadata.generation of the spec this status was written for."
    )
    tasks: TaskStatus | None = Field(None, description="A task array's tasks (spec.tasks).")

    @property
    def is_terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES


# ------------------------------------------------------------------------------- whole object


class JobMeta(WireModel):
    """The part of a job's metadata the core reads."""

    name: str
    namespace: str
    uid: str
    generation: int = 1
    resource_version: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    deletion_timestamp: datetime | None = None


class VigilJob(WireModel):
    """A VigilJob as read from the API server (not used for the CRD schema)."""

    metadata: JobMeta
    spec: VigilJobSpec
    status: VigilJobStatus = Field(default_factory=VigilJobStatus)
