"""What every Kubernetes object Vigil keeps has in common: its key, the order of its versions,
and the parts of it that are dropped before it is kept."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vigil import api

Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects

# Client-side `kubectl apply` (the default, and Argo CD's) copies the whole manifest into this
# annotation: for a VigilJob, a second copy of its template that Vigil never reads.
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def key_of(obj: Mapping[str, Any]) -> Key:
    metadata = obj["metadata"]
    return metadata.get("namespace", ""), metadata["name"]


def version_number(resource_version: str | None) -> int | None:
    """A resourceVersion as a number, or None. resourceVersions are opaque by contract, but
    every API server backed by etcd makes them increasing integers; where one is not, versions
    cannot be ordered and the newcomer is taken (`is_older_version` is then False)."""
    text = resource_version or ""
    return int(text) if text.isdigit() else None


def version_of(obj: Mapping[str, Any]) -> int | None:
    """The object's resourceVersion as a number, or None (see `version_number`)."""
    return version_number(obj["metadata"].get("resourceVersion"))


def is_older_version(candidate: str | None, current: str | None) -> bool:
    """Whether resourceVersion `candidate` is older than `current`; False if either is not a number."""
    new, old = version_number(candidate), version_number(current)
    return new is not None and old is not None and new < old


def is_older(candidate: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """Whether `candidate` is an older version of the same object (same UID) than `current`."""
    if candidate["metadata"].get("uid") != current["metadata"].get("uid"):
        return False
    return is_older_version(candidate["metadata"].get("resourceVersion"), current["metadata"].get("resourceVersion"))


def strip(obj: dict[str, Any]) -> dict[str, Any]:
    """Drops what Vigil never reads and what makes objects large, in place: managedFields and
    kubectl's last-applied copy. Every object Vigil keeps goes through here: a VigilJob's
    managedFields are half of it in memory. What is dropped is never written back: Vigil's
    writes are patches of named fields, and a pod is built from the job's spec.template."""
    metadata = obj.get("metadata", {})
    metadata.pop("managedFields", None)
    annotations = metadata.get("annotations")
    if annotations and LAST_APPLIED in annotations:
        del annotations[LAST_APPLIED]
    return obj


# The only names a job's own labels and annotations carry that Vigil reads (the dead-letter mark
# it sets, the redrive a person sets). The rest is the job's author's, for their own tools.
_KEPT_JOB_LABELS = (api.LABEL_DEAD_LETTER,)
_KEPT_JOB_ANNOTATIONS = (api.ANNOTATION_REDRIVE,)


def strip_job(job: dict[str, Any]) -> dict[str, Any]:
    """What Vigil keeps of a VigilJob, in place: `strip`, of its labels and annotations only
    the ones Vigil reads, and of a Succeeded job not its pod template. Every job stays in the
    view until it is deleted (no TTL is set by default, as batch/v1 sets none); a Succeeded job
    never starts another attempt (only a dead-lettered one can be redriven), so its template,
    most of a job in memory, is never read again; a job that has not succeeded is kept whole,
    since any later look may start a pod from it. docs/capacity-planning.md has the figures."""
    strip(job)
    metadata = job.get("metadata") or {}
    for field, kept in (("labels", _KEPT_JOB_LABELS), ("annotations", _KEPT_JOB_ANNOTATIONS)):
        values = metadata.get(field)
        if values:
            metadata[field] = {key: values[key] for key in kept if key in values}
    spec = job.get("spec")
    if (job.get("status") or {}).get("phase") == "Succeeded" and isinstance(spec, dict) and spec.get("template"):
        spec["template"] = {}
    return job
