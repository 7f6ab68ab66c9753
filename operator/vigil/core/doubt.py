"""Which decisions rest on the watch cache in a way that must be checked with the API server
before they run.

The cache is a rumour about the cluster: it may miss a pod that exists, keep one that is gone,
or miss heartbeats while its connection is stalled. Most decisions are harmless to take on a
rumour, since the fence that leads them (a status write, or a read of the job) fails on a stale
job and everything is idempotent. These are not, because they cannot be undone:

- declaring an attempt Lost (its pod is then marked superseded and deleted, and its agent
  stops a child that may be working fine): the cache may have missed its heartbeats, or a pod
  that "vanished" may only be missing from the cache;
- deleting a pod;
- starting an attempt under NoOverlap, which is safe only if no earlier pod still runs.

For these the shell lists the job's pods directly (a consistent read; the current attempt's
pod, if the list lacks it, is read by name as well, since the API server answers lists from its
own watch cache) and decides again on what the API server says; only that second decision runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vigil import api
from vigil.core import fields
from vigil.core.actions import CreatePod, Decision, DeletePod, PatchStatus


def doubt(job: Mapping[str, Any], decision: Decision) -> str | None:
    """Why `decision` must be checked against the API server first, for a log line; None if it
    may run on what the cache says."""
    for action in decision.actions:
        if isinstance(action, DeletePod):
            return f"it deletes pod {action.name}"
    lost = _newly_lost(job, decision)
    if lost:
        return f"it declares attempt {lost} lost"
    if fields.spec(job).get("guarantee") == "NoOverlap":
        array = bool(fields.spec(job).get("tasks"))
        for create in decision.of_type(CreatePod):
            # A task's first attempt has no earlier pod to overlap: only its later ones are checked,
            # or every start of an array would list all its pods.
            if array and fields.labels(create.manifest).get(api.LABEL_ATTEMPT) == "1":
                continue
            return f"it starts pod {fields.name(create.manifest)} under NoOverlap"
    return None


def _newly_lost(job: Mapping[str, Any], decision: Decision) -> int | None:
    writes = decision.of_type(PatchStatus)
    if not writes:
        return None
    before = {record.get("number") for record in fields.status(job).get("history") or []}
    for record in writes[0].status.get("history") or []:
        if record.get("outcome") == "Lost" and record.get("number") not in before:
            return record.get("number")
    # A task array: each task's last finished attempt, and the last of those dead-lettered.
    lost_before = _lost_tasks(fields.status(job).get("tasks"))
    newly = sorted(_lost_tasks(writes[0].status.get("tasks")) - lost_before)
    return newly[0][1] if newly else None


def _lost_tasks(tasks: Mapping[str, Any] | None) -> set[tuple[int, int]]:
    """(index, attempt) of the tasks whose last finished attempt was Lost."""
    if not tasks:
        return set()
    lost: set[tuple[int, int]] = set()
    for task in tasks.get("active") or []:
        last = task.get("last") or {}
        if last.get("outcome") == "Lost":
            lost.add((int(task.get("index", -1)), int(last.get("number", 0))))
    for failure in tasks.get("failed") or []:
        if failure.get("outcome") == "Lost":
            lost.add((int(failure.get("index", -1)), int(failure.get("attempts", 0))))
    return lost
