"""Orphans: pods held by Vigil's attempt-tracking finalizer whose job is gone. The finalizer
exists to keep a pod until its job's status holds how it ended; once the job is gone there is
nothing to write it into, and a finalizer left behind keeps the pod Terminating and its
namespace's deletion hanging (the Job controller strips its own tracking finalizer from orphans
the same way).

Pure: which pods are worth asking about (`candidates`, on what the operator has heard), whether
the API server's answer makes a pod an orphan (`orphaned`: only that answer, never the cache, may
release a pod), and when the periodic sweep runs next (`next_sweep_in`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from vigil import api
from vigil.core import fields
from vigil.core.fields import Pod
from vigil.core.podstate import is_tracked

# How often the operator lists Vigil's pods from the API server to find orphans its watches could
# not show it (a job deleted while no operator ran, a DELETED lost with a watch, a look cut short).
SWEEP_SECONDS = 300.0
SWEEP_JITTER = 0.2  # a share of the interval, so that replicas restarted together do not list together


def controller_of(pod: Pod) -> tuple[str, str] | None:
    """(name, uid) of the VigilJob the pod's controller reference names, if any."""
    for ref in fields.owner_references(pod):
        if ref.get("controller") and ref.get("kind") == api.KIND:
            return ref.get("name", ""), ref.get("uid", "")
    return None


def candidates(pods: Iterable[Pod], knows_job: Callable[[tuple[str, str]], bool]) -> list[Pod]:
    """The pods worth asking the API server about: those still carrying the finalizer whose
    controlling job (by namespace and UID) the operator does not know. A known job's pods are its looks'
    business, and a pod without the finalizer holds nothing."""
    found = []
    for pod in pods:
        if not is_tracked(pod):
            continue
        owner = controller_of(pod)
        if owner is None or not knows_job((fields.namespace(pod), owner[1])):
            found.append(pod)
    return found


def orphaned(pod: Pod, job: Mapping[str, Any] | None) -> bool:
    """Whether the pod is an orphan, given the API server's answer for the job its controller
    reference names (None: 404, or no such reference). A job of that name with another UID is a
    new job, not the pod's; a job being deleted still exists (its look releases its pods)."""
    owner = controller_of(pod)
    if owner is None or job is None:
        return True
    return fields.metadata(job).get("uid") != owner[1]


def next_sweep_in(interval: float, u: float) -> float:
    """Seconds to the next sweep, `u` uniform in [0, 1): the interval, lengthened by up to
    SWEEP_JITTER of it."""
    return interval * (1.0 + SWEEP_JITTER * u)
