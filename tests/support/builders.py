"""Builders of VigilJob and Pod objects as the API server returns them, and of what the decision
core makes of them, for the unit tests."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from vigil import api
from vigil.core.actions import Decision, PatchStatus, SetDeadLetterLabel
from vigil.core.manifest import attempt_pod_name

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
JOB_UID = "0b5c1d2e-job"
TEMPLATE = {"spec": {"containers": [{"name": "main", "image": "registry.example/ledger:1"}]}}


def at(seconds: float) -> datetime:
    """T0 plus `seconds`."""
    return T0 + timedelta(seconds=seconds)


def stamp(moment: datetime) -> str:
    """A time as the API server writes it (RFC 3339, whole seconds, UTC)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_job(
    *,
    name: str = "ledger",
    uid: str = JOB_UID,
    spec: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    generation: int = 1,
    resource_version: str = "100",
) -> dict[str, Any]:
    """A VigilJob body; `spec` entries are merged over a template-only spec."""
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {
            "name": name,
            "namespace": "work",
            "uid": uid,
            "generation": generation,
            "resourceVersion": resource_version,
            "creationTimestamp": "2025-03-01T11:59:00Z",
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        },
        "spec": {"template": copy.deepcopy(TEMPLATE), **(spec or {})},
        "status": copy.deepcopy(status) if status else {},
    }


def make_pod(
    attempt: int,
    *,
    job_name: str = "ledger",
    job_uid: str = JOB_UID,
    owner_uid: str | None = JOB_UID,
    uid: str | None = None,
    phase: str = "Pending",
    exit_code: int | None = None,
    container_reason: str | None = None,
    reason: str | None = None,
    conditions: list[dict[str, str]] | None = None,
    node: str | None = "node-a",
    deleting: bool = False,
    deleted_at: datetime | None = None,
    grace: int = 30,
    finished_at: datetime | None = None,
    tracked: bool = False,
    resource_version: str = "1",
    checkpoint: str | None = None,
    heartbeat: str | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod of `attempt` as the API server shows it; `exit_code` terminates its container.

    deleting / deleted_at: its deletion was requested (at T0 / at that time) with `grace` seconds
    of grace, so deletionTimestamp is that time plus `grace`, as the API server writes it.
    finished_at: when its terminated container ended (no finishedAt otherwise).
    tracked: it carries Vigil's attempt-tracking finalizer, as every pod Vigil creates does until
    Vigil releases it.
    """
    metadata: dict[str, Any] = {
        "name": attempt_pod_name(job_name, attempt),
        "namespace": "work",
        "uid": uid or f"pod-{attempt}",
        "resourceVersion": resource_version,
        "labels": {api.LABEL_JOB_UID: job_uid, api.LABEL_ATTEMPT: str(attempt)},
        "annotations": {
            **({api.ANNOTATION_CHECKPOINT: checkpoint} if checkpoint else {}),
            **({api.ANNOTATION_HEARTBEAT: heartbeat} if heartbeat is not None else {}),
            **(annotations or {}),
        },
    }
    if owner_uid is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": api.API_VERSION,
                "kind": api.KIND,
                "name": job_name,
                "uid": owner_uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    if tracked:
        metadata["finalizers"] = [api.FINALIZER_ATTEMPT_TRACKING]
    if deleting or deleted_at is not None:
        metadata["deletionTimestamp"] = stamp((deleted_at or T0) + timedelta(seconds=grace))
        metadata["deletionGracePeriodSeconds"] = grace
    status: dict[str, Any] = {"phase": phase, "conditions": list(conditions or [])}
    if reason:
        status["reason"] = reason
    if exit_code is not None:
        terminated = {"exitCode": exit_code, "reason": container_reason or ("Completed" if exit_code == 0 else "Error")}
        if finished_at is not None:
            terminated["finishedAt"] = stamp(finished_at)
        status["containerStatuses"] = [{"name": "main", "state": {"terminated": terminated}}]
    elif phase == "Running":
        status["containerStatuses"] = [{"name": "main", "state": {"running": {"startedAt": "2025-03-01T12:00:00Z"}}}]
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "registry.example/ledger:1"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": status}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, as the API server applies it."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def apply_to_job(job: dict[str, Any], decision: Decision) -> dict[str, Any]:
    """The job after the decision's status patch and label change, with a new resourceVersion."""
    job = copy.deepcopy(job)
    for patch in decision.of_type(PatchStatus):
        job["status"] = merge_patch(job.get("status") or {}, patch.status)
    for label in decision.of_type(SetDeadLetterLabel):
        for key, flag in ((api.LABEL_DEAD_LETTER, label.dead_lettered), (api.LABEL_DEAD_TASKS, label.dead_tasks)):
            if flag:
                job["metadata"]["labels"][key] = "true"
            elif flag is not None:
                job["metadata"]["labels"].pop(key, None)
    job["metadata"]["resourceVersion"] = str(int(job["metadata"]["resourceVersion"]) + 1)
    return job


def status_of(decision: Decision) -> dict[str, Any]:
    """The status written by the decision (its only PatchStatus)."""
    (patch,) = decision.of_type(PatchStatus)
    return patch.status


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)
