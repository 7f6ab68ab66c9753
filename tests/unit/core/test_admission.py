"""Admission backpressure: the verdict, the AdmissionReview in and out, the shape checked.

The count is in tasks: a plain job adds one, an array (spec.tasks) its count or its items. The
answers are stateless: the property tests play any reviews (forged or real, for any queue, plain
or arrays) before a victim's and check that its answer is what the cache alone says; and they
drive creates of plain jobs and arrays as the API server and the operator's watch interleave them
(admitted, committed, shown by the watch with any delay, tasks leaving the queue one by one) to
check the bound docs/admission.md states: when a create is admitted, the backlog passes maxQueued
by at most the tasks of the admitted jobs the watch had not shown yet, and once the watch shows
them a queue without room refuses again.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vigil.core.admission import (
    MAX_TASKS,
    MAX_UID_LENGTH,
    BadReview,
    Submission,
    admit,
    array_message,
    full_message,
    parse,
    read,
    review,
)
from vigil.core.queueing.book import QueueSpec
from vigil.core.reviewbody import ITEMS_COUNT, NotJson, keep, skim

pytestmark = pytest.mark.unit


def admission_review(
    name: str = "job",
    namespace: str = "etl",
    queue: str | None = "batch",
    *,
    uid: str = "",
    operation: str = "CREATE",
    dry_run: bool = False,
    review_uid: str = "r-1",
    resource: str = "vigiljobs",
    tasks: object = None,
) -> dict:
    """A review of a create; `tasks`: the job's spec.tasks (an array), as given (None: a plain job)."""
    spec: dict = {"template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}}
    if queue is not None:
        spec["queue"] = queue
    if tasks is not None:
        spec["tasks"] = tasks
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": review_uid,
            "kind": {"group": "vigil.dev", "version": "v1beta1", "kind": "VigilJob"},
            "resource": {"group": "vigil.dev", "version": "v1beta1", "resource": resource},
            "name": name,
            "namespace": namespace,
            "operation": operation,
            "dryRun": dry_run,
            "object": {
                "apiVersion": "vigil.dev/v1beta1",
                "kind": "VigilJob",
                "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}"},
                "spec": spec,
            },
        },
    }


def submission(queue: str = "batch", dry_run: bool = False, name: str = "job", tasks: object = None) -> Submission:
    return parse(admission_review(name, queue=queue, dry_run=dry_run, tasks=tasks))


def fixed(spec: QueueSpec | None, waiting: int):
    calls = []

    def lookup(namespace: str, queue: str):
        calls.append((namespace, queue))
        return spec, waiting

    lookup.calls = calls  # type: ignore[attr-defined]
    return lookup


# ---------------------------------------------------------------------------- the verdict


def test_a_full_queue_refuses_with_429_and_says_which_queue_how_full_and_what_to_do():
    answer = review(admission_review(), fixed(QueueSpec(max_queued=20), 20))
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "r-1"
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"] == {
        "status": "Failure",
        "code": 429,
        "reason": "TooManyRequests",
        "message": 'queue "batch" in namespace "etl" is full: 20 jobs wait to start (maxQueued 20); '
        "retry later, or raise spec.maxQueued of VigilQueue etl/batch",
    }


def test_the_message_says_how_many_wait():
    assert "is full: 1 job waits to start (maxQueued 1)" in full_message("etl", "batch", 1, 1)
    assert "is full: 7 jobs wait to start (maxQueued 5)" in full_message("etl", "batch", 7, 5)


def test_a_queue_with_room_admits_and_a_full_one_refuses():
    assert admit(submission(), QueueSpec(max_queued=20), 19).allowed
    assert not admit(submission(), QueueSpec(max_queued=20), 20).allowed
    assert not admit(submission(), QueueSpec(max_queued=20), 25).allowed  # past the cap (a burst): still full


def test_max_queued_zero_refuses_every_new_job():
    verdict = admit(submission(), QueueSpec(max_queued=0), 0)
    assert not verdict.allowed and "is full: 0 jobs wait to start (maxQueued 0)" in verdict.message


def test_a_missing_queue_admits():
    # A named queue that does not exist: the job waits with a condition; a missing "default": unlimited.
    for queue in ("batch", "default"):
        assert admit(submission(queue), None, 10**6).allowed


def test_a_job_that_names_no_queue_is_in_the_default_queue():
    lookup = fixed(QueueSpec(max_queued=1), 1)
    answer = review(admission_review(queue=None), lookup)
    assert lookup.calls == [("etl", "default")]
    assert 'queue "default" in namespace "etl" is full' in answer["response"]["status"]["message"]


def test_a_name_that_exists_is_left_to_the_api_servers_already_exists():
    answer = review(admission_review(), fixed(QueueSpec(max_queued=1), 1), exists=lambda ns, n: True)
    assert answer["response"]["allowed"]


def test_a_dry_run_is_judged_as_a_create():
    spec = QueueSpec(max_queued=1)
    assert review(admission_review(dry_run=True), fixed(spec, 0))["response"]["allowed"]
    assert not review(admission_review(dry_run=True), fixed(spec, 1))["response"]["allowed"]


@pytest.mark.parametrize(
    "body",
    [
        admission_review(operation="UPDATE"),
        admission_review(operation="DELETE"),
        admission_review(resource="vigilqueues"),
    ],
)
def test_anything_but_a_job_create_is_let_through_without_a_look(body):
    lookup = fixed(QueueSpec(max_queued=0), 0)
    assert review(body, lookup)["response"] == {"uid": "r-1", "allowed": True}
    assert lookup.calls == []


# ------------------------------------------------------------------ arrays: counted in tasks


def test_an_array_is_admitted_while_its_tasks_fit_and_refused_by_the_one_task_too_many():
    spec = QueueSpec(max_queued=20)
    for tasks in ({"count": 5}, {"items": ["a", {"k": 1}, 3, None, [1, 2]]}):
        assert admit(submission(tasks=tasks), spec, 15).allowed  # 15 + 5 = 20: full, not over
        verdict = admit(submission(tasks=tasks), spec, 16)
        assert (verdict.allowed, verdict.code, verdict.reason) == (False, 429, "TooManyRequests")
        assert verdict.message == (
            'queue "batch" in namespace "etl" has no room for an array of 5 tasks: 16 tasks wait to start '
            "(maxQueued 20); retry later, submit fewer tasks, or raise spec.maxQueued of VigilQueue etl/batch"
        )


def test_an_array_is_answered_with_a_429_that_says_how_many_wait_how_many_it_adds_and_what_to_do():
    answer = review(admission_review(tasks={"count": 10, "parallelism": 2}), fixed(QueueSpec(max_queued=20), 11))
    assert answer["response"]["status"] == {
        "status": "Failure",
        "code": 429,
        "reason": "TooManyRequests",
        "message": 'queue "batch" in namespace "etl" has no room for an array of 10 tasks: 11 tasks wait to '
        "start (maxQueued 20); retry later, submit fewer tasks, or raise spec.maxQueued of VigilQueue etl/batch",
    }
    assert "1 task waits to start" in array_message("etl", "batch", 1, 20, 20)
    assert "an array of 1 task: " in array_message("etl", "batch", 20, 1, 20)


def test_an_array_larger_than_max_queued_can_never_fit_and_is_told_so_even_on_an_empty_queue():
    verdict = admit(submission(tasks={"count": 21}), QueueSpec(max_queued=20), 0)
    assert not verdict.allowed and verdict.code == 429
    assert verdict.message == (
        'an array of 21 tasks can never fit in queue "batch" in namespace "etl" (maxQueued 20): split it into '
        "arrays of at most 20 tasks, or raise spec.maxQueued of VigilQueue etl/batch"
    )
    assert admit(submission(tasks={"count": 20}), QueueSpec(max_queued=20), 0).allowed
    nothing_fits = admit(submission(tasks={"items": ["x"]}), QueueSpec(max_queued=0), 0)
    assert not nothing_fits.allowed and nothing_fits.message == (
        'an array of 1 task can never fit in queue "batch" in namespace "etl" (maxQueued 0): '
        "raise spec.maxQueued of VigilQueue etl/batch"
    )


@pytest.mark.parametrize("waiting", [0, 4, 5, 6])
def test_a_plain_job_is_judged_and_told_exactly_as_before_arrays(waiting):
    """waiting >= maxQueued, the message in jobs: what clients and tests have matched since 0.1."""
    verdict = admit(submission(), QueueSpec(max_queued=5), waiting)
    assert verdict.allowed == (waiting < 5)
    if not verdict.allowed:
        assert verdict.message == full_message("etl", "batch", waiting, 5)
    assert submission().tasks is None and submission().adds == 1


def test_an_array_of_one_task_is_judged_as_a_plain_job_and_told_as_an_array():
    one = submission(tasks={"count": 1})
    assert (one.tasks, one.adds) == (1, 1)
    for waiting in range(4):
        assert (
            admit(one, QueueSpec(max_queued=2), waiting).allowed
            == admit(submission(), QueueSpec(max_queued=2), waiting).allowed
        )
    assert "has no room for an array of 1 task: 2 tasks wait" in admit(one, QueueSpec(max_queued=2), 2).message


def test_a_missing_queue_or_a_name_that_exists_admits_an_array_as_a_plain_job():
    array = submission(tasks={"count": MAX_TASKS})
    assert admit(array, None, 10**6).allowed
    assert admit(array, QueueSpec(max_queued=1), 1, exists=True).allowed


def test_tasks_null_is_a_plain_job():
    body = admission_review()
    body["request"]["object"]["spec"]["tasks"] = None
    assert parse(body).tasks is None


V1 = {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}


@pytest.mark.parametrize(
    "body, why",
    [
        (None, "the body must be an object, not null"),
        ([], "the body must be an object, not an array"),
        ("review", "the body must be an object, not the string 'review'"),
        ({"kind": "Pod"}, "kind must be 'AdmissionReview', not 'Pod'"),
        ({**V1, "apiVersion": "admission.k8s.io/v1beta1", "request": {"uid": "x"}}, "apiVersion must be 'admission"),
        (V1, "request is missing"),
        ({**V1, "request": []}, "request must be an object, not an array"),
        ({**V1, "request": {}}, "request.uid is missing"),
        ({**V1, "request": {"uid": ""}}, "request.uid must not be empty"),
        ({**V1, "request": {"uid": 7}}, "request.uid must be a string, not the number 7"),
        ({**V1, "request": {"uid": "u" * (MAX_UID_LENGTH + 1)}}, f"request.uid is longer than {MAX_UID_LENGTH}"),
        ({**V1, "request": {"uid": "x", "resource": "x"}}, "request.resource must be an object, not the string 'x'"),
        ({**V1, "request": {"uid": "x", "dryRun": "yes"}}, "request.dryRun must be true or false, not the string"),
        ({**V1, "request": {"uid": "x", "operation": None}}, "request.operation must be a string, not null"),
        ({**V1, "request": {"uid": "x", "object": {"spec": [1]}}}, "request.object.spec must be an object, not an"),
        ({**V1, "request": {"uid": "x", "object": {"metadata": None}}}, "request.object.metadata must be an object"),
        ({**V1, "request": {"uid": "x", "object": {"spec": {"queue": 3}}}}, "request.object.spec.queue must be a str"),
    ],
)
def test_a_malformed_review_is_refused_saying_what_is_wrong(body, why):
    with pytest.raises(BadReview, match="^expected an AdmissionReview admission.k8s.io/v1: .*" + re.escape(why)):
        review(body, fixed(None, 0))


TASKS = "request.object.spec.tasks"


@pytest.mark.parametrize(
    "tasks, why",
    [
        ([{"count": 1}], f"{TASKS} must be an object, not an array"),
        ("all", f"{TASKS} must be an object, not the string 'all'"),
        ({"count": "5"}, f"{TASKS}.count must be an integer, not the string '5'"),
        ({"count": True}, f"{TASKS}.count must be an integer, not the boolean true"),
        ({"count": 2.5}, f"{TASKS}.count must be an integer, not the number 2.5"),
        ({"count": [5]}, f"{TASKS}.count must be an integer, not an array"),
        ({"count": 0}, f"{TASKS}.count must be from 1 to {MAX_TASKS}, not 0"),
        ({"count": -3}, f"{TASKS}.count must be from 1 to {MAX_TASKS}, not -3"),
        (
            {"count": 10**400},
            f"{TASKS}.count must be from 1 to {MAX_TASKS}, not 1000000000000000000000000000000000000...",
        ),
        ({"items": "a.csv"}, f"{TASKS}.items must be an array, not the string 'a.csv'"),
        ({"items": {"a": 1}}, f"{TASKS}.items must be an array, not an object"),
        ({"items": 3}, f"{TASKS}.items must be an array, not the number 3"),
        ({"items": []}, f"{TASKS}.items must hold from 1 to {MAX_TASKS} entries, not 0"),
        (
            {"items": [0] * (MAX_TASKS + 1)},
            f"{TASKS}.items must hold from 1 to {MAX_TASKS} entries, not {MAX_TASKS + 1}",
        ),
        ({"count": 2, "items": ["a"]}, f"{TASKS} must set exactly one of count and items, not both"),
        ({}, f"{TASKS} must set exactly one of count and items, not neither"),
        ({"parallelism": 5}, f"{TASKS} must set exactly one of count and items, not neither"),
        ({"count": None, "items": None}, f"{TASKS} must set exactly one of count and items, not neither"),
        # The key skim writes for the items' length, sent by a caller: dropped like any unread field.
        ({ITEMS_COUNT: 1}, f"{TASKS} must set exactly one of count and items, not neither"),
    ],
)
def test_a_malformed_spec_tasks_is_refused_saying_what_is_wrong(tasks, why):
    body = json.dumps(admission_review(tasks=tasks)).encode()
    for decoded in (lambda: parse(json.loads(body)), lambda: read(skim(body))):
        with pytest.raises(BadReview, match="^expected an AdmissionReview admission.k8s.io/v1: " + re.escape(why)):
            decoded()


def test_every_problem_is_named_up_to_four():
    with pytest.raises(BadReview) as caught:
        parse({"kind": 1, "apiVersion": 2, "request": {"uid": 3, "name": 4, "namespace": 5, "operation": 6}})
    assert str(caught.value).count(" must be ") == 4 and str(caught.value).endswith("; and 2 more")


def test_fields_the_webhook_does_not_read_may_be_anything():
    body = admission_review()
    body["request"]["object"]["spec"]["template"] = "nonsense"
    body["request"]["userInfo"] = [1, 2, 3]
    body["request"]["oldObject"] = None
    parsed = parse(body)
    assert (parsed.namespace, parsed.name, parsed.queue, parsed.job_uid) == ("etl", "job", "batch", "uid-job")


def test_a_delete_review_carries_no_object_and_is_let_through():
    body = admission_review(operation="DELETE")
    body["request"]["object"] = None
    assert review(body, fixed(QueueSpec(max_queued=0), 0))["response"] == {"uid": "r-1", "allowed": True}


# ---------------------------------------------------------------------- the body, skimmed


@pytest.mark.parametrize(
    "body, why",
    [
        (b"", "the body is not JSON: Expecting value: line 1 column 1 (char 0)"),
        (b"{", "the body is not JSON: Expecting property name enclosed in double quotes: line 1 column 2"),
        (b'{"kind": "AdmissionReview",}', "the body is not JSON: Expecting property name"),
        (b"[" * 100_000 + b"]" * 100_000, "the body's JSON is nested too deeply for an AdmissionReview"),
        (b'{"a": "\xff\xfe"}', "the body is not UTF-8 JSON: invalid start byte at byte"),
        (b"[" + b"9" * 5000 + b"]", "the body is not JSON: Exceeds the limit"),
    ],
)
def test_a_body_that_is_not_json_is_refused_saying_why(body, why):
    with pytest.raises(NotJson, match="^" + re.escape(why)):
        skim(body)


def test_skimming_keeps_only_the_fields_admission_reads():
    body = admission_review()
    body["request"]["object"]["spec"]["template"] = {"spec": {"containers": [{"name": "x" * 10_000}]}}
    body["request"]["userInfo"] = {"username": "someone", "groups": ["a"] * 1000}
    kept = skim(json.dumps(body).encode())
    assert kept == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "r-1",
            "resource": {"group": "vigil.dev", "version": "v1beta1", "resource": "vigiljobs"},
            "name": "job",
            "namespace": "etl",
            "operation": "CREATE",
            "dryRun": False,
            "object": {"metadata": {"name": "job", "namespace": "etl", "uid": "uid-job"}, "spec": {"queue": "batch"}},
        },
    }
    assert read(kept) == parse(body)


def test_an_arrays_items_are_kept_as_their_number_alone():
    """100,000 items (the most an array may have, 1.2 MiB of JSON here): the skim is the same few
    hundred bytes as a plain job's, so the child's answer costs the loop nothing either."""
    items = [{"file": f"s3://bucket/part-{i:05d}.csv"} for i in range(MAX_TASKS)]
    body = admission_review(tasks={"items": items, "parallelism": 50, "maxDeadLetteredTasks": 3})
    raw = json.dumps(body).encode()
    kept = skim(raw)
    assert len(raw) > 1024 * 1024
    assert kept["request"]["object"]["spec"] == {"queue": "batch", "tasks": {ITEMS_COUNT: MAX_TASKS}}
    assert len(json.dumps(kept)) < 600
    assert read(kept).tasks == MAX_TASKS == parse(body).tasks


def test_an_arrays_count_is_kept_as_is_and_a_callers_own_items_count_is_dropped():
    kept = keep(admission_review(tasks={"count": 7, ITEMS_COUNT: 1, "parallelism": 2}))
    assert kept["request"]["object"]["spec"]["tasks"] == {"count": 7}
    kept = keep(admission_review(tasks={ITEMS_COUNT: 1, "items": ["a", "b", "c"]}))
    assert kept["request"]["object"]["spec"]["tasks"] == {ITEMS_COUNT: 3}
    assert read(kept).tasks == 3


def test_a_container_of_the_wrong_kind_is_kept_empty_so_the_check_can_name_its_kind():
    kept = skim(json.dumps({**V1, "request": {"uid": ["a"] * 1000, "resource": [{"group": "x"}], "name": {"a": 1}}}))
    assert kept["request"] == {"uid": [], "resource": [], "name": {}}
    with pytest.raises(BadReview, match="request.uid must be a string, not an array; request.name must be a string"):
        read(kept)


# ----------------------------------------------------------------------------- stateless


def spec_tasks():
    """spec.tasks of a plain job (None), of an array (count or items), or malformed."""
    return st.one_of(
        st.none(),
        st.builds(lambda n: {"count": n}, st.integers(1, 12)),
        st.builds(lambda items: {"items": items}, st.lists(st.integers(), min_size=1, max_size=12)),
        st.sampled_from([{"count": 0}, {"items": []}, {"count": 1, "items": [1]}, {ITEMS_COUNT: 3}, []]),
    )


def reviews_of_anyone():
    """Reviews anyone who can reach the webhook might post: any queue, namespace, operation,
    dry run or not, for names that exist or not, plain jobs or arrays; malformed ones too."""
    good = st.builds(
        admission_review,
        name=st.sampled_from(["a", "b", "victim-job"]),
        namespace=st.sampled_from(["victim", "attacker", "etl"]),
        queue=st.sampled_from(["batch", "default", None]),
        operation=st.sampled_from(["CREATE", "UPDATE", "DELETE"]),
        dry_run=st.booleans(),
        review_uid=st.text(min_size=1, max_size=8),
        tasks=spec_tasks(),
    )
    bad = st.sampled_from([None, [], {"kind": "AdmissionReview"}, {**V1, "request": {"uid": "x", "resource": "x"}}])
    return st.one_of(good, bad)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(reviews_of_anyone(), max_size=25),
    st.integers(0, 8),
    st.integers(0, 8),
    st.one_of(st.none(), st.integers(1, 10)),
)
def test_no_review_changes_the_answer_to_another(forged, max_queued, waiting, victims_tasks):
    """20 forged reviews for victim/batch used to fill its queue for 90 s; now a review's answer
    is the cache's alone, whatever was posted before it, plain job or array."""
    spec = QueueSpec(max_queued=max_queued)

    def lookup(namespace, queue):
        return (spec, waiting) if (namespace, queue) == ("victim", "batch") else (QueueSpec(max_queued=1), 0)

    tasks = None if victims_tasks is None else {"count": victims_tasks}
    victim = admission_review("victim-job", "victim", "batch", review_uid="victim", tasks=tasks)
    alone = review(victim, lookup)
    for body in forged:
        with contextlib.suppress(BadReview):
            review(body, lookup)
    assert review(victim, lookup) == alone
    assert alone["response"]["allowed"] == (waiting + (victims_tasks or 1) <= max_queued)


# ----------------------------------------------------------- the overshoot of a burst, bounded


def tasks_of(jobs: list[int]) -> int:
    return sum(jobs)


@dataclass
class Bed:
    """What the API server stores and what the operator's watch has shown of one queue: each job
    as its tasks not started yet (a plain job: 1)."""

    inflight: list[int] = field(default_factory=list)  # admitted, create not finished
    unseen: list[int] = field(default_factory=list)  # stored, not yet shown by the watch
    waiting: list[int] = field(default_factory=list)  # shown by the watch, with tasks waiting to start

    def backlog(self) -> int:
        return tasks_of(self.inflight) + tasks_of(self.unseen) + tasks_of(self.waiting)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 12),
    st.lists(
        st.tuples(
            st.sampled_from(["create", "commit", "show", "start"]),
            st.integers(0, 50),
            st.one_of(st.none(), st.integers(1, 8)),  # a create's spec.tasks.count, or a plain job
        ),
        max_size=150,
    ),
)
def test_a_burst_passes_max_queued_by_at_most_the_tasks_the_watch_has_not_shown(max_queued, ops):
    """The bound docs/admission.md states, in tasks: when a create is admitted, the backlog is at
    most maxQueued plus the tasks of the admitted jobs the watch had not shown yet; with every one
    shown, the backlog is within maxQueued (a queue without room for a create's tasks refuses it).
    Tasks start one at a time, so an array leaves the count task by task."""
    spec, bed, created = QueueSpec(max_queued=max_queued), Bed(), 0

    def lookup(namespace, queue):
        return spec, tasks_of(bed.waiting)

    for op, k, count in ops:
        if op == "create":
            created += 1
            unshown = tasks_of(bed.inflight) + tasks_of(bed.unseen)
            tasks = None if count is None else {"count": count}
            if review(admission_review(f"j{created}", tasks=tasks), lookup)["response"]["allowed"]:
                bed.inflight.append(count or 1)
                assert bed.backlog() <= max_queued + unshown
                if not unshown:
                    assert bed.backlog() <= max_queued  # the watch had shown all: no overshoot
            else:
                # refused only by what the cache shows
                assert tasks_of(bed.waiting) + (count or 1) > max_queued
        elif op == "commit" and bed.inflight:
            bed.unseen.append(bed.inflight.pop(k % len(bed.inflight)))
        elif op == "show" and bed.unseen:
            bed.waiting.append(bed.unseen.pop(k % len(bed.unseen)))
        elif op == "start" and bed.waiting:
            i = k % len(bed.waiting)
            bed.waiting[i] -= 1  # one task starts
            if not bed.waiting[i]:
                bed.waiting.pop(i)
