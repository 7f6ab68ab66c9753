"""Admission backpressure: the verdict, the AdmissionReview in and out, the shape checked.

The answers are stateless: the property tests play any reviews (forged or real, for any queue)
before a victim's and check that its answer is what the cache alone says; and they drive
creates as the API server and the operator's watch interleave them (admitted, committed, shown
by the watch with any delay, leaving the queue) to check the bound docs/admission.md states:
when a create is admitted, the backlog passes maxQueued by at most the admitted jobs the watch
had not shown yet, and once the watch shows them a full queue refuses again.
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
    MAX_UID_LENGTH,
    BadReview,
    Submission,
    admit,
    full_message,
    parse,
    read,
    review,
)
from vigil.core.queueing.book import QueueSpec
from vigil.core.reviewbody import NotJson, skim

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
) -> dict:
    spec = {"template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}}
    if queue is not None:
        spec["queue"] = queue
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


def submission(queue: str = "batch", dry_run: bool = False, name: str = "job") -> Submission:
    return parse(admission_review(name, queue=queue, dry_run=dry_run))


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


def test_a_container_of_the_wrong_kind_is_kept_empty_so_the_check_can_name_its_kind():
    kept = skim(json.dumps({**V1, "request": {"uid": ["a"] * 1000, "resource": [{"group": "x"}], "name": {"a": 1}}}))
    assert kept["request"] == {"uid": [], "resource": [], "name": {}}
    with pytest.raises(BadReview, match="request.uid must be a string, not an array; request.name must be a string"):
        read(kept)


# ----------------------------------------------------------------------------- stateless


def reviews_of_anyone():
    """Reviews anyone who can reach the webhook might post: any queue, namespace, operation,
    dry run or not, for names that exist or not; malformed ones too."""
    good = st.builds(
        admission_review,
        name=st.sampled_from(["a", "b", "victim-job"]),
        namespace=st.sampled_from(["victim", "attacker", "etl"]),
        queue=st.sampled_from(["batch", "default", None]),
        operation=st.sampled_from(["CREATE", "UPDATE", "DELETE"]),
        dry_run=st.booleans(),
        review_uid=st.text(min_size=1, max_size=8),
    )
    bad = st.sampled_from([None, [], {"kind": "AdmissionReview"}, {**V1, "request": {"uid": "x", "resource": "x"}}])
    return st.one_of(good, bad)


@settings(max_examples=100, deadline=None)
@given(st.lists(reviews_of_anyone(), max_size=25), st.integers(0, 8), st.integers(0, 8))
def test_no_review_changes_the_answer_to_another(forged, max_queued, waiting):
    """20 forged reviews for victim/batch used to fill its queue for 90 s; now a review's answer
    is the cache's alone, whatever was posted before it."""
    spec = QueueSpec(max_queued=max_queued)

    def lookup(namespace, queue):
        return (spec, waiting) if (namespace, queue) == ("victim", "batch") else (QueueSpec(max_queued=1), 0)

    victim = admission_review("victim-job", "victim", "batch", review_uid="victim")
    alone = review(victim, lookup)
    for body in forged:
        with contextlib.suppress(BadReview):
            review(body, lookup)
    assert review(victim, lookup) == alone
    assert alone["response"]["allowed"] == (waiting < max_queued)


# ----------------------------------------------------------- the overshoot of a burst, bounded


@dataclass
class Bed:
    """What the API server stores and what the operator's watch has shown of one queue."""

    inflight: list[str] = field(default_factory=list)  # admitted, create not finished
    unseen: list[str] = field(default_factory=list)  # stored, not yet shown by the watch
    waiting: list[str] = field(default_factory=list)  # shown by the watch, waiting to start

    def backlog(self) -> int:
        return len(self.inflight) + len(self.unseen) + len(self.waiting)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 6),
    st.lists(st.tuples(st.sampled_from(["create", "commit", "show", "start"]), st.integers(0, 50)), max_size=150),
)
def test_a_burst_passes_max_queued_by_at_most_the_admitted_jobs_the_watch_has_not_shown(max_queued, ops):
    """The bound docs/admission.md states: when a create is admitted, the backlog is at most
    maxQueued plus the admitted jobs the watch had not shown yet; with every one shown, the
    backlog is within maxQueued again for any create to get in (a full queue refuses)."""
    spec, bed, created = QueueSpec(max_queued=max_queued), Bed(), 0

    def lookup(namespace, queue):
        return spec, len(bed.waiting)

    for op, k in ops:
        if op == "create":
            created += 1
            unshown = len(bed.inflight) + len(bed.unseen)
            if review(admission_review(f"j{created}"), lookup)["response"]["allowed"]:
                bed.inflight.append(f"j{created}")
                assert bed.backlog() <= max_queued + unshown
                if not unshown:
                    assert bed.backlog() <= max_queued  # the watch had shown all: no overshoot
            else:
                assert len(bed.waiting) >= max_queued  # refused only by what the cache shows
        elif op == "commit" and bed.inflight:
            bed.unseen.append(bed.inflight.pop(k % len(bed.inflight)))
        elif op == "show" and bed.unseen:
            bed.waiting.append(bed.unseen.pop(k % len(bed.unseen)))
        elif op == "start" and bed.waiting:
            bed.waiting.pop(k % len(bed.waiting))
