"""The shell around the decision core: level-triggered reconciliation of VigilJobs.

Watch events (delivered by kopf, see `vigil.handlers`) only put a job's key in a work queue.
A worker takes the key, reads the newest job it knows and the job's pods, asks the core what
to do, and executes the actions in order. Nothing is remembered between two looks at a job
except what is in its status, so duplicate, stale or missed events cost at most an extra look.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from vigil import actions, api, lifecycle, podstate
from vigil.kube import Conflict, Kube, Refused
from vigil.liveness import HeartbeatTracker, beat_stamp_due
from vigil.workqueue import WorkQueue

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)
PodSource = Callable[[str], Iterable[Mapping[str, Any]]]  # job uid -> its pods

CONFLICT_RETRY_SECONDS = 0.2
CREATED_GRACE_SECONDS = 30.0
ERROR_RETRY_SECONDS = (1, 2, 5, 10, 30)


def key_of(body: Mapping[str, Any]) -> Key:
    return body["metadata"]["namespace"], body["metadata"]["name"]


def _owner_key(pod: Mapping[str, Any]) -> Key | None:
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == api.KIND:
            return pod["metadata"]["namespace"], ref["name"]
    return None


def _fingerprint(pod: Mapping[str, Any]) -> int:
    """A hash of what the decision core reads of a pod, the heartbeat annotation left out."""
    metadata = pod["metadata"]
    annotations = {k: v for k, v in (metadata.get("annotations") or {}).items() if k != api.ANNOTATION_HEARTBEAT}
    seen = (
        metadata.get("deletionTimestamp"),
        metadata.get("labels"),
        annotations,
        pod.get("spec", {}).get("nodeName"),
        pod.get("status"),
    )
    return hash(json.dumps(seen, sort_keys=True, default=str))


def _newer(candidate: Mapping[str, Any], current: Mapping[str, Any] | None) -> bool:
    """Whether `candidate` is a later version of the job than `current`.

    resourceVersions are opaque by contract, but every API server backed by etcd makes them
    increasing integers; this only keeps our own write-through from being overwritten by an
    older watch event, and falls back to "take the newcomer" otherwise.
    """
    if current is None or candidate["metadata"]["uid"] != current["metadata"]["uid"]:
        return True
    new, old = candidate["metadata"].get("resourceVersion", ""), current["metadata"].get("resourceVersion", "")
    if new.isdigit() and old.isdigit():
        return int(new) >= int(old)
    return True


class Controller:
    """Owns the job cache and the work queue; executes decisions against the API server."""

    def __init__(
        self,
        kube: Kube,
        pods_of: PodSource,
        *,
        workers: int = 4,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.kube = kube
        self.pods_of = pods_of
        self.workers = workers
        self.clock = clock
        self.monotonic = monotonic
        self.rng = rng or random.Random()
        self.tracker = HeartbeatTracker()
        self._fingerprints: dict[str, int] = {}  # pod UID -> what of it, beats aside, decide() reads
        self.jobs: dict[Key, Mapping[str, Any]] = {}
        self._heartbeats: dict[Key, api.Heartbeat] = {}  # each job's spec.heartbeat, parsed
        self.queue: WorkQueue[Key] = WorkQueue()
        self._failures: dict[Key, int] = {}
        self._strangers: dict[Key, Mapping[str, Any]] = {}  # pods bearing an attempt's name, not ours
        # Pods this operator created that the watch has not shown yet, by job UID then pod UID:
        # a decision must never miss a pod that exists (NoOverlap counts on it).
        self._created: dict[str, dict[str, tuple[Mapping[str, Any], float]]] = {}
        self._tasks: list[asyncio.Task] = []

    # --- what the watches report --------------------------------------------------------

    def job_seen(self, body: Mapping[str, Any]) -> None:
        key = key_of(body)
        if _newer(body, self.jobs.get(key)):
            self.jobs[key] = body
            # Parsed once per job version, not on every heartbeat of its pods.
            self._heartbeats[key] = api.Heartbeat.model_validate((body.get("spec") or {}).get("heartbeat") or {})
        self.queue.add(key)

    def job_gone(self, body: Mapping[str, Any]) -> None:
        key = key_of(body)
        current = self.jobs.get(key)
        if current is not None and current["metadata"]["uid"] == body["metadata"]["uid"]:
            del self.jobs[key]
            del self._heartbeats[key]
            self._created.pop(current["metadata"]["uid"], None)
            self.queue.forget(key)
            self._failures.pop(key, None)
            self._strangers.pop(key, None)

    def pod_changed(self, pod: Mapping[str, Any], deleted: bool = False) -> None:
        """A pod of some job changed. The hot path: most events are heartbeats, which cost a few
        dictionary operations here and no reconcile; the detector's deadline wakes the job
        when its silence crosses a threshold."""
        key = _owner_key(pod)
        uid = pod["metadata"]["uid"]
        job_uid = (pod["metadata"].get("labels") or {}).get(api.LABEL_JOB_UID, "")
        if uid in self._created.get(job_uid, {}):  # the watch has caught up with our create
            del self._created[job_uid][uid]
        if deleted:
            self.tracker.forget(uid)
            self._fingerprints.pop(uid, None)
        else:
            beat = self.tracker.observe(pod, self.monotonic(), self.clock())
            fingerprint = _fingerprint(pod)
            only_a_beat = self._fingerprints.get(uid) == fingerprint
            # A beat alone makes the job worth a look only if the job is in doubt (resume it now,
            # not at the next deadline) or its LAST-BEAT stamp is due.
            if only_a_beat and not (beat and key is not None and self._beat_matters(key, uid)):
                return
            self._fingerprints[uid] = fingerprint
        if key is not None:
            self.queue.add(key)

    def _beat_matters(self, key: Key, uid: str) -> bool:
        job = self.jobs.get(key)
        if job is None:
            return False
        status = job.get("status") or {}
        if status.get("phase") == "Uncertain":
            return True
        heartbeat = self._heartbeats[key]
        stored = (status.get("currentAttempt") or {}).get("lastHeartbeatAt")
        verdict = self.tracker.verdict(uid, heartbeat, self.monotonic())
        return beat_stamp_due(dt.datetime.fromisoformat(stored) if stored else None, verdict.last_beat_at, heartbeat)

    # --- workers ------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._work(), name=f"vigil-worker-{i}") for i in range(self.workers)]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.queue.shutdown()

    async def _work(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                await self.reconcile(key)
                self._failures.pop(key, None)
            except Conflict as err:
                log.debug("conflict on %s/%s, looking again: %s", *key, err)
                self.queue.add_after(key, CONFLICT_RETRY_SECONDS)
            except Exception:
                failures = self._failures.get(key, 0)
                self._failures[key] = failures + 1
                delay = ERROR_RETRY_SECONDS[min(failures, len(ERROR_RETRY_SECONDS) - 1)]
                log.exception("reconciling %s/%s failed; retrying in %ss", *key, delay)
                self.queue.add_after(key, delay)
            finally:
                self.queue.done(key)

    # --- one look at one job ------------------------------------------------------------

    async def reconcile(self, key: Key) -> None:
        job = self.jobs.get(key)
        if job is None:
            return
        pods = self._pods_of(job["metadata"]["uid"])
        stranger = await self._recheck_stranger(key)
        if stranger is not None:
            pods.append(stranger)
        heartbeat = self._heartbeats[key]
        now = self.monotonic()
        uids = [pod["metadata"]["uid"] for pod in pods]
        liveness = {uid: self.tracker.verdict(uid, heartbeat, now) for uid in uids}
        decision = lifecycle.decide(job, pods, self.clock(), may_start=True, rng=self.rng, liveness=liveness)
        for action in decision.actions:
            job = await self._execute(job, action)
        # Wake when some attempt's silence crosses its next threshold (one timer per job).
        deadlines = [d for uid in uids if (d := self.tracker.deadline(uid, heartbeat, now)) is not None]
        if deadlines:
            self.queue.add_after(key, min(deadlines) - now)

    def _pods_of(self, job_uid: str) -> list[Mapping[str, Any]]:
        """The job's pods as watched, plus those created here that the watch has not shown yet
        (for at most CREATED_GRACE_SECONDS: a pod made and deleted while a watch was being
        re-established never shows, and must not be believed in for ever)."""
        watched = list(self.pods_of(job_uid))
        created = self._created.get(job_uid, {})
        horizon = self.monotonic() - CREATED_GRACE_SECONDS
        for uid in [uid for uid, (_, at) in created.items() if at < horizon]:
            del created[uid]
        seen = {pod["metadata"]["uid"] for pod in watched}
        return watched + [pod for uid, (pod, _) in created.items() if uid not in seen]

    async def _execute(self, job: Mapping[str, Any], action: actions.Action) -> Mapping[str, Any]:
        """Runs one action; returns the job as it is afterwards (a status patch changes it)."""
        namespace, name = key_of(job)
        match action:
            case actions.PatchStatus(status=status, resource_version=rv):
                updated = await self.kube.patch_job_status(namespace, name, rv or "", status)
                self.job_seen(updated)
                return updated
            case actions.CreatePod(manifest=manifest):
                await self._create_pod(job, manifest)
            case actions.DeletePod(name=pod_name, uid=uid):
                await self.kube.delete_pod(namespace, pod_name, uid)
            case actions.AnnotatePod(name=pod_name, uid=uid, annotations=annotations):
                await self.kube.annotate_pod(namespace, pod_name, uid, annotations)
            case actions.SetDeadLetterLabel(dead_lettered=flag):
                await self.kube.patch_job_labels(namespace, name, {api.LABEL_DEAD_LETTER: "true" if flag else None})
            case actions.EmitEvent(type=type_, reason=reason, message=message):
                await self.kube.post_event(job, type_, reason, message)
            case actions.DeleteJob(uid=uid):
                await self.kube.delete_job(namespace, name, uid)
            case actions.RequeueAfter(seconds=seconds):
                self.queue.add_after(key_of(job), seconds)
            case _:
                raise TypeError(f"unknown action {action!r}")
        return job

    async def _create_pod(self, job: Mapping[str, Any], manifest: Mapping[str, Any]) -> None:
        namespace, pod_name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        try:
            created = await self.kube.create_pod(namespace, manifest)
        except Refused as err:
            # A template Kubernetes will not accept: say so on the job rather than crash-loop.
            attempt = int(manifest["metadata"]["labels"][api.LABEL_ATTEMPT])
            for action in lifecycle.reject_pod(job, attempt, err.message, self.clock()).actions:
                job = await self._execute(job, action)
            return
        if created is not None:
            self._created.setdefault(job["metadata"]["uid"], {})[created["metadata"]["uid"]] = (
                created,
                self.monotonic(),
            )
            return
        # AlreadyExists: ours (the watch will show it) or a stranger's (say, a leftover of a
        # deleted job of the same name), which the core must see to refuse it; no watch of
        # this job's pods brings it, as it does not carry this job's UID.
        existing = await self.kube.read_pod(namespace, pod_name)
        if existing is not None and not podstate.is_controlled_by(existing, job["metadata"]["uid"]):
            self._strangers[key_of(job)] = existing
            self.queue.add(key_of(job))

    async def _recheck_stranger(self, key: Key) -> Mapping[str, Any] | None:
        stranger = self._strangers.get(key)
        if stranger is None:
            return None
        current = await self.kube.read_pod(key[0], stranger["metadata"]["name"])
        if current is None or current["metadata"]["uid"] != stranger["metadata"]["uid"]:
            del self._strangers[key]
            return None
        return current
