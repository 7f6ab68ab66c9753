"""The VigilJob API (group vigil.dev, version v1beta1) as pydantic models.

These models are the one source of truth for the wire format: `vigil.api.crd` generates the CRD's
OpenAPI schema, defaults and CEL rules from them, and the decision core parses jobs with them.
Field names are snake_case in Python and camelCase on the wire.

The package is in parts: `names` (the group, kinds, labels, annotations, environment names,
limits, phases and reasons), `wire` (the models' base, `WireModel` with its `Rule`s, and
metav1.Condition), `job` (VigilJob), `queue` (VigilQueue) and `pool`
(VigilWorkerPool). Every public name of those is
re-exported here, so `from vigil import api; api.X` reaches each one.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from vigil.api.names import (
    AGENT_CONTAINER,
    AGENT_CONTAINER_REFUSAL,
    ANNOTATION_CHECKPOINT,
    ANNOTATION_HEARTBEAT,
    ANNOTATION_REDRIVE,
    ANNOTATION_REDRIVE_TASKS,
    ANNOTATION_STARTED_AT,
    ANNOTATION_SUPERSEDED,
    API_VERSION,
    BLOCKED_REASONS,
    CHECKPOINT_FILE,
    DEFAULT_QUEUE,
    DEFAULT_TASK_PARALLELISM,
    DEPRECATED_VERSION,
    ENV_CHECKPOINT_FILE,
    FINALIZER_ATTEMPT_TRACKING,
    GROUP,
    HEAD_OF_LINE_LIMIT,
    HISTORY_LIMIT,
    INT32_MAX,
    INT32_MIN,
    KIND,
    LABEL_ATTEMPT,
    LABEL_DEAD_LETTER,
    LABEL_DEAD_TASKS,
    LABEL_JOB_UID,
    LABEL_POOL,
    LABEL_QUEUE,
    LABEL_TASK_INDEX,
    LIVENESS_DIR,
    LIVENESS_FILE_PATTERN,
    MAX_ATTEMPTS,
    MAX_BACKOFF_FACTOR,
    MAX_CHECKPOINT_BYTES,
    MAX_CONDITION_MESSAGE,
    MAX_HEARTBEAT_CHARS,
    MAX_POOL_REPLICAS,
    MAX_POOL_SLOTS,
    MAX_SECONDS,
    MAX_TASK_ITEM_BYTES,
    MAX_TASK_ITEMS_BYTES,
    MAX_TASK_PARALLELISM,
    MAX_TASKS,
    MIN_RETRY_SECONDS,
    PLURAL,
    POOL_KIND,
    POOL_PLURAL,
    QUEUE_KIND,
    QUEUE_PLURAL,
    REASON_AGENT_IMAGE_MISSING,
    REASON_PREVIOUS_POD,
    RESERVED_PREFIX,
    SERVED_VERSIONS,
    TASK_FAILURE_DETAILS,
    TEMPLATE_CONTAINER_LISTS,
    TERMINAL_PHASES,
    VERSION,
    AgentKind,
    AttemptPhase,
    ConditionStatus,
    Guarantee,
    Outcome,
    Phase,
)

# The models (pydantic) are imported on first use, not with the package: the names above are all
# that `kubectl vigil` reads, and its zipapp (release/dist.sh) can hold no compiled module, such as
# pydantic-core. `from vigil.api import VigilJob` and `api.VigilJob` work as before.
if TYPE_CHECKING:
    from vigil.api.job import (
        AttemptGroup,
        AttemptRecord,
        Backoff,
        CurrentAttempt,
        Heartbeat,
        JobMeta,
        Retry,
        TaskFailure,
        TaskSpec,
        TaskState,
        TaskStatus,
        TemplateMeta,
        VigilJob,
        VigilJobSpec,
        VigilJobStatus,
    )
    from vigil.api.pool import (
        PoolHeartbeat,
        PoolMeta,
        VigilWorkerPool,
        VigilWorkerPoolSpec,
        VigilWorkerPoolStatus,
    )
    from vigil.api.queue import (
        QueueMeta,
        VigilQueue,
        VigilQueueSpec,
        VigilQueueStatus,
    )
    from vigil.api.wire import (
        Condition,
        Rule,
        WireModel,
    )

_LAZY = {
    **dict.fromkeys(
        (
            "TaskSpec",
            "TaskState",
            "TaskStatus",
            "TaskFailure",
            "AttemptGroup",
            "AttemptRecord",
            "Backoff",
            "CurrentAttempt",
            "Heartbeat",
            "JobMeta",
            "Retry",
            "TemplateMeta",
            "VigilJob",
            "VigilJobSpec",
            "VigilJobStatus",
        ),
        "job",
    ),
    **dict.fromkeys(
        (
            "QueueMeta",
            "VigilQueue",
            "VigilQueueSpec",
            "VigilQueueStatus",
        ),
        "queue",
    ),
    **dict.fromkeys(
        (
            "PoolHeartbeat",
            "PoolMeta",
            "VigilWorkerPool",
            "VigilWorkerPoolSpec",
            "VigilWorkerPoolStatus",
        ),
        "pool",
    ),
    **dict.fromkeys(
        (
            "Condition",
            "Rule",
            "WireModel",
        ),
        "wire",
    ),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"vigil.api.{module}"), name)
    globals()[name] = value  # once: later reads find it without this call
    return value


__all__ = [
    "AttemptGroup",
    "TaskFailure",
    "TaskStatus",
    "TaskState",
    "TaskSpec",
    "TASK_FAILURE_DETAILS",
    "MAX_TASK_ITEM_BYTES",
    "MAX_TASK_ITEMS_BYTES",
    "DEFAULT_TASK_PARALLELISM",
    "MAX_TASK_PARALLELISM",
    "MAX_TASKS",
    "LABEL_TASK_INDEX",
    "ANNOTATION_REDRIVE_TASKS",
    "AGENT_CONTAINER",
    "AGENT_CONTAINER_REFUSAL",
    "ANNOTATION_CHECKPOINT",
    "ANNOTATION_HEARTBEAT",
    "ANNOTATION_REDRIVE",
    "ANNOTATION_STARTED_AT",
    "ANNOTATION_SUPERSEDED",
    "API_VERSION",
    "AgentKind",
    "AttemptPhase",
    "AttemptRecord",
    "BLOCKED_REASONS",
    "Backoff",
    "CHECKPOINT_FILE",
    "Condition",
    "ConditionStatus",
    "CurrentAttempt",
    "DEFAULT_QUEUE",
    "DEPRECATED_VERSION",
    "ENV_CHECKPOINT_FILE",
    "FINALIZER_ATTEMPT_TRACKING",
    "GROUP",
    "Guarantee",
    "HEAD_OF_LINE_LIMIT",
    "HISTORY_LIMIT",
    "Heartbeat",
    "INT32_MAX",
    "INT32_MIN",
    "JobMeta",
    "KIND",
    "LABEL_ATTEMPT",
    "LABEL_DEAD_LETTER",
    "LABEL_DEAD_TASKS",
    "LABEL_JOB_UID",
    "LABEL_POOL",
    "LABEL_QUEUE",
    "LIVENESS_DIR",
    "LIVENESS_FILE_PATTERN",
    "MAX_ATTEMPTS",
    "MAX_BACKOFF_FACTOR",
    "MAX_CHECKPOINT_BYTES",
    "MAX_CONDITION_MESSAGE",
    "MAX_HEARTBEAT_CHARS",
    "MAX_POOL_REPLICAS",
    "MAX_POOL_SLOTS",
    "MAX_SECONDS",
    "MIN_RETRY_SECONDS",
    "Outcome",
    "PLURAL",
    "POOL_KIND",
    "POOL_PLURAL",
    "PoolHeartbeat",
    "PoolMeta",
    "Phase",
    "QUEUE_KIND",
    "QUEUE_PLURAL",
    "QueueMeta",
    "REASON_AGENT_IMAGE_MISSING",
    "REASON_PREVIOUS_POD",
    "RESERVED_PREFIX",
    "SERVED_VERSIONS",
    "Retry",
    "Rule",
    "TEMPLATE_CONTAINER_LISTS",
    "TERMINAL_PHASES",
    "TemplateMeta",
    "VERSION",
    "VigilJob",
    "VigilJobSpec",
    "VigilJobStatus",
    "VigilQueue",
    "VigilQueueSpec",
    "VigilQueueStatus",
    "VigilWorkerPool",
    "VigilWorkerPoolSpec",
    "VigilWorkerPoolStatus",
    "WireModel",
]
