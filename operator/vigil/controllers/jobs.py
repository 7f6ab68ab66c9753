"""The shell around the decision core: level-triggered reconciliation of VigilJobs.

Watch deltas (from `vigil.kube.informer`) only update the caches and put a job's key in a work queue.
A worker takes the key, reads the newest job it knows and the job's pods, asks the core what to
do, and executes the actions in order. Nothing is remembered between two looks at a job except
what is in its status, so duplicate, stale or missed events cost at most an extra look.

The caches are a rumour: a decision that cannot be undone (`vigil.core.doubt`) is taken again on a
direct read of the job's pods before it runs, and while the pod watch is not fresh silence
cannot make an attempt Lost (`liveness.heard`). A failure while reconciling is shown on the job
and retried with backoff (`vigil.core.failures`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple

from vigil import api
from vigil.controllers.alarms import SilenceAlarms
from vigil.controllers.dispatcher import Dispatcher
from vigil.controllers.podcache import PodCache, job_uid_of
from vigil.controllers.rechecks import StartingRechecks
from vigil.core import actions, doubt, failures, lifecycle, podstate
from vigil.core.liveness import HeartbeatTracker, beat_stamp_due, heard
from vigil.core.objects import is_older, key_of
from vigil.core.queueing import Admission
from vigil.kube.errors import Conflict, NotFound, Refused
from vigil.kube.events import EventRecorder
from vigil.kube.operations import Kube
from vigil.kube.seen import Delta
from vigil.metrics import CONTROLLER, Metrics, count_transition
from vigil.runtime.workqueue import WorkQueue

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)

# A pod this operator created that the watch has not shown after this long is read directly.
UNSEEN_CHECK_SECONDS = 10.0
# A job left Starting this long has itself and its pods read directly: a watch can miss an event
# (kubernetes#123072), and a Pending pod has no heartbeat deadline that would catch it.
STARTING_RECHECK_SECONDS = 30.0
# Conflicts on one job in a row before they are logged as a warning rather than at debug level.
CONFLICTS_WORTH_A_WARNING = 3
# A pod event makes its job worth a look within this long, not at once, so that a pod's changes
# in that window (created, bound, running, finished) cost one look and one status write, not one
# each. The Job controller's batch period (syncJobBatchPeriod) is the same second.
POD_BATCH_SECONDS = 1.0
# How soon a job whose Lost verdict waits for a fresh view of pods is looked at again.
DEAF_RECHECK_SECONDS = 2.0


class Judgement(NamedTuple):
    """A decision and what it was taken on."""

    decision: actions.Decision
    deaf: bool  # a Lost verdict was held back because the pod watch is not fresh
    admission: Admission  # the queue's say
    verdicts: dict[str, str]  # the detector's state of each pod, by UID (for the silence alarm)


class PodCreateRefused(Refused):
    """The API server refused an attempt's pod for a reason that may pass (403: a quota, a
    policy; 400: a webhook): shown on the job, retried with backoff."""


def _owner_key(pod: Mapping[str, Any]) -> Key | None:
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == api.KIND:
            return pod["metadata"]["namespace"], ref["name"]
    return None


def _more_than_a_beat(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether two versions of a pod differ in anything the decision core reads, the heartbeat
    annotation left out. Compared field by field (dict equality, in C): no copy, no encoding."""
    before, after = old["metadata"], new["metadata"]
    return (
        old.get("status") != new.get("status")
        or before.get("deletionTimestamp") != after.get("deletionTimestamp")
        or before.get("finalizers") != after.get("finalizers")
        or before.get("labels") != after.get("labels")
        or (old.get("spec") or {}).get("nodeName") != (new.get("spec") or {}).get("nodeName")
        or _annotations_but_the_beat(before) != _annotations_but_the_beat(after)
    )


def _annotations_but_the_beat(metadata: Mapping[str, Any]) -> dict[str, str]:
    annotations = metadata.get("annotations") or {}
    if api.ANNOTATION_HEARTBEAT not in annotations:
        return annotations
    return {k: v for k, v in annotations.items() if k != api.ANNOTATION_HEARTBEAT}


def _parse_heartbeat(job: Mapping[str, Any]) -> api.Heartbeat:
    try:
        return api.Heartbeat.model_validate((job.get("spec") or {}).get("heartbeat") or {})
    except ValueError:  # decide() reports the invalid spec; the detector uses the defaults meanwhile
        return api.Heartbeat()


def _describe(err: Exception) -> tuple[str, str]:
    """(reason, message) for the ReconcileError condition."""
    if isinstance(err, PodCreateRefused):
        return "PodCreateRefused", f"{err.message}; retrying with backoff"
    if isinstance(err, Refused):
        return "WriteRefused", f"the API server refused a write: {err.message}"
    return "ReconcileFailed", f"reconciling failed: {type(err).__name__}: {str(err)[:1000]}"


class Controller:
    """Owns the job and pod caches and the work queue; executes decisions against the API server.

    What it remembers, besides the caches: the detector's view of each pod (`tracker`), which
    pods the watch has shown (after that, a heartbeat alone costs no reconcile), each job's
    silence alarm (`alarms`), the events not yet posted (`events`), the failures in a row per job
    (for backoff), and pods bearing an attempt's name that are not the job's (strangers, which no
    watch of the job's pods shows). Everything is dropped with the job.
    """

    def __init__(
        self,
        kube: Kube,
        *,
        workers: int = 4,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        hearing: Callable[[], bool] = lambda: True,
        on_missed: Callable[[str], None] = lambda reason: None,
        metrics: Metrics | None = None,
        pod_batch_seconds: float = POD_BATCH_SECONDS,
    ) -> None:
        self.kube = kube
        self.pod_batch_seconds = pod_batch_seconds
        self.metrics = metrics or getattr(kube, "metrics", None) or Metrics()
        self.workers = workers
        self.clock = clock
        self.monotonic = monotonic
        self.rng = rng or random.Random()
        self.hearing = hearing  # whether the pod watch is fresh (see vigil.kube.informer)
        self.on_missed = on_missed  # a direct read showed what the pod watch missed: repair it
        # Every job version taken into the caches (namespace, name, uid), and each deletion (uid
        # None): the admission webhook's count of jobs it admitted that the watch has not shown.
        self.on_job: Callable[[str, str, str | None], None] = lambda namespace, name, uid: None
        self.tracker = HeartbeatTracker()
        self.pods = PodCache()
        self.jobs: dict[Key, Mapping[str, Any]] = {}
        self._job_uids: dict[str, Key] = {}  # job UID -> key, of the jobs above
        self._orphan_checks: set[str] = set()  # pod UIDs whose job is being looked up
        self._looked_at: set[str] = set()  # UIDs of pods whose watched versions reached a reconcile
        self._heartbeats: dict[Key, api.Heartbeat] = {}  # each job's spec.heartbeat, parsed
        self.queue: WorkQueue[Key] = WorkQueue(
            on_add=self.metrics.workqueue_adds.labels(CONTROLLER).inc,
            on_wait=self.metrics.workqueue_queue_duration.labels(CONTROLLER).observe,
        )
        self.alarms: SilenceAlarms[Key] = SilenceAlarms(self._silence, self.queue.add, monotonic)
        self.events = EventRecorder(
            lambda job, type_, reason, message: self.kube.post_event(job, type_, reason, message),
            on_drop=self.metrics.events_dropped.inc,
        )
        self.dispatcher = Dispatcher(
            wake=self.queue.add,
            write_status=lambda namespace, name, status: self.kube.patch_queue_status(namespace, name, status),
            clock=clock,
            metrics=self.metrics,
        )
        self._failures: dict[Key, int] = {}
        self._strangers: dict[Key, Mapping[str, Any]] = {}  # pods bearing an attempt's name, not ours
        self._starting: StartingRechecks[Key] = StartingRechecks(self.queue.add, monotonic, STARTING_RECHECK_SECONDS)
        self._tasks: list[asyncio.Task] = []
        self._started = False  # start() was called: every watch has listed
        self._background: set[asyncio.Task] = set()

    # --- what the watches report --------------------------------------------------------

    def job_delta(self, delta: Delta) -> None:
        if delta.kind == "delete":
            self.job_gone(delta.obj)
        else:
            self.job_seen(delta.obj)

    def queue_delta(self, delta: Delta) -> None:
        self.dispatcher.queue_delta(delta)

    def pod_delta(self, delta: Delta) -> None:
        self.pod_changed(delta.obj, deleted=delta.kind == "delete")

    def job_seen(self, body: Mapping[str, Any], *, look: bool = True, read: bool = False) -> None:
        """A version of a job, from the watch or from a write of ours. `look`: worth a reconcile
        (not so for the write that reports a failure: the retry's backoff decides when). `read`:
        a direct read from the API server, which replaces the cache even if its resourceVersion
        is lower (an etcd restored from a backup, or one that lost a write, goes back in time)."""
        key = key_of(body)
        current = self.jobs.get(key)
        if current is not None and body["metadata"].get("resourceVersion") == current["metadata"].get(
            "resourceVersion"
        ):
            return  # the watch echoing a write of ours, or a duplicate: nothing new
        if read or current is None or not is_older(body, current):  # no older watch event undoes our write
            self.jobs[key] = body
            self._job_uids[body["metadata"]["uid"]] = key
            # Parsed once per job version, not on every heartbeat of its pods.
            self._heartbeats[key] = _parse_heartbeat(body)
            self.dispatcher.job_seen(body)
            for pod in self.pods.of_job(body["metadata"]["uid"]):
                self._note_start(key, body, pod)
            self.on_job(*key, body["metadata"]["uid"])
        if look:
            self.queue.add(key)

    def job_gone(self, body: Mapping[str, Any]) -> None:
        key = key_of(body)
        current = self.jobs.get(key)
        if current is None or current["metadata"]["uid"] != body["metadata"]["uid"]:
            return
        self._drop(key)
        # Its pods can tell nobody anything any more: let them go.
        pods = self.pods.drop_job(body["metadata"]["uid"])
        self._in_background(lambda: self._release(pods), f"releasing the pods of deleted job {key[0]}/{key[1]}")

    def _drop(self, key: Key) -> None:
        job = self.jobs.pop(key, None)
        if job is not None:
            self._job_uids.pop(job["metadata"]["uid"], None)
            self.dispatcher.job_gone(*key)
            self.on_job(*key, None)
        self._heartbeats.pop(key, None)
        self.queue.forget(key)
        self.alarms.cancel(key)
        self._failures.pop(key, None)
        self._strangers.pop(key, None)
        self._starting.clear(key)

    def pod_changed(self, pod: Mapping[str, Any], deleted: bool = False) -> None:
        """A pod of some job changed. The hot path: most events are heartbeats, which cost a few
        dictionary operations here and no reconcile; the detector's deadline wakes the job
        when its silence crosses a threshold."""
        key = _owner_key(pod)
        uid = pod["metadata"]["uid"]
        if deleted:
            self.pods.gone(job_uid_of(pod), uid)
            self.tracker.forget(uid)
            self._looked_at.discard(uid)
        else:
            previous = self.pods.get(job_uid_of(pod), uid)
            if not self.pods.watched(pod):
                return  # older than what a direct read showed
            self._check_orphan(pod)
            beats = self.tracker.beats
            beat = self.tracker.observe(pod, self.monotonic(), self.clock())
            if self.tracker.beats > beats:
                self.metrics.heartbeats.inc()
                if self.tracker.last_gap is not None:  # not the pod's first beat
                    self.metrics.heartbeat_gap.observe(self.tracker.last_gap)
            # The first version the watch shows is worth a look, whatever the cache held before.
            only_a_beat = uid in self._looked_at and previous is not None and not _more_than_a_beat(previous, pod)
            # A beat alone makes the job worth a look only if the job is in doubt (resume it now,
            # not at the next deadline) or its LAST-BEAT stamp is due.
            if only_a_beat and not (beat and key is not None and self._beat_matters(key, uid)):
                return
            self._looked_at.add(uid)
            if key is not None and (job := self.jobs.get(key)) is not None:
                self._note_start(key, job, pod)
        if key is not None:
            self.queue.add_batched(key, self.pod_batch_seconds)

    def _note_start(self, key: Key, job: Mapping[str, Any], pod: Mapping[str, Any]) -> None:
        """A pod of an attempt the job's status does not hold yet is a start made (its pod came
        first): its queue counts it as running until status shows it, after a restart too."""
        attempt = podstate.attempt_of(pod)
        recorded = int((job.get("status") or {}).get("attempts") or 0)
        if attempt is not None and attempt > recorded and podstate.is_controlled_by(pod, job["metadata"]["uid"]):
            self.dispatcher.started_unseen(*key, attempt)

    def _check_orphan(self, pod: Mapping[str, Any]) -> None:
        """A pod held by Vigil's finalizer whose job is not known (deleted while the job watch
        lagged, say): released if the API server confirms the job is gone."""
        uid = pod["metadata"]["uid"]
        if (
            not self._started  # before the first listing, jobs may simply not be listed yet
            or job_uid_of(pod) in self._job_uids
            or api.FINALIZER_ATTEMPT_TRACKING not in (pod["metadata"].get("finalizers") or [])
            or uid in self._orphan_checks
        ):
            return
        self._orphan_checks.add(uid)

        async def check() -> None:
            try:
                await self._release_orphans([pod])
            finally:
                self._orphan_checks.discard(uid)

        self._in_background(check, f"releasing pod {pod['metadata']['name']}, whose job is gone")

    def _beat_matters(self, key: Key, uid: str) -> bool:
        job = self.jobs.get(key)
        if job is None:
            return False
        status = job.get("status") or {}
        if status.get("phase") == "Uncertain":
            return True
        heartbeat = self._heartbeats[key]
        if not heartbeat.required:
            return False  # no stamp: liveness is the pod phase alone
        stored = (status.get("currentAttempt") or {}).get("lastHeartbeatAt")
        last_beat_at = self.tracker.last_beat_at(uid)
        return beat_stamp_due(dt.datetime.fromisoformat(stored) if stored else None, last_beat_at, heartbeat)

    # --- workers ------------------------------------------------------------------------

    def start(self) -> None:
        """Begin reconciling: call once every watch has listed (before, a job whose pods are not
        listed yet would look as if its pods had vanished)."""
        self._started = True
        self._tasks = [asyncio.create_task(self._work(), name=f"vigil-worker-{i}") for i in range(self.workers)]
        self.dispatcher.start()
        known = {job["metadata"]["uid"] for job in self.jobs.values()}
        orphans = [pod for uid in self.pods.job_uids() if uid not in known for pod in self.pods.of_job(uid)]
        if orphans:
            self._in_background(lambda: self._release_orphans(orphans), "releasing pods whose job is gone")

    async def stop(self) -> None:
        await self.dispatcher.stop()
        for task in [*self._tasks, *self._background]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._background, return_exceptions=True)
        await self.events.close()  # the last decisions' events, briefly, before the lease goes
        self.queue.shutdown()
        self.alarms.shutdown()
        self._starting.shutdown()

    def _in_background(self, work: Callable[[], Awaitable[None]], what: str) -> None:
        """Runs `work` apart from the work queue, retried with backoff until it succeeds (it is
        idempotent: releasing a finalizer already gone is done)."""

        async def attempts() -> None:
            for failures_so_far in range(1, 1_000_000):
                try:
                    await work()
                    return
                except Exception as err:
                    delay = failures.retry_delay(failures_so_far, self.rng)
                    log.warning("%s failed (%s); retrying in %.0fs", what, err, delay)
                    await asyncio.sleep(delay)

        task = asyncio.ensure_future(attempts())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _work(self) -> None:
        m = self.metrics
        while True:
            key = await self.queue.get()
            m.workqueue_depth.labels(CONTROLLER).set(len(self.queue))
            began, result = time.monotonic(), "success"
            try:
                await self.reconcile(key)
                if self._failures.pop(key, None):
                    await self._clear_failure(key)
            except NotFound:
                log.info("%s/%s is gone; forgetting it", *key)
                self._drop(key)
            except Conflict as err:
                in_a_row = self._failures.get(key, 0) + 1
                # One conflict is routine (the watch was a step behind); a run of them means the
                # cache and the API server disagree for longer than a watch lags: say so.
                level = logging.WARNING if in_a_row >= CONFLICTS_WORTH_A_WARNING else logging.DEBUG
                log.log(level, "conflict on %s/%s (%d in a row), reading it again: %s", *key, in_a_row, err)
                result = "requeue"
                await self._reread(key)
                self._retry(key, conflict=True)
            except Exception as err:
                result = "error"
                m.reconcile_errors.labels(CONTROLLER).inc()
                await self._report_failure(key, err)
                self._retry(key)
            finally:
                self.queue.done(key)
                elapsed = time.monotonic() - began
                m.reconcile_total.labels(CONTROLLER, result).inc()
                m.reconcile_time.labels(CONTROLLER).observe(elapsed)
                m.workqueue_work_duration.labels(CONTROLLER).observe(elapsed)

    async def _reread(self, key: Key) -> None:
        """After a conflict the cached job is older than the API server's: read it directly, so
        the next look decides on the stored version, not on the watch's promise to deliver it (a
        watch that missed that version would otherwise make every retry conflict again, and the
        job would stand still)."""
        try:
            fresh = await self.kube.read_job(*key)
        except Exception as err:  # noqa: BLE001 - the retry comes anyway, on the cache
            log.debug("could not read %s/%s again after a conflict: %s", *key, err)
            return
        if fresh is not None:  # gone: the retry's write meets the 404 and forgets it, as ever
            self.job_seen(fresh, look=False, read=True)

    def _retry(self, key: Key, *, conflict: bool = False) -> None:
        self.metrics.workqueue_retries.labels(CONTROLLER).inc()
        count = self._failures[key] = self._failures.get(key, 0) + 1
        self.queue.add_after(key, failures.retry_delay(count, self.rng, conflict=conflict))

    async def _report_failure(self, key: Key, err: Exception) -> None:
        """Show the failure on the job (condition, and one event per distinct cause)."""
        job = self.jobs.get(key)
        reason, message = _describe(err)
        if job is None:
            return
        patch, new_cause = failures.report(job, reason, message, self.clock())
        if new_cause:
            log.error("reconciling %s/%s failed: %s", *key, message, exc_info=not isinstance(err, PodCreateRefused))
        else:
            log.warning("reconciling %s/%s failed again: %s", *key, message)
        try:
            if patch is not None:
                self.job_seen(
                    await self.kube.patch_job_status(*key, job["metadata"]["resourceVersion"], patch), look=False
                )
            if new_cause:
                self.events.record(job, "Warning", reason, message)
        except Exception as report_err:  # the API server may be what fails: the retry comes anyway
            log.warning("could not report the failure on %s/%s: %s", *key, report_err)

    async def _clear_failure(self, key: Key) -> None:
        job = self.jobs.get(key)
        patch = failures.cleared(job) if job is not None else None
        if job is not None and patch is not None:
            self.job_seen(await self.kube.patch_job_status(*key, job["metadata"]["resourceVersion"], patch))

    # --- one look at one job ------------------------------------------------------------

    async def reconcile(self, key: Key) -> None:
        job = self.jobs.get(key)
        if job is None:
            return
        namespace, job_uid = key[0], job["metadata"]["uid"]
        await self._settle_unseen(namespace, job_uid)
        job = await self._recheck_starting(key, job)
        if job is None:
            return
        stranger = await self._recheck_stranger(key)
        extra = [stranger] if stranger is not None else []
        judged = self._decide(key, job, self.pods.of_job(job_uid) + extra)
        deaf = judged.deaf
        why = doubt.doubt(job, judged.decision)
        if why is not None:
            # Never on a rumour: decide again on what the API server says now.
            truth = await self._read_truth(job)
            self._take_truth(job_uid, truth)
            judged = self._decide(key, job, truth + extra)
            if doubt.doubt(job, judged.decision) != why:  # the watch missed a beat, a pod, a deletion
                self.on_missed(f"a direct read of {namespace}/{key[1]}'s pods contradicts the watch: {why}")
        wait = self.dispatcher.pace(job, judged.admission, judged.decision)
        if wait is not None:  # the queue's start rate: this start goes a little later
            self.queue.add_after(key, wait)
            return
        for action in judged.decision.actions:
            job = await self._execute(job, action)
        self._schedule(key, judged.verdicts, deaf)

    def _decide(self, key: Key, job: Mapping[str, Any], pods: list[Mapping[str, Any]]) -> Judgement:
        """The core's decision on these pods, and what it was taken on."""
        heartbeat, now, hearing = self._heartbeats[key], self.monotonic(), self.hearing()
        liveness, verdicts, deaf = {}, {}, False
        for pod in pods:
            uid = pod["metadata"]["uid"]
            verdict = self.tracker.verdict(uid, heartbeat, now)
            verdicts[uid] = verdict.state
            liveness[uid] = heard(verdict, hearing)
            deaf = deaf or liveness[uid] is not verdict
        admission = self.dispatcher.admission(*key)
        decision = lifecycle.decide(
            job,
            pods,
            self.clock(),
            may_start=admission.may_start,
            waiting=(admission.reason, admission.message),
            rng=self.rng,
            liveness=liveness,
        )
        self.dispatcher.decided(job, admission, decision)
        return Judgement(decision, deaf, admission, verdicts)

    def _schedule(self, key: Key, verdicts: Mapping[str, str], deaf: bool) -> None:
        """Sets the job's silence alarm (vigil.controllers.alarms), or wakes it soon if a Lost verdict waits
        for the watch to be fresh again. Pods the decision did not see (one it just created) are
        taken as they are now."""
        current, _ = self._silence(key)
        self.alarms.arm(key, {uid: verdicts.get(uid, state) for uid, state in current.items()})
        if deaf:
            self.queue.add_after(key, DEAF_RECHECK_SECONDS)

    def _silence(self, key: Key) -> tuple[dict[str, str], float | None]:
        """The verdict state of each of the job's pods now, and the next instant one changes if
        no beat arrives (vigil.controllers.alarms' `look`)."""
        job, heartbeat, now = self.jobs.get(key), self._heartbeats.get(key), self.monotonic()
        if job is None or heartbeat is None:
            return {}, None
        states, deadlines = {}, []
        for pod in self.pods.of_job(job["metadata"]["uid"]):
            uid = pod["metadata"]["uid"]
            states[uid] = self.tracker.verdict(uid, heartbeat, now).state
            if (deadline := self.tracker.deadline(uid, heartbeat, now)) is not None:
                deadlines.append(deadline)
        return states, min(deadlines, default=None)

    async def _read_truth(self, job: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        """The job's pods as the API server has them now. A list is served from the API
        server's watch cache (consistent reads from cache, KEP-2340), and a cache can lose an
        event (kubernetes#123072); so the current attempt's pod, if the list lacks it, is read
        by name, which the API server answers from etcd."""
        namespace, job_uid = job["metadata"]["namespace"], job["metadata"]["uid"]
        truth = await self.kube.list_job_pods(namespace, job_uid)
        current = (job.get("status") or {}).get("currentAttempt") or {}
        name = current.get("podName")
        if name and all(pod["metadata"]["name"] != name for pod in truth):
            pod = await self.kube.read_pod(namespace, name)
            if pod is not None and podstate.is_controlled_by(pod, job_uid):
                log.warning("pod %s/%s exists but the API server's list lacks it", namespace, name)
                truth.append(pod)
        return truth

    def _take_truth(self, job_uid: str, truth: list[Mapping[str, Any]]) -> None:
        """Fold a direct list of a job's pods into the caches and the detector."""
        now, wall = self.monotonic(), self.clock()
        for pod in self.pods.replace_job(job_uid, truth):
            self.tracker.forget(pod["metadata"]["uid"])
        for pod in truth:
            self.tracker.observe(pod, now, wall)

    async def _settle_unseen(self, namespace: str, job_uid: str) -> None:
        """Pods this operator created that the watch is slow to show are read directly: kept if
        they exist, dropped on 404. Never forgotten on a timer."""
        horizon = self.monotonic() - UNSEEN_CHECK_SECONDS
        for pod, created_at in self.pods.unseen(job_uid):
            if created_at > horizon:
                continue
            current = await self.kube.read_pod(namespace, pod["metadata"]["name"])
            if current is None or current["metadata"]["uid"] != pod["metadata"]["uid"]:
                self.pods.gone(job_uid, pod["metadata"]["uid"])
            else:
                self.pods.read(current)
                if self.hearing():  # a fresh watch that never showed a pod this old missed it
                    self.on_missed(f"pod {namespace}/{pod['metadata']['name']} exists and the watch never showed it")

    async def _release(self, pods: list[Mapping[str, Any]]) -> None:
        for pod in pods:
            if api.FINALIZER_ATTEMPT_TRACKING in (pod["metadata"].get("finalizers") or []):
                meta = pod["metadata"]
                await self.kube.release_pod(meta["namespace"], meta["name"], meta["uid"])

    async def _release_orphans(self, pods: list[Mapping[str, Any]]) -> None:
        """Pods whose job was deleted while no operator ran: release them once the API server
        confirms their job is gone."""
        for pod in pods:
            key = _owner_key(pod)
            job = await self.kube.read_job(*key) if key is not None else None
            if job is None or job["metadata"]["uid"] != job_uid_of(pod):
                await self._release([pod])
                self.pods.gone(job_uid_of(pod), pod["metadata"]["uid"])

    async def _execute(self, job: Mapping[str, Any], action: actions.Action) -> Mapping[str, Any]:
        """Runs one action; returns the job as it is afterwards (a status patch changes it)."""
        namespace, name = key_of(job)
        match action:
            case actions.PatchStatus(status=status, resource_version=rv):
                updated = await self.kube.patch_job_status(namespace, name, rv or "", status)
                spec = job.get("spec") or {}
                count_transition(
                    self.metrics,
                    job.get("status") or {},
                    updated.get("status") or {},
                    queue=(namespace, spec.get("queue") or api.DEFAULT_QUEUE),
                    created=job["metadata"].get("creationTimestamp"),
                    now=self.clock(),
                )
                # No look at our own write: a decision is complete, and deciding again on what it
                # wrote changes nothing (tests/unit/test_lifecycle_properties.py checks it). What
                # comes next is a watch event, a timer or a pod's change, each a look of its own.
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
                await self.kube.release_pod(namespace, pod_name, uid)
            case actions.SetDeadLetterLabel(dead_lettered=flag):
                await self.kube.patch_job_labels(namespace, name, {api.LABEL_DEAD_LETTER: "true" if flag else None})
            case actions.EmitEvent(type=type_, reason=reason, message=message):
                self.events.record(job, type_, reason, message)  # posted beside the work (vigil.kube.events)
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
        if stored is None or stored["metadata"]["uid"] != job["metadata"]["uid"]:
            raise NotFound(f"{key_of(job)} is gone")
        if stored["metadata"]["resourceVersion"] != resource_version:
            self.job_seen(stored, look=False, read=True)
            stored_rv = stored["metadata"]["resourceVersion"]
            raise Conflict(f"the job is at resourceVersion {stored_rv}, not {resource_version}")

    async def _create_pod(self, job: Mapping[str, Any], manifest: Mapping[str, Any]) -> None:
        namespace, pod_name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        try:
            created = await self.kube.create_pod(namespace, manifest)
        except Refused as err:
            if err.status in (400, 403):  # a quota, a policy, a webhook: may pass; say so and retry
                message = f"the API server refused pod {pod_name}: {err.message}"
                raise PodCreateRefused(message, status=err.status, reason=err.reason) from err
            # A template Kubernetes will not accept: say so on the job rather than crash-loop.
            attempt = int(manifest["metadata"]["labels"][api.LABEL_ATTEMPT])
            for action in lifecycle.reject_pod(job, attempt, err.message, self.clock()).actions:
                job = await self._execute(job, action)
            return
        key, job_uid = key_of(job), job["metadata"]["uid"]
        if created is not None:
            self.pods.created(created, self.monotonic())
            # Should the watch never show it (a watch can miss an event), the job is looked at
            # again once the pod counts as unseen, and read directly then.
            asyncio.get_running_loop().call_later(UNSEEN_CHECK_SECONDS + 1, self._look_if_unseen, key, job_uid)
            return
        # AlreadyExists: ours (an earlier create whose answer was lost) or a stranger's (say, a
        # leftover of a deleted job of the same name), which the core must see to refuse it; no
        # watch of this job's pods brings a stranger, as it does not carry this job's UID.
        existing = await self.kube.read_pod(namespace, pod_name)
        if existing is None:
            return
        if podstate.is_controlled_by(existing, job_uid):
            self.pods.read(existing)  # the truth, whether or not the watch ever shows it
        else:
            self._strangers[key] = existing
        self.queue.add(key)

    async def _recheck_starting(self, key: Key, job: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """A job that stays Starting has itself and its pods read from the API server every
        STARTING_RECHECK_SECONDS, rather than waiting on watches that may have lost them (a
        Pending pod has no heartbeat deadline that would catch a lost event). Returns the job to
        decide on; None if it is gone."""
        if (job.get("status") or {}).get("phase") != "Starting":
            self._starting.clear(key)
            return job
        if self._starting.due(key):
            fresh = await self.kube.read_job(*key)
            if fresh is None or fresh["metadata"]["uid"] != job["metadata"]["uid"]:
                self.job_gone(job)
                return None
            self.job_seen(fresh, look=False, read=True)
            job = self.jobs[key]
            job_uid = job["metadata"]["uid"]
            self._take_truth(job_uid, await self._read_truth(job))
            if (job.get("status") or {}).get("phase") != "Starting":
                self._starting.clear(key)
                return job
        self._starting.arm(key)
        return job

    def _look_if_unseen(self, key: Key, job_uid: str) -> None:
        if self.pods.unseen(job_uid):
            self.queue.add(key)

    async def _recheck_stranger(self, key: Key) -> Mapping[str, Any] | None:
        stranger = self._strangers.get(key)
        if stranger is None:
            return None
        current = await self.kube.read_pod(key[0], stranger["metadata"]["name"])
        if current is None or current["metadata"]["uid"] != stranger["metadata"]["uid"]:
            del self._strangers[key]
            return None
        return current
