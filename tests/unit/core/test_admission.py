"""StartPermit backpressure: the verdict, the AdmissionReview in and out, and `Pending`.

The property tests drive reviews as the API server and the operator's watch would interleave
them (creates admitted, committed or failed later, shown by the watch with any delay, jobs
leaving the queue, time passing) against a model of what the cluster holds, and check the bound
docs/admission.md states: with one serving process no admission ever lets the queue's backlog
pass maxQueued while the watch shows every job within the TTL; with N processes the overshoot
is at most what the others admitted that the admitting one has not seen yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vigil.core.admission import (
    MAX_PENDING,
    PENDING_TTL_SECONDS,
    BadReview,
    Pending,
    Submission,
    admit,
    full_message,
    parse,
    review,
)
from vigil.core.queueing.book import QueueSpec
from vigil.kube.client import LIST_TIMEOUT_SECONDS
from vigil.kube.informer import PROGRESS_DEADLINE_SECONDS

pytestmark = pytest.mark.unit

TTL = 30.0


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
            "kind": {"group": "vigil.dev", "version": "v1alpha1", "kind": "VigilJob"},
            "resource": {"group": "vigil.dev", "version": "v1alpha1", "resource": resource},
            "name": name,
            "namespace": namespace,
            "operation": operation,
            "dryRun": dry_run,
            "object": {
                "apiVersion": "vigil.dev/v1alpha1",
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
    answer = review(admission_review(), fixed(QueueSpec(max_queued=20), 20), Pending(), 0.0)
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


def test_the_message_counts_jobs_admitted_moments_ago():
    assert full_message("etl", "batch", 17, 3, 20) == (
        'queue "batch" in namespace "etl" is full: 20 jobs wait to start, 3 of them admitted moments ago '
        "(maxQueued 20); retry later, or raise spec.maxQueued of VigilQueue etl/batch"
    )
    assert "is full: 1 job waits to start (maxQueued 1)" in full_message("etl", "batch", 1, 0, 1)


def test_a_queue_with_room_admits_and_counts_the_job():
    verdict = admit(submission(), QueueSpec(max_queued=20), 19, 0)
    assert verdict.allowed and verdict.record


def test_pending_jobs_fill_the_queue_as_waiting_ones_do():
    assert not admit(submission(), QueueSpec(max_queued=20), 15, 5).allowed
    assert admit(submission(), QueueSpec(max_queued=20), 15, 4).allowed


def test_max_queued_zero_refuses_every_new_job():
    verdict = admit(submission(), QueueSpec(max_queued=0), 0, 0)
    assert not verdict.allowed and "is full: 0 jobs wait to start (maxQueued 0)" in verdict.message


def test_a_missing_queue_admits_without_counting():
    # A named queue that does not exist: the job waits with a condition; a missing "default": unlimited.
    for queue in ("batch", "default"):
        verdict = admit(submission(queue), None, 10**6, 10**6)
        assert verdict.allowed and not verdict.record


def test_a_job_that_names_no_queue_is_in_the_default_queue():
    lookup = fixed(QueueSpec(max_queued=1), 1)
    answer = review(admission_review(queue=None), lookup, Pending(), 0.0)
    assert lookup.calls == [("etl", "default")]
    assert 'queue "default" in namespace "etl" is full' in answer["response"]["status"]["message"]


def test_a_name_that_exists_is_left_to_the_api_servers_already_exists():
    pending = Pending()
    answer = review(admission_review(), fixed(QueueSpec(max_queued=1), 1), pending, 0.0, exists=lambda ns, n: True)
    assert answer["response"]["allowed"] and len(pending) == 0


def test_a_dry_run_is_judged_but_not_counted():
    pending = Pending()
    spec = QueueSpec(max_queued=1)
    assert review(admission_review(dry_run=True), fixed(spec, 0), pending, 0.0)["response"]["allowed"]
    assert len(pending) == 0
    assert not review(admission_review(dry_run=True), fixed(spec, 1), pending, 0.0)["response"]["allowed"]


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
    assert review(body, lookup, Pending(), 0.0)["response"] == {"uid": "r-1", "allowed": True}
    assert lookup.calls == []


@pytest.mark.parametrize(
    "body, why",
    [
        (None, "kind AdmissionReview"),
        ([], "kind AdmissionReview"),
        ({"kind": "Pod"}, "kind AdmissionReview"),
        ({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1beta1", "request": {"uid": "x"}}, "v1"),
        ({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}, "request.uid"),
        ({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"uid": ""}}, "request.uid"),
    ],
)
def test_what_is_not_an_admission_review_is_refused_as_bad(body, why):
    with pytest.raises(BadReview, match=why):
        review(body, fixed(None, 0), Pending(), 0.0)


def test_a_review_with_odd_fields_still_parses():
    body = admission_review()
    body["request"]["object"]["spec"] = "nonsense"
    body["request"]["object"]["metadata"] = None
    parsed = parse(body)
    assert (parsed.namespace, parsed.name, parsed.queue, parsed.job_uid) == ("etl", "job", "default", "")


# ------------------------------------------------------------------------------- Pending


def test_pending_forgets_a_job_the_watch_shows_by_uid_or_by_name():
    pending = Pending(ttl=TTL)
    assert pending.add(submission(name="a"), 0.0) and pending.add(submission(name="b"), 0.0)
    body = admission_review("c", uid="")
    body["request"]["object"]["metadata"]["uid"] = ""
    assert pending.add(parse(body), 0.0)
    assert pending.count("etl", "batch", 1.0) == 3
    assert pending.seen("etl", "a", "uid-a")
    assert not pending.seen("etl", "b", "another-uid")  # a job of the same name, not this one
    assert pending.seen("etl", "c", "uid-c")  # admitted without a uid: its name confirms it
    assert pending.count("etl", "batch", 1.0) == 1
    assert not pending.seen("etl", "a", "uid-a")


def test_pending_forgets_after_the_ttl_a_create_that_never_showed():
    pending = Pending(ttl=TTL)
    pending.add(submission(name="failed"), 0.0)
    assert pending.count("etl", "batch", TTL - 0.001) == 1
    assert pending.count("etl", "batch", TTL) == 0
    assert pending.counts(TTL) == {}


def test_the_same_review_twice_is_one_job():
    pending = Pending(ttl=TTL)
    pending.add(submission(name="a"), 0.0)
    pending.add(submission(name="a"), 5.0)
    assert pending.count("etl", "batch", 5.0) == 1
    assert pending.count("etl", "batch", TTL + 1.0) == 1  # counted from the second admission
    assert pending.count("etl", "batch", TTL + 5.0) == 0


def test_pending_is_bounded_and_refuses_honestly_when_full():
    pending = Pending(ttl=TTL, limit=3)
    spec = QueueSpec(max_queued=100)
    for i in range(3):
        assert review(admission_review(f"j{i}"), fixed(spec, 0), pending, 0.0)["response"]["allowed"]
    answer = review(admission_review("j3"), fixed(spec, 0), pending, 0.0)["response"]
    assert not answer["allowed"] and answer["status"]["code"] == 429
    assert "holds 3 admitted jobs that its watch has not shown yet" in answer["status"]["message"]
    assert len(pending) == 3
    assert review(admission_review("j3"), fixed(spec, 0), pending, TTL)["response"]["allowed"]


def test_confirmed_entries_do_not_pile_up_in_the_expiry_order():
    pending = Pending(ttl=TTL)
    for i in range(10_000):
        pending.add(submission(name=f"j{i}"), float(i) / 1000)
        pending.seen("etl", f"j{i}", f"uid-j{i}")
    assert len(pending) == 0 and len(pending._order) <= 1024 + 1


def test_the_defaults_are_the_documented_ones():
    assert PENDING_TTL_SECONDS == 90.0 and MAX_PENDING == 100_000
    with pytest.raises(ValueError):
        Pending(ttl=0)


# ------------------------------------------------------------------- interleavings, one process


QUEUES = {"q0": QueueSpec(max_queued=3), "q1": QueueSpec(max_queued=1), "none": None}


@dataclass
class Job:
    name: str
    queue: str
    admitted_at: float


@dataclass
class Cluster:
    """What the API server and the operator's cache hold, as the test sees it."""

    inflight: list[Job] = field(default_factory=list)  # admitted, create not finished
    unseen: list[Job] = field(default_factory=list)  # stored, not yet shown by the watch
    waiting: list[Job] = field(default_factory=list)  # shown by the watch, waiting to start
    failed: list[Job] = field(default_factory=list)  # admitted, then refused by the API server

    def backlog(self, queue: str) -> int:
        """Jobs of the queue stored or on their way to be stored: what maxQueued caps."""
        return sum(j.queue == queue for j in self.inflight + self.unseen + self.waiting)


operations = st.lists(
    st.one_of(
        st.tuples(st.just("create"), st.sampled_from(sorted(QUEUES)), st.booleans()),
        st.tuples(st.sampled_from(["commit", "fail", "show", "start"]), st.integers(0, 50), st.just(False)),
        st.tuples(st.just("tick"), st.floats(0.0, 2 * TTL), st.just(False)),
    ),
    max_size=120,
)


def run_one_process(ops, keep_ttl: bool):
    """Plays `ops`; with keep_ttl, time never passes the TTL of a job the watch has not shown
    (the premise of the bound). Checks the accounting and the bound after every step."""
    pending, cluster, now, created = Pending(ttl=TTL), Cluster(), 0.0, 0

    def lookup(namespace, queue):
        return QUEUES[queue], sum(j.queue == queue for j in cluster.waiting)

    for op, arg, flag in ops:
        if op == "create":
            created += 1
            name = f"j{created}"
            answer = review(admission_review(name, queue=arg, dry_run=flag), lookup, pending, now)["response"]
            if answer["allowed"] and not flag:
                cluster.inflight.append(Job(name, arg, now))
            elif not answer["allowed"]:
                # Refused only for want of room: the backlog, or creates that failed within the TTL
                # (the temporary undershoot), fill the queue.
                failures = sum(j.queue == arg and now - j.admitted_at < TTL for j in cluster.failed)
                assert QUEUES[arg] is not None
                if keep_ttl:
                    assert cluster.backlog(arg) + failures >= QUEUES[arg].max_queued
                assert f'queue "{arg}" in namespace "etl" is full' in answer["status"]["message"]
        elif op in ("commit", "fail") and cluster.inflight:
            job = cluster.inflight.pop(arg % len(cluster.inflight))
            (cluster.unseen if op == "commit" else cluster.failed).append(job)
        elif op == "show" and cluster.unseen:
            job = cluster.unseen.pop(arg % len(cluster.unseen))
            pending.seen("etl", job.name, f"uid-{job.name}")  # the same step makes it count in waiting
            cluster.waiting.append(job)
        elif op == "start" and cluster.waiting:
            cluster.waiting.pop(arg % len(cluster.waiting))
        elif op == "tick":
            step = arg
            if keep_ttl and (unshown := cluster.inflight + cluster.unseen):
                step = min(step, min(j.admitted_at for j in unshown) + TTL - now - 1e-6)
            now += max(0.0, step)
        for queue, spec in QUEUES.items():
            recent_failures = sum(j.queue == queue and now - j.admitted_at < TTL for j in cluster.failed)
            unshown = [j for j in cluster.inflight + cluster.unseen if j.queue == queue]
            if spec is None:
                assert pending.count("etl", queue, now) == 0  # nothing caps it, nothing is counted
                continue
            if keep_ttl:
                # Exact accounting: every admitted job not shown yet, plus failures within the TTL.
                assert pending.count("etl", queue, now) == len(unshown) + recent_failures
                # The bound: no admission ever let the backlog pass maxQueued.
                assert cluster.backlog(queue) <= spec.max_queued
            assert pending.count("etl", queue, now) <= spec.max_queued
    return pending, cluster, now


@settings(max_examples=400, deadline=None)
@given(operations)
def test_one_process_never_admits_past_max_queued_whatever_the_interleaving(ops):
    run_one_process(ops, keep_ttl=True)


@settings(max_examples=200, deadline=None)
@given(operations)
def test_a_create_that_fails_after_admission_holds_its_slot_only_until_the_ttl(ops):
    pending, cluster, now = run_one_process(ops, keep_ttl=False)
    later = now + TTL + 1e-3  # float slack: (t + 30) - t may be 29.999...
    assert pending.counts(later) == {}  # every entry, confirmed or not, is gone a TTL later
    for queue, spec in QUEUES.items():
        if spec is not None:  # and then the queue admits up to what the watch shows waiting
            waiting = sum(j.queue == queue for j in cluster.waiting)
            verdict = admit(submission(queue), spec, waiting, pending.count("etl", queue, later))
            assert verdict.allowed == (waiting < spec.max_queued)


# ----------------------------------------------------------------- interleavings, N processes


@settings(max_examples=300, deadline=None)
@given(
    st.integers(2, 4),
    st.integers(1, 6),
    st.lists(
        st.tuples(st.sampled_from(["create", "commit", "show"]), st.integers(0, 3), st.integers(0, 60)), max_size=150
    ),
)
def test_n_processes_overshoot_by_at_most_what_the_others_admitted_unseen(replicas, max_queued, ops):
    """Each process has its own Pending and its own watch (which shows jobs in its own order).
    When process r admits, the backlog is at most maxQueued plus the jobs the other processes
    admitted that r's watch has not shown; and never more than replicas x maxQueued."""
    spec = QueueSpec(max_queued=max_queued)
    pendings = [Pending(ttl=TTL) for _ in range(replicas)]
    shown: list[set[str]] = [set() for _ in range(replicas)]  # per process: jobs its watch showed
    inflight: list[str] = []
    stored: list[str] = []
    admitted_by: dict[str, int] = {}
    for i, (op, r, k) in enumerate(ops):
        r %= replicas
        if op == "create":
            name = f"j{i}"
            lookup = lambda ns, q, r=r: (spec, len(shown[r]))  # noqa: E731
            if review(admission_review(name), lookup, pendings[r], 0.0)["response"]["allowed"]:
                inflight.append(name)
                admitted_by[name] = r
                backlog = len(inflight) + len(stored)
                others_unseen = sum(admitted_by[j] != r and j not in shown[r] for j in inflight + stored)
                assert backlog <= max_queued + others_unseen
        elif op == "commit" and inflight:
            stored.append(inflight.pop(k % len(inflight)))
        elif op == "show":
            unseen = [j for j in stored if j not in shown[r]]
            if unseen:
                job = unseen[k % len(unseen)]
                pendings[r].seen("etl", job, f"uid-{job}")
                shown[r].add(job)
        assert len(inflight) + len(stored) <= replicas * max_queued


def test_a_pending_entry_outlives_a_stalled_watch_and_its_relist():
    """PENDING_TTL_SECONDS's reason: a job admitted while the watch is stalled is shown by the
    relist that follows the progress deadline, a list that may take up to its timeout; the entry
    must not expire before, or that many jobs would get in over maxQueued."""
    assert PENDING_TTL_SECONDS >= PROGRESS_DEADLINE_SECONDS + LIST_TIMEOUT_SECONDS
