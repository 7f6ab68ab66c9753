"""Upkeep of metav1.Condition lists, as upstream controllers do it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from vigil.api import MAX_CONDITION_MESSAGE, Condition, ConditionStatus

ELLIPSIS = "…"


def set_condition(
    conditions: Sequence[Condition],
    *,
    type: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    now: datetime,
    generation: int,
) -> list[Condition]:
    """`conditions` with the one of `type` set; others are kept in place.

    lastTransitionTime moves only when `status` changes, so it tells how long the condition has
    held; reason, message and observedGeneration are updated freely. A message over
    metav1.Condition's limit is cut (a longer one would make the whole status write fail
    validation) and ends in an ellipsis, so that a reader sees it was.
    """
    previous = next((c for c in conditions if c.type == type), None)
    transitioned = previous is None or previous.status != status
    updated = Condition(
        type=type,
        status=status,
        reason=reason,
        message=truncate_message(message),
        last_transition_time=now if previous is None or transitioned else previous.last_transition_time,
        observed_generation=generation,
    )
    if previous is None:
        return [*conditions, updated]
    return [updated if c.type == type else c for c in conditions]


def truncate_message(message: str) -> str:
    """`message`, cut to MAX_CONDITION_MESSAGE characters (the API server counts characters, as
    len() does) with a visible ellipsis if it was longer."""
    if len(message) <= MAX_CONDITION_MESSAGE:
        return message
    return message[: MAX_CONDITION_MESSAGE - len(ELLIPSIS)] + ELLIPSIS


def find_condition(conditions: Sequence[Condition], type: str) -> Condition | None:
    """The condition of `type`, if there is one."""
    return next((c for c in conditions if c.type == type), None)


def remove_condition(conditions: Sequence[Condition], type: str) -> list[Condition]:
    """`conditions` without the one of `type` (for a condition that no longer applies)."""
    return [c for c in conditions if c.type != type]
