"""The queue book: every queue's line, capacity, start rate and retry budget, and the starts it
gives (`QueueBook.dispatch`), in memory, rebuilt from the jobs' statuses after a restart."""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from vigil.api import ANNOTATION_REDRIVE, ANNOTATION_REDRIVE_TASKS, BLOCKED_REASONS, DEFAULT_QUEUE
from vigil.core import fields
from vigil.core.queueing.heap import LazyHeap
from vigil.core.queueing.limits import RETRY_WINDOW_SECONDS, RetryWindow, TokenBucket, retry_floor

# A start the shell gave back (the job's decision reserved no attempt: a NoOverlap pod still
# there, say) is not offered to the same job again sooner than this, so the two cannot loop.
RELEASE_RECHECK_SECONDS = 1.0

HEAD_OF_LINE = 5
# The starts of a job whose queue sets no limit: a task array is then bound by its parallelism alone.
UNLIMITED_STARTS = 1 << 30  # names of the next jobs to start shown in the queue's status


@dataclass(frozen=True)
class QueueSpec:
    """A VigilQueue's spec: maxRunning, maxQueued, paused, retryBudget, retryWindowSeconds,
    maxStartsPerSecond."""

    max_running: int = 100
    max_queued: int = 10_000
    paused: bool = False
    retry_budget: float = 0.2
    max_starts_per_second: float | None = None
    retry_window_seconds: int = RETRY_WINDOW_SECONDS

    def __post_init__(self) -> None:
        if self.max_running < 0 or self.max_queued < 0:
            raise ValueError("maxRunning and maxQueued must be >= 0")
        if not 0.0 <= self.retry_budget <= 1.0:
            raise ValueError(f"retryBudget must be in [0, 1], not {self.retry_budget}")
        if self.max_starts_per_second is not None and not self.max_starts_per_second > 0:
            raise ValueError(f"maxStartsPerSecond must be > 0 (or null), not {self.max_starts_per_second}")
        if self.retry_window_seconds < 1:
            raise ValueError(f"retryWindowSeconds must be >= 1, not {self.retry_window_seconds}")

    @property
    def retry_floor(self) -> int:
        return retry_floor(self.max_running)


def order_key(priority: int, created: float, name: str) -> tuple[int, float, str]:
    """A job's place in its queue: priority (high first), then creation time, then name."""
    return (-priority, created, name)


class Standing(StrEnum):
    """Where a job stands for its queue; the values are the queue status's counters."""

    QUEUED = "queued"  # wants to start an attempt (new, resumed, redriven, or a due retry waiting)
    BACKING_OFF = "backingOff"  # waits out its backoff; joins the line when nextAttemptAt comes
    RUNNING = "running"  # an attempt in Starting, Running or Uncertain
    DEAD_LETTERED = "deadLettered"


@dataclass(frozen=True, slots=True)
class QueueEntry:
    """What a queue needs to know of one job, read from the job as the cluster holds it.

    standing: None for a job its queue no longer tracks (succeeded, suspended, being deleted).
    attempts: status.attempts; a start is confirmed when the job shows more than it had.
    is_retry: the next attempt follows an earlier one of the same round (a failure, a Lost or
        a disruption), as opposed to a first attempt, a redrive or a resume.
    ready_at: status.nextAttemptAt: the job may not start before it.
    blocked: the job waits for something of its own (under NoOverlap, an earlier attempt's pod
        to be gone), not for the queue: it is counted, not offered a start.
    """

    namespace: str
    name: str
    queue: str
    priority: int
    created: float
    standing: Standing | None
    attempts: int = 0
    is_retry: bool = False
    ready_at: float | None = None
    blocked: bool = False
    # A task array (spec.tasks) counts in tasks, not as one job: how many starts it wants now, and
    # its tasks by standing (running, queued, backingOff, deadLettered). None for a plain job.
    wants: int = 1
    units: tuple[tuple[str, int], ...] | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def queue_key(self) -> tuple[str, str]:
        return (self.namespace, self.queue)

    @property
    def order(self) -> tuple[int, float, str]:
        return order_key(self.priority, self.created, self.name)

    @property
    def waiting_since(self) -> float:
        """When it began to wait for the queue: its retry's due time, else its creation."""
        return self.ready_at if self.ready_at is not None else self.created


def entry_of(job: Mapping[str, Any]) -> QueueEntry:
    """The queue's entry of a VigilJob as read from the API server (a dict on the wire format).

    It reads the state the job's next decision starts from: a job about to be resumed (suspend
    turned off) or redriven (a new vigil.dev/redrive value) is already QUEUED, since that same
    decision may start its attempt.
    """
    meta, spec, status = fields.metadata(job), fields.spec(job), fields.status(job)
    if spec.get("tasks"):
        return _array_entry(job, meta, spec, status)
    standing, fresh_round = _standing(meta, spec, status)
    return QueueEntry(
        namespace=fields.namespace(job),
        name=fields.name(job),
        queue=spec.get("queue") or DEFAULT_QUEUE,
        priority=int(spec.get("priority") or 0),
        created=_epoch(fields.creation_timestamp(job)) or 0.0,
        standing=standing,
        attempts=int(status.get("attempts") or 0),
        # startedAt is the round's first start; lifecycle resets it on redrive and resume
        is_retry=not fresh_round and status.get("startedAt") is not None,
        ready_at=_epoch(status.get("nextAttemptAt")),
        blocked=status.get("reason") in BLOCKED_REASONS and not status.get("currentAttempt"),
    )


def _array_entry(
    job: Mapping[str, Any], meta: Mapping[str, Any], spec: Mapping[str, Any], status: Mapping[str, Any]
) -> QueueEntry:
    """The queue's entry of a task array: its tasks count as jobs do (each running task toward
    maxRunning, each waiting one toward maxQueued), and it wants as many starts as it has tasks
    ready and room under parallelism."""
    tasks = status.get("tasks") or {}
    spec_tasks = spec.get("tasks") or {}
    total = int(tasks.get("total") or spec_tasks.get("count") or len(spec_tasks.get("items") or ()) or 0)
    active = tasks.get("active") or []
    running = sum(1 for task in active if task.get("currentAttempt"))
    backing_off = [task for task in active if task.get("phase") == "BackingOff"]
    waiting = [task for task in active if task.get("phase") == "Queued"]
    occupied = sum(1 for task in active if task.get("phase") != "Suspended")
    done = int(tasks.get("succeeded") or 0) + int(tasks.get("deadLettered") or 0)
    fresh = max(0, total - done - len(active))
    parallelism = int(spec_tasks.get("parallelism") or 10)
    new = min(fresh, max(0, parallelism - occupied))
    annotations = meta.get("annotations") or {}
    phase, redrive = status.get("phase"), annotations.get(ANNOTATION_REDRIVE)
    some = annotations.get(ANNOTATION_REDRIVE_TASKS)
    redriven = (phase == "DeadLettered" and bool(redrive) and redrive != status.get("lastRedrive")) or (
        bool(some) and some != tasks.get("lastRedrive") and int(tasks.get("deadLettered") or 0) > 0
    )
    units = (
        (Standing.RUNNING.value, running),
        (Standing.QUEUED.value, fresh + len(waiting)),
        (Standing.BACKING_OFF.value, len(backing_off)),
        (Standing.DEAD_LETTERED.value, int(tasks.get("deadLettered") or 0)),
    )
    standing: Standing | None
    if meta.get("deletionTimestamp") or spec.get("suspend") or phase == "Succeeded":
        standing = None
    elif phase == "DeadLettered" and not redriven:
        standing = Standing.DEAD_LETTERED
    elif redriven or new or waiting:
        standing = Standing.QUEUED
    elif backing_off:
        standing = Standing.BACKING_OFF
    else:
        standing = Standing.RUNNING
    ready = [_epoch(task.get("nextAttemptAt")) for task in backing_off]
    wants = (new + len(waiting) + len(backing_off)) if not redriven else max(1, parallelism)
    return QueueEntry(
        namespace=fields.namespace(job),
        name=fields.name(job),
        queue=spec.get("queue") or DEFAULT_QUEUE,
        priority=int(spec.get("priority") or 0),
        created=_epoch(fields.creation_timestamp(job)) or 0.0,
        standing=standing,
        attempts=int(status.get("attempts") or 0),
        # its retries alone wait for the retry budget: a new task is a first attempt
        is_retry=standing is Standing.BACKING_OFF or (standing is Standing.QUEUED and not new and not redriven),
        ready_at=min((r for r in ready if r is not None), default=None) if standing is Standing.BACKING_OFF else None,
        wants=wants,
        units=units,
    )


def _standing(
    meta: Mapping[str, Any], spec: Mapping[str, Any], status: Mapping[str, Any]
) -> tuple[Standing | None, bool]:
    """The job's standing, and whether its next decision begins a new round (resume, redrive)."""
    phase = status.get("phase")
    if meta.get("deletionTimestamp") or spec.get("suspend") or phase == "Succeeded":
        return None, False
    if status.get("currentAttempt"):
        return Standing.RUNNING, False
    if phase == "DeadLettered":
        redrive = (meta.get("annotations") or {}).get(ANNOTATION_REDRIVE)
        if redrive and redrive != status.get("lastRedrive"):
            return Standing.QUEUED, True
        return Standing.DEAD_LETTERED, False
    if phase == "BackingOff":
        return Standing.BACKING_OFF, False
    return Standing.QUEUED, phase == "Suspended"  # new (no phase yet), Queued, or about to resume


def _standing_of(job: _Job) -> Standing | None:
    """Where a job stands, holding a start aside (None while it holds one)."""
    return job.entry.standing if job.hold is None else None


def _epoch(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value)).timestamp()


QueueKey = tuple[str, str]  # (namespace, VigilQueue name)
JobKey = tuple[str, str]  # (namespace, VigilJob name)


@dataclass(frozen=True)
class Dispatch:
    """What one look at a queue decided.

    start: the jobs given a start, in order; each is held for its job until the job shows the
        attempt in status (`observe`) or the shell gives it back (`release`).
    wake_at: when to look at the queue again although no job changes (a token refills, the
        retry budget frees up, a backoff ends while there is room); None: only a change wakes it.
    """

    start: tuple[JobKey, ...] = ()
    wake_at: float | None = None


@dataclass(frozen=True)
class StartPermit:
    """A job's answer from its queue: may it start an attempt now, and if not, why.

    reason: Admitted (held for it), NoQueue (no `default` VigilQueue: unlimited), QueueNotFound,
        QueuePaused, QueueSaturated, RetryBudgetExhausted, StartRateLimited, WaitingForQueue
        (its turn has not come).
    retry_at: when the budget or the rate limit lets it go, if that is why it waits.
    """

    may_start: bool
    reason: str
    message: str
    retry_at: float | None = None
    starts: int = 1  # how many attempts it may start (a task array may start several)


@dataclass(slots=True)
class _Hold:
    attempt: int  # the status.attempts that shows the start happened
    second: int  # where the retry window counted it, to take it back
    retry: bool
    units: int = 1  # starts held (a task array's several)


@dataclass(slots=True)
class _Job:
    entry: QueueEntry
    hold: _Hold | None = None
    not_before: float = -math.inf  # after a release (RELEASE_RECHECK_SECONDS)
    tally: tuple[tuple[str, int], ...] = ()  # what it adds to the status counters


@dataclass
class _Queue:
    spec: QueueSpec | None = None
    jobs: dict[str, _Job] = field(default_factory=dict)
    firsts: LazyHeap = field(default_factory=LazyHeap)  # due first attempts, by order_key
    retries: LazyHeap = field(default_factory=LazyHeap)  # due retries, by order_key
    pending: LazyHeap = field(default_factory=LazyHeap)  # not yet due, by (due time, name)
    ages: LazyHeap = field(default_factory=LazyHeap)  # QUEUED jobs, by (waiting_since, name)
    counts: dict[str, int] = field(default_factory=lambda: {s.value: 0 for s in Standing})
    bucket: TokenBucket | None = None
    window: RetryWindow = field(default_factory=RetryWindow)

    @property
    def running(self) -> int:
        return self.counts[Standing.RUNNING]


class QueueBook:
    """Every queue's line, capacity, start rate and retry budget, kept in memory by the shell.

    Remembers, per (namespace, queue name):
    - the queue's spec (`set_queue`), or None while no VigilQueue of that name exists;
    - the entry of each job naming it that is not finished (`observe`; `forget` on deletion):
      the jobs waiting in order, those backing off, running and dead-lettered, with their counts;
    - holds: starts given by `dispatch` (or seen made, `started_unseen`) to jobs whose status
      does not show the attempt yet.
      They count as running, so concurrent reconciles cannot overshoot maxRunning in the time
      between a start and the watch echoing it; a hold ends when an observation shows the job's
      attempt number past it (a stale event cannot end it) or on `release`;
    - the token bucket and the retry window (RetryWindow: 2 x retryWindowSeconds integers).
    Bounds: O(jobs tracked), one small record each (plus heap arrays of at most 2 x live + 64
    entries), and O(queues) fixed-size state; jobs that succeeded or are suspended are dropped.

    Why it may be forgotten: all of it but the token bucket and the retry window is rebuilt by
    observing every job after a restart, from their statuses, so maxRunning is counted from the
    cluster, not from memory. Dispatch must wait until the job watch has listed once; before
    that the book undercounts what runs. After a restart the bucket is full and the retry window
    empty (at most one burst and one floor of retries more than had the operator not restarted).

    Not thread-safe; meant for one event loop, where each call runs to completion.
    """

    def __init__(self, default_policy: QueueSpec | None = None) -> None:
        """`default_policy`: the limits of a namespace's `default` queue while no VigilQueue of
        that name exists (the operator's --default-queue-* flags, set by the chart); None: such
        jobs run unlimited."""
        self.default_policy = default_policy
        self._queues: dict[QueueKey, _Queue] = {}
        self._where: dict[JobKey, QueueKey] = {}
        self._changed: set[QueueKey] = set()

    # --- what the shell tells the book -----------------------------------------------------

    def set_queue(self, namespace: str, name: str, spec: QueueSpec | None, now: float) -> None:
        """A VigilQueue was seen (its spec) or deleted (None). Takes effect at the next dispatch:
        a lower maxRunning stops new starts at once, it stops nothing running."""
        key = (namespace, name)
        queue = self._queue(key)
        rate = spec.max_starts_per_second if spec is not None else None
        if rate is None:
            queue.bucket = None
        elif queue.bucket is None:
            queue.bucket = TokenBucket.full(rate, now)
        elif queue.bucket.rate != rate:
            queue.bucket = queue.bucket.with_rate(rate, now)
        window = spec.retry_window_seconds if spec is not None else RETRY_WINDOW_SECONDS
        if queue.window.seconds != window:
            queue.window = RetryWindow(window)  # empty, as after a restart: loosens by one floor at most
        queue.spec = spec
        self._changed.add(key)
        self._drop_if_empty(key)

    def observe(self, entry: QueueEntry) -> None:
        """A job as the cluster holds it now (each watch event, each status the shell wrote)."""
        if entry.standing is None:
            # The first status that shows a start can also show its end (its pod came first and
            # finished before the look that records it): the start was made, its count stays.
            qkey = self._where.get(entry.key)
            if qkey is not None:
                job = self._queues[qkey].jobs[entry.name]
                if job.hold is not None and entry.attempts >= job.hold.attempt:
                    self._end_hold(self._queues[qkey], job, started=True)
            self.forget(entry.namespace, entry.name)
            return
        previous = self._where.get(entry.key)
        if previous is not None and previous != entry.queue_key:
            self.forget(entry.namespace, entry.name)  # it moved to another queue
        queue = self._queue(entry.queue_key)
        self._where[entry.key] = entry.queue_key
        held = queue.jobs.get(entry.name)
        if held is None:
            job = queue.jobs[entry.name] = _Job(entry)
        else:
            job, job.entry = held, entry
        if job.hold is not None:
            if entry.attempts >= job.hold.attempt:
                self._end_hold(queue, job, started=True)
            elif entry.standing is Standing.DEAD_LETTERED:
                self._end_hold(queue, job, started=False)
        self._file(queue, job)
        self._changed.add(entry.queue_key)

    def forget(self, namespace: str, name: str) -> None:
        """A job finished, was suspended or deleted: its queue no longer tracks it."""
        qkey = self._where.pop((namespace, name), None)
        if qkey is None:
            return
        queue = self._queues[qkey]
        job = queue.jobs.pop(name)
        if job.hold is not None:
            self._end_hold(queue, job, started=False)
        for heap in (queue.firsts, queue.retries, queue.pending, queue.ages):
            heap.discard(name)
        self._count(queue, job, forget=True)
        self._changed.add(qkey)
        self._drop_if_empty(qkey)

    def release(self, namespace: str, name: str, now: float) -> None:
        """The shell gives back a start: the job's decision reserved no attempt. The job keeps
        its place and is not offered a start again for RELEASE_RECHECK_SECONDS (see `_end_hold`
        for what is given back). Call `dispatch` afterwards: the slot is free."""
        qkey = self._where.get((namespace, name))
        if qkey is None:
            return
        queue = self._queues[qkey]
        job = queue.jobs[name]
        if job.hold is None:
            return
        self._end_hold(queue, job, started=False)
        job.not_before = now + RELEASE_RECHECK_SECONDS
        self._file(queue, job)
        self._changed.add(qkey)

    def top_up(self, namespace: str, name: str, wants: int, now: float) -> None:
        """A task array about to be looked at may take up to `wants` starts now, without waiting
        for `dispatch` to see its status again, when no other job of its queue waits ahead of it
        and the queue has room, tokens and (for retries) budget: so that a task that ended is
        followed by the next in the same look. Call `permit` after, and `use` once decided."""
        qkey = self._where.get((namespace, name))
        if qkey is None or wants <= 0:
            return
        queue = self._queues[qkey]
        job = queue.jobs[name]
        spec = self._policy(qkey, queue)
        if job.hold is not None or job.entry.units is None or spec is None or spec.paused:
            return
        if job.entry.standing in (None, Standing.DEAD_LETTERED) or job.not_before > now:
            return
        for heap in (queue.firsts, queue.retries):
            head = heap.peek()
            if head is not None and head[1] != name:
                return  # another job's turn first
        room = spec.max_running - queue.running
        if room <= 0 or (queue.bucket is not None and not queue.bucket.ready(now)):
            return
        if job.entry.is_retry and not queue.window.allows_retry(now, spec.retry_budget, spec.retry_floor):
            return
        for heap in (queue.firsts, queue.retries, queue.pending):
            heap.discard(name)
        self._hold(queue, job, now, min(room, wants), wants=wants)
        self._changed.add(qkey)

    def use(self, namespace: str, name: str, used: int, now: float) -> None:
        """The shell used `used` of the starts a task array's hold gave (fewer than it held): the
        rest go back, as `release` gives back a start that was not used. Call `dispatch` after."""
        qkey = self._where.get((namespace, name))
        if qkey is None:
            return
        queue = self._queues[qkey]
        job = queue.jobs[name]
        hold = job.hold
        if hold is None or used >= hold.units:
            return
        if used <= 0:
            self.release(namespace, name, now)
            return
        if hold.retry:
            for _ in range(hold.units - used):
                queue.window.unrecord(hold.second, retry=True)
        hold.attempt -= hold.units - used
        hold.units = used
        self._count(queue, job)
        self._changed.add(qkey)

    def started_unseen(self, namespace: str, name: str, attempt: int, now: float) -> None:
        """A pod of `attempt` exists that the job's status does not hold yet: its start was made
        (the pod comes first, vigil.core.lifecycle), by this process or by one that died before the
        job's next look recorded it. It counts as running from now on, as a hold, until an
        observation shows the attempt. This is what keeps maxRunning across a restart: the new
        process sees those pods in its listing, before it gives any start. Takes no token (the
        start was paid for); counts in the retry window, which a restart emptied."""
        qkey = self._where.get((namespace, name))
        if qkey is None:
            return
        queue = self._queues[qkey]
        job = queue.jobs[name]
        if job.hold is not None or job.entry.attempts >= attempt or job.entry.units is not None:
            return  # an array's starts are in its status before its pods exist
        retry = job.entry.is_retry
        job.hold = _Hold(attempt=attempt, second=queue.window.record(now, retry), retry=retry)
        self._file(queue, job)
        self._changed.add(qkey)

    # --- what the book decides -----------------------------------------------------------------

    def dispatch(self, queue_key: QueueKey, now: float) -> Dispatch:
        """Gives starts to the queue's first waiting jobs while it has room, tokens and (for
        retries) budget. Costs O(log n) per job started or come due, O(1) otherwise. Call it after
        each observation of a job of the queue, after `set_queue` and `release`, and at wake_at."""
        queue = self._queues.get(queue_key)
        spec = self._policy(queue_key, queue)
        if queue is None or spec is None:
            return Dispatch()
        self._promote_due(queue, now)
        if spec.paused:
            return Dispatch()
        started: list[JobKey] = []
        wake_at: list[float] = []
        budget, floor = spec.retry_budget, spec.retry_floor
        while queue.running < spec.max_running:
            first, retry = queue.firsts.peek(), queue.retries.peek()
            if retry is not None and not queue.window.allows_retry(now, budget, floor):
                retry = None  # over budget: first attempts go past it
            if first is None and retry is None:
                break
            if queue.bucket is not None and not queue.bucket.ready(now):
                wake_at.append(queue.bucket.next_token_at(now))
                break
            heap = queue.retries if first is None or (retry is not None and retry < first) else queue.firsts
            _, name = heap.pop()  # type: ignore[misc]
            self._hold(queue, queue.jobs[name], now, spec.max_running - queue.running)
            started.append((queue_key[0], name))
        if queue.running < spec.max_running:
            if queue.retries and not queue.window.allows_retry(now, budget, floor):
                wake_at.append(queue.window.next_retry_at(now, budget, floor))
            if (due := queue.pending.peek()) is not None:
                wake_at.append(due[0][0])
        if started:
            self._changed.add(queue_key)
        return Dispatch(tuple(started), min(wake_at) if wake_at else None)

    def permit(self, namespace: str, name: str, now: float) -> StartPermit:
        """Whether the job may start an attempt now: yes when `dispatch` gave it a start (or it
        names a `default` queue that does not exist); else why it waits. Changes nothing."""
        qkey = self._where.get((namespace, name))
        if qkey is None:
            return StartPermit(False, "WaitingForQueue", "the job waits to be seen by its queue")
        queue, job = self._queues[qkey], self._queues[qkey].jobs[name]
        entry, spec, label = job.entry, self._policy(qkey, queue), f"queue {qkey[1]}"
        if queue.spec is None and spec is not None:
            label = f"the cluster-wide default policy of queue {qkey[1]} (no VigilQueue {qkey[1]} in {namespace})"
        if job.hold is not None:
            return StartPermit(True, "Admitted", f"{label} admitted it", starts=job.hold.units)
        if spec is None:
            if entry.queue == DEFAULT_QUEUE:
                message = f"no VigilQueue {DEFAULT_QUEUE} in namespace {namespace}: unlimited"
                return StartPermit(True, "NoQueue", message, starts=UNLIMITED_STARTS)
            return StartPermit(
                False,
                "QueueNotFound",
                f"VigilQueue {entry.queue} does not exist in namespace {namespace}: the job waits until it is created",
            )
        if spec.paused:
            message = f"{label} is paused (spec.paused): no attempt starts until resumed"
            return StartPermit(False, "QueuePaused", message)
        if queue.running >= spec.max_running:
            return StartPermit(
                False,
                "QueueSaturated",
                f"{label} is full: {queue.running} attempts run, maxRunning is {spec.max_running}",
            )
        if entry.is_retry and not queue.window.allows_retry(now, spec.retry_budget, spec.retry_floor):
            starts, retries = queue.window.counts(now)
            at = queue.window.next_retry_at(now, spec.retry_budget, spec.retry_floor)
            return StartPermit(
                False,
                "RetryBudgetExhausted",
                f"{label} spent its retry budget: {retries} of the {starts} attempt starts in the last "
                f"{queue.window.seconds}s were retries (retryBudget {spec.retry_budget}, floor "
                f"{spec.retry_floor}); this retry may go in {max(0.0, at - now):.0f}s",
                retry_at=at,
            )
        if queue.bucket is not None and not queue.bucket.ready(now):
            at = queue.bucket.next_token_at(now)
            return StartPermit(
                False,
                "StartRateLimited",
                f"{label} starts at most {spec.max_starts_per_second:g} attempts per second",
                retry_at=at,
            )
        waiting = len(queue.firsts) + len(queue.retries)
        return StartPermit(
            False,
            "WaitingForQueue",
            f"the job waits its turn in {label} (priority {entry.priority}; {waiting} jobs waiting)",
        )

    # --- what the book tells -----------------------------------------------------------------

    def queue_of(self, namespace: str, name: str) -> QueueKey | None:
        """The queue a tracked job is in."""
        return self._where.get((namespace, name))

    def spec(self, queue_key: QueueKey) -> QueueSpec | None:
        queue = self._queues.get(queue_key)
        return queue.spec if queue is not None else None

    def policy(self, queue_key: QueueKey) -> QueueSpec | None:
        """The limits the queue's jobs start under: its VigilQueue's spec, else for a namespace's
        `default` queue the cluster-wide default policy, else none (unlimited or QueueNotFound)."""
        return self._policy(queue_key, self._queues.get(queue_key))

    def _policy(self, queue_key: QueueKey, queue: _Queue | None) -> QueueSpec | None:
        if queue is not None and queue.spec is not None:
            return queue.spec
        return self.default_policy if queue_key[1] == DEFAULT_QUEUE else None

    def count(self, queue_key: QueueKey, standing: Standing) -> int:
        """Jobs of the queue in `standing`; a job holding a start counts as running."""
        queue = self._queues.get(queue_key)
        return queue.counts[standing] if queue is not None else 0

    def oldest_waiting_since(self, queue_key: QueueKey) -> float | None:
        queue = self._queues.get(queue_key)
        entry = queue.ages.peek() if queue is not None else None
        return entry[0][0] if entry is not None else None

    def head_of_line(self, queue_key: QueueKey, k: int = HEAD_OF_LINE) -> list[str]:
        """The names of the next `k` jobs in order (due ones; the budget aside), O(k log k)."""
        queue = self._queues.get(queue_key)
        if queue is None:
            return []
        merged = heapq.merge(queue.firsts.smallest(k), queue.retries.smallest(k))
        return [name for _, name in list(merged)[:k]]

    def budget_exhausted(self, queue_key: QueueKey, now: float) -> bool:
        """Whether a due retry waits for the retry budget."""
        queue = self._queues.get(queue_key)
        if queue is None or queue.spec is None or not queue.retries:
            return False
        return not queue.window.allows_retry(now, queue.spec.retry_budget, queue.spec.retry_floor)

    def window_counts(self, queue_key: QueueKey, now: float) -> tuple[int, int]:
        """(starts, retries) in the queue's retry window at `now`."""
        queue = self._queues.get(queue_key)
        return queue.window.counts(now) if queue is not None else (0, 0)

    def queues(self) -> Iterator[QueueKey]:
        """Every queue that exists or that some tracked job names."""
        return iter(list(self._queues))

    def jobs_of(self, queue_key: QueueKey, standing: Standing) -> list[JobKey]:
        """The jobs of the queue in `standing` (holding a start aside), O(jobs of the queue): for
        the rare moments all of them must look again (the queue was created or deleted)."""
        queue = self._queues.get(queue_key)
        if queue is None:
            return []
        return [(queue_key[0], name) for name, job in queue.jobs.items() if _standing_of(job) is standing]

    def mark_changed(self, queue_key: QueueKey) -> None:
        """The queue's status is to be written again (the last write failed)."""
        self._changed.add(queue_key)

    def take_changed(self) -> set[QueueKey]:
        """The queues whose status may have changed since the last call (the shell writes their
        status, batched, at its own pace; oldestQueuedSeconds also moves with time alone)."""
        changed, self._changed = self._changed, set()
        return changed

    # --- inside ------------------------------------------------------------------------------

    def _file(self, queue: _Queue, job: _Job) -> None:
        """Puts the job in the one heap its state says (or none), and in the counts."""
        entry, name = job.entry, job.entry.name
        for heap in (queue.firsts, queue.retries, queue.pending, queue.ages):
            heap.discard(name)
        wants = entry.standing in (Standing.QUEUED, Standing.BACKING_OFF) and not entry.blocked and entry.wants > 0
        if job.hold is None and wants:
            due = max(entry.ready_at if entry.ready_at is not None else -math.inf, job.not_before)
            if due > -math.inf:
                queue.pending.push(name, (due, name))  # `dispatch` moves it on when due
            else:
                (queue.retries if entry.is_retry else queue.firsts).push(name, entry.order)
        if job.hold is None and entry.standing is Standing.QUEUED:
            queue.ages.push(name, (entry.waiting_since, name))
        self._count(queue, job)

    @staticmethod
    def _count(queue: _Queue, job: _Job, *, forget: bool = False) -> None:
        """Puts what the job adds to the status counters in them: a plain job counts once, in its
        standing (RUNNING while it holds a start); a task array counts its tasks, its held starts
        as running."""
        for key, n in job.tally:
            queue.counts[key] -= n
        entry, held = job.entry, job.hold.units if job.hold is not None else 0
        if forget:
            tally: tuple[tuple[str, int], ...] = ()
        elif entry.units is not None:
            tally = tuple((key, n + (held if key == Standing.RUNNING.value else 0)) for key, n in entry.units)
        elif job.hold is not None:
            tally = ((Standing.RUNNING.value, 1),)
        elif entry.standing is not None:
            tally = ((entry.standing.value, 1),)
        else:
            tally = ()
        job.tally = tally
        for key, n in tally:
            queue.counts[key] += n

    @staticmethod
    def _promote_due(queue: _Queue, now: float) -> None:
        while (entry := queue.pending.peek()) is not None and entry[0][0] <= now:
            queue.pending.pop()
            due = queue.jobs[entry[1]].entry
            (queue.retries if due.is_retry else queue.firsts).push(due.name, due.order)

    def _hold(self, queue: _Queue, job: _Job, now: float, room: int, wants: int | None = None) -> None:
        """Holds starts for the job: one, or for a task array as many as it wants (its entry's
        count, or `wants`) and the queue has room, tokens and (for retries) budget for."""
        entry, retry = job.entry, job.entry.is_retry
        units = 1 if entry.units is None else max(1, min(entry.wants if wants is None else wants, room))
        second = queue.window.record(now, retry)
        if queue.bucket is not None:
            queue.bucket = queue.bucket.take(now)
        taken = 1
        while taken < units:
            if queue.bucket is not None and not queue.bucket.ready(now):
                break
            spec = queue.spec or self.default_policy
            if retry and spec is not None and not queue.window.allows_retry(now, spec.retry_budget, spec.retry_floor):
                break
            queue.window.record(now, retry)
            if queue.bucket is not None:
                queue.bucket = queue.bucket.take(now)
            taken += 1
        job.hold = _Hold(attempt=entry.attempts + taken, second=second, retry=retry, units=taken)
        queue.ages.discard(entry.name)
        self._count(queue, job)

    @staticmethod
    def _end_hold(queue: _Queue, job: _Job, *, started: bool) -> None:
        """Ends the job's hold. A start that did not happen gives back its retry's count (a retry
        that did not run costs no budget, and no other retry relied on it). Its token is not given
        back, so the rate limit stays an upper bound; nor is a first attempt's count, since
        retries may have been let through on its strength.
        """
        hold, job.hold = job.hold, None
        assert hold is not None
        if not started and hold.retry:
            for _ in range(hold.units):
                queue.window.unrecord(hold.second, retry=True)

    def _queue(self, key: QueueKey) -> _Queue:
        queue = self._queues.get(key)
        if queue is None:  # not setdefault: a _Queue is too dear to build on every call
            queue = self._queues[key] = _Queue()
        return queue

    def _drop_if_empty(self, key: QueueKey) -> None:
        queue = self._queues.get(key)
        if queue is not None and queue.spec is None and not queue.jobs:
            del self._queues[key]
