"""Admission backpressure: refuse a new VigilJob while its queue already holds `maxQueued`
waiting jobs (docs/design.md, "VigilQueue"). Overload shows at the door, as a 429 the client
can retry, instead of as a backlog nobody sees.

A pure core, as `lifecycle` and `queueing` are: no I/O and no clock (the shell passes monotonic
`now`). `review()` turns an AdmissionReview v1 into the AdmissionReview to answer with;
`admit()` is the verdict alone; `Pending` remembers the jobs this process admitted that the
operator's watch has not shown yet. docs/admission.md says why each choice was made; in short:

- The count is `waiting` (the operator's cache: jobs of the queue that wait to start) plus
  `Pending` (jobs admitted here that the cache does not show yet). Without `Pending`, a burst
  of creates all read the same stale count and all get in.
- The bound. One process: `review()` reads the count, decides and records without an `await`
  in between, so concurrent reviews are serialized by the event loop, and the overshoot is 0 as
  long as the watch shows every admitted job within `ttl` (and the caller confirms a job with
  `Pending.seen` in the same step that makes it count in `waiting`). An admitted create that
  fails later (another webhook or a quota refuses it) keeps its entry until `ttl`: a temporary
  undershoot of one slot per such failure, never a lost job. N processes serving the webhook
  (each with its own `Pending`): when a process admits, the true backlog is at most maxQueued
  plus the jobs the *other* processes admitted that this process's watch has not shown yet,
  so the overshoot is at most what the other N-1 admitted within one watch delay, and never
  more than (N-1) x maxQueued (each process alone never lets its own count pass maxQueued).
- Jobs whose queue does not exist are admitted and not counted: nothing caps them (a named
  queue that is missing makes the job wait with a condition; a missing `default` queue means
  unlimited).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from vigil import api
from vigil.core.queueing.book import QueueKey

ADMISSION_API_VERSION = "admission.k8s.io/v1"

# How long an admitted job counts as pending without the watch showing it. It must outlive the
# longest time a created job can take to reach the operator's count while the watch is still
# believed: ~ms normally, but a stalled watch is noticed only at the informer's progress deadline
# (informer.PROGRESS_DEADLINE_SECONDS, 30 s) and then listed again, plus the list itself. A TTL
# near the deadline would let a stall turn expired entries into an overshoot; the price of 90 s is
# only that an admitted create that then fails holds a slot that long.
PENDING_TTL_SECONDS = 90.0

# Entries over all queues. Per queue, Pending never holds more than maxQueued (it only records
# what the queue had room for); this caps the sum so a watch that shows nothing for minutes
# cannot grow memory without end (~200 bytes an entry: 100,000 is ~20 MB).
MAX_PENDING = 100_000

class QueueLimits(Protocol):
    """What admission reads of a queue's spec: `api.VigilQueueSpec` and `queueing.QueueSpec` both fit."""

    @property
    def max_queued(self) -> int: ...


# (namespace, queue) -> (the queue's spec, or None if no such VigilQueue; jobs of it waiting now).
# Called in the event loop: it must answer from memory, without I/O.
Lookup = Callable[[str, str], tuple[QueueLimits | None, int]]


class BadReview(ValueError):
    """The body is not an AdmissionReview v1 with a request: the webhook answers 400."""


@dataclass(frozen=True, slots=True)
class Submission:
    """The create being reviewed."""

    review_uid: str  # the AdmissionReview request's uid, echoed in the response
    namespace: str
    name: str
    job_uid: str  # set by the API server before validating admission; "" if absent
    queue: str
    operation: str
    dry_run: bool

    @property
    def queue_key(self) -> QueueKey:
        return self.namespace, self.queue


@dataclass(frozen=True, slots=True)
class AdmissionVerdict:
    allowed: bool
    record: bool = False  # count it as pending (admitted into a capped queue, not a dry run)
    code: int = 200
    reason: str = ""
    message: str = ""


ADMIT = AdmissionVerdict(True)


def parse(body: Any) -> Submission:
    """The request of an AdmissionReview v1; raises BadReview on anything else."""
    if not isinstance(body, Mapping) or body.get("kind") != "AdmissionReview":
        raise BadReview("expected a JSON AdmissionReview (kind AdmissionReview)")
    if body.get("apiVersion") != ADMISSION_API_VERSION:
        raise BadReview(f"expected apiVersion {ADMISSION_API_VERSION}, not {body.get('apiVersion')!r}")
    request = body.get("request")
    if not isinstance(request, Mapping) or not isinstance(request.get("uid"), str) or not request["uid"]:
        raise BadReview("expected request.uid in the AdmissionReview")
    obj = _mapping(request.get("object"))
    metadata, spec = _mapping(obj.get("metadata")), _mapping(obj.get("spec"))
    queue = spec.get("queue")
    return Submission(
        review_uid=request["uid"],
        namespace=str(request.get("namespace") or metadata.get("namespace") or ""),
        name=str(request.get("name") or metadata.get("name") or ""),
        job_uid=str(metadata.get("uid") or ""),
        # The CRD defaults spec.queue before admission; the fallback is for a request without it.
        queue=queue if isinstance(queue, str) and queue else api.DEFAULT_QUEUE,
        operation=str(request.get("operation") or ""),
        dry_run=bool(request.get("dryRun")),
    )


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def is_job_create(body: Mapping, submission: Submission) -> bool:
    """Only creates of VigilJobs are held back; anything else sent here is let through."""
    resource = body["request"].get("resource") or {}
    return (
        submission.operation == "CREATE"
        and resource.get("group") == api.GROUP
        and resource.get("resource") == api.PLURAL
        and bool(submission.namespace)
    )


def full_message(namespace: str, queue: str, waiting: int, pending: int, max_queued: int) -> str:
    """What a refused client reads: which queue, how full, and what to do."""
    count = waiting + pending
    jobs = "1 job waits" if count == 1 else f"{count} jobs wait"
    recent = f", {pending} of them admitted moments ago" if pending else ""
    return (
        f'queue "{queue}" in namespace "{namespace}" is full: {jobs} to start{recent} '
        f"(maxQueued {max_queued}); retry later, or raise spec.maxQueued of VigilQueue {namespace}/{queue}"
    )


def admit(
    submission: Submission, spec: QueueLimits | None, waiting: int, pending: int, *, exists: bool = False
) -> AdmissionVerdict:
    """Admit the job unless its queue has no room for one more waiting job.

    exists: a job of this name is already known; the API server will answer AlreadyExists, which
    tells the client more than a 429 would, so it is let through and not counted.
    """
    if spec is None or exists:
        return ADMIT  # no such queue: nothing caps it (it waits with a condition, or runs unlimited)
    if waiting + pending >= spec.max_queued:
        message = full_message(submission.namespace, submission.queue, waiting, pending, spec.max_queued)
        # 429, not 403: the refusal is about load, not about the job; clients treat it as retryable.
        return AdmissionVerdict(False, code=429, reason="TooManyRequests", message=message)
    return AdmissionVerdict(True, record=not submission.dry_run)


def pending_full_verdict(submission: Submission, limit: int) -> AdmissionVerdict:
    return AdmissionVerdict(
        False,
        code=429,
        reason="TooManyRequests",
        message=(
            f"Vigil's admission webhook holds {limit} admitted jobs that its watch has not shown yet "
            f"(the operator is behind); retry later (queue {submission.namespace}/{submission.queue})"
        ),
    )


def response(review_uid: str, verdict: AdmissionVerdict) -> dict[str, Any]:
    """The AdmissionReview v1 answer."""
    answer: dict[str, Any] = {"uid": review_uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        # The API server copies this Status into the error the client gets (code and message).
        answer["status"] = {
            "status": "Failure",
            "code": verdict.code,
            "reason": verdict.reason,
            "message": verdict.message,
        }
    return {"apiVersion": ADMISSION_API_VERSION, "kind": "AdmissionReview", "response": answer}


def review(
    body: Any,
    lookup: Lookup,
    pending: Pending,
    now: float,
    exists: Callable[[str, str], bool] | None = None,
) -> dict[str, Any]:
    """The answer to one AdmissionReview, recording an admitted job in `pending`. Synchronous on
    purpose: nothing may run between reading the count and recording the admission, or two
    concurrent reviews could both take the last slot. Raises BadReview on a malformed body."""
    submission = parse(body)
    if not is_job_create(body, submission):
        return response(submission.review_uid, ADMIT)
    spec, waiting = lookup(submission.namespace, submission.queue)
    known = exists is not None and bool(submission.name) and exists(submission.namespace, submission.name)
    verdict = admit(
        submission, spec, waiting, pending.count(submission.namespace, submission.queue, now), exists=known
    )
    if verdict.record and not pending.add(submission, now):
        verdict = pending_full_verdict(submission, pending.limit)
    return response(submission.review_uid, verdict)


@dataclass(slots=True)
class _Entry:
    queue_key: QueueKey
    name: str
    admitted_at: float


class Pending:
    """Jobs this process admitted that the operator's watch has not shown yet, per queue.

    An entry goes when the watch shows the job (`seen`, by UID, or by name for a job admitted
    without one) or `ttl` seconds after admission, whichever is first: a create the API server
    refused after this webhook admitted it (another webhook, a quota) never shows up, and is
    forgotten after `ttl`. Bounded: at most maxQueued entries per queue (only admissions into a
    queue with room are recorded) and `limit` in all. `now` is a monotonic time, non-decreasing.
    """

    def __init__(self, ttl: float = PENDING_TTL_SECONDS, limit: int = MAX_PENDING) -> None:
        if ttl <= 0 or limit <= 0:
            raise ValueError("ttl and limit must be > 0")
        self.ttl, self.limit = ttl, limit
        self._entries: dict[str, _Entry] = {}  # by job UID, or "name:<namespace>/<name>" without one
        self._counts: Counter[QueueKey] = Counter()
        self._order: deque[tuple[float, str]] = deque()  # (admitted at, key): expiry order

    def __len__(self) -> int:
        return len(self._entries)

    def count(self, namespace: str, queue: str, now: float) -> int:
        self.expire(now)
        return self._counts[(namespace, queue)]

    def counts(self, now: float) -> dict[QueueKey, int]:
        """Every queue with pending jobs (for metrics and tests)."""
        self.expire(now)
        return dict(self._counts)

    def add(self, submission: Submission, now: float) -> bool:
        """Records an admitted job; false (and nothing recorded) when `limit` entries are held."""
        self.expire(now)
        key = _key(submission.namespace, submission.name, submission.job_uid)
        if key in self._entries:  # the same review again (the API server retried it): one job
            self._drop(key)
        elif len(self._entries) >= self.limit:
            return False
        self._entries[key] = _Entry(submission.queue_key, submission.name, now)
        self._counts[submission.queue_key] += 1
        self._order.append((now, key))
        return True

    def seen(self, namespace: str, name: str, uid: str = "") -> bool:
        """The watch shows this job (any event: it now counts in `waiting`, or is gone): forget
        it. Call it in the same step that makes the job count in the lookup's `waiting`."""
        found = False
        for key in {_key(namespace, name, uid), _key(namespace, name, "")}:
            if key in self._entries:
                self._drop(key)
                found = True
        return found

    def expire(self, now: float) -> None:
        while self._order and now - self._order[0][0] >= self.ttl:
            admitted_at, key = self._order.popleft()
            entry = self._entries.get(key)
            if entry is not None and entry.admitted_at == admitted_at:
                self._drop(key)
        # Entries confirmed by `seen` leave stale tuples behind; rebuild before they pile up.
        if len(self._order) > 2 * len(self._entries) + 1024:
            self._order = deque(sorted((e.admitted_at, k) for k, e in self._entries.items()))

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key)
        self._counts[entry.queue_key] -= 1
        if not self._counts[entry.queue_key]:
            del self._counts[entry.queue_key]


def _key(namespace: str, name: str, uid: str) -> str:
    return uid if uid else f"name:{namespace}/{name}"
