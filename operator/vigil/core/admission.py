"""Admission backpressure: refuse a new VigilJob while its queue has no room for what it adds,
`maxQueued` counted in tasks (docs/design.md, "VigilQueue"). Overload shows at the door, as a 429
the client can retry, instead of as a backlog nobody sees.

A pure core, as `lifecycle` and `queueing` are: no I/O, no clock and no state. `review()` turns
an AdmissionReview v1 into the AdmissionReview to answer with, from the review and the
operator's cache alone (`Lookup`), as controller-runtime's webhooks answer; `admit()` is the
verdict alone; `read()` checks the shape of the fields the webhook reads. docs/admission.md says
why each choice was made; in short:

- Stateless: no review changes the answer to another. Anyone who can reach the webhook can post
  it a review, so a review that left anything behind (the old table of admitted-but-unseen jobs)
  let a forged one fill a victim's queue.
- The count is `waiting`, from the operator's watch cache, in tasks: a plain job waiting to start
  is one, an array's tasks not started yet are one each. A submission adds one task (a plain
  job) or its array's tasks (`spec.tasks.count`, or how many `spec.tasks.items` holds); it is
  refused when `waiting + added > maxQueued`, which for a plain job is `waiting >= maxQueued`.
- The price: the creates of a burst that arrive within one watch delay all read the same count,
  so a burst can pass maxQueued by the tasks of what the API server stored and the watch has not
  shown yet; the cap holds again from the moment the watch shows them (docs/admission.md gives
  the bound and the figures).
- Jobs whose queue does not exist are admitted and not counted: nothing caps them (a named
  queue that is missing makes the job wait with a condition; a missing `default` queue means
  unlimited).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vigil import api
from vigil.core.queueing.book import QueueKey
from vigil.core.reviewbody import ITEMS_COUNT, keep

ADMISSION_API_VERSION = "admission.k8s.io/v1"
MAX_UID_LENGTH = 128  # the API server's request uid is a UUID (36): this is a cap on garbage echoed back
# The most tasks an array may have (the CRD's bound on spec.tasks.count and on spec.tasks.items).
# The API server checks the CRD's schema before it calls a validating webhook, so a review it sends
# is always within; a forged one past it is a 400, not a number carried into a message.
MAX_TASKS = api.MAX_TASKS


class QueueLimits(Protocol):
    """What admission reads of a queue's spec: `api.VigilQueueSpec` and `queueing.QueueSpec` both fit."""

    @property
    def max_queued(self) -> int: ...


# (namespace, queue) -> (the queue's spec, or None if no such VigilQueue; tasks of it waiting now:
# the plain jobs waiting to start and the arrays' tasks not started). Called in the event loop: it
# must answer from memory, without I/O.
Lookup = Callable[[str, str], tuple[QueueLimits | None, int]]


class BadReview(ValueError):
    """Not an AdmissionReview v1 the webhook can read: it answers 400 with this message."""


class _Shape(BaseModel):
    # Strict: a forged "dryRun": "yes" is an error, not True. Fields the webhook does not read are
    # not even kept (vigil.core.reviewbody), so `extra` has nothing to ignore but is explicit.
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class _Resource(_Shape):
    group: str = ""
    version: str = ""
    resource: str = ""


class _Metadata(_Shape):
    name: str = ""
    namespace: str = ""
    uid: str = ""


class _Tasks(_Shape):
    count: int | None = None
    # reviewbody keeps a list of items as its length alone (under ITEMS_COUNT); `items` itself is
    # kept only when it is not a list, as evidence of its kind, so that the check can name it.
    items: list[Any] | None = None
    items_count: int | None = Field(default=None, alias=ITEMS_COUNT)


class _Spec(_Shape):
    queue: str = ""  # the CRD defaults it before admission; "" falls back to the default queue
    tasks: _Tasks | None = None  # an array's; absent or null: a plain job


class _Object(_Shape):
    metadata: _Metadata = _Metadata()
    spec: _Spec = _Spec()


class _Request(_Shape):
    uid: str = Field(min_length=1, max_length=MAX_UID_LENGTH)
    name: str = ""
    namespace: str = ""
    operation: str = ""
    dryRun: bool = False
    resource: _Resource = _Resource()
    object: _Object | None = None  # null in a DELETE's review


class _Review(_Shape):
    apiVersion: Literal["admission.k8s.io/v1"]
    kind: Literal["AdmissionReview"]
    request: _Request


@dataclass(frozen=True, slots=True)
class Submission:
    """The request being reviewed, as far as admission reads it."""

    review_uid: str  # the AdmissionReview request's uid, echoed in the response
    namespace: str
    name: str
    job_uid: str  # set by the API server before validating admission; "" if absent
    queue: str
    operation: str
    dry_run: bool
    group: str = api.GROUP  # of the resource reviewed
    resource: str = api.PLURAL
    tasks: int | None = None  # an array's tasks (spec.tasks.count, or its items); None: a plain job

    @property
    def adds(self) -> int:
        """The waiting tasks this job adds to its queue: one for a plain job."""
        return 1 if self.tasks is None else self.tasks

    @property
    def queue_key(self) -> QueueKey:
        return self.namespace, self.queue

    @property
    def is_job_create(self) -> bool:
        """Only creates of VigilJobs are held back; anything else sent here is let through."""
        return (
            self.operation == "CREATE"
            and self.group == api.GROUP
            and self.resource == api.PLURAL
            and bool(self.namespace)
        )


@dataclass(frozen=True, slots=True)
class AdmissionVerdict:
    allowed: bool
    code: int = 200
    reason: str = ""
    message: str = ""


ADMIT = AdmissionVerdict(True)


def read(fields: Any) -> Submission:
    """The request of an AdmissionReview v1, from the fields of it that
    `vigil.core.reviewbody.skim` (or `keep`) keeps; raises BadReview saying what is wrong otherwise.
    A whole decoded review goes through `keep` first, as in `parse`: `keep` is what turns
    spec.tasks.items into its length."""
    try:
        shaped = _Review.model_validate(fields)
    except ValidationError as err:
        _refuse([_describe(error) for error in err.errors(include_url=False)])
    request = shaped.request
    obj = request.object or _Object()
    tasks = _tasks(obj.spec.tasks)
    return Submission(
        review_uid=request.uid,
        namespace=request.namespace or obj.metadata.namespace,
        name=request.name or obj.metadata.name,
        job_uid=obj.metadata.uid,
        queue=obj.spec.queue or api.DEFAULT_QUEUE,
        operation=request.operation,
        dry_run=request.dryRun,
        group=request.resource.group,
        resource=request.resource.resource,
        tasks=tasks,
    )


def _refuse(problems: list[str]) -> NoReturn:
    shown = "; ".join(problems[:4]) + (f"; and {len(problems) - 4} more" if len(problems) > 4 else "")
    raise BadReview(f"expected an AdmissionReview {ADMISSION_API_VERSION}: {shown}") from None


def _tasks(tasks: _Tasks | None) -> int | None:
    """How many tasks an array adds (None: no spec.tasks, a plain job). BadReview unless exactly
    one of count and items is set, within 1..MAX_TASKS, as the CRD has it."""
    if tasks is None:
        return None
    where = "request.object.spec.tasks"
    items = tasks.items_count if tasks.items is None else len(tasks.items)
    if (tasks.count is None) == (items is None):
        _refuse([f"{where} must set exactly one of count and items, not {'both' if items is not None else 'neither'}"])
    if tasks.count is not None:
        if not 1 <= tasks.count <= MAX_TASKS:
            _refuse([f"{where}.count must be from 1 to {MAX_TASKS}, not {_short(tasks.count)}"])
        return tasks.count
    assert items is not None
    if not 1 <= items <= MAX_TASKS:
        _refuse([f"{where}.items must hold from 1 to {MAX_TASKS} entries, not {items}"])
    return items


def parse(body: Any) -> Submission:
    """`read` of a whole decoded AdmissionReview (what the webhook reads of it is picked first)."""
    return read(keep(body))


_EXPECTED = {
    "model_type": "an object",
    "model_attributes_type": "an object",
    "dict_type": "an object",
    "string_type": "a string",
    "bool_type": "true or false",
    "int_type": "an integer",
    "list_type": "an array",
}


def _describe(error: Mapping[str, Any]) -> str:
    """One pydantic error as a reader of the 400 wants it: where, what was expected, what came."""
    where = ".".join(str(part) for part in error["loc"]) or "the body"
    kind, value = error["type"], error.get("input")
    if kind == "missing":
        return f"{where} is missing"
    if kind == "literal_error":
        return f"{where} must be {error['ctx']['expected']}, not {_short(value)}"
    if kind == "string_too_short":
        return f"{where} must not be empty"
    if kind == "string_too_long":
        return f"{where} is longer than {error['ctx']['max_length']} characters"
    if kind in _EXPECTED:
        return f"{where} must be {_EXPECTED[kind]}, not {_kind_of(value)}"
    return f"{where}: {error['msg']}"


def _kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return f"the string {_short(value)}"
    return f"the number {_short(value)}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def full_message(namespace: str, queue: str, waiting: int, max_queued: int) -> str:
    """What a refused client of a plain job reads: which queue, how full, and what to do.
    (`waiting` counts tasks: an array's task not started yet is one more job waiting.)"""
    jobs = "1 job waits" if waiting == 1 else f"{waiting} jobs wait"
    return (
        f'queue "{queue}" in namespace "{namespace}" is full: {jobs} to start '
        f"(maxQueued {max_queued}); retry later, or raise spec.maxQueued of VigilQueue {namespace}/{queue}"
    )


def array_message(namespace: str, queue: str, waiting: int, tasks: int, max_queued: int) -> str:
    """What a refused client of an array reads: which queue, how many tasks wait, how many the
    array adds, and what to do; an array larger than maxQueued on its own can never fit."""
    where = f'queue "{queue}" in namespace "{namespace}"'
    raise_it = f"raise spec.maxQueued of VigilQueue {namespace}/{queue}"
    adds = "1 task" if tasks == 1 else f"{tasks} tasks"
    if tasks > max_queued:
        split = f"split it into arrays of at most {max_queued} tasks, or " if max_queued > 0 else ""
        return f"an array of {adds} can never fit in {where} (maxQueued {max_queued}): {split}{raise_it}"
    wait = "1 task waits" if waiting == 1 else f"{waiting} tasks wait"
    return (
        f"{where} has no room for an array of {adds}: {wait} to start (maxQueued {max_queued}); "
        f"retry later, submit fewer tasks, or {raise_it}"
    )


def admit(submission: Submission, spec: QueueLimits | None, waiting: int, *, exists: bool = False) -> AdmissionVerdict:
    """Admit the job unless its queue has no room for the tasks it adds: refused when
    `waiting + submission.adds > maxQueued` (for a plain job, `waiting >= maxQueued`, as before
    arrays).

    waiting: the queue's tasks waiting to start (plain jobs, and arrays' tasks not started).
    exists: a job of this name is already known; the API server will answer AlreadyExists, which
    tells the client more than a 429 would, so it is let through.
    """
    if spec is None or exists:
        return ADMIT  # no such queue: nothing caps it (it waits with a condition, or runs unlimited)
    if waiting + submission.adds > spec.max_queued:
        ns, queue, max_queued = submission.namespace, submission.queue, spec.max_queued
        if submission.tasks is None:
            message = full_message(ns, queue, waiting, max_queued)
        else:
            message = array_message(ns, queue, waiting, submission.tasks, max_queued)
        # 429, not 403: the refusal is about load, not about the job; clients treat it as retryable.
        return AdmissionVerdict(False, code=429, reason="TooManyRequests", message=message)
    return ADMIT


def decide(
    submission: Submission, lookup: Lookup, exists: Callable[[str, str], bool] | None = None
) -> AdmissionVerdict:
    """The verdict on one request, from it and the operator's cache alone: no review leaves
    anything behind, so none can change the answer to another."""
    if not submission.is_job_create:
        return ADMIT
    spec, waiting = lookup(submission.namespace, submission.queue)
    known = exists is not None and bool(submission.name) and exists(submission.namespace, submission.name)
    return admit(submission, spec, waiting, exists=known)


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


def review(body: Any, lookup: Lookup, exists: Callable[[str, str], bool] | None = None) -> dict[str, Any]:
    """The answer to one decoded AdmissionReview. Raises BadReview on a malformed one."""
    submission = parse(body)
    return response(submission.review_uid, decide(submission, lookup, exists))
