"""A VigilQueue's status, read from the queue book."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from vigil.api import Condition
from vigil.core import fields
from vigil.core.conditions import set_condition
from vigil.core.queueing.book import QueueBook, QueueKey, Standing


@dataclass(frozen=True)
class QueueCondition:
    type: str  # Saturated | Paused | RetryBudgetExhausted
    status: str  # "True" | "False"
    reason: str
    message: str


@dataclass(frozen=True)
class QueueStatus:
    """A VigilQueue's status numbers and conditions. Equal values mean nothing to write."""

    queued: int
    running: int
    backing_off: int
    dead_lettered: int
    oldest_queued_seconds: int  # whole seconds (0: none waits), so it changes at most once a second
    head_of_line: tuple[str, ...]
    conditions: tuple[QueueCondition, ...]

    def numbers(self) -> dict[str, Any]:
        """The status fields on the wire (camelCase), conditions aside (the shell merges those
        with conditions.set_condition, which keeps lastTransitionTime)."""
        return {
            "queued": self.queued,
            "running": self.running,
            "backingOff": self.backing_off,
            "deadLettered": self.dead_lettered,
            "oldestQueuedSeconds": self.oldest_queued_seconds,
            "headOfLine": list(self.head_of_line),
        }


def queue_status(book: QueueBook, queue_key: QueueKey, now: float) -> QueueStatus | None:
    """The status of an existing queue from the book, O(log n); None if no VigilQueue exists."""
    spec = book.spec(queue_key)
    if spec is None:
        return None
    queued, running = book.count(queue_key, Standing.QUEUED), book.count(queue_key, Standing.RUNNING)
    since = book.oldest_waiting_since(queue_key)
    oldest = max(0, math.floor(now - since)) if since is not None else 0
    if running >= spec.max_running:
        saturated = QueueCondition(
            "Saturated", "True", "AtMaxRunning", f"{running} attempts run, maxRunning is {spec.max_running}"
        )
    else:
        saturated = QueueCondition(
            "Saturated", "False", "BelowMaxRunning", f"{running} of maxRunning {spec.max_running} attempts run"
        )
    if spec.paused:
        paused = QueueCondition("Paused", "True", "Paused", f"spec.paused is true: no attempt starts; {running} run on")
    else:
        paused = QueueCondition("Paused", "False", "NotPaused", "attempts start as room allows")
    starts, retries = book.window_counts(queue_key, now)
    window = spec.retry_window_seconds
    within = f"{retries} of the {starts} attempt starts in the last {window}s were retries"
    rule = f"retryBudget {spec.retry_budget}, floor {spec.retry_floor} per {window}s"
    if book.budget_exhausted(queue_key, now):
        budget = QueueCondition(
            "RetryBudgetExhausted", "True", "RetriesDelayed", f"{within} ({rule}): due retries wait, none is dropped"
        )
    else:
        budget = QueueCondition("RetryBudgetExhausted", "False", "WithinBudget", f"{within} ({rule})")
    return QueueStatus(
        queued=queued,
        running=running,
        backing_off=book.count(queue_key, Standing.BACKING_OFF),
        dead_lettered=book.count(queue_key, Standing.DEAD_LETTERED),
        oldest_queued_seconds=oldest,
        head_of_line=tuple(book.head_of_line(queue_key)),
        conditions=(saturated, paused, budget),
    )


def status_patch(body: Mapping[str, Any], status: QueueStatus, now: datetime) -> dict[str, Any]:
    """The merge patch of a VigilQueue's status that shows `status`, its conditions kept in place
    and their lastTransitionTime moved only when they change (`core.conditions`)."""
    generation = int(fields.metadata(body).get("generation") or 1)
    conditions = [Condition.model_validate(c) for c in fields.status(body).get("conditions") or []]
    for condition in status.conditions:
        conditions = set_condition(
            conditions,
            type=condition.type,
            status=condition.status,  # type: ignore[arg-type]
            reason=condition.reason,
            message=condition.message,
            now=now,
            generation=generation,
        )
    return {
        **status.numbers(),
        "conditions": [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in conditions],
        "observedGeneration": generation,
    }


def same_status(patch: Mapping[str, Any] | None, other: Mapping[str, Any] | None) -> bool:
    """Whether two status patches say the same, transition times aside (nothing to write)."""
    return _without_times(patch) == _without_times(other)


def _without_times(patch: Mapping[str, Any] | None) -> Any:
    if patch is None:
        return None
    return {
        **patch,
        "conditions": [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in patch["conditions"]],
    }
