"""The VigilJob API (group vigil.dev, version v1alpha1) as pydantic models.

These models are the one source of truth for the wire format: `vigil.api.crd` generates the CRD's
OpenAPI schema, defaults and CEL rules from them, and the decision core parses jobs with them.
Field names are snake_case in Python and camelCase on the wire.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

GROUP = "vigil.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "VigilJob"
PLURAL = "vigiljobs"
QUEUE_KIND = "VigilQueue"
QUEUE_PLURAL = "vigilqueues"
DEFAULT_QUEUE = "default"  # a job's queue when it names none; absent, such jobs run unlimited
HEAD_OF_LINE_LIMIT = 10  # the most names of waiting jobs a queue's status may hold (the schema's maxItems)

# Names Vigil puts on objects (docs/design.md, "Names on objects").
LABEL_JOB_UID = "vigil.dev/job-uid"
LABEL_ATTEMPT = "vigil.dev/attempt"
LABEL_QUEUE = "vigil.dev/queue"
LABEL_DEAD_LETTER = "vigil.dev/dead-letter"
ANNOTATION_REDRIVE = "vigil.dev/redrive"
ANNOTATION_CHECKPOINT = "vigil.dev/checkpoint"
ANNOTATION_HEARTBEAT = "vigil.dev/heartbeat"  # written by the agent; a new value is a beat
ANNOTATION_SUPERSEDED = "vigil.dev/superseded"  # written by Vigil on a replaced attempt's pod: stop
# Set by Vigil on the pods it creates: when the attempt started (the operator's clock, to the
# microsecond), which status records once it finds the pod (creationTimestamp has whole seconds).
ANNOTATION_STARTED_AT = "vigil.dev/started-at"
# On every attempt pod; removed only once the attempt's outcome is in the job's status, so no
# final phase or exit code is lost (as batch/v1 does with batch.kubernetes.io/job-tracking).
FINALIZER_ATTEMPT_TRACKING = "vigil.dev/attempt-tracking"

MAX_CHECKPOINT_BYTES = 2048
# The agent writes "<sequence>:<8 hex digits>", at most 28 characters; the chart's admission
# policy refuses a longer value from anyone (charts/vigil/templates/heartbeat-policy.yaml).
MAX_HEARTBEAT_CHARS = 64
HISTORY_LIMIT = 20
MAX_CONDITION_MESSAGE = 32768  # metav1.Condition's limit, in characters

# Upper bounds of the spec's numbers. They exist so that no value the API server admits can make
# the decision core overflow (a datetime plus 3e11 seconds raises OverflowError), and each is
# far beyond any sensible use.
MAX_SECONDS = 10 * 365 * 24 * 3600  # 10 years, for every duration; fits in an int32 too
MAX_ATTEMPTS = 10_000  # beyond this a job is poison, whatever its backoff
MAX_BACKOFF_FACTOR = 10.0
# The least delay between two attempts of a job. batch/v1's Job controller waits 10 s after a
# failed pod, doubling up to 10 min, and lets no one set less; Vigil keeps 10 s as the default and
# lets a job ask for less, down to this floor, so that no job can retry as fast as the API answers.
MIN_RETRY_SECONDS = 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1  # priority, as Kubernetes' own priorities
# The injected agent (heartbeat.agent: Sidecar): its container's name, which a template must not
# use, and the directory of heartbeat.livenessFile, an emptyDir Vigil mounts in every container.
AGENT_CONTAINER = "vigil-agent"
LIVENESS_DIR = "/var/run/vigil"
LIVENESS_FILE_PATTERN = r"^/var/run/vigil/[A-Za-z0-9_-][A-Za-z0-9._-]*$"
# Where a job of any image leaves its checkpoint for the injected agent (in that emptyDir), and
# the variable that says so to the job (`vigil-agent -- CMD` sets it for its command too).
ENV_CHECKPOINT_FILE = "VIGIL_CHECKPOINT_FILE"
CHECKPOINT_FILE = f"{LIVENESS_DIR}/checkpoint.json"
# Reasons of a job that waits for something other than its queue: the queue passes it by (no
# start is given to it) until a new decision changes its reason.
REASON_PREVIOUS_POD = "WaitingForPreviousPod"  # NoOverlap: an earlier attempt's pod remains
REASON_AGENT_IMAGE_MISSING = "AgentImageMissing"  # heartbeat.agent: Sidecar, and no --agent-image
BLOCKED_REASONS = frozenset({REASON_PREVIOUS_POD, REASON_AGENT_IMAGE_MISSING})
TEMPLATE_CONTAINER_LISTS = ("initContainers", "containers")  # where AGENT_CONTAINER is refused
AGENT_CONTAINER_REFUSAL = (
    f"{AGENT_CONTAINER} is the name of the agent Vigil injects into attempt pods: name this container otherwise"
)
RESERVED_PREFIX = f"{GROUP}/"  # label, annotation and finalizer names that are Vigil's alone

Phase = Literal[
    "Queued",
    "Starting",
    "Running",
    "Uncertain",
    "BackingOff",
    "Succeeded",
    "DeadLettered",
    "Suspended",
]
TERMINAL_PHASES: frozenset[str] = frozenset({"Succeeded", "DeadLettered"})
AttemptPhase = Literal["Starting", "Running", "Uncertain"]
Outcome = Literal["Succeeded", "Failed", "Lost", "DeadlineExceeded", "Disrupted", "Superseded", "Cancelled"]
Guarantee = Literal["AtLeastOnce", "NoOverlap"]
AgentKind = Literal["Image", "Sidecar"]
ConditionStatus = Literal["True", "False", "Unknown"]


@dataclass(frozen=True)
class Rule:
    """One validation rule, stated twice: in CEL for the API server, in Python for the core.

    Both sides carry the same message, so a person sees the same text whichever refuses. A
    rule that can name the offending values says it twice as well: `message_expression` in CEL
    and `explain` in Python (`message` stays as the API server's fallback).
    """

    cel: str
    message: str
    holds: Callable[[Any], bool]
    message_expression: str | None = None
    explain: Callable[[Any], str] | None = None
    # False for a rule added after objects were stored under the looser one: the API server
    # refuses new values (and, ratcheting, lets an update that leaves the field alone pass), while
    # the core still reads the stored objects and enforces the rule its own way.
    on_read: bool = True

    def as_validation(self) -> dict[str, str]:
        """The rule as an entry of x-kubernetes-validations."""
        entry = {"rule": self.cel, "message": self.message}
        if self.message_expression:
            entry["messageExpression"] = self.message_expression
        return entry


class WireModel(BaseModel):
    """Base of every API model: camelCase on the wire, immutable, validated by `cel_rules`."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)
    cel_rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_cel_rules(self) -> Self:
        for rule in self.cel_rules:
            if rule.on_read and not rule.holds(self):
                raise ValueError(rule.explain(self) if rule.explain else rule.message)
        return self

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> dict[str, Any]:
        schema = handler(core_schema)
        if cls.cel_rules:
            handler.resolve_ref_schema(schema)["x-kubernetes-validations"] = [
                rule.as_validation() for rule in cls.cel_rules
            ]
        return schema


def _cel_string(text: str) -> str:
    """`text` as a CEL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _seconds(default: int | None, *, ge: int, description: str) -> Any:
    """A duration in whole seconds, from `ge` up to MAX_SECONDS."""
    return Field(default, ge=ge, le=MAX_SECONDS, description=f"{description} At most {MAX_SECONDS} (10 years).")


def _nested(model: type[WireModel], description: str) -> Any:
    """A sub-object that may be left out: the API server then fills it in with all its defaults."""
    # The default is spelled out whole: the API server checks a default against the CEL rules
    # without first filling in the defaults nested inside it, so `{}` would fail them.
    default = model().model_dump(by_alias=True, mode="json", exclude_none=True)  # unset stays unset
    return Field(default_factory=model, description=description, json_schema_extra={"default": default})


# ---------------------------------------------------------------------------------------- spec


class Backoff(WireModel):
    """Delay before a retry: min(maxSeconds, initialSeconds * factor^(n-1)), then jittered."""

    initial_seconds: int = _seconds(
        10, ge=0, description=f"Delay after the first failed attempt; at least {MIN_RETRY_SECONDS}."
    )
    factor: float = Field(
        2.0,
        le=MAX_BACKOFF_FACTOR,
        description=f"Growth of the delay per failed attempt, from 1 to {MAX_BACKOFF_FACTOR:g}.",
    )
    max_seconds: int = _seconds(600, ge=0, description="Upper bound of the delay.")
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
    backoff: Backoff = _nested(Backoff, "Exponential backoff with jitter between attempts.")
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

    interval_seconds: int = _seconds(10, ge=1, description="How often the agent beats.")
    timeout_seconds: int = _seconds(60, ge=1, description="Silence after which an attempt is Lost.")
    startup_grace_seconds: int = _seconds(
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
            f"!has(self.livenessFile) || self.livenessFile.matches({_cel_string(LIVENESS_FILE_PATTERN)})",
            f"heartbeat.livenessFile must be a file directly under {LIVENESS_DIR}/ (e.g. {LIVENESS_DIR}/alive; "
            "letters, digits, '.', '_' and '-', not starting with '.'): Vigil mounts a shared emptyDir there",
            lambda h: h.liveness_file is None or re.fullmatch(LIVENESS_FILE_PATTERN, h.liveness_file) is not None,
        ),
        Rule(
            f"!has(self.livenessFile) || self.livenessFile != {_cel_string(CHECKPOINT_FILE)}",
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
    prefix = _cel_string(RESERVED_PREFIX)
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
            f"{_cel_string(refusal + ': remove ')} + self.{field}.filter(n, n.startsWith({prefix}))[0]"
            f" + {_cel_string(others)}"
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
    template: dict[str, Any] = Field(
        description="A PodTemplateSpec, kept as given except restartPolicy: Never and Vigil's "
        "labels, owner reference and VIGIL_* environment. Immutable. Its labels, annotations and "
        "finalizers must not use the vigil.dev/ prefix, which is Vigil's.",
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
    retry: Retry = _nested(Retry, "Attempts, backoff and poison exit codes.")
    heartbeat: Heartbeat = _nested(Heartbeat, "Liveness of attempts.")
    guarantee: Guarantee = Field(
        "AtLeastOnce",
        description=(
            "NoOverlap: attempt N+1 starts only once attempt N's pod has stopped (phase Succeeded or "
            "Failed) or is gone; a terminating pod that still runs holds it back."
        ),
    )
    attempt_deadline_seconds: int | None = _seconds(
        None, ge=1, description="One attempt's time limit; the attempt is then retried."
    )
    active_deadline_seconds: int | None = _seconds(
        None, ge=1, description="The whole job's time limit; the job is then dead-lettered."
    )
    ttl_seconds_after_finished: int | None = _seconds(
        None, ge=0, description="Delete the job this long after it finishes."
    )
    suspend: bool = Field(False, description="Start no attempts; stop a running one.")

    @field_validator("template")
    @classmethod
    def _check_template_metadata(cls, template: dict[str, Any]) -> dict[str, Any]:
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
    pod_name: str
    pod_uid: str | None = Field(
        None,
        alias="podUID",
        description="UID of the attempt's pod once seen: a seen pod that vanishes is Lost, "
        "never created again under the same attempt number.",
    )
    phase: AttemptPhase
    started_at: datetime
    last_heartbeat_at: datetime | None = None
    node_name: str | None = None


class AttemptRecord(WireModel):
    """A finished attempt, as kept in status.history."""

    number: int
    pod_name: str
    outcome: Outcome
    reason: str | None = None
    exit_code: int | None = None
    node_name: str | None = None
    started_at: datetime
    finished_at: datetime


class Condition(WireModel):
    """metav1.Condition."""

    type: str = Field(max_length=316)
    status: ConditionStatus
    reason: str = Field(max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    message: str = Field(max_length=MAX_CONDITION_MESSAGE)
    last_transition_time: datetime
    observed_generation: int | None = Field(None, ge=0)


class VigilJobStatus(WireModel):
    """All of Vigil's memory of a job; written only through the status subresource."""

    phase: Phase | None = None
    reason: str | None = Field(None, description="Why the job is in its phase (CamelCase).")
    message: str | None = Field(None, description="The same, for a person.")
    attempts: int = Field(0, description="Attempts started in all rounds: the newest attempt's number.")
    round_attempts: int = Field(
        0,
        description="Attempts of the current round that count against retry.maxAttempts "
        "(disruptions and cancellations do not, unless retry.countDisruptions).",
    )
    current_attempt: CurrentAttempt | None = None
    next_attempt_at: datetime | None = None
    started_at: datetime | None = Field(
        None,
        description="When the round's first attempt started (reset by redrive and resume); "
        "activeDeadlineSeconds counts from here.",
    )
    finished_at: datetime | None = None
    redrives: int = 0
    last_redrive: str | None = Field(None, description="The vigil.dev/redrive annotation value last honoured.")
    last_checkpoint: str | None = Field(None, description="The newest checkpoint an attempt left.")
    history: list[AttemptRecord] = Field(default_factory=list, max_length=HISTORY_LIMIT)
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
    observed_generation: int | None = None

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


# ------------------------------------------------------------------------------------ queues


class VigilQueueSpec(WireModel):
    """What a queue admits and how fast it lets attempts start."""

    max_running: int = Field(
        100,
        ge=0,
        le=1_000_000,
        description="Attempts in Starting, Running or Uncertain at once (BackingOff ones do not "
        "count); 0 starts nothing, like paused.",
    )
    max_queued: int = Field(
        10_000,
        ge=0,
        le=10_000_000,
        description="Admission refuses a new job while this many jobs of the queue wait to start.",
    )
    paused: bool = Field(False, description="Start no new attempts; running ones finish (drain).")
    retry_budget: float = Field(
        0.2,
        ge=0.0,
        le=1.0,
        description="Retries may be at most this share of the queue's attempt starts over a sliding "
        "window (with a small floor so a quiet queue can still retry); retries over budget wait.",
    )
    max_starts_per_second: float | None = Field(
        None,
        ge=0.001,
        le=10_000.0,
        description="Optional limit on attempt starts per second (a token bucket), to protect what "
        "the jobs call from a burst of submissions.",
    )


class VigilQueueStatus(WireModel):
    """How the queue stands, written by Vigil in batches (not on every job event)."""

    queued: int = Field(0, description="Jobs waiting for the queue to let their next attempt start.")
    running: int = Field(0, description="Attempts in Starting, Running or Uncertain.")
    backing_off: int = Field(0, description="Jobs waiting out a retry's backoff.")
    dead_lettered: int = Field(0, description="Dead-lettered jobs of the queue.")
    oldest_queued_seconds: int | None = Field(None, description="How long the first job in line has waited.")
    head_of_line: list[str] = Field(
        default_factory=list, max_length=HEAD_OF_LINE_LIMIT, description="The next jobs to start, in order."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = None


class QueueMeta(WireModel):
    name: str
    namespace: str
    uid: str
    generation: int = 1
    resource_version: str | None = None


class VigilQueue(WireModel):
    """A VigilQueue as read from the API server (not used for the CRD schema)."""

    metadata: QueueMeta
    spec: VigilQueueSpec = Field(default_factory=VigilQueueSpec)
    status: VigilQueueStatus = Field(default_factory=VigilQueueStatus)
