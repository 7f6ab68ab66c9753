"""One accessor per field of a Kubernetes object, and the one name for each kind of object.

Objects stay what the JSON decoder made them, plain dicts (read as `Mapping`s): no copy, no
validation, a function call per field. Each accessor reads its field exactly as the expressions it
replaced did, so there are two kinds:

- required fields, which every object the API server returns carries: `metadata`, `name`,
  `namespace`, `uid`, `resource_version` subscript, and raise KeyError on an object without them
  (as `obj["metadata"]["uid"]` did);
- optional fields, whose absence is a value: `spec` and `status` are `{}` when missing or null
  (as `obj.get("status") or {}` was), `labels` and `annotations` `{}`, `owner_references` and
  `finalizers` `[]`, `phase` and the timestamps None. The ones under metadata still need the
  metadata itself (`obj["metadata"].get("labels") or {}`).

A read with other semantics (a default only when the key is missing, `.get("phase", "Pending")`;
metadata that may itself be missing, `.get("metadata") or {}`) is spelled out where it is made,
on top of these: `status(pod).get("phase", "Pending")`.

An empty part is a new `{}` (or `[]`) each call, as `or {}` made: writing into it writes nothing
into the object, so the accessors are for reading. Import the module, not its names (`fields.uid(pod)`):
`status`, `spec`, `name` are every caller's local names too.
"""

from collections.abc import Mapping, Sequence
from typing import Any

Obj = Mapping[str, Any]  # any Kubernetes object, as decoded JSON
Pod = Obj  # a core/v1 Pod
Job = Obj  # a VigilJob


def metadata(obj: Obj) -> Mapping[str, Any]:
    """metadata; KeyError if the object has none."""
    return obj["metadata"]


def name(obj: Obj) -> str:
    """metadata.name; KeyError if missing."""
    return obj["metadata"]["name"]


def namespace(obj: Obj) -> str:
    """metadata.namespace; KeyError if missing (a cluster-scoped object has none: `objects.key_of`
    reads it as "")."""
    return obj["metadata"]["namespace"]


def uid(obj: Obj) -> str:
    """metadata.uid; KeyError if missing."""
    return obj["metadata"]["uid"]


def resource_version(obj: Obj) -> str:
    """metadata.resourceVersion; KeyError if missing."""
    return obj["metadata"]["resourceVersion"]


def labels(obj: Obj) -> Mapping[str, str]:
    """metadata.labels; {} if missing or null."""
    return obj["metadata"].get("labels") or {}


def annotations(obj: Obj) -> Mapping[str, str]:
    """metadata.annotations; {} if missing or null."""
    return obj["metadata"].get("annotations") or {}


def owner_references(obj: Obj) -> Sequence[Mapping[str, Any]]:
    """metadata.ownerReferences; [] if missing or null."""
    return obj["metadata"].get("ownerReferences") or []


def finalizers(obj: Obj) -> Sequence[str]:
    """metadata.finalizers; [] if missing or null."""
    return obj["metadata"].get("finalizers") or []


def creation_timestamp(obj: Obj) -> str | None:
    """metadata.creationTimestamp, as the API server wrote it; None if missing."""
    return obj["metadata"].get("creationTimestamp")


def deletion_timestamp(obj: Obj) -> str | None:
    """metadata.deletionTimestamp, as the API server wrote it; None if missing (not being deleted)."""
    return obj["metadata"].get("deletionTimestamp")


def spec(obj: Obj) -> Mapping[str, Any]:
    """spec; {} if missing or null."""
    return obj.get("spec") or {}


def status(obj: Obj) -> Mapping[str, Any]:
    """status; {} if missing or null (a new object has none)."""
    return obj.get("status") or {}


def phase(obj: Obj) -> str | None:
    """status.phase; None if it or the status is missing."""
    return (obj.get("status") or {}).get("phase")
