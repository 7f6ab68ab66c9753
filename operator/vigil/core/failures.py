"""What the shell does when reconciling a job fails: how long it waits before the next try, and
what it says on the job, so that a job never looks idle while Vigil cannot move it on.

Any failure (an exception in the core, a write the API server refuses, an API server that does
not answer) sets the condition ReconcileError=True on the job, with the cause as its reason and
the message saying what failed; a Warning event is posted once per distinct cause, not on every
retry. The condition is removed by the first reconcile that goes through. Retries back off
exponentially with jitter (`core.backoff.reconcile_retry_delay`), so a job that cannot be
written, or a refusal that repeats, costs a bounded number of calls however long it lasts. Pure:
the shell passes the time.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from vigil.api import Condition
from vigil.core import fields
from vigil.core.conditions import find_condition, remove_condition, set_condition

CONDITION = "ReconcileError"


def _conditions(job: Mapping[str, Any]) -> list[Condition]:
    return [Condition.model_validate(c) for c in fields.status(job).get("conditions") or []]


def _wire(conditions: list[Condition]) -> list[dict[str, Any]]:
    return [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in conditions]


def report(job: Mapping[str, Any], reason: str, message: str, now: datetime) -> tuple[dict | None, bool]:
    """The status patch that shows the failure (None when the job already shows exactly this),
    and whether it is a new cause that deserves an event."""
    conditions = _conditions(job)
    previous = find_condition(conditions, CONDITION)
    if previous is not None and previous.status == "True" and (previous.reason, previous.message) == (reason, message):
        return None, False
    generation = int((job.get("metadata") or {}).get("generation") or 1)
    updated = set_condition(
        conditions, type=CONDITION, status="True", reason=reason, message=message, now=now, generation=generation
    )
    new_cause = previous is None or previous.reason != reason or previous.message != message
    return {"conditions": _wire(updated)}, new_cause


def cleared(job: Mapping[str, Any]) -> dict | None:
    """The status patch that removes the failure once reconciling works again; None if none shows."""
    conditions = _conditions(job)
    if find_condition(conditions, CONDITION) is None:
        return None
    return {"conditions": _wire(remove_condition(conditions, CONDITION))}
