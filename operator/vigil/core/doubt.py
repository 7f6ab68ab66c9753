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
        for create in decision.of_type(CreatePod):
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
    return None
