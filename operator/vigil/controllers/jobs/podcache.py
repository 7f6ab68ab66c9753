"""The operator's memory of Vigil's pods, filed by job: (namespace, job UID).

It holds the newest snapshot of every pod that belongs to a VigilJob (`podstate.owning_job`:
its controller reference is a VigilJob whose UID its `vigil.dev/job-uid` label repeats, in the
pod's own namespace), from three sources:
the pod watch (the usual one), the pods this operator created (written through at once, since
the watch may show them late, and a decision must never miss a pod that exists: NoOverlap
counts on it), and direct reads of the API server (the source of truth, asked before anything
destructive). A snapshot older than the one held for the same pod is ignored, whatever its
source, so a late watch event never undoes a direct read.

A created pod the watch has not shown yet is kept until the watch shows it or a direct read
says it is gone: never forgotten on a timer. `unseen()` lists them with their age so the shell
can ask about those the watch is slow to show.

A pod that belongs to no job is never filed (`put` refuses it), and a pod is filed under its
own namespace, so a pod in another namespace carrying a job's UID can never be among that
job's pods: the namespace is part of the key, not a check a caller may forget.

Size: one dict per pod of a job, as `podstate.strip_pod` leaves it (its identity, Vigil's own
labels and annotations, bounded; of the spec only nodeName; of the status only what `podstate`
reads): docs/capacity-planning.md has the figures. A task array's pod that is settled (finished
and released: its task's status holds its outcome, and it can say nothing more) is held as its
UID and resourceVersion alone, so that an array of 100,000 tasks does not keep 100,000 pods:
no decision reads such a pod, and the version still keeps a late event of it from coming back.
"""

from __future__ import annotations

from collections.abc import Iterable

from vigil.core import fields, podstate
from vigil.core.fields import Pod
from vigil.core.objects import is_older, version_number
from vigil.core.podstate import owning_job

JobRef = tuple[str, str]  # (namespace, job UID)


class PodCache:
    """Vigil's pods by job (namespace, job UID), then pod UID; plus when each created-but-unseen
    pod was made."""

    def __init__(self) -> None:
        self._by_job: dict[JobRef, dict[str, Pod]] = {}
        self._unseen: dict[str, float] = {}  # pod UID -> monotonic time this operator created it
        self._job_of: dict[str, JobRef] = {}  # pod UID -> its job: a heartbeat names the pod alone
        self._settled: dict[JobRef, dict[str, int]] = {}  # settled task pods: UID -> resourceVersion

    def __len__(self) -> int:
        return sum(len(pods) for pods in self._by_job.values()) + self.settled_count()

    def settled_count(self) -> int:
        return sum(len(uids) for uids in self._settled.values())

    def is_settled(self, job: JobRef, uid: str) -> bool:
        """Whether the pod of that UID is a settled task pod (held as its version alone)."""
        return uid in self._settled.get(job, ())

    def of_job(self, job: JobRef) -> list[Pod]:
        return list(self._by_job.get(job, {}).values())

    def jobs(self) -> list[JobRef]:
        return list(self._by_job)

    def get(self, job: JobRef, uid: str) -> Pod | None:
        return self._by_job.get(job, {}).get(uid)

    def by_uid(self, uid: str) -> Pod | None:
        """The pod of that UID, whichever job's it is (a heartbeat to the leader names its pod)."""
        job = self._job_of.get(uid)
        return None if job is None else self._by_job.get(job, {}).get(uid)

    def watched(self, pod: Pod) -> bool:
        """The watch showed `pod` (ADDED or MODIFIED). Returns False if it was older than the
        snapshot held, or belongs to no job (then it is not kept)."""
        uid = fields.uid(pod)
        self._unseen.pop(uid, None)
        return self._put(pod)

    def created(self, pod: Pod, now: float) -> None:
        """This operator created `pod` (the API server's answer)."""
        if self._put(pod):
            self._unseen[fields.uid(pod)] = now

    def read(self, pod: Pod) -> None:
        """A direct read of the API server showed `pod` as it is."""
        self._unseen.pop(fields.uid(pod), None)
        self._put(pod)

    def gone(self, job: JobRef, uid: str) -> Pod | None:
        """The pod no longer exists (the watch's DELETED, a relist, or a direct 404)."""
        self._unseen.pop(uid, None)
        self._unsettle(job, uid)
        pods = self._by_job.get(job)
        if pods is None:
            return None
        pod = pods.pop(uid, None)
        if pod is not None:
            self._job_of.pop(uid, None)
        if not pods:
            del self._by_job[job]
        return pod

    def replace_job(self, job: JobRef, pods: Iterable[Pod]) -> list[Pod]:
        """A direct list of the job's pods, the whole truth as of now: pods not in it are gone
        (and pods in it that are not the job's are not kept). Returns the pods it dropped."""
        truth = {fields.uid(pod): pod for pod in pods if owning_job(pod) == job}
        dropped = [pod for uid, pod in self._by_job.get(job, {}).items() if uid not in truth]
        for pod in dropped:
            self.gone(job, fields.uid(pod))
        for uid in [uid for uid in self._settled.get(job, {}) if uid not in truth]:
            self._unsettle(job, uid)
        for pod in truth.values():
            self.read(pod)
        return dropped

    def drop_job(self, job: JobRef) -> list[Pod]:
        """Forget a job's pods (the job is gone); returns them (not the settled ones: nothing
        is left to do with those)."""
        self._settled.pop(job, None)
        pods = list(self._by_job.pop(job, {}).values())
        for pod in pods:
            self._unseen.pop(fields.uid(pod), None)
            self._job_of.pop(fields.uid(pod), None)
        return pods

    def unseen(self, job: JobRef) -> list[tuple[Pod, float]]:
        """The job's pods this operator created that no watch event or read has shown yet, with
        when they were created."""
        pods = self._by_job.get(job, {})
        return [(pods[uid], at) for uid, at in self._unseen.items() if uid in pods]

    def _put(self, pod: Pod) -> bool:
        job = owning_job(pod)
        if job is None:
            return False  # nobody's pod is never kept (podstate.owning_job)
        uid = fields.uid(pod)
        version = version_number(fields.metadata(pod).get("resourceVersion"))
        settled = self._settled.get(job)
        if settled is not None and uid in settled:
            # Settled is for good (a finalizer never comes back to a finished pod): only its version moves.
            if version is not None and version > settled[uid]:
                settled[uid] = version
                return True
            return False
        pods = self._by_job.setdefault(job, {})
        held = pods.get(uid)
        if held is not None and is_older(pod, held):
            return False
        if _is_settled(pod):
            pods.pop(uid, None)
            if not pods:
                del self._by_job[job]
            self._job_of.pop(uid, None)
            self._settled.setdefault(job, {})[uid] = version if version is not None else -1
            return True
        pods[uid] = pod
        filed = self._job_of.setdefault(uid, job)
        if filed != job:  # its owner changed (only a forgery could do that): filed once, under the newest
            self._by_job.get(filed, {}).pop(uid, None)
            if not self._by_job.get(filed, True):
                del self._by_job[filed]
            self._job_of[uid] = job
        return True

    def _unsettle(self, job: JobRef, uid: str) -> None:
        settled = self._settled.get(job)
        if settled is not None and settled.pop(uid, None) is not None and not settled:
            del self._settled[job]


def _is_settled(pod: Pod) -> bool:
    """A task's pod that finished and was released: its outcome is in its task's status."""
    return podstate.task_of(pod) is not None and podstate.is_finished(pod) and not podstate.is_tracked(pod)
