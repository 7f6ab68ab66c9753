"""The names and limits of the VigilJob API: its group, version and kinds, the labels,
annotations, finalizer and environment variables Vigil puts on objects, the bounds of the spec's
numbers, and the phases, outcomes and reasons status speaks in.

Standard library only: every model (`vigil.api.job`, `vigil.api.queue`) and every user of a
name reads them from here, through `vigil.api`.
"""

from __future__ import annotations

from typing import Literal

GROUP = "vigil.dev"
VERSION = "v1beta1"  # served, and the version the API server stores (docs/design.md, "API versions")
API_VERSION = f"{GROUP}/{VERSION}"
# Still served, with the same schema (the CRDs convert with `strategy: None`), but deprecated: the
# API server warns every request made through it. Removed in a later release, once stored objects
# were migrated (`vigil migrate-storage`, docs/upgrading.md).
DEPRECATED_VERSION = "v1alpha1"
SERVED_VERSIONS = (VERSION, DEPRECATED_VERSION)
KIND = "VigilJob"
PLURAL = "vigiljobs"
QUEUE_KIND = "VigilQueue"
QUEUE_PLURAL = "vigilqueues"
DEFAULT_QUEUE = "default"  # a job's queue when it names none; absent, such jobs run unlimited
HEAD_OF_LINE_LIMIT = 10  # the most names of waiting jobs a queue's status may hold (the schema's maxItems)
POOL_KIND = "VigilWorkerPool"  # long-lived workers that pull a task array's tasks (docs/pull.md)
POOL_PLURAL = "vigilworkerpools"
MAX_POOL_REPLICAS = 10_000  # the most workers a pool may keep (spec.maxReplicas)
MAX_POOL_SLOTS = 1_000  # the most tasks one worker runs at once (spec.slotsPerWorker)

# Names Vigil puts on objects (docs/design.md, "Names on objects").
LABEL_JOB_UID = "vigil.dev/job-uid"
LABEL_ATTEMPT = "vigil.dev/attempt"
LABEL_QUEUE = "vigil.dev/queue"
LABEL_POOL = "vigil.dev/pool"  # on a worker pool's pods: the pool's name
LABEL_DEAD_LETTER = "vigil.dev/dead-letter"
# On a task array some of whose tasks are dead-lettered, whatever its phase: what `kubectl vigil
# dlq` selects beside vigil.dev/dead-letter, rather than listing every job.
LABEL_DEAD_TASKS = "vigil.dev/dead-tasks"
ANNOTATION_REDRIVE = "vigil.dev/redrive"
# On an array: "<index ranges>@<token>" redrives those of its tasks that are dead-lettered, once
# per distinct value (status.tasks.lastRedrive).
ANNOTATION_REDRIVE_TASKS = "vigil.dev/redrive-tasks"
LABEL_TASK_INDEX = "vigil.dev/task-index"  # on a task's pod: the task's index in its array
ANNOTATION_CHECKPOINT = "vigil.dev/checkpoint"
ANNOTATION_HEARTBEAT = "vigil.dev/heartbeat"  # written by the agent; a new value is a beat
ANNOTATION_SUPERSEDED = "vigil.dev/superseded"  # written by Vigil on a replaced attempt's pod: stop
# Set by Vigil on the pods it creates: when the attempt started (the operator's clock, to the
# microsecond), which status records once it finds the pod (creationTimestamp has whole seconds).
ANNOTATION_STARTED_AT = "vigil.dev/started-at"
# On every attempt pod; removed only once the attempt's outcome is in the job's status, so no
# final phase or exit code is lost (as batch/v1 does with batch.kubernetes.io/job-tracking).
FINALIZER_ATTEMPT_TRACKING = "vigil.dev/attempt-tracking"

# Task arrays (spec.tasks). Status holds a record per active task, so parallelism bounds its size
# (about 400 bytes a task: 1,000 active tasks make ~400 KiB of the object's 1.5 MiB in etcd); the
# items' JSON is bounded so that the spec and that status fit together.
MAX_TASKS = 100_000
MAX_TASK_PARALLELISM = 1_000
DEFAULT_TASK_PARALLELISM = 10
MAX_TASK_ITEMS_BYTES = 512 * 1024
MAX_TASK_ITEM_BYTES = 4096  # one item, passed to its pod as VIGIL_TASK_ITEM
TASK_FAILURE_DETAILS = 20  # the dead-lettered tasks status.tasks.failed describes (the newest)

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
