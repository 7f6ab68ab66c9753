"""The VigilQueue: what a queue admits and how fast it lets attempts start (spec), how it stands
(status), and the whole object as read from the API server."""

from __future__ import annotations

from pydantic import Field

from vigil.api.names import HEAD_OF_LINE_LIMIT
from vigil.api.wire import Condition, WireModel


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
    retry_window_seconds: int = Field(
        60,
        ge=10,
        le=3600,
        description="The retry budget's sliding window, in seconds: retries and starts are counted "
        "over the last this many. Shorter lets a budget spent in an outage come back sooner; longer "
        "weighs a storm's retries against more fresh starts. A change starts the window empty.",
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
        description="Saturated (maxRunning attempts run: jobs wait), Paused (spec.paused), "
        "RetryBudgetExhausted (due retries wait for the budget; none is dropped).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = Field(
        None, description="The metadata.generation of the spec this status was written for."
    )


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
