"""Carries out a decision's actions (`vigil.core.actions`) against the API server, in order,
stopping at the first that fails: the first mutating action is always the decision's fence (its
status write, or a read that confirms the version it was decided on).

What it writes goes into the view at once (a status write's answer, a pod it created), since a
later decision must never miss a pod that exists. A created pod the watch is slow to show
brings its job back for a look (`UNSEEN_CHECK_SECONDS` later), which reads it directly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from vigil import api
from vigil.controllers.jobs.view import ClusterView
from vigil.core import actions, fields, lifecycle, podstate
from vigil.core.objects import Key, key_of
from vigil.core.tasks.array import is_array, reject_array_pod
from vigil.kube.errors import Conflict, NotFound, Refused
from vigil.kube.events import EventRecorder
from vigil.kube.operations import Kube
from vigil.metrics import Metrics
from vigil.metrics.collectors import count_transition
from vigil.runtime.clock import Clock
from vigil.runtime.timers import Timers
from vigil.runtime.workqueue import WorkQueue

# A pod this operator created that the watch has not shown after this long is read directly.
UNSEEN_CHECK_SECONDS = 10.0

JobSeen = Callable[..., None]  # handlers.JobEvents.job_seen(body, look=..., read=...)


class PodCreateRefused(Refused):
    """The API server refused an attempt's pod for a reason that may pass (403: a quota, a
    policy; 400: a webhook): shown on the job, retried with backoff."""


class Executor:
    def __init__(
        self,
        kube: Kube,
        view: ClusterView,
        queue: WorkQueue[Key],
        events: EventRecorder,
        *,
        job_seen: JobSeen,
        clock: Clock,
        metrics: Metrics,
    ) -> None:
        self.kube, self.view, self.queue, self.events = kube, view, queue, events
        self.job_seen, self.clock, self.metrics = job_seen, clock, metrics
        self._unseen: Timers[Key] = Timers(clock, self._look_if_unseen)

    def forget(self, key: Key) -> None:
        self._unseen.cancel(key)

    def shutdown(self) -> None:
        self._unseen.shutdown()

    async def execute(self, job: Mapping[str, Any], action: actions.Action) -> Mapping[str, Any]:
        """Runs one action; returns the job as it is afterwards (a status patch changes it)."""
        namespace, name = key_of(job)
        match action:
            case actions.PatchStatus(status=status, resource_version=rv):
                updated = await self.kube.patch_job_status(namespace, name, rv or "", status)
                count_transition(
                    self.metrics,
                    fields.status(job),
                    fields.status(updated),
                    queue=(namespace, fields.spec(job).get("queue") or api.DEFAULT_QUEUE),
                    created=fields.creation_timestamp(job),
                    now=self.clock.wall(),
                )
                # No look at our own write: a decision is complete, and deciding again on what it
                # wrote changes nothing (a property test holds decide() to that). What comes next
                # is a watch event, a timer or a pod's change, each a look of its own.
                self.job_seen(updated, look=False)
                return updated
            case actions.ConfirmVersion(resource_version=rv):
                await self._confirm_version(job, rv)
            case actions.CreatePod(manifest=manifest):
                await self._create_pod(job, manifest)
            case actions.DeletePod(name=pod_name, uid=uid):
                await self.kube.delete_pod(namespace, pod_name, uid)
            case actions.AnnotatePod(name=pod_name, uid=uid, annotations=annotations):
                await self.kube.annotate_pod(namespace, pod_name, uid, annotations)
            case actions.ReleasePod(name=pod_name, uid=uid):
                released = await self.kube.release_pod(namespace, pod_name, uid)
                owner = (namespace, fields.uid(job))
                # The view holds the pod released at once: the job's next look must not release it
                # again before the watch shows it (a task array looks twice a second). Only a pod
                # the view still holds, and not one being deleted (released, it is gone at once):
                # its DELETED may have come first, and a pod put back then is a phantom for ever.
                if (
                    released is not None
                    and self.view.pods.get(owner, uid) is not None
                    and not podstate.is_deleting(released)
                ):
                    self.view.pods.read(released)
                    self.view.drop_if_settled(owner, uid)
            case actions.SetDeadLetterLabel(dead_lettered=flag, dead_tasks=tasks_flag):
                # Fenced as the status write or the read before it was: on the version it left.
                rv = fields.resource_version(job)
                labels: dict[str, str | None] = {api.LABEL_DEAD_LETTER: "true" if flag else None}
                if tasks_flag is not None:
                    labels[api.LABEL_DEAD_TASKS] = "true" if tasks_flag else None
                labelled = await self.kube.patch_job_labels(namespace, name, rv, labels)
                if labelled is not None:
                    self.job_seen(labelled, look=False)
                    return labelled
            case actions.EmitEvent(type=type_, reason=reason, message=message):
                self.events.record(job, type_, reason, message)  # posted beside the work
            case actions.DeleteJob(uid=uid):
                await self.kube.delete_job(namespace, name, uid)
            case actions.RequeueAfter(seconds=seconds):
                self.queue.add_after(key_of(job), seconds)
            case _:
                raise TypeError(f"unknown action {action!r}")
        return job

    async def _confirm_version(self, job: Mapping[str, Any], resource_version: str | None) -> None:
        """The fence of a decision that writes no status: the job as the API server has it now
        must be the version decided on, else the decision is void (a Conflict, as a status
        write's 409 would be)."""
        stored = await self.kube.read_job(*key_of(job))
        if stored is None or fields.uid(stored) != fields.uid(job):
            raise NotFound(f"{key_of(job)} is gone")
        stored_rv = fields.resource_version(stored)
        if stored_rv != resource_version:
            self.job_seen(stored, look=False, read=True)
            raise Conflict(f"the job is at resourceVersion {stored_rv}, not {resource_version}")

    async def _create_pod(self, job: Mapping[str, Any], manifest: Mapping[str, Any]) -> None:
        namespace, pod_name = fields.namespace(manifest), fields.name(manifest)
        try:
            created = await self.kube.create_pod(namespace, manifest)
        except Refused as err:
            if err.status in (400, 403):  # a quota, a policy, a webhook: may pass; say so and retry
                message = f"the API server refused pod {pod_name}: {err.message}"
                raise PodCreateRefused(message, status=err.status, reason=err.reason) from err
            # A template Kubernetes will not accept: say so on the job rather than crash-loop.
            attempt = int(fields.labels(manifest)[api.LABEL_ATTEMPT])
            if is_array(job):  # every task's pod is made of the same template: none can start
                rejected = reject_array_pod(job, pod_name, err.message, self.clock.wall())
            else:
                rejected = lifecycle.reject_pod(job, attempt, err.message, self.clock.wall())
            for action in rejected.actions:
                job = await self.execute(job, action)
            return
        key, job_uid = key_of(job), fields.uid(job)
        if created is not None:
            self.view.pods.created(created, self.clock.monotonic())
            # Should the watch never show it (a watch can miss an event), the job is looked at
            # again once the pod counts as unseen, and read directly then.
            self._unseen.set_after(key, UNSEEN_CHECK_SECONDS + 1)
            return
        # AlreadyExists: ours (an earlier create whose answer was lost) or a stranger's (say, a
        # leftover of a deleted job of the same name), which the core must see to refuse it; no
        # watch of this job's pods brings a stranger, as it does not carry this job's UID.
        existing = await self.kube.read_pod(namespace, pod_name)
        if existing is None:
            return
        if podstate.belongs_to(existing, namespace, job_uid):
            self.view.pods.read(existing)  # the truth, whether or not the watch ever shows it
        else:
            self.view.strangers[key] = existing
        self.queue.add(key)

    def _look_if_unseen(self, key: Key) -> None:
        job = self.view.job(key)
        if job is not None and self.view.pods.unseen((key[0], fields.uid(job))):
            self.queue.add(key)
