"""One look at one job: read the newest version the view holds and the job's pods, ask the core
what to do (`vigil.core.lifecycle.decide`), and carry it out (`Executor`).

Nothing is remembered between two looks at a job except what is in its status. The view is a
rumour, so around the decision the reconciler asks the API server directly:

- before a decision that cannot be undone (`core.doubt`), the job's pods are listed and the
  decision taken again on that list; a list that contradicts the watch has the watch repaired;
- a pod this operator created that the watch has not shown within `UNSEEN_CHECK_SECONDS` is
  read by name;
- a job left Starting has itself and its pods read every `STARTING_RECHECK_SECONDS`;
- a stranger in the way of the job's next pod is read again at each look;
- a job whose pod template the view did not keep (a large one: `core.objects.strip_job`) is
  read whole (`Kube.read_job(..., whole_template=True)`) by the look that would create a pod from it, and the
  decision taken again on that read; a small template, the common case, costs no read.

While the pod watch is not fresh, silence is no evidence: a Lost verdict is held back (the
attempt may become Uncertain) and the job looked at again soon. A failure is shown on the job
(`core.failures`: the ReconcileError condition, one event per distinct cause) and retried by the
worker with backoff.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from vigil import api
from vigil.controllers.dispatcher import Dispatcher
from vigil.controllers.jobs.alarms import SilenceAlarms
from vigil.controllers.jobs.executor import UNSEEN_CHECK_SECONDS, Executor, PodCreateRefused
from vigil.controllers.jobs.handlers import JobEvents
from vigil.controllers.jobs.pulled import Pulled
from vigil.controllers.jobs.rechecks import StartingRechecks
from vigil.controllers.jobs.view import ClusterView
from vigil.controllers.worker import AfterFailure
from vigil.core import actions, doubt, failures, fields, lifecycle, podstate
from vigil.core.fields import Job, Pod
from vigil.core.liveness import actionable
from vigil.core.manifest import BeatChannel
from vigil.core.objects import Key, kept_copy, template_dropped
from vigil.core.queueing.book import StartPermit
from vigil.core.tasks.array import ArrayDecision, decide_array, is_array, wants_now
from vigil.kube.errors import Conflict, NotFound, Refused
from vigil.kube.events import EventRecorder
from vigil.kube.operations import Kube
from vigil.runtime import logs
from vigil.runtime.clock import Clock
from vigil.runtime.memory import give_back
from vigil.runtime.workqueue import WorkQueue

log = logging.getLogger(__name__)

# A job left Starting this long has itself and its pods read directly: a watch can miss an event
# (kubernetes#123072), and a Pending pod has no heartbeat deadline that would catch it.
STARTING_RECHECK_SECONDS = 30.0
# Conflicts on one job in a row before they are logged as a warning rather than at debug level.
CONFLICTS_WORTH_A_WARNING = 3
# How soon a job whose Lost verdict was held back (the pod watch not fresh) is looked at again.
HELD_BACK_RECHECK_SECONDS = 2.0
# The least time between two looks at one task array that wrote its status: an array's status is
# written at most 1/ARRAY_LOOK_SECONDS times a second however many of its tasks end, and each
# look records every task that ended since the last (docs/design.md, "Task arrays").
ARRAY_LOOK_SECONDS = 0.5
# The most writes of one look in flight at once (a task array's releases, or its pods' creations).
CONCURRENT_WRITES = 16


def _batches(steps: tuple[actions.Action, ...]) -> list[list[actions.Action]]:
    """A decision's actions in order, with each run of releases, and each run of pod creations,
    made one batch that may go side by side (the order between them, and everything else, kept)."""
    batches: list[list[actions.Action]] = []
    for action in steps:
        kind = type(action)
        if batches and kind in _SIDE_BY_SIDE and type(batches[-1][0]) is kind:
            batches[-1].append(action)
        else:
            batches.append([action])
    return batches


_SIDE_BY_SIDE = (actions.ReleasePod, actions.CreatePod)


def read_is_the_fence(decision: actions.Decision, read_version: str | None) -> actions.Decision:
    """`decision` without a first ConfirmVersion of `read_version`: a decision taken on a job
    just read from the API server is fenced by that read, and confirming it would read the
    whole job (its template too) again."""
    first = decision.actions[0] if decision.actions else None
    if isinstance(first, actions.ConfirmVersion) and first.resource_version == read_version:
        return actions.Decision(decision.actions[1:])
    return decision


class Decided(NamedTuple):
    """A decision and what it was taken on."""

    decision: actions.Decision
    held_back: bool  # a Lost verdict was held back because the pod watch is not fresh
    permit: StartPermit  # the queue's say
    states: dict[str, str]  # the detector's state of each pod, by UID (for the silence alarm)
    array: ArrayDecision | None = None  # a task array's decision, with what it did with its starts


def failure_condition(err: Exception) -> tuple[str, str]:
    """(reason, message) for the ReconcileError condition."""
    if isinstance(err, PodCreateRefused):
        return "PodCreateRefused", f"{err.message}; retrying with backoff"
    if isinstance(err, Refused):
        return "WriteRefused", f"the API server refused a write: {err.message}"
    return "ReconcileFailed", f"reconciling failed: {type(err).__name__}: {str(err)[:1000]}"


class JobReconciler:
    """`pods_fresh()` says whether the pod watch can be believed now; `repair(reason)` has it
    listed again (a direct read showed what it missed)."""

    def __init__(
        self,
        kube: Kube,
        view: ClusterView,
        queue: WorkQueue[Key],
        dispatcher: Dispatcher,
        handlers: JobEvents,
        executor: Executor,
        events: EventRecorder,
        *,
        clock: Clock,
        rng: random.Random | None = None,
        pods_fresh: Callable[[], bool] = lambda: True,
        repair: Callable[[str], None] = lambda reason: None,
        beat_channel: BeatChannel | None = None,
        agent_image: str | None = None,
        task_outcomes: Callable[[str, str, str, int], None] = lambda *outcome: None,
        pulled: Pulled | None = None,
    ) -> None:
        """`task_outcomes(namespace, queue, outcome, count)` hears what each task array's look did
        with its tasks (Succeeded, DeadLettered, Retried): `Metrics.task_outcome`."""
        self.kube, self.view, self.queue, self.dispatcher = kube, view, queue, dispatcher
        self.handlers, self.executor, self.events = handlers, executor, events
        self.clock = clock
        self.rng = rng or random.Random()
        self.pods_fresh, self.repair = pods_fresh, repair
        self.beat_channel, self.agent_image = beat_channel, agent_image
        self.alarms: SilenceAlarms[Key] = SilenceAlarms(self._silence, queue.add, clock)
        self.rechecks: StartingRechecks[Key] = StartingRechecks(queue.add, clock, STARTING_RECHECK_SECONDS)
        self.array_look_seconds = ARRAY_LOOK_SECONDS
        self._next_array_look: dict[Key, float] = {}  # per array that wrote, the soonest next look
        self.task_outcomes = task_outcomes
        self.pulled = pulled or Pulled(clock, queue.add)

    def forget(self, key: Key) -> None:
        self.alarms.cancel(key)
        self.rechecks.clear(key)
        self._next_array_look.pop(key, None)

    def shutdown(self) -> None:
        self.alarms.shutdown()
        self.rechecks.shutdown()

    # --- the worker's questions -----------------------------------------------------------

    async def reconcile(self, key: Key) -> None:
        if await self._look(key):
            give_back()  # what the read's parse and the pod's manifest grew the heap by, now freed

    async def _look(self, key: Key) -> bool:
        """One look; True if it read the job whole for its template."""
        job = self.view.job(key)
        if job is None:
            return False
        if is_array(job):
            due = self._next_array_look.get(key)
            now = self.clock.monotonic()
            if due is not None and now < due:
                self.queue.add_after(key, due - now)  # this look comes at its time, with all that ended by then
                return False
        logs.bind(attempt=(job.get("status") or {}).get("attempts") or None)  # the latest attempt, if any
        if fields.spec(job).get("pool"):
            await self._look_pulled(key, job)
            return False
        namespace, job_uid = key[0], fields.uid(job)
        await self._settle_unseen(namespace, job_uid)
        job = await self._recheck_starting(key, job)
        if job is None:
            return False
        stranger = await self._recheck_stranger(key)
        extra = [stranger] if stranger is not None else []
        pods = self.view.pods.of_job((namespace, job_uid)) + extra
        looked_at = job
        decided = self._decide(key, job, pods)
        job, decided = await self._with_template(key, job, pods, decided)
        if job is None:
            return False
        held_back = decided.held_back
        why = doubt.doubt(job, decided.decision)
        if why is not None:
            # Never on a rumour: decide again on what the API server says now.
            read = await self.read_pods(job)
            self._take_pods_read((namespace, job_uid), read)
            decided = self._decide(key, job, read + extra)
            if doubt.doubt(job, decided.decision) != why:  # the watch missed a beat, a pod, a deletion
                self.repair(f"a direct read of {namespace}/{key[1]}'s pods contradicts the watch: {why}")
            job, decided = await self._with_template(key, job, read + extra, decided)
            if job is None:
                return False
        if template_dropped(job) and decided.decision.of_type(actions.CreatePod):
            # Not reached (_with_template reads the template first): a pod made from the marker
            # would have no containers, and its refusal would dead-letter the job.
            raise RuntimeError(f"a pod of {namespace}/{key[1]} was to be made from a template not kept")
        read_whole = job is not looked_at
        if read_whole:
            # Decided on the job read whole; the actions carry it as the view keeps it (nothing
            # of theirs reads the template, and an event waiting in the recorder's backlog holds
            # the job it is about).
            job = kept_copy(dict(job))
        wait = self.dispatcher.pace(job, decided.permit, decided.decision)
        if wait is not None:  # the queue's start rate: this start goes a little later
            self.queue.add_after(key, wait)
            return read_whole
        for batch in _batches(decided.decision.actions):
            if len(batch) == 1:
                job = await self.executor.execute(job, batch[0])
            else:
                await self._execute_together(job, batch)
        if decided.array is not None:
            if decided.decision.of_type(actions.PatchStatus):
                self._next_array_look[key] = self.clock.monotonic() + self.array_look_seconds
            queue = fields.spec(job).get("queue") or api.DEFAULT_QUEUE
            for outcome, count in decided.array.outcomes.items():
                self.task_outcomes(key[0], queue, outcome, count)
        self._schedule(key, decided.states, held_back)
        return read_whole

    async def _look_pulled(self, key: Key, job: Job) -> None:
        """One look at a pulled array (spec.pool): its pods are the virtual ones of its leases,
        which are the leader's own memory, not a rumour (no direct read, no template); the
        decision's actions on them go to the lease state after the write that fences them."""
        pulled = self.pulled
        wall = self.clock.wall()
        pods = pulled.pods_of(key, job)
        permit = self.dispatcher.permit(*key, wants_now(job, pods, wall))
        array = decide_array(
            job,
            pods,
            wall,
            rng=self.rng,
            starts=permit.starts if permit.may_start else 0,
            waiting=(permit.reason, permit.message),
            liveness=pulled.liveness(job),
        )
        self.dispatcher.decided(job, permit, array.decision, used=array.starts_used)
        wait = self.dispatcher.pace(job, permit, array.decision)
        if wait is not None:
            self.queue.add_after(key, wait)
            return
        for action in array.decision.actions:
            if not pulled.carry_out(job, action):
                job = await self.executor.execute(job, action)
        if array.decision.of_type(actions.PatchStatus):
            self._next_array_look[key] = self.clock.monotonic() + self.array_look_seconds
        queue = fields.spec(job).get("queue") or api.DEFAULT_QUEUE
        for outcome, count in array.outcomes.items():
            self.task_outcomes(key[0], queue, outcome, count)
        delay = pulled.next_change(job)
        if delay is not None:  # a silent worker's leases turn Uncertain, then Lost, with no event
            self.queue.add_after(key, delay)

    async def _execute_together(self, job: Job, batch: list[actions.Action]) -> None:
        """Runs releases (or creations) of one decision side by side, at most CONCURRENT_WRITES at
        once: a task array's look may release and create a hundred pods, one after the other
        seconds of round trips. None of them changes the job; each waits for the fence before
        it, and the first failure is raised once all have ended (the next look redoes the rest)."""
        gate = asyncio.Semaphore(CONCURRENT_WRITES)

        async def one(action: actions.Action) -> None:
            async with gate:
                await self.executor.execute(job, action)

        results = await asyncio.gather(*(one(action) for action in batch), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def failed(self, key: Key, err: Exception, in_a_row: int) -> AfterFailure:
        if isinstance(err, NotFound):
            log.info("%s/%s is gone; forgetting it", *key)
            self.handlers.job_vanished(key)
            return AfterFailure.FORGET
        if isinstance(err, Conflict):
            # One conflict is routine (the watch was a step behind); a run of them means the
            # view and the API server disagree for longer than a watch lags: say so.
            level = logging.WARNING if in_a_row >= CONFLICTS_WORTH_A_WARNING else logging.DEBUG
            log.log(level, "conflict on %s/%s (%d in a row), reading it again: %s", *key, in_a_row, err)
            await self._read_again(key)
            return AfterFailure.CONFLICT
        await self._report_failure(key, err)
        return AfterFailure.ERROR

    async def recovered(self, key: Key) -> None:
        job = self.view.job(key)
        patch = failures.cleared(job) if job is not None else None
        if job is not None and patch is not None:
            self.handlers.job_seen(await self.kube.patch_job_status(*key, fields.resource_version(job), patch))

    # --- deciding -------------------------------------------------------------------------

    def _decide(self, key: Key, job: Job, pods: list[Pod]) -> Decided:
        """The core's decision on these pods, and what it was taken on."""
        view = self.view
        heartbeat, now, fresh = view.heartbeats[key], self.clock.monotonic(), self.pods_fresh()
        liveness, states, held_back = {}, dict[str, str](), False
        array_job = is_array(job)
        for pod in pods:
            if array_job and podstate.is_finished(pod):
                continue  # an ended task's pod has no liveness to read, and a large array has thousands
            uid = fields.uid(pod)
            heard = view.tracker.liveness(uid, heartbeat, now)
            states[uid] = heard.state
            liveness[uid] = actionable(heard, fresh)
            held_back = held_back or liveness[uid] is not heard
        permit = self.dispatcher.permit(*key, wants_now(job, pods, self.clock.wall()) if array_job else 0)
        if array_job:
            array = decide_array(
                job,
                pods,
                self.clock.wall(),
                rng=self.rng,
                starts=permit.starts if permit.may_start else 0,
                waiting=(permit.reason, permit.message),
                liveness=liveness,
                beat_channel=self.beat_channel,
                agent_image=self.agent_image,
            )
            self.dispatcher.decided(job, permit, array.decision, used=array.starts_used)
            return Decided(array.decision, held_back, permit, states, array)
        decision = lifecycle.decide(
            job,
            pods,
            self.clock.wall(),
            may_start=permit.may_start,
            waiting=(permit.reason, permit.message),
            rng=self.rng,
            liveness=liveness,
            beat_channel=self.beat_channel,
            agent_image=self.agent_image,
            stamp_floor=view.stamp_floor(),
        )
        self.dispatcher.decided(job, permit, decision)
        return Decided(decision, held_back, permit, states)

    async def _with_template(
        self, key: Key, job: Job, pods: list[Pod], decided: Decided
    ) -> tuple[Mapping[str, Any] | None, Decided]:
        """The job to carry `decided` out on, and the decision: as given, unless the decision
        creates a pod and the view did not keep the job's template. Then the job is read from the
        API server whole, and decided on again (the same pods): that read is the version the
        decision is fenced on, and the template the pod is made of, as the job is now (a redrive,
        an edit, a new job of the same name since the view heard of it). The view takes the read,
        trimmed. (None, decided) if the job is gone, or is another job now."""
        if not template_dropped(job) or not decided.decision.of_type(actions.CreatePod):
            return job, decided
        whole = await self.kube.read_job(*key, whole_template=True)
        if whole is None or fields.uid(whole) != fields.uid(job):
            self.handlers.job_gone(job)
            if whole is not None:  # a new job of that name: a look of its own
                self.handlers.job_seen(kept_copy(whole), read=True)
            return None, decided
        self.handlers.job_seen(kept_copy(whole), look=False, read=True)
        again = self._decide(key, whole, pods)
        return whole, again._replace(decision=read_is_the_fence(again.decision, fields.resource_version(whole)))

    def _schedule(self, key: Key, states: Mapping[str, str], held_back: bool) -> None:
        """Sets the job's silence alarm, or wakes it soon if a Lost verdict waits for the pod
        watch to be fresh again. Pods the decision did not see (one it just created) are taken
        as they are now."""
        current, _ = self._silence(key)
        self.alarms.arm(key, {uid: states.get(uid, state) for uid, state in current.items()})
        if held_back:
            self.queue.add_after(key, HELD_BACK_RECHECK_SECONDS)

    def _silence(self, key: Key) -> tuple[dict[str, str], float | None]:
        """The liveness state of each of the job's pods now, and the next instant one changes if
        no beat arrives (the silence alarm's `look`)."""
        view = self.view
        job, heartbeat, now = view.job(key), view.heartbeats.get(key), self.clock.monotonic()
        if job is None or heartbeat is None:
            return {}, None
        states: dict[str, str] = {}
        deadlines: list[float] = []
        array_job = is_array(job)
        for pod in view.pods.of_job((key[0], fields.uid(job))):
            if array_job and podstate.is_finished(pod):
                continue  # as in _decide
            uid = fields.uid(pod)
            states[uid] = view.tracker.liveness(uid, heartbeat, now).state
            if (deadline := view.tracker.deadline(uid, heartbeat, now)) is not None:
                deadlines.append(deadline)
        return states, min(deadlines, default=None)

    # --- asking the API server ------------------------------------------------------------

    async def read_pods(self, job: Job) -> list[Pod]:
        """The job's pods as the API server has them now. A list is served from the API
        server's watch cache (consistent reads from cache, KEP-2340), and a cache can lose an
        event (kubernetes#123072); so the current attempt's pod, if the list lacks it, is read
        by name, which the API server answers from etcd."""
        namespace, job_uid = fields.namespace(job), fields.uid(job)
        pods: list[Pod] = list(await self.kube.list_job_pods(namespace, job_uid))
        current = fields.status(job).get("currentAttempt") or {}
        name = current.get("podName")
        if name and all(fields.name(pod) != name for pod in pods):
            pod = await self.kube.read_pod(namespace, name)
            if pod is not None and podstate.belongs_to(pod, namespace, job_uid):
                log.warning("pod %s/%s exists but the API server's list lacks it", namespace, name)
                pods.append(pod)
        return pods

    def _take_pods_read(self, job: tuple[str, str], pods: list[Pod]) -> None:
        """Folds a direct list of a job's pods (namespace, job UID) into the view and the
        detector; a listed pod that is not the job's (`podstate.belongs_to`) is not taken."""
        view, now, wall = self.view, self.clock.monotonic(), self.clock.wall()
        for pod in view.pods.replace_job(job, pods):
            view.tracker.forget(fields.uid(pod))
        for pod in pods:
            if podstate.belongs_to(pod, *job) and not view.pods.is_settled(job, fields.uid(pod)):
                view.tracker.observe(pod, now, wall)

    async def _settle_unseen(self, namespace: str, job_uid: str) -> None:
        """Pods this operator created that the watch is slow to show are read directly: kept if
        they exist, dropped on 404. Never forgotten on a timer."""
        pods, job = self.view.pods, (namespace, job_uid)
        horizon = self.clock.monotonic() - UNSEEN_CHECK_SECONDS
        for pod, created_at in pods.unseen(job):
            if created_at > horizon:
                continue
            current = await self.kube.read_pod(namespace, fields.name(pod))
            if current is None or fields.uid(current) != fields.uid(pod):
                pods.gone(job, fields.uid(pod))
            else:
                pods.read(current)
                if self.pods_fresh():  # a fresh watch that never showed a pod this old missed it
                    self.repair(f"pod {namespace}/{pod['metadata']['name']} exists and the watch never showed it")

    async def _recheck_starting(self, key: Key, job: Job) -> Mapping[str, Any] | None:
        """A job that stays Starting has itself and its pods read from the API server every
        STARTING_RECHECK_SECONDS. Returns the job to decide on; None if it is gone."""
        if fields.phase(job) != "Starting":
            self.rechecks.clear(key)
            return job
        if self.rechecks.due(key):
            stored = await self.kube.read_job(*key)
            if stored is None or fields.uid(stored) != fields.uid(job):
                self.handlers.job_gone(job)
                return None
            self.handlers.job_seen(stored, look=False, read=True)
            job = self.view.jobs[key]
            self._take_pods_read((key[0], fields.uid(job)), await self.read_pods(job))
            if fields.phase(job) != "Starting":
                self.rechecks.clear(key)
                return job
        self.rechecks.arm(key)
        return job

    async def _recheck_stranger(self, key: Key) -> Pod | None:
        stranger = self.view.strangers.get(key)
        if stranger is None:
            return None
        current = await self.kube.read_pod(key[0], fields.name(stranger))
        if current is None or fields.uid(current) != fields.uid(stranger):
            del self.view.strangers[key]
            return None
        return current

    async def _read_again(self, key: Key) -> None:
        """After a conflict the job in the view is older than the API server's: read it, so the
        next look decides on the stored version, not on the watch's promise to deliver it (a
        watch that missed that version would otherwise make every retry conflict again, and the
        job would stand still)."""
        try:
            stored = await self.kube.read_job(*key)
        except Exception as err:  # noqa: BLE001 - the retry comes anyway, on the view
            log.debug("could not read %s/%s again after a conflict: %s", *key, err)
            return
        if stored is not None:  # gone: the retry's write meets the 404 and forgets it, as ever
            self.handlers.job_seen(stored, look=False, read=True)

    async def _report_failure(self, key: Key, err: Exception) -> None:
        """Shows the failure on the job (condition, and one event per distinct cause)."""
        job = self.view.job(key)
        reason, message = failure_condition(err)
        if job is None:
            return
        patch, new_cause = failures.report(job, reason, message, self.clock.wall())
        if new_cause:
            log.error("reconciling %s/%s failed: %s", *key, message, exc_info=not isinstance(err, PodCreateRefused))
        else:
            log.warning("reconciling %s/%s failed again: %s", *key, message)
        try:
            if patch is not None:
                self.handlers.job_seen(
                    await self.kube.patch_job_status(*key, fields.resource_version(job), patch), look=False
                )
            if new_cause:
                self.events.record(job, "Warning", reason, message)
        except Exception as report_err:  # the API server may be what fails: the retry comes anyway
            log.warning("could not report the failure on %s/%s: %s", *key, report_err)
