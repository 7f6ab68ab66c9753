"""The VigilWorkerPool: long-lived worker pods that pull the tasks of task arrays (docs/pull.md):
its spec (the workers' template, how many, how many tasks each runs, their heartbeat), its
status, and the whole object as read from the API server."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import Field, ValidationError, field_validator

from vigil.api.job import TemplateMeta
from vigil.api.names import INT32_MAX, MAX_POOL_REPLICAS, MAX_POOL_SLOTS
from vigil.api.wire import Condition, Rule, WireModel, nested_field

MAX_POOL_NAME = 63  # the pool's name is the value of its pods' vigil.dev/pool label
MAX_HEARTBEAT_INTERVAL = 300
MAX_HEARTBEAT_TIMEOUT = 3600
MAX_SCALE_DOWN_DELAY = 24 * 3600


class PoolHeartbeat(WireModel):
    """How often a worker speaks to the leader, and how long its silence may last."""

    interval_seconds: int = Field(
        5,
        ge=1,
        le=MAX_HEARTBEAT_INTERVAL,
        description=f"How often a worker sends its request (its beat) to the leader: 1 to {MAX_HEARTBEAT_INTERVAL}.",
    )
    timeout_seconds: int = Field(
        30,
        ge=2,
        le=MAX_HEARTBEAT_TIMEOUT,
        description="Silence after which a worker's tasks are Lost (and retried elsewhere), and after which a "
        "worker that has had no answer stops its tasks; at least twice intervalSeconds.",
    )

    cel_rules = (
        Rule(
            "self.timeoutSeconds >= 2 * self.intervalSeconds",
            "heartbeat.timeoutSeconds must be at least twice heartbeat.intervalSeconds, "
            "or a worker would look lost after one late beat",
            lambda h: h.timeout_seconds >= 2 * h.interval_seconds,
        ),
    )


class VigilWorkerPoolSpec(WireModel):
    """The workers: their template, how many, and how many tasks each runs at once."""

    template: dict[str, Any] = Field(
        description="A PodTemplateSpec for every worker, whose entrypoint is `vigil-worker -- CMD...`; kept as "
        "given but for Vigil's name, label (vigil.dev/pool), owner reference and VIGIL_* environment and token "
        "volume. Immutable: create a new VigilWorkerPool to change it. Its labels, annotations and finalizers "
        "must not use the vigil.dev/ prefix, which is Vigil's.",
        json_schema_extra={
            # vigil.api.crd puts Kubernetes' PodTemplateSpec schema here (vigil.api.template_schema), with
            # TemplateMeta's rules on its metadata.
            "x-vigil-schema": "PodTemplateSpec",
            "x-kubernetes-validations": [
                {
                    "rule": "self == oldSelf",
                    "message": "spec.template is immutable: create a new VigilWorkerPool instead",
                }
            ],
        },
    )
    min_replicas: int = Field(
        1, ge=0, le=MAX_POOL_REPLICAS, description="The fewest workers the pool keeps, whatever its backlog."
    )
    max_replicas: int = Field(
        10,
        ge=1,
        le=MAX_POOL_REPLICAS,
        description=f"The most workers the pool keeps, whatever its backlog (1 to {MAX_POOL_REPLICAS}).",
    )
    replicas: int | None = Field(
        None,
        ge=0,
        le=INT32_MAX,
        description="Set (by `kubectl scale`, an HPA or KEDA, through the /scale subresource): the pool runs this "
        "many workers, clamped to [minReplicas, maxReplicas], and Vigil does not autoscale. Unset: Vigil scales "
        "by backlog, ceil((tasks waiting + tasks running) / slotsPerWorker) within the bounds.",
    )
    slots_per_worker: int = Field(
        1,
        ge=1,
        le=MAX_POOL_SLOTS,
        description=f"Tasks one worker runs at once (1 to {MAX_POOL_SLOTS}); its VIGIL_POOL_SLOTS.",
    )
    heartbeat: PoolHeartbeat = nested_field(PoolHeartbeat, "How often workers beat, and when silence is Lost.")
    scale_down_delay_seconds: int = Field(
        60,
        ge=0,
        le=MAX_SCALE_DOWN_DELAY,
        description="How long the backlog must keep allowing fewer workers before an idle one is removed "
        "(autoscaling only; more workers are added at once).",
    )

    cel_rules = (
        Rule(
            "self.minReplicas <= self.maxReplicas",
            "spec.minReplicas must not be greater than spec.maxReplicas",
            lambda spec: spec.min_replicas <= spec.max_replicas,
            explain=lambda spec: (
                f"spec.minReplicas ({spec.min_replicas}) must not be greater than "
                f"spec.maxReplicas ({spec.max_replicas})"
            ),
        ),
    )

    @field_validator("template")
    @classmethod
    def _check_template_metadata(cls, template: dict[str, Any]) -> dict[str, Any]:
        try:
            TemplateMeta.model_validate(template.get("metadata") or {})
        except ValidationError as err:  # said with the full path, as the API server says it
            raise ValueError("; ".join(_template_meta_error(e) for e in err.errors())) from None
        return template

    def target(self) -> int | None:
        """spec.replicas clamped to [minReplicas, maxReplicas], or None when unset (autoscaled)."""
        if self.replicas is None:
            return None
        return min(max(self.replicas, self.min_replicas), self.max_replicas)


def _template_meta_error(error: Any) -> str:
    if error["type"] == "value_error":  # a rule's own message, which names its field
        return str(error["ctx"]["error"])
    return ".".join(["spec.template.metadata", *map(str, error["loc"])]) + f": {error['msg']}"


class VigilWorkerPoolStatus(WireModel):
    """How the pool stands, written by Vigil when it changed."""

    replicas: int = Field(0, description="Worker pods that exist and are not being deleted (the /scale status).")
    ready_replicas: int = Field(0, description="Worker pods that are Ready.")
    desired_replicas: int = Field(0, description="The workers the pool wants now.")
    slots: int = Field(0, description="Tasks the ready workers can run at once: readyReplicas x slotsPerWorker.")
    slots_used: int = Field(0, description="Tasks the pool's workers run now (leased).")
    backlog: int = Field(0, description="Tasks waiting for a worker of the pool.")
    selector: str | None = Field(
        None, description="The label selector of the pool's pods, for the /scale subresource (HPA, KEDA)."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready (as many workers Ready as desired), AtMaximum (the backlog, or spec.replicas, asks for "
        "more than maxReplicas).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = Field(
        None, description="The metadata.generation of the spec this status was written for."
    )
    last_scale_time: datetime | None = Field(None, description="When desiredReplicas last changed.")


class PoolMeta(WireModel):
    name: str = Field(max_length=MAX_POOL_NAME)
    namespace: str
    uid: str
    generation: int = 1
    resource_version: str | None = None
    deletion_timestamp: datetime | None = None


class VigilWorkerPool(WireModel):
    """A VigilWorkerPool as read from the API server (not used for the CRD schema)."""

    metadata: PoolMeta
    spec: VigilWorkerPoolSpec
    status: VigilWorkerPoolStatus = Field(default_factory=VigilWorkerPoolStatus)
