"""What every Kubernetes object Vigil keeps has in common: its key, the order of its versions,
and the parts of it that are dropped before it is kept."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vigil import api
from vigil.core import fields

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
_KEPT_JOB_LABELS = (api.LABEL_DEAD_LETTER, api.LABEL_DEAD_TASKS)
_KEPT_JOB_ANNOTATIONS = (api.ANNOTATION_REDRIVE, api.ANNOTATION_REDRIVE_TASKS)

# A job's pod template is kept in memory only while its JSON is estimated at most this long
# (`json_size`). Templates are typically 1-2 KiB, so the common job is kept whole; one of 900 KiB
# (the API server takes up to 1.5 MiB) costs 8-11 MiB as Python objects, for as long as
# the job waits. docs/capacity-planning.md ("A tenant's templates") has the figures.
TEMPLATE_KEPT_BYTES = 8 * 1024
# What stands in spec.template for a template that was not kept: the look that would create a pod
# from it reads the job from the API server first (`Kube.read_job(..., whole_template=True)`).
TEMPLATE_DROPPED = "vigil.dev/template-dropped"

# The estimate's figures, as JSON spells them: a string's quotes, a key's quotes and colon, a
# container's brackets, and a number, a boolean or null at the length of a short one.
_QUOTES, _KEY, _BRACKETS, _SCALAR = 2, 3, 2, 5


def json_size(value: Any, limit: int) -> int:
    """About len(json.dumps(value, separators=(",", ":"))), as decoded JSON holds it (dicts,
    lists, strings, numbers, booleans, None): strings count their characters (not their UTF-8
    bytes), numbers, booleans and null five each. It stops once past `limit` and returns what it
    has counted, more than `limit`; a container is counted (one character an element at least)
    before its elements are, so the walk costs at most what a value of `limit` characters costs,
    whatever `value` is (a template of 900 KiB as much as one of 8 KiB). No encoding, no copy:
    it runs on every job event (13 µs for a typical template of 1.5 KiB: docs/capacity-planning.md)."""
    size = 0
    stack = [value]
    pop, push, extend = stack.pop, stack.append, stack.extend
    while stack:
        item = pop()
        kind = type(item)
        if kind is dict:
            size += _BRACKETS + len(item)  # the commas, and one more
            if size > limit:
                return size
            for key, nested in item.items():
                if type(nested) is str:  # most of a template: names and values
                    size += len(key) + _KEY + len(nested) + _QUOTES
                else:
                    size += len(key) + _KEY
                    push(nested)
        elif kind is str:
            size += len(item) + _QUOTES
        elif kind is list:
            size += _BRACKETS + len(item)
            if size > limit:
                return size
            extend(item)
        elif isinstance(item, Mapping):  # not what a JSON decoder makes; counted all the same
            push(dict(item))
        else:
            size += _SCALAR
        if size > limit:
            return size
    return size


def template_dropped(job: Mapping[str, Any]) -> bool:
    """Whether the job's pod template was not kept (`strip_job`): read the job whole to use it."""
    template = fields.spec(job).get("template")
    return isinstance(template, Mapping) and TEMPLATE_DROPPED in template


def strip_job(job: dict[str, Any], *, whole_template: bool = False) -> dict[str, Any]:
    """What Vigil keeps of a VigilJob, in place: `strip`, of its labels and annotations only
    the ones Vigil reads, and its pod template only while the job may start a pod from it and
    the template is small (`TEMPLATE_KEPT_BYTES`); otherwise the template is replaced by a marker
    (`template_dropped`). Every job stays in the view until it is deleted (no TTL is set by
    default, as batch/v1 sets none), and a job may wait in its queue for as long as a tenant
    likes: kept whole, a large template (most of a job in memory) would let anyone who may create
    VigilJobs fill the operator's memory. A Succeeded job never starts another attempt (only a
    dead-lettered one can be redriven), so its template is never read again, whatever its size;
    a large one is read from the API server by the look that creates a pod from it. The watch's
    copies, the lists' and the writes' answers all pass here, so a list never holds large
    templates either. `whole_template`: keep the template as it is (the one read that needs it).
    docs/capacity-planning.md has the figures."""
    strip(job)
    metadata = job.get("metadata") or {}
    for field, kept in (("labels", _KEPT_JOB_LABELS), ("annotations", _KEPT_JOB_ANNOTATIONS)):
        values = metadata.get(field)
        if values:
            metadata[field] = {key: values[key] for key in kept if key in values}
    spec = job.get("spec")
    if whole_template or not isinstance(spec, dict):
        return job
    template = spec.get("template")
    if not template or TEMPLATE_DROPPED in template:
        return job
    succeeded = fields.phase(job) == "Succeeded"
    if succeeded or json_size(template, TEMPLATE_KEPT_BYTES) > TEMPLATE_KEPT_BYTES:
        spec["template"] = {TEMPLATE_DROPPED: True}
    return job


def kept_copy(job: dict[str, Any]) -> dict[str, Any]:
    """What the view keeps of a job read whole (`strip_job(..., whole_template=True)`): a copy
    that shares all of it but its spec, whose template is then dropped if `strip_job` drops it;
    `job` keeps its template."""
    return strip_job({**job, "spec": dict(job["spec"])} if isinstance(job.get("spec"), dict) else dict(job))
