"""The shell around the decision core: level-triggered reconciliation of VigilJobs.

Watch events (delivered by kopf, see `vigil.handlers`) only put a job's key in a work queue.
A worker takes the key, reads the newest job it knows and the job's pods, asks the core what
to do, and executes the actions in order. Nothing is remembered between two looks at a job
except what is in its status, so duplicate, stale or missed events cost at most an extra look.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from vigil import actions, api, lifecycle, podstate
from vigil.kube import Conflict, Kube, Refused
from vigil.workqueue import WorkQueue

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)
PodSource = Callable[[str], Iterable[Mapping[str, Any]]]  # job uid -> its pods

CONFLICT_RETRY_SECONDS = 0.2
ERROR_RETRY_SECONDS = (1, 2, 5, 10, 30)


def key_of(body: Mapping[str, Any]) -> Key:
    return body["metadata"]["namespace"], body["metadata"]["name"]


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
        rng: random.Random | None = None,
    ) -> None:
        self.kube = kube
        self.pods_of = pods_of
        self.workers = workers
        self.clock = clock
        self.rng = rng or random.Random()
        self.jobs: dict[Key, Mapping[str, Any]] = {}
        self.queue: WorkQueue[Key] = WorkQueue()
        self._failures: dict[Key, int] = {}
        self._strangers: dict[Key, Mapping[str, Any]] = {}  # pods bearing an attempt's name, not ours
        self._tasks: list[asyncio.Task] = []

    # --- what the watches report --------------------------------------------------------

    def job_seen(self, body: Mapping[str, Any]) -> None:
        key = key_of(body)
        if _newer(body, self.jobs.get(key)):
            self.jobs[key] = body
        self.queue.add(key)

    def job_gone(self, body: Mapping[str, Any]) -> None:
        key = key_of(body)
        current = self.jobs.get(key)
        if current is not None and current["metadata"]["uid"] == body["metadata"]["uid"]:
            del self.jobs[key]
            self.queue.forget(key)
            self._failures.pop(key, None)
            self._strangers.pop(key, None)

    def pod_changed(self, pod: Mapping[str, Any]) -> None:
        """A pod of some job changed: look at that job again."""
        for ref in pod["metadata"].get("ownerReferences") or []:
            if ref.get("controller") and ref.get("kind") == "VigilJob":
                self.queue.add((pod["metadata"]["namespace"], ref["name"]))

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
        pods = list(self.pods_of(job["metadata"]["uid"]))
        stranger = await self._recheck_stranger(key)
        if stranger is not None:
            pods.append(stranger)
        decision = lifecycle.decide(job, pods, self.clock(), may_start=True, rng=self.rng)
        for action in decision.actions:
            job = await self._execute(job, action)

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
        if created is None:
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
