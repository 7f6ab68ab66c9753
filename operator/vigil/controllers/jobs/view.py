"""The job controller's view of the cluster: the jobs, their pods, and what the failure detector
has heard from each pod. A view is a rumour (DESIGN: "never on a rumour"): it is what the
watches, this operator's own writes and its direct reads have shown, and the reconciler asks
the API server before anything that cannot be undone.

Remembers, per job: its newest version, its spec.heartbeat parsed once per version (not on
every beat of its pods), and a pod bearing its current attempt's name that is not its own (a
stranger, which no watch of the job's pods shows); per pod: its newest snapshot (`PodCache`),
the detector's record (`HeartbeatTracker`), and whether a watched version of it has reached a
reconcile yet. Everything is dropped with the job or the pod. The jobs by phase are counted as
versions come and go (`phases`), so the metrics read a count instead of walking every job.
"""

from __future__ import annotations

from collections import Counter

from vigil import api
from vigil.controllers.jobs.podcache import PodCache
from vigil.core import fields
from vigil.core.fields import Job, Pod
from vigil.core.liveness import STAMP_WRITES_PER_SECOND, HeartbeatTracker, stamp_floor
from vigil.core.objects import Key, is_older, key_of
from vigil.core.ratelimit import TokenBucket


def parse_heartbeat(job: Job) -> api.Heartbeat:
    try:
        return api.Heartbeat.model_validate(fields.spec(job).get("heartbeat") or {})
    except ValueError:  # decide() reports the invalid spec; the detector uses the defaults meanwhile
        return api.Heartbeat()


class ClusterView:
    def __init__(self, stamp_writes_per_second: float = STAMP_WRITES_PER_SECOND) -> None:
        self.stamp_writes_per_second = stamp_writes_per_second
        # The floor spreads the stamps' average; this bounds their bursts: jobs started together
        # (10,000 submitted at once) come due together, every period, at whatever pace the
        # operator can write. A beat whose stamp is due and finds no token waits for a later beat.
        self.stamps = TokenBucket(rate=stamp_writes_per_second, burst=max(1, round(stamp_writes_per_second)))
        self.jobs: dict[Key, Job] = {}
        self.pods = PodCache()
        self.tracker = HeartbeatTracker()
        self.heartbeats: dict[Key, api.Heartbeat] = {}
        self.strangers: dict[Key, Pod] = {}
        self.looked_at: set[str] = set()  # UIDs of pods whose watched versions reached a reconcile
        self._uids: dict[str, Key] = {}  # job UID -> key, of the jobs above
        self.phases: Counter[str] = Counter()  # of the jobs above, "New" for a job with no phase yet

    def stamp_floor(self) -> float:
        """The least period of a job's lastHeartbeatAt written alone, for the attempts tracked."""
        return stamp_floor(len(self.tracker), self.stamp_writes_per_second)

    def stamp_allowed(self, now: float) -> bool:
        """Whether a stamp due at monotonic `now` may be written now (counted if so)."""
        return self.stamps.take(now)

    def job(self, key: Key) -> Job | None:
        return self.jobs.get(key)

    def job_by_uid(self, namespace: str, uid: str) -> Job | None:
        """The job of that UID in that namespace, if the view holds it."""
        key = self._uids.get(uid)
        return self.jobs.get(key) if key is not None and key[0] == namespace else None

    def knows_job(self, job: tuple[str, str]) -> bool:
        """Whether a job of that (namespace, UID) is in the view."""
        key = self._uids.get(job[1])
        return key is not None and key[0] == job[0]

    def forged(self, job: tuple[str, str]) -> bool:
        """Whether a pod filed under `job` (namespace, UID) names a job this view knows in another
        namespace: UIDs are unique in a cluster, so such a pod is a forgery (another namespace's
        pod carrying this job's UID in its label and owner reference), and is kept nowhere."""
        key = self._uids.get(job[1])
        return key is not None and key[0] != job[0]

    def take(self, body: Job, *, read: bool = False) -> bool:
        """Keeps `body` as the job's newest version; False when it is the version held, or an
        older one (a late watch event never undoes a write of ours). `read`: a direct read, taken
        even if its resourceVersion is lower (an etcd restored from a backup goes back in time)."""
        key = key_of(body)
        current = self.jobs.get(key)
        version = fields.metadata(body).get("resourceVersion")
        if current is not None and version == fields.metadata(current).get("resourceVersion"):
            return False  # the watch echoing a write of ours, or a duplicate
        if not read and current is not None and is_older(body, current):
            return False
        if current is not None:
            self._count(current, -1)
        self.jobs[key] = body
        self._count(body, +1)
        self._uids[fields.uid(body)] = key
        self.heartbeats[key] = parse_heartbeat(body)
        return True

    def drop(self, key: Key) -> Job | None:
        """Forgets the job (not its pods: `pods.drop_job` does); returns what was held."""
        job = self.jobs.pop(key, None)
        if job is not None:
            self._count(job, -1)
            self._uids.pop(fields.uid(job), None)
        self.heartbeats.pop(key, None)
        self.strangers.pop(key, None)
        return job

    def drop_if_settled(self, job: tuple[str, str], uid: str) -> bool:
        """Whether the pod is a settled task pod (`PodCache`); if so, the detector forgets it too:
        a finished task's pod is neither tracked nor looked at again."""
        if not self.pods.is_settled(job, uid):
            return False
        self.tracker.forget(uid)
        self.looked_at.discard(uid)
        return True

    def pod_gone(self, job: tuple[str, str], uid: str) -> None:
        self.pods.gone(job, uid)
        self.tracker.forget(uid)
        self.looked_at.discard(uid)

    def _count(self, job: Job, change: int) -> None:
        phase = phase_of(job)
        self.phases[phase] += change
        if not self.phases[phase]:
            del self.phases[phase]


def phase_of(job: Job) -> str:
    return fields.phase(job) or "New"
