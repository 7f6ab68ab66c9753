"""What the watches report, turned into the view's updates and keys in the work queue.

Deltas only update the view and say which job is worth a look; the reconciler reads the newest
version when it takes the key, so duplicate, stale or missed events cost at most an extra look.
The hot path is `pod_changed`: most pod events are heartbeats, which cost a few dictionary
operations here and no reconcile (the silence alarm wakes a job when its silence crosses a
threshold). A pod's other changes are batched over `pod_batch_seconds`, so that its changes of
that window (created, bound, running, finished) cost one look; a change to the job itself is
looked at at once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any

from vigil import api
from vigil.controllers.dispatcher import Dispatcher
from vigil.controllers.jobs.orphans import Releaser
from vigil.controllers.jobs.view import ClusterView
from vigil.core import fields, podstate
from vigil.core.liveness import beat_stamp_due
from vigil.core.objects import Key, key_of
from vigil.kube.seen import Delta
from vigil.metrics import Metrics
from vigil.runtime.clock import Clock
from vigil.runtime.workqueue import WorkQueue

# A pod event makes its job worth a look within this long, not at once (the Job controller's
# batch period, syncJobBatchPeriod, is the same second).
POD_BATCH_SECONDS = 1.0


def more_than_a_beat(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether two versions of a pod differ in anything the decision core reads, the heartbeat
    annotation left out. Compared field by field (dict equality, in C): no copy, no encoding."""
    before, after = fields.metadata(old), fields.metadata(new)
    return (
        old.get("status") != new.get("status")
        or fields.deletion_timestamp(old) != fields.deletion_timestamp(new)
        or before.get("finalizers") != after.get("finalizers")
        or before.get("labels") != after.get("labels")
        or fields.spec(old).get("nodeName") != fields.spec(new).get("nodeName")
        or _annotations_but_the_beat(before) != _annotations_but_the_beat(after)
    )


def _annotations_but_the_beat(metadata: Mapping[str, Any]) -> dict[str, str]:
    annotations = metadata.get("annotations") or {}
    if api.ANNOTATION_HEARTBEAT not in annotations:
        return annotations
    return {k: v for k, v in annotations.items() if k != api.ANNOTATION_HEARTBEAT}


class JobEvents:
    """`forget(key)` drops everything known of a job (the controller's, across its parts)."""

    def __init__(
        self,
        view: ClusterView,
        queue: WorkQueue[Key],
        dispatcher: Dispatcher,
        releaser: Releaser,
        *,
        clock: Clock,
        metrics: Metrics,
        forget: Callable[[Key], None],
        pod_batch_seconds: float = POD_BATCH_SECONDS,
    ) -> None:
        self.view, self.queue, self.dispatcher, self.releaser = view, queue, dispatcher, releaser
        self.clock, self.metrics = clock, metrics
        self.forget = forget
        self.pod_batch_seconds = pod_batch_seconds
        self.listed = False  # every watch has listed: an unknown job is then really unknown

    def job_delta(self, delta: Delta) -> None:
        if delta.kind == "delete":
            self.job_gone(delta.obj)
        else:
            self.job_seen(delta.obj)

    def pod_delta(self, delta: Delta) -> None:
        self.pod_changed(delta.obj, deleted=delta.kind == "delete")

    def job_seen(self, body: Mapping[str, Any], *, look: bool = True, read: bool = False) -> None:
        """A version of a job, from the watch or from a write of ours. `look`: worth a reconcile
        (not so for the write that reports a failure: the retry's backoff decides when). `read`:
        a direct read from the API server, taken even if it is older (`ClusterView.take`)."""
        key = key_of(body)
        if self.view.take(body, read=read):
            self.dispatcher.job_seen(body)
            for pod in self.view.pods.of_job((key[0], fields.uid(body))):
                self._note_start(key, body, pod)
        if look:
            self.queue.add(key)

    def job_gone(self, body: Mapping[str, Any]) -> None:
        """The job was deleted (the watch's DELETED, a relist, or a direct read). Its pods are
        released even if the job was forgotten already (a look that met its 404 first), or
        replaced by a new job of the same name: they are filed by the deleted job's UID."""
        key, uid = key_of(body), fields.uid(body)
        current = self.view.job(key)
        if current is not None and fields.uid(current) == uid:
            self.forget(key)
        # Its pods can tell nobody anything any more: let them go.
        pods = self.view.pods.drop_job((key[0], uid))
        self.releaser.release(pods, f"the pods of deleted job {key[0]}/{key[1]}")

    def job_vanished(self, key: Key) -> None:
        """A look met the job's 404: it is forgotten, and its pods are released once the API
        server confirms the job is gone (a 404 may be a namespace's, not the job's). Without
        this, a pod that changes no more (finished, Terminating) would keep the finalizer, since
        the job's DELETED then finds nothing to release."""
        job = self.view.job(key)
        self.forget(key)
        if job is not None:
            self.releaser.release_orphans(self.view.pods.of_job((key[0], fields.uid(job))))

    def pod_changed(self, pod: Mapping[str, Any], deleted: bool = False) -> None:
        """A pod of some job changed (the hot path: see the module docstring)."""
        view = self.view
        job_ref = podstate.owning_job(pod)
        if job_ref is None:
            return  # nobody's pod (the pod watch keeps none: podstate.keep_job_pod)
        key = podstate.owner_key(pod)
        uid = fields.uid(pod)
        if deleted:
            view.pod_gone(job_ref, uid)
        elif view.forged(job_ref):
            self._check_orphan(pod, job_ref)  # Vigil's finalizer on it has no reason to stay
            return
        else:
            previous = view.pods.get(job_ref, uid)
            if not view.pods.watched(pod):
                return  # older than what a direct read showed
            if view.drop_if_settled(job_ref, uid):
                return  # a task's pod finished and released: its outcome is in status already
            self._check_orphan(pod, job_ref)
            tracker = view.tracker
            beats = tracker.beats
            beat = tracker.observe(pod, self.clock.monotonic(), self.clock.wall())
            if tracker.beats > beats:
                self.metrics.heartbeats.inc()
                if tracker.last_gap is not None:  # not the pod's first beat
                    self.metrics.heartbeat_gap.observe(tracker.last_gap)
            # The first version the watch shows is worth a look, whatever the view held before.
            only_a_beat = uid in view.looked_at and previous is not None and not more_than_a_beat(previous, pod)
            # A beat alone makes the job worth a look only if the job is in doubt (resume it now,
            # not at the next deadline) or its LAST-BEAT stamp is due.
            first = tracker.last_gap is None  # the pod's first beat, if a beat
            if only_a_beat and not (beat and key is not None and self._beat_matters(key, uid, first=first)):
                return
            view.looked_at.add(uid)
            if key is not None and (job := view.job(key)) is not None:
                self._note_start(key, job, pod)
        if key is not None:
            self.queue.add_batched(key, self.pod_batch_seconds)

    def beat_heard(self, pod: Mapping[str, Any]) -> None:
        """A verified beat posted to the leader for `pod` (held in the view): as a new
        annotation value would be, without the pod having changed."""
        view = self.view
        uid = fields.uid(pod)
        tracker = view.tracker
        if not tracker.heard(uid, self.clock.monotonic(), self.clock.wall()):
            return  # the pod is held but not tracked yet: its first watch event tracks it
        self.metrics.heartbeats.inc()
        if tracker.last_gap is not None:
            self.metrics.heartbeat_gap.observe(tracker.last_gap)
        key = podstate.owner_key(pod)
        if key is not None and self._beat_matters(key, uid, first=tracker.last_gap is None):
            self.queue.add_batched(key, self.pod_batch_seconds)

    def _note_start(self, key: Key, job: Mapping[str, Any], pod: Mapping[str, Any]) -> None:
        """A pod of an attempt the job's status does not hold yet is a start made (its pod came
        first): its queue counts it as running until status shows it, after a restart too."""
        attempt = podstate.attempt_of(pod)
        recorded = int(fields.status(job).get("attempts") or 0)
        if attempt is not None and attempt > recorded and podstate.belongs_to(pod, key[0], fields.uid(job)):
            self.dispatcher.started_unseen(*key, attempt)

    def _check_orphan(self, pod: Mapping[str, Any], job: tuple[str, str]) -> None:
        """A pod held by Vigil's finalizer whose job is not known (deleted while the job watch
        lagged, say): released if the API server confirms the job is gone."""
        if (
            self.listed  # before the first listing, jobs may simply not be listed yet
            and not self.view.knows_job(job)
            and podstate.is_tracked(pod)
        ):
            self.releaser.release_orphan(pod)

    def _beat_matters(self, key: Key, uid: str, *, first: bool = False) -> bool:
        """Whether a beat of pod `uid` makes its job worth a look. A pod's first beat always does:
        its silence then counts from the beat, not from the end of the startup grace, so the job's
        silence alarm, armed for the later instant, must be armed again, earlier (else a pod that
        beats once and dies is declared Lost at the grace's end, never Uncertain first)."""
        job = self.view.job(key)
        if job is None:
            return False
        if first:
            return True
        status = fields.status(job)
        if status.get("phase") == "Uncertain":
            return True
        tasks = status.get("tasks")
        if tasks is not None:
            # A task array: a beat matters to the task it resumes; its LAST-BEAT rides along with
            # the array's other writes (one per look at most, whatever its tasks beat).
            return any(
                task.get("phase") == "Uncertain" and (task.get("currentAttempt") or {}).get("podUID") == uid
                for task in tasks.get("active") or ()
            )
        heartbeat = self.view.heartbeats[key]
        if not heartbeat.required:
            return False  # no stamp: liveness is the pod phase alone
        stored = (status.get("currentAttempt") or {}).get("lastHeartbeatAt")
        last_beat_at = self.view.tracker.last_beat_at(uid)
        stamped = dt.datetime.fromisoformat(stored) if stored else None
        if not beat_stamp_due(stamped, last_beat_at, heartbeat, self.view.stamp_floor()):
            return False
        return self.view.stamp_allowed(self.clock.monotonic())  # at most R stamps a second, bursts too
