"""The shell around the queueing core: keeps the `QueueBook` fed from the watches, wakes the
jobs it gives a start, spaces the starts of rate-limited queues, and writes each VigilQueue's
status in batches.

The controller tells it what the watches show (`job_seen`, `job_gone`, `queue_delta`), asks it
before each decision whether the job may start (`admission`), tells it afterwards whether the
start was used (`decided`), and asks whether the start must wait for the queue's rate (`pace`).
It remembers, besides the book: the VigilQueues as last seen (for their status's conditions), the
status last written per queue (so an unchanged one costs no write), one wake-up timer per queue,
and when a rate-limited queue's next start may go. All of it is rebuilt from the watches after a
restart.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from vigil import api
from vigil.core import queueing
from vigil.core.actions import CreatePod, Decision, PatchStatus
from vigil.core.conditions import set_condition
from vigil.core.queueing import Admission, QueueBook, QueueKey, Standing, queue_status, view_of
from vigil.kube.seen import Delta
from vigil.metrics import Metrics

log = logging.getLogger(__name__)

Key = tuple[str, str]
STATUS_PERIOD_SECONDS = 2.0  # a queue's status is written at most this often


def queue_spec(body: Mapping[str, Any]) -> queueing.QueueSpec:
    """The core's view of a VigilQueue's spec (defaults as the CRD applies them)."""
    spec = api.VigilQueueSpec.model_validate(body.get("spec") or {})
    return queueing.QueueSpec(
        max_running=spec.max_running,
        max_queued=spec.max_queued,
        paused=spec.paused,
        retry_budget=spec.retry_budget,
        max_starts_per_second=spec.max_starts_per_second,
    )


class Dispatcher:
    """Which jobs may start, per queue; see the module docstring for what it remembers."""

    def __init__(
        self,
        wake: Callable[[Key], None],
        write_status: Callable[[str, str, dict[str, Any]], Awaitable[Any]],
        clock: Callable[[], dt.datetime],
        metrics: Metrics | None = None,
    ) -> None:
        self.book = QueueBook()
        self.metrics = metrics or Metrics()
        self.wake = wake  # puts a job's key in the work queue
        self.write_status = write_status  # (namespace, queue, status patch)
        self.clock = clock
        self.queues: dict[QueueKey, Mapping[str, Any]] = {}
        self._written: dict[QueueKey, dict[str, Any]] = {}
        self._timers: dict[QueueKey, asyncio.TimerHandle] = {}
        self._next_start: dict[QueueKey, float] = {}  # per rate-limited queue, when a start may go next
        self._started = False
        self._writer: asyncio.Task | None = None

    def _now(self) -> float:
        return self.clock().timestamp()

    # --- what the watches show ------------------------------------------------------------

    def job_seen(self, body: Mapping[str, Any]) -> None:
        before = self.book.queue_of(body["metadata"]["namespace"], body["metadata"]["name"])
        view = view_of(body)
        self.book.observe(view)
        if before is not None and before != view.queue_key:
            self._dispatch(before)
        self._dispatch(view.queue_key)

    def job_gone(self, namespace: str, name: str) -> None:
        queue = self.book.queue_of(namespace, name)
        self.book.forget(namespace, name)
        if queue is not None:
            self._dispatch(queue)

    def queue_delta(self, delta: Delta) -> None:
        meta = delta.obj["metadata"]
        key = (meta["namespace"], meta["name"])
        if delta.kind == "delete":
            self.queues.pop(key, None)
            self._written.pop(key, None)
            self.book.set_queue(*key, None, self._now())
        else:
            try:
                spec = queue_spec(delta.obj)
            except ValueError as err:  # the CRD validates; an older stored object may not
                log.error("VigilQueue %s/%s has an invalid spec, ignored: %s", *key, err)
                return
            self.queues[key] = delta.obj
            self.book.set_queue(*key, spec, self._now())
        # Jobs that waited for the queue to exist, or that now run unlimited, look again.
        for job_key in self.book.jobs_of(key, Standing.QUEUED):
            self.wake(job_key)
        self._dispatch(key)

    # --- before and after a decision ------------------------------------------------------------

    def admission(self, namespace: str, name: str) -> Admission:
        if not self._started:  # never before every watch listed: running would be undercounted
            return Admission(False, "WaitingForQueue", "the operator is still listing what runs")
        admission = self.book.admission(namespace, name, self._now())
        if admission.reason == "RetryBudgetExhausted":
            queue = self.book.queue_of(namespace, name)
            if queue is not None:
                self.metrics.queue_budget_delays.labels(*queue).inc()
        return admission

    def started_unseen(self, namespace: str, name: str, attempt: int) -> None:
        """A pod of an attempt the job's status does not hold yet exists: a start that was made."""
        self.book.started_unseen(namespace, name, attempt, self._now())

    def queue_numbers(self) -> list[tuple[str, str, dict[str, int]]]:
        """(namespace, queue, numbers) of every VigilQueue, for the metrics collector."""
        now, numbers = self._now(), []
        for key in list(self.queues):
            status = queue_status(self.book, key, now)
            spec = self.book.spec(key)
            if status is not None and spec is not None:
                numbers.append((*key, {**status.numbers(), "maxRunning": spec.max_running}))
        return numbers

    def decided(self, job: Mapping[str, Any], admission: Admission, decision: Decision) -> None:
        """Gives a start back when the decision reserved no attempt with it (a NoOverlap pod that
        is still there, a backoff not over), so that the next job in line gets it."""
        if admission.reason != "Admitted" or _reserves_attempt(job, decision):
            return
        meta = job["metadata"]
        self.book.release(meta["namespace"], meta["name"], self._now())
        queue = self.book.queue_of(meta["namespace"], meta["name"])
        if queue is not None:
            self._dispatch(queue)

    def pace(self, job: Mapping[str, Any], admission: Admission, decision: Decision) -> float | None:
        """Seconds a start must still wait under its queue's maxStartsPerSecond, or None to go now.

        The token bucket spaces the starts `dispatch` gives; the workers carry them out later, and
        a busy worker pool would bunch them up again. So the start itself (the decision that
        creates the attempt's pod) is spaced too, at most one per 1/rate seconds per queue; a start
        told to wait keeps its hold and is looked at again then. The look that records an attempt
        whose pod came first starts nothing and is not spaced: were it, each start would take two
        of the queue's slots, and a recording put off by newer starts would be put off again.
        """
        if admission.reason != "Admitted" or not _creates_attempt_pod(job, decision):
            return None
        queue = self.book.queue_of(job["metadata"]["namespace"], job["metadata"]["name"])
        spec = self.book.spec(queue) if queue is not None else None
        if queue is None or spec is None or spec.max_starts_per_second is None:
            return None
        now = self._now()
        due = self._next_start.get(queue, 0.0)
        if now < due:
            return due - now
        self._next_start[queue] = now + 1.0 / spec.max_starts_per_second
        return None

    # --- dispatching --------------------------------------------------------------------------

    def listed(self) -> None:
        """Every watch has listed: what runs is known, starts may be given."""
        self._started = True
        for queue in list(self.book.queues()):
            self._dispatch(queue)

    def start(self) -> None:
        """`listed()`, and the status writer begins (in the running event loop)."""
        self.listed()
        self._writer = asyncio.create_task(self._write_statuses(), name="vigil-queue-status")

    async def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if self._writer is not None:
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)

    def _dispatch(self, queue: QueueKey) -> None:
        if not self._started:
            return
        decision = self.book.dispatch(queue, self._now())
        for job_key in decision.start:
            self.wake(job_key)
        timer = self._timers.pop(queue, None)
        if timer is not None:
            timer.cancel()
        if decision.wake_at is not None:
            loop = asyncio.get_running_loop()
            delay = max(0.0, decision.wake_at - self._now())
            self._timers[queue] = loop.call_later(delay, self._woken, queue)

    def _woken(self, queue: QueueKey) -> None:
        self._timers.pop(queue, None)
        self._dispatch(queue)

    # --- queue status, in batches ---------------------------------------------------------------

    async def _write_statuses(self) -> None:
        while True:
            await asyncio.sleep(STATUS_PERIOD_SECONDS)
            changed = self.book.take_changed() | {
                key
                for key in self.queues
                if self.book.count(key, Standing.QUEUED)  # the oldest wait grows
            }
            for key in changed:
                if key not in self.queues:
                    continue
                try:
                    await self._write_status(key)
                except Exception as err:  # the next round tries again
                    log.warning("could not write the status of VigilQueue %s/%s: %s", *key, err)
                    self.book.mark_changed(key)

    async def _write_status(self, key: QueueKey) -> None:
        body = self.queues.get(key)
        status = queue_status(self.book, key, self._now())
        if body is None or status is None:
            return
        now = self.clock()
        generation = int(body["metadata"].get("generation") or 1)
        conditions = [api.Condition.model_validate(c) for c in (body.get("status") or {}).get("conditions") or []]
        for condition in status.conditions:
            conditions = set_condition(
                conditions,
                type=condition.type,
                status=condition.status,  # type: ignore[arg-type]
                reason=condition.reason,
                message=condition.message,
                now=now,
                generation=generation,
            )
        patch = {
            **status.numbers(),
            "conditions": [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in conditions],
            "observedGeneration": generation,
        }
        if _without_times(patch) == _without_times(self._written.get(key)):
            return
        updated = await self.write_status(key[0], key[1], patch)
        self._written[key] = patch
        if updated is not None and key in self.queues:
            self.queues[key] = updated


def _without_times(patch: Mapping[str, Any] | None) -> Any:
    if patch is None:
        return None
    return {
        **patch,
        "conditions": [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in patch["conditions"]],
    }


def _creates_attempt_pod(job: Mapping[str, Any], decision: Decision) -> bool:
    """Whether the decision creates the pod of an attempt that status does not hold yet: the
    moment an attempt starts, which a queue's maxStartsPerSecond spaces."""
    before = int((job.get("status") or {}).get("attempts") or 0)
    creations = decision.of_type(CreatePod)
    return any(int(create.manifest["metadata"]["labels"][api.LABEL_ATTEMPT]) > before for create in creations)


def _reserves_attempt(job: Mapping[str, Any], decision: Decision) -> bool:
    """Whether the decision starts a new attempt: its status write reserves one, or it creates
    the pod of one that status does not hold yet (the pod first, see vigil.core.lifecycle)."""
    before = int((job.get("status") or {}).get("attempts") or 0)
    if any(int(write.status.get("attempts") or 0) > before for write in decision.of_type(PatchStatus)):
        return True
    return _creates_attempt_pod(job, decision)
