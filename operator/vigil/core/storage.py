"""The storage-version migration's decisions, pure (`vigil migrate-storage` runs them:
`vigil.migration`).

After the CRDs of a release that stores a new version are applied, the objects written before
stay in etcd encoded as the old version until something writes them again; the CRD's
`status.storedVersions` lists every version that may still be there, and a later release may
drop the old version only once it lists the storage version alone. So every object is written
once, changing nothing (a merge patch carrying only its resourceVersion: the API server encodes
it at the storage version, and the fence refuses the write if the object changed since it was
read), then `status.storedVersions` is set to the storage version alone, fenced by the CRD's own
resourceVersion as it was read before the first object, so that a CRD changed meanwhile (its
storage version put back, say) is not declared migrated.

A conflict is retried on a fresh read: on an API server that had not yet taken the new CRD, the
other writer's write may itself have stored the old version, so only a write of the migration's
own proves the object rewritten.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_RATE = 20.0  # writes a second, all resources together: a background chore, not a burst
DEFAULT_PAGE = 100  # objects a list page (metadata only)
MAX_CONFLICTS = 10  # fresh reads of one object after conflicts before giving up on it
MAX_TRANSIENT = 8  # tries of one request that got no answer or 429/5xx before giving up
TRANSIENT_DELAY_SECONDS = 0.5  # the first wait after such an answer, doubling, at most
MAX_TRANSIENT_DELAY_SECONDS = 30.0
TRANSIENT_STATUSES = frozenset({0, 429, 500, 502, 503, 504})  # 0: no answer at all


class NotReady(ValueError):
    """The CRD does not store the version the migration writes: nothing was changed."""


@dataclass(frozen=True, slots=True)
class CrdState:
    """What the migration reads of a CRD."""

    name: str
    resource_version: str
    storage: str | None  # the version spec.versions marks `storage: true`
    served: tuple[str, ...]
    stored_versions: tuple[str, ...]  # status.storedVersions

    @classmethod
    def of(cls, crd: Mapping[str, Any]) -> CrdState:
        metadata = crd.get("metadata") or {}
        versions = (crd.get("spec") or {}).get("versions") or []
        storage = next((str(v.get("name")) for v in versions if v.get("storage")), None)
        return cls(
            name=str(metadata.get("name") or ""),
            resource_version=str(metadata.get("resourceVersion") or ""),
            storage=storage,
            served=tuple(str(v.get("name")) for v in versions if v.get("served")),
            stored_versions=tuple(str(v) for v in (crd.get("status") or {}).get("storedVersions") or ()),
        )


def check_ready(crd: CrdState, version: str) -> None:
    """NotReady, saying what to do, unless `crd` stores and serves `version`."""
    if crd.storage != version:
        raise NotReady(
            f"the CRD {crd.name} stores {crd.storage or 'no version'}, not {version}: apply this release's CRDs "
            "first (kubectl apply --server-side -f crds/), then migrate"
        )
    if version not in crd.served:
        raise NotReady(f"the CRD {crd.name} does not serve {version}: apply this release's CRDs first")


def migrated(crd: CrdState, version: str) -> bool:
    """Whether nothing of `crd` can be stored as another version than `version` any more."""
    return crd.stored_versions == (version,)


def rewrite_patch(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that writes `obj` again unchanged, refused (409) if it changed since it was
    read: its resourceVersion, and nothing else."""
    return {"metadata": {"resourceVersion": str((obj.get("metadata") or {}).get("resourceVersion") or "")}}


def stored_versions_patch(crd: CrdState, version: str) -> dict[str, Any]:
    """The merge patch of the CRD's status subresource that records `version` as the only one
    stored, fenced by the CRD's resourceVersion as read before the migration began."""
    return {"metadata": {"resourceVersion": crd.resource_version}, "status": {"storedVersions": [version]}}


class Next(enum.Enum):
    """What to do after a write or a read of one object answered with an error."""

    REREAD = "reread"  # 409: read the object afresh and write that version
    GONE = "gone"  # 404: deleted meanwhile; nothing left to migrate
    WAIT = "wait"  # no answer, 429 or 5xx: the same request again, after transient_delay
    FAIL = "fail"  # anything else (403: RBAC; 422), or tries used up: stop, storedVersions untouched


def after_error(status: int, conflicts: int, transient: int) -> Next:
    """The next step for an object whose request got `status` (0: no answer), after `conflicts`
    conflicts and `transient` transient failures so far (this one included)."""
    if status == 404:
        return Next.GONE
    if status == 409:
        return Next.REREAD if conflicts < MAX_CONFLICTS else Next.FAIL
    if status in TRANSIENT_STATUSES:
        return Next.WAIT if transient < MAX_TRANSIENT else Next.FAIL
    return Next.FAIL


def list_restarts(status: int) -> bool:
    """Whether a list page that failed with `status` is recovered by listing again from the start:
    410, its continue token expired (etcd compacted past the list's snapshot). Objects already
    rewritten are written again, which changes nothing."""
    return status == 410


def transient_delay(transient: int) -> float:
    """Seconds to wait before the `transient`-th try again (1 for the first retry)."""
    return min(MAX_TRANSIENT_DELAY_SECONDS, TRANSIENT_DELAY_SECONDS * 2 ** max(0, transient - 1))
