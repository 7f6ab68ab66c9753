"""A VigilJob's conditions: the five that follow its phase (Succeeded, DeadLettered, Running, and
kstatus' Reconciling and Stalled), HeartbeatHealthy and CheckpointAccepted, brought up to date in
one pass as a decision ends (`vigil.core.draft.Draft.decision`). The upkeep of a condition list
itself is `vigil.core.conditions`'."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Literal

from vigil.api import Condition, ConditionStatus, VigilJobStatus
from vigil.core.conditions import find_condition, remove_condition, set_condition

CONDITION_HEARTBEAT = "HeartbeatHealthy"
# Present once a checkpoint was refused; its message is the memory that makes the warning event
# about a bad checkpoint fire once per distinct value, not on every look.
CONDITION_CHECKPOINT = "CheckpointAccepted"
_KEPT_CONDITIONS = (CONDITION_HEARTBEAT, CONDITION_CHECKPOINT)  # kept between decisions as they are


def job_conditions(
    status: VigilJobStatus,
    asked: Mapping[str, tuple[ConditionStatus, str, str]],
    *,
    heartbeat_required: bool,
    now: datetime,
    generation: int,
) -> list[Condition] | None:
    """`status.conditions` brought up to date with `status`'s phase and with `asked` (type ->
    (status, reason, message), what the decision's steps set), observedGeneration `generation`;
    None for a status without phase, written by someone else: nothing to say yet."""
    if status.phase is None:
        return None
    reason, message = status.reason or status.phase, status.message or ""
    succeeded: ConditionStatus = (
        "True" if status.phase == "Succeeded" else "False" if status.phase == "DeadLettered" else "Unknown"
    )
    # The five conditions that follow the phase, then those steps asked for, in one pass.
    wanted: dict[str, tuple[ConditionStatus, str, str]] = {
        "Succeeded": (succeeded, reason, message),
        "DeadLettered": (_bool(status.phase == "DeadLettered"), reason, message),
        "Running": (_bool(status.phase == "Running"), reason, message),
        # kstatus (Flux, kubectl wait, cli-utils) reads these two: InProgress while Reconciling,
        # Failed while Stalled, Current when neither is True (observedGeneration caught up).
        # A suspended job is where its spec asks it to be: not reconciling.
        "Reconciling": (_bool(status.phase not in ("Succeeded", "DeadLettered", "Suspended")), reason, message),
        "Stalled": (_bool(status.phase == "DeadLettered"), reason, message),
    }
    asked = dict(asked)
    conditions = list(status.conditions)
    if not heartbeat_required:  # liveness is the pod phase alone: nothing to say
        conditions = remove_condition(conditions, CONDITION_HEARTBEAT)
        asked.pop(CONDITION_HEARTBEAT, None)
    elif CONDITION_HEARTBEAT not in asked and not find_condition(conditions, CONDITION_HEARTBEAT):
        asked[CONDITION_HEARTBEAT] = ("Unknown", "NoAttemptRunning", "no attempt has run yet")
    for type_ in _KEPT_CONDITIONS:  # the rest keep their values, with observedGeneration moved on
        kept = find_condition(conditions, type_)
        if kept is not None and type_ not in asked:
            asked[type_] = (kept.status, kept.reason, kept.message)
    wanted.update(asked)
    for type_, (value, reason_, message_) in wanted.items():
        conditions = set_condition(
            conditions,
            type=type_,
            status=value,
            reason=reason_,
            message=message_,
            now=now,
            generation=generation,
        )
    return conditions


def _bool(value: bool) -> Literal["True", "False"]:
    return "True" if value else "False"
