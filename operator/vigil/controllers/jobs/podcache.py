"""The operator's memory of Vigil's pods, filed by job UID.

It holds the newest snapshot of every pod labelled `vigil.dev/job-uid`, from three sources:
the pod watch (the usual one), the pods this operator created (written through at once, since
the watch may show them late, and a decision must never miss a pod that exists: NoOverlap
counts on it), and direct reads of the API server (the source of truth, asked before anything
destructive). A snapshot older than the one held for the same pod is ignored, whatever its
source, so a late watch event never undoes a direct read.

A created pod the watch has not shown yet is kept until the watch shows it or a direct read
says it is gone: never forgotten on a timer. `unseen()` lists them with their age so the shell
can ask about those the watch is slow to show.

Size: one dict per pod of a job Vigil knows, as `podstate.strip_pod` leaves it (metadata
without managedFields; of the spec only nodeName; of the status only what `podstate` reads).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from vigil import api
from vigil.core.objects import is_older

Pod = Mapping[str, Any]


def job_uid_of(pod: Pod) -> str:
    return (pod["metadata"].get("labels") or {}).get(api.LABEL_JOB_UID, "")


class PodCache:
    """Vigil's pods by job UID, then pod UID; plus when each created-but-unseen pod was made."""

    def __init__(self) -> None:
        self._by_job: dict[str, dict[str, Pod]] = {}
        self._unseen: dict[str, float] = {}  # pod UID -> monotonic time this operator created it

    def __len__(self) -> int:
        return sum(len(pods) for pods in self._by_job.values())

    def of_job(self, job_uid: str) -> list[Pod]:
        return list(self._by_job.get(job_uid, {}).values())

    def job_uids(self) -> list[str]:
        return list(self._by_job)

    def get(self, job_uid: str, uid: str) -> Pod | None:
        return self._by_job.get(job_uid, {}).get(uid)

    def watched(self, pod: Pod) -> bool:
        """The watch showed `pod` (ADDED or MODIFIED). Returns False if it was older than the
        snapshot held."""
        uid = pod["metadata"]["uid"]
        self._unseen.pop(uid, None)
        return self._put(pod)

    def created(self, pod: Pod, now: float) -> None:
        """This operator created `pod` (the API server's answer)."""
        if self._put(pod):
            self._unseen[pod["metadata"]["uid"]] = now

    def read(self, pod: Pod) -> None:
        """A direct read of the API server showed `pod` as it is."""
        self._unseen.pop(pod["metadata"]["uid"], None)
        self._put(pod)

    def gone(self, job_uid: str, uid: str) -> Pod | None:
        """The pod no longer exists (the watch's DELETED, a relist, or a direct 404)."""
        self._unseen.pop(uid, None)
        pods = self._by_job.get(job_uid)
        if pods is None:
            return None
        pod = pods.pop(uid, None)
        if not pods:
            del self._by_job[job_uid]
        return pod

    def replace_job(self, job_uid: str, pods: Iterable[Pod]) -> list[Pod]:
        """A direct list of the job's pods, the whole truth as of now: pods not in it are gone.
        Returns the pods it dropped."""
        truth = {pod["metadata"]["uid"]: pod for pod in pods}
        dropped = [pod for uid, pod in self._by_job.get(job_uid, {}).items() if uid not in truth]
        for pod in dropped:
            self.gone(job_uid, pod["metadata"]["uid"])
        for pod in truth.values():
            self.read(pod)
        return dropped

    def drop_job(self, job_uid: str) -> list[Pod]:
        """Forget a job's pods (the job is gone); returns them."""
        pods = list(self._by_job.pop(job_uid, {}).values())
        for pod in pods:
            self._unseen.pop(pod["metadata"]["uid"], None)
        return pods

    def unseen(self, job_uid: str) -> list[tuple[Pod, float]]:
        """The job's pods this operator created that no watch event or read has shown yet, with
        when they were created."""
        pods = self._by_job.get(job_uid, {})
        return [(pods[uid], at) for uid, at in self._unseen.items() if uid in pods]

    def _put(self, pod: Pod) -> bool:
        uid, job_uid = pod["metadata"]["uid"], job_uid_of(pod)
        pods = self._by_job.setdefault(job_uid, {})
        held = pods.get(uid)
        if held is not None and is_older(pod, held):
            return False
        pods[uid] = pod
        return True
