"""The shell around the queueing core: keeps the `QueueBook` fed from the watches, wakes the
jobs it gives a start, and spaces the starts of rate-limited queues. What changed in a queue's
book goes to `on_changed` (the VigilQueue status controller writes it, `vigil.controllers.queues`).

The controller tells it what the watches show (`job_seen`, `job_gone`, `queue_delta`), asks it
before each decision whether the job may start (`permit`), tells it afterwards whether the
start was used (`decided`), and asks whether the start must wait for the queue's rate (`pace`).
It remembers, besides the book: one wake-up timer per queue, and when a rate-limited queue's next
start may go. All of it is rebuilt from the watches after a restart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from vigil import api
from vigil.core import fields
from vigil.core.actions import CreatePod, Decision, PatchStatus
from vigil.core.queueing.book import QueueBook, QueueKey, QueueSpec, Standing, StartPermit, entry_of
from vigil.core.queueing.status import queue_status
from vigil.kube.seen import Delta
from vigil.metrics import Metrics
from vigil.runtime.clock import Clock
from vigil.runtime.timers import Timers

log = logging.getLogger(__name__)

Key = tuple[str, str]


def queue_spec(body: Mapping[str, Any]) -> QueueSpec:
    """The core's view of a VigilQueue's spec (defaults as the CRD applies them)."""
    spec = api.VigilQueueSpec.model_validate(fields.spec(body))
    return QueueSpec(
        max_running=spec.max_running,
        max_queued=spec.max_queued,
        paused=spec.paused,
        retry_budget=spec.retry_budget,
        max_starts_per_second=spec.max_starts_per_second,
        retry_window_seconds=spec.retry_window_seconds,
    )


class Dispatcher:
    """Which jobs may start, per queue; see the module docstring for what it remembers.

    `wake(key)` puts a job's key in the job controller's work queue; `on_changed(queue)` hears of
    every queue whose book changed (its status may have)."""

    def __init__(
        self,
        book: QueueBook,
        *,
        wake: Callable[[Key], None],
        clock: Clock,
        metrics: Metrics,
        on_changed: Callable[[QueueKey], None] = lambda queue: None,
    ) -> None:
        self.book, self.wake, self.clock, self.metrics, self.on_changed = book, wake, clock, metrics, on_changed
        self._timers: Timers[QueueKey] = Timers(clock, self._dispatch)
        self._next_start: dict[QueueKey, float] = {}  # per rate-limited queue, when a start may go next
        self._listed = False

    def _now(self) -> float:
        # The book's times are the wall clock's: the clock the jobs' own timestamps are on.
        return self.clock.wall().timestamp()

    # --- what the watches show ------------------------------------------------------------

    def job_seen(self, body: Mapping[str, Any]) -> None:
        before = self.book.queue_of(fields.namespace(body), fields.name(body))
        entry = entry_of(body)
        self.book.observe(entry)
        if before is not None and before != entry.queue_key:
            self._dispatch(before)
        self._dispatch(entry.queue_key)

    def job_gone(self, namespace: str, name: str) -> None:
        queue = self.book.queue_of(namespace, name)
        self.book.forget(namespace, name)
        if queue is not None:
            self._dispatch(queue)
        self._tell()

    def queue_delta(self, delta: Delta) -> None:
        key = (fields.namespace(delta.obj), fields.name(delta.obj))
        if delta.kind == "delete":
            self.book.set_queue(*key, None, self._now())
            self._next_start.pop(key, None)
        else:
            try:
                spec = queue_spec(delta.obj)
            except ValueError as err:  # the CRD validates; an older stored object may not
                log.error("VigilQueue %s/%s has an invalid spec, ignored: %s", *key, err)
                return
            self.book.set_queue(*key, spec, self._now())
        # Jobs that waited for the queue to exist, or that now run unlimited, look again.
        for job_key in self.book.jobs_of(key, Standing.QUEUED):
            self.wake(job_key)
        self._dispatch(key)

    # --- before and after a decision ------------------------------------------------------------

    def permit(self, namespace: str, name: str, wants: int = 0) -> StartPermit:
        """The job's permit; `wants`: a task array's starts wanted now, which it may take at once
        when no other job of its queue waits ahead (`QueueBook.top_up`)."""
        if not self._listed:  # never before every watch listed: running would be undercounted
            return StartPermit(False, "WaitingForQueue", "the operator is still listing what runs")
        if wants:
            self.book.top_up(namespace, name, wants, self._now())
        permit = self.book.permit(namespace, name, self._now())
        if permit.reason == "RetryBudgetExhausted":
            queue = self.book.queue_of(namespace, name)
            if queue is not None:
                self.metrics.queue_budget_delays.labels(*queue).inc()
        return permit

    def started_unseen(self, namespace: str, name: str, attempt: int) -> None:
        """A pod of an attempt the job's status does not hold yet exists: a start that was made."""
        self.book.started_unseen(namespace, name, attempt, self._now())
        self._tell()

    def queue_numbers(self) -> list[tuple[str, str, dict[str, int]]]:
        """(namespace, queue, numbers) of every VigilQueue, for the metrics collector."""
        now, numbers = self._now(), []
        for key in self.book.queues():
            status = queue_status(self.book, key, now)
            spec = self.book.spec(key)
            if status is not None and spec is not None:
                numbers.append((*key, {**status.numbers(), "maxRunning": spec.max_running}))
        return numbers

    def decided(self, job: Mapping[str, Any], permit: StartPermit, decision: Decision, used: int | None = None) -> None:
        """Gives a start back when the decision reserved no attempt with it (a NoOverlap pod that
        is still there, a backoff not over), so that the next job in line gets it; `used`: how
        many of its starts a task array's decision used (the rest go back)."""
        if permit.reason != "Admitted":
            return
        namespace, name = fields.namespace(job), fields.name(job)
        if used is not None:
            if used >= permit.starts:
                return
            self.book.use(namespace, name, used, self._now())
        elif _reserves_attempt(job, decision):
            return
        else:
            self.book.release(namespace, name, self._now())
        queue = self.book.queue_of(namespace, name)
        if queue is not None:
            self._dispatch(queue)

    def pace(self, job: Mapping[str, Any], permit: StartPermit, decision: Decision) -> float | None:
        """Seconds a start must still wait under its queue's maxStartsPerSecond, or None to go now.

        The token bucket spaces the starts `dispatch` gives; the workers carry them out later, and
        a busy worker pool would bunch them up again. So the start itself (the decision that
        creates the attempt's pod) is spaced too, at most one per 1/rate seconds per queue; a start
        told to wait keeps its hold and is looked at again then. The look that records an attempt
        whose pod came first starts nothing and is not spaced: were it, each start would take two
        of the queue's slots, and a recording put off by newer starts would be put off again.
        """
        if permit.reason != "Admitted" or not _creates_attempt_pod(job, decision):
            return None
        queue = self.book.queue_of(fields.namespace(job), fields.name(job))
        spec = self.book.spec(queue) if queue is not None else None
        if queue is None or spec is None or spec.max_starts_per_second is None:
            return None
        now = self._now()
        due = self._next_start.get(queue, 0.0)
        if now < due:
            return due - now
        starts = len(decision.of_type(CreatePod)) if fields.spec(job).get("tasks") else 1
        self._next_start[queue] = now + max(1, starts) / spec.max_starts_per_second
        return None

    # --- dispatching --------------------------------------------------------------------------

    def listed(self) -> None:
        """Every watch has listed: what runs is known, starts may be given."""
        self._listed = True
        for queue in self.book.queues():
            self._dispatch(queue)

    async def start(self) -> None:
        """This process leads: starts may be given (`listed`)."""
        self.listed()

    async def stop(self) -> None:
        self._timers.shutdown()

    def _dispatch(self, queue: QueueKey) -> None:
        if self._listed:
            decision = self.book.dispatch(queue, self._now())
            for job_key in decision.start:
                self.wake(job_key)
            self._timers.cancel(queue)
            if decision.wake_at is not None:
                self._timers.set_after(queue, max(0.0, decision.wake_at - self._now()))
        self._tell()

    def _tell(self) -> None:
        for queue in self.book.take_changed():
            self.on_changed(queue)


def _creates_attempt_pod(job: Mapping[str, Any], decision: Decision) -> bool:
    """Whether the decision creates the pod of an attempt that status does not hold yet: the
    moment an attempt starts, which a queue's maxStartsPerSecond spaces."""
    creations = decision.of_type(CreatePod)
    if fields.spec(job).get("tasks"):  # an array's starts: its status holds them before its pods exist
        return bool(creations)
    before = int(fields.status(job).get("attempts") or 0)
    return any(int(fields.labels(create.manifest)[api.LABEL_ATTEMPT]) > before for create in creations)


def _reserves_attempt(job: Mapping[str, Any], decision: Decision) -> bool:
    """Whether the decision starts a new attempt: its status write reserves one, or it creates
    the pod of one that status does not hold yet (the pod first, see vigil.core.lifecycle)."""
    before = int(fields.status(job).get("attempts") or 0)
    if any(int(write.status.get("attempts") or 0) > before for write in decision.of_type(PatchStatus)):
        return True
    return _creates_attempt_pod(job, decision)
