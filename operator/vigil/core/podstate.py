"""What an observed pod says about its attempt.

Observations may be stale, duplicated or out of order; these functions read one snapshot, and
`freshest_by_uid` picks, among snapshots of the same pod, the one furthest along in its life.

Stopped by deletion: a pod that was deleted while it ran gets SIGTERM from its kubelet, and a
process may well exit 0 on it (or any other code): the pod then ends Succeeded or Failed although
it did not finish its work, it was stopped. So a finished pod that is being deleted counts as
having ended on its own only if its containers prove it: a success if every container had exited
0, a failure if one had exited non-zero, before the deletion was requested. Otherwise it reads as
`Stopped` (with its exit code), never as Succeeded.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from vigil import api
from vigil.core import fields
from vigil.core.fields import Pod
from vigil.core.objects import version_of

# Stopped: finished after its deletion was requested (see the module docstring); Deleted: being
# deleted and not finished yet.
PodState = Literal["Pending", "Running", "Succeeded", "Failed", "Disrupted", "Stopped", "Deleted", "Unknown"]

# pod.status.reason values that mean "taken away", not "failed": API-initiated or kubelet
# eviction, scheduler preemption, graceful node shutdown (Terminated in current kubelets,
# Shutdown in older ones, NodeShutdown for pods refused while the node shuts down).
DISRUPTION_REASONS = frozenset({"Evicted", "Preempted", "Terminated", "Shutdown", "NodeShutdown"})

# The deletion request and a container's end are written by two machines' clocks (the API server
# sets deletionTimestamp, the node's runtime finishedAt), which may disagree by a few seconds: a
# container counts as finished before the deletion only if it finished this much earlier. A node
# clock running behind would otherwise make a pod stopped right after the request look finished
# before it; a real success this close to a deletion is merely retried.
CLOCK_SKEW_ALLOWANCE = timedelta(seconds=5)

# A pod's phase only moves forward; Unknown (node unreachable) ranks with Running.
_PHASE_RANK = {"Pending": 0, "Running": 1, "Unknown": 1, "Succeeded": 2, "Failed": 2}


@dataclass(frozen=True)
class PodReport:
    """One pod snapshot, read as an attempt's progress."""

    state: PodState
    exit_code: int | None = None
    reason: str | None = None
    node_name: str | None = None
    checkpoint: str | None = None


# What a terminated container's state tells the readings below (`_exit`, `_ended_before_deletion`).
_TERMINATED_KEYS = ("exitCode", "reason", "finishedAt")


# What Vigil reads of a pod's metadata (this module, `liveness`, the controller's change test,
# the finalizer release). Everything else a pod's author wrote (labels, annotations, owners,
# finalizers of their own) is dropped before the pod is kept, so a pod costs a bounded amount
# whatever it carries: on the bed, 100 pods with Vigil's label, 2,500 other labels and a 150 KB
# annotation each grew the operator by 52-56 MiB when they were kept whole.
_KEPT_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)
KEPT_LABELS = (
    api.LABEL_JOB_UID,
    api.LABEL_ATTEMPT,
    api.LABEL_TASK_INDEX,
)  # label values are at most 63 characters (the API's rule)
_OWNER_FIELDS = ("apiVersion", "kind", "name", "uid", "controller")
# Longest value kept of each annotation Vigil reads. The agent's beat is "<sequence>:<8 hex>";
# started-at an isoformat time; superseded a reason (only its presence is read); the checkpoint
# is refused over MAX_CHECKPOINT_BYTES anyway. An annotation may hold 256 KB, so a longer value
# is replaced by a stand-in of bounded size that keeps what the readings need (`_bounded`).
MAX_KEPT_ANNOTATION = {
    api.ANNOTATION_HEARTBEAT: 128,
    api.ANNOTATION_STARTED_AT: 64,
    api.ANNOTATION_SUPERSEDED: 256,
    api.ANNOTATION_CHECKPOINT: api.MAX_CHECKPOINT_BYTES,
}
MAX_KEPT_REASON = 256  # status reasons are the kubelet's words: a short CamelCase name
# An oversize checkpoint is kept as this mark, its size in bytes and its fingerprint: enough to
# refuse it with the same message as the whole value would give (`checkpoint_problem`).
_OVERSIZE_MARK = "\x00oversize:"


def owning_job(pod: Pod) -> tuple[str, str] | None:
    """(namespace, job UID) of the VigilJob the pod belongs to, or None if it belongs to none.

    A pod is a job's only when three things agree: its controller ownerReference is a VigilJob
    (kind VigilJob, apiVersion vigil.dev/*), that reference's UID is the value of its
    `vigil.dev/job-uid` label, and the job lives in the pod's namespace (an ownerReference never
    crosses namespaces, so the pod's own namespace is the job's). A pod anywhere else carrying a
    job's UID, in its label or its owner reference, is nobody's: a tenant cannot make its pods
    count for another namespace's job."""
    metadata = fields.metadata(pod)
    ref = _controller(metadata)
    if ref is None or ref.get("kind") != api.KIND:
        return None
    if not str(ref.get("apiVersion") or "").startswith(api.RESERVED_PREFIX):
        return None
    uid = ref.get("uid")
    if not isinstance(uid, str) or not uid or fields.labels(pod).get(api.LABEL_JOB_UID) != uid:
        return None
    return metadata.get("namespace") or "", uid


def belongs_to(pod: Pod, namespace: str, job_uid: str) -> bool:
    """Whether the pod is the pod of the job of that namespace and UID (`owning_job`)."""
    return owning_job(pod) == (namespace, job_uid)


def _controller(metadata: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return next((ref for ref in metadata.get("ownerReferences") or [] if ref.get("controller") is True), None)


def keep_job_pod(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The pod watch's transform, applied to each pod as it arrives (as client-go's
    SetTransform): a pod that belongs to no VigilJob (`owning_job`) is not kept at all (None);
    a job's pod is trimmed to what Vigil reads (`strip_pod`)."""
    return strip_pod(pod) if owning_job(pod) is not None else None


def strip_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """What Vigil keeps of a pod, in place: of the metadata, its identity, version, creation and
    deletion, Vigil's own labels and annotations (each value bounded), the controller reference
    and Vigil's finalizer; of the spec and status only what the readings of this module and the
    controller's change test read. Every pod of every job is kept (the watch, creations and
    direct reads all go through here), and the rest is most of a pod in memory: the spec
    (containers, volumes, tolerations), the status's bookkeeping (Ready and other conditions,
    IPs, images, container IDs, termination messages), and whatever labels and annotations the
    pod's author added (bench/README.md has what a kept pod weighs; docs/capacity-planning.md
    the memory per pod and per job). A new reading of a pod must find here what it reads: the
    property test `test_a_kept_pod_reads_as_the_whole_pod` fails otherwise.

    Kept: metadata.{name, namespace, uid, resourceVersion, creationTimestamp, deletionTimestamp,
    deletionGracePeriodSeconds}; the labels `vigil.dev/job-uid` and `vigil.dev/attempt`; the
    annotations heartbeat, checkpoint, superseded and started-at (`MAX_KEPT_ANNOTATION`); the
    controller ownerReference (apiVersion, kind, name, uid, controller); Vigil's finalizer;
    spec.nodeName; status.phase and status.reason; DisruptionTarget conditions (type, status);
    and of each container, init containers first as the kubelet lists them, only a terminated
    state's exit code, reason and finishedAt. Dropping the rest also spares a reconcile per
    change the decision cannot see, such as a node controller flipping a pod's Ready condition."""
    metadata = pod.get("metadata")
    if metadata is not None:
        pod["metadata"] = _kept_metadata(metadata)
    spec = pod.get("spec")
    if spec is not None:
        pod["spec"] = {"nodeName": spec["nodeName"]} if "nodeName" in spec else {}
    status = pod.get("status")
    if status is not None:
        pod["status"] = _kept_status(status)
    return pod


def _kept_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The same whatever else the pod carries: labels and annotations always (maybe empty), an
    owner and Vigil's finalizer only when there."""
    kept = {key: metadata[key] for key in _KEPT_METADATA if key in metadata}
    labels, annotations = metadata.get("labels") or {}, metadata.get("annotations") or {}
    kept["labels"] = {key: labels[key] for key in KEPT_LABELS if key in labels}
    kept["annotations"] = {
        key: _bounded(key, annotations[key]) for key in MAX_KEPT_ANNOTATION if isinstance(annotations.get(key), str)
    }
    ref = _controller(metadata)
    if ref is not None:
        kept["ownerReferences"] = [{key: ref[key] for key in _OWNER_FIELDS if key in ref}]
    if api.FINALIZER_ATTEMPT_TRACKING in (metadata.get("finalizers") or []):
        kept["finalizers"] = [api.FINALIZER_ATTEMPT_TRACKING]
    return kept


def _bounded(key: str, value: str) -> str:
    """The value of one of Vigil's annotations as kept: whole if short enough, else a stand-in
    of bounded size that reads as the whole value would. A heartbeat becomes its digest (a new
    value is still a new beat); a checkpoint its size and fingerprint (refused with the same
    message); started-at is no time at that length (dropped to "", read as absent); superseded
    is cut (only its presence is read)."""
    limit = MAX_KEPT_ANNOTATION[key]
    if len(value) <= limit and (key != api.ANNOTATION_CHECKPOINT or _size(value) <= limit):
        return value
    if key == api.ANNOTATION_HEARTBEAT:
        return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
    if key == api.ANNOTATION_CHECKPOINT:
        return f"{_OVERSIZE_MARK}{_size(value)}:{fingerprint(value)}"
    if key == api.ANNOTATION_STARTED_AT:
        return ""
    return value[:limit]


def _size(value: str) -> int:
    return len(value.encode("utf-8", "surrogatepass"))


def _kept_status(status: Mapping[str, Any]) -> dict[str, Any]:
    kept = {key: status[key] for key in ("phase", "reason") if key in status}
    if isinstance(kept.get("reason"), str):
        kept["reason"] = kept["reason"][:MAX_KEPT_REASON]
    disruptions = [
        {"type": c.get("type"), "status": c.get("status")}
        for c in status.get("conditions") or []
        if c.get("type") == "DisruptionTarget"
    ]
    if disruptions:
        kept["conditions"] = disruptions
    for key in ("initContainerStatuses", "containerStatuses"):
        ended = [
            {"state": {"terminated": _kept_terminated(terminated)}}
            for container in status.get(key) or []
            if (terminated := (container.get("state") or {}).get("terminated"))
        ]
        if ended:
            kept[key] = ended
    return kept


def _kept_terminated(terminated: Mapping[str, Any]) -> dict[str, Any]:
    kept = {key: terminated.get(key) for key in _TERMINATED_KEYS}
    if isinstance(kept["reason"], str):
        kept["reason"] = kept["reason"][:MAX_KEPT_REASON]
    return kept


def is_controlled_by(pod: Pod, owner_uid: str) -> bool:
    return any(ref.get("uid") == owner_uid and ref.get("controller") for ref in fields.owner_references(pod))


def owner_key(pod: Pod) -> tuple[str, str] | None:
    """(namespace, name) of the VigilJob controlling the pod: always the pod's own namespace."""
    for ref in fields.owner_references(pod):
        if ref.get("controller") and ref.get("kind") == api.KIND:
            return fields.namespace(pod), ref["name"]
    return None


def attempt_of(pod: Pod) -> int | None:
    """The attempt number in the pod's `vigil.dev/attempt` label, if it has a valid one."""
    value = fields.labels(pod).get(api.LABEL_ATTEMPT, "")
    return int(value) if value.isdigit() else None


def task_of(pod: Pod) -> int | None:
    """The task index in the pod's `vigil.dev/task-index` label (a task array's pod), if valid."""
    value = fields.labels(pod).get(api.LABEL_TASK_INDEX, "")
    return int(value) if value.isdigit() and len(value) <= 9 else None


def started_at(pod: Pod) -> datetime | None:
    """When its attempt started: as Vigil wrote it on the pod, else when the API server created
    the pod (whole seconds); None if the pod says neither."""
    written = _time(fields.annotations(pod).get(api.ANNOTATION_STARTED_AT))
    return written or _time(fields.creation_timestamp(pod))


def is_finished(pod: Pod) -> bool:
    return fields.phase(pod) in ("Succeeded", "Failed")


def is_deleting(pod: Pod) -> bool:
    return fields.deletion_timestamp(pod) is not None


def is_force_deleted(pod: Pod) -> bool:
    """Deleted with no grace period: the API server waits for no kubelet (a force delete, the
    pod garbage collector, or a pod never scheduled), so only finalizers keep the object."""
    return is_deleting(pod) and fields.metadata(pod).get("deletionGracePeriodSeconds") == 0


def is_tracked(pod: Pod) -> bool:
    """Whether the pod still carries Vigil's attempt-tracking finalizer."""
    return api.FINALIZER_ATTEMPT_TRACKING in fields.finalizers(pod)


def annotation_of(pod: Pod, key: str) -> str | None:
    return fields.annotations(pod).get(key)


def checkpoint_problem(value: str) -> str | None:
    """Why a `vigil.dev/checkpoint` value cannot be used, or None if it can: it must be JSON of at
    most MAX_CHECKPOINT_BYTES bytes (UTF-8). Never raises, whatever the pod wrote."""
    oversize = _oversize(value)
    size = oversize[0] if oversize is not None else _size(value)
    if size > api.MAX_CHECKPOINT_BYTES:
        return f"it is {size} bytes, over the limit of {api.MAX_CHECKPOINT_BYTES}"
    try:
        json.loads(value)
    except (ValueError, RecursionError) as err:  # deep nesting overflows the parser's stack
        return f"it is not JSON ({type(err).__name__}: {str(err)[:80]})"
    return None


def fingerprint(value: str) -> str:
    """A short, stable name for a value, to tell distinct bad checkpoints apart in messages (of
    an oversize checkpoint kept as its stand-in, the whole value's)."""
    oversize = _oversize(value)
    if oversize is not None:
        return oversize[1]
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def _oversize(value: str) -> tuple[int, str] | None:
    """(size, fingerprint) of the oversize checkpoint `value` stands for, if it is a stand-in."""
    if not value.startswith(_OVERSIZE_MARK):
        return None
    size, _, digest = value[len(_OVERSIZE_MARK) :].partition(":")
    return (int(size), digest) if size.isdigit() and digest else None


def freshest_by_uid(pods: Iterable[Pod]) -> list[Pod]:
    """One snapshot per pod UID: the one furthest along (phase, then deletion, then version)."""
    best: dict[str, Pod] = {}
    for pod in pods:
        uid = fields.uid(pod)
        if uid not in best or _progress(pod) > _progress(best[uid]):
            best[uid] = pod
    return list(best.values())


def _progress(pod: Pod) -> tuple[int, bool, bool, int]:
    return (
        _PHASE_RANK.get(fields.status(pod).get("phase", "Pending"), 0),
        _is_disrupted(pod),
        is_deleting(pod),
        version_of(pod) or 0,
    )


def read_pod(pod: Pod) -> PodReport:
    """What this snapshot says about the attempt. A success of its own wins over everything; a
    disruption wins over a failure (an evicted pod's containers fail too) and over a stop by
    deletion (an eviction is a deletion that says why)."""
    status = fields.status(pod)
    phase = status.get("phase", "Pending")
    node_name = pod.get("spec", {}).get("nodeName")
    checkpoint = annotation_of(pod, api.ANNOTATION_CHECKPOINT)
    exit_code, container_reason = _exit(status)
    stopped = is_deleting(pod) and is_finished(pod) and not _ended_before_deletion(pod)

    def report(state: PodState, reason: str | None) -> PodReport:
        return PodReport(state, exit_code, reason, node_name, checkpoint)

    if phase == "Succeeded" and not stopped:
        return report("Succeeded", container_reason or status.get("reason"))
    if _is_disrupted(pod):
        return report("Disrupted", status.get("reason") or "DisruptionTarget")
    if stopped:
        return report("Stopped", "PodDeleted")
    if phase == "Failed":
        return report("Failed", container_reason or status.get("reason"))
    if is_deleting(pod):
        return report("Deleted", "PodDeleted")
    if phase in ("Running", "Unknown"):
        return report(phase, None)
    return report("Pending", None)


def _is_disrupted(pod: Pod) -> bool:
    status = fields.status(pod)
    return status.get("reason") in DISRUPTION_REASONS or any(
        c.get("type") == "DisruptionTarget" and c.get("status") == "True" for c in status.get("conditions") or []
    )


def _ended_before_deletion(pod: Pod) -> bool:
    """Whether the finished, deleted pod's containers prove that it ended before its deletion was
    requested: all had exited 0 by then (a success), or one had exited non-zero (a failure).

    The request time is deletionTimestamp minus deletionGracePeriodSeconds, both as the API
    server wrote them at the first, graceful deletion. A later deletion that shortens the grace
    period moves deletionTimestamp to the time of that later call when the shortened deadline
    would lie in the past, and leaves a grace period of 1 (or 0): the kubelet's own final
    deletion (grace 0, after it has reported the terminal phase) always does so, as do force
    deletes. With a grace period of 0 or 1 the request time is therefore unknown (it may be
    earlier), and nothing is proven: the pod reads as stopped.
    """
    metadata, status = fields.metadata(pod), fields.status(pod)
    grace = metadata.get("deletionGracePeriodSeconds")
    deleted = _time(metadata.get("deletionTimestamp"))
    if not isinstance(grace, int) or grace <= 1 or deleted is None:
        return False
    try:
        requested = deleted - timedelta(seconds=grace)
    except OverflowError:  # whatever the pod says, reading it never raises
        return False
    failed = status.get("phase") == "Failed"
    deciding = [t for t in _terminated(status) if t.get("exitCode") != 0] if failed else _terminated(status)
    ends = [end for end in (_time(t.get("finishedAt")) for t in deciding) if end is not None]
    if not ends or len(ends) < len(deciding):
        return False
    # A failure is decided by the first container that failed; a success only by the last to end.
    decided = min(ends) if failed else max(ends)
    return decided < requested - CLOCK_SKEW_ALLOWANCE


def _time(value: Any) -> datetime | None:
    """An RFC 3339 time as Kubernetes writes it, or None if it is missing or not one."""
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def _exit(status: Mapping[str, Any]) -> tuple[int | None, str | None]:
    """Exit code and reason of the container that decided the pod's fate: the first one (init
    containers first) that exited non-zero, else the first that exited at all."""
    terminated = _terminated(status)
    failed = [t for t in terminated if t.get("exitCode") != 0]
    if not terminated:
        return None, None
    decisive = (failed or terminated)[0]
    return decisive.get("exitCode"), decisive.get("reason")


def _terminated(status: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The terminated states of the pod's containers, init containers first."""
    return [
        container["state"]["terminated"]
        for key in ("initContainerStatuses", "containerStatuses")
        for container in status.get(key) or []
        if (container.get("state") or {}).get("terminated")
    ]
