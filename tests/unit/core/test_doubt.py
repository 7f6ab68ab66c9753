"""Doubt in the shell, without a cluster: which decisions must be checked with the API server
before they run, silence that is no evidence while the operator cannot hear, and how failures
are shown on the job and spaced out."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.builders import T0, at, make_job, make_pod
from vigil.controllers.jobs.podcache import PodCache
from vigil.core import doubt, failures
from vigil.core.lifecycle import decide
from vigil.core.liveness import Liveness, actionable

pytestmark = pytest.mark.unit

RUNNING = {
    "phase": "Running",
    "attempts": 1,
    "roundAttempts": 1,
    "startedAt": "2025-03-01T12:00:00Z",
    "currentAttempt": {
        "number": 1,
        "podName": "ledger-1",
        "podUID": "pod-1",
        "phase": "Running",
        "startedAt": "2025-03-01T12:00:00Z",
    },
}


def running_pod(uid: str = "pod-1"):
    return make_pod(1, uid=uid, phase="Running")


def test_a_lost_verdict_is_doubted_and_a_healthy_one_is_not():
    job = make_job(status=RUNNING)
    lost = {"pod-1": Liveness("Lost", 61, "no heartbeat for 60s")}
    decision = decide(job, [running_pod()], at(120), rng=random.Random(0), liveness=lost)
    assert doubt.doubt(job, decision) is not None
    healthy = decide(job, [running_pod()], at(120), rng=random.Random(0), liveness={})
    assert doubt.doubt(job, healthy) is None


def test_a_vanished_pod_is_doubted():
    job = make_job(status=RUNNING)
    decision = decide(job, [], at(30), rng=random.Random(0))
    assert "lost" in (doubt.doubt(job, decision) or "")


def test_starting_the_next_attempt_under_no_overlap_is_doubted_but_the_first_is_not_under_at_least_once():
    job = make_job(spec={"guarantee": "NoOverlap"})
    decision = decide(job, [], T0, rng=random.Random(0))
    assert "NoOverlap" in (doubt.doubt(job, decision) or "")
    plain = make_job()
    assert doubt.doubt(plain, decide(plain, [], T0, rng=random.Random(0))) is None


def test_while_deaf_lost_is_only_uncertain():
    lost = Liveness("Lost", 70, "no heartbeat for 60s or more")
    assert actionable(lost, True) is lost
    held = actionable(lost, False)
    assert held.state == "Uncertain" and "not fresh" in held.detail
    healthy = Liveness("Healthy", 1, "heartbeats arriving")
    assert actionable(healthy, False) is healthy


@given(st.sampled_from(["Healthy", "Uncertain", "Lost"]), st.booleans())
def test_heard_never_raises_a_verdict(state, pods_fresh):
    order = {"Healthy": 0, "Uncertain": 1, "Lost": 2}
    verdict = Liveness(state, 5.0, "d")
    assert order[actionable(verdict, pods_fresh).state] <= order[state]
    assert pods_fresh or actionable(verdict, pods_fresh).state != "Lost"


def test_a_failure_is_shown_once_per_cause_and_cleared():
    job = make_job(status=RUNNING)
    patch, new = failures.report(job, "PodCreateRefused", "quota exceeded", T0)
    assert new and patch["conditions"][-1]["type"] == "ReconcileError"
    assert patch["conditions"][-1]["message"] == "quota exceeded"
    job["status"]["conditions"] = patch["conditions"]
    assert failures.report(job, "PodCreateRefused", "quota exceeded", at(5)) == (None, False), "no churn"
    again, new = failures.report(job, "PodCreateRefused", "policy denies it", at(5))
    assert new and again is not None, "another cause is worth another event"
    job["status"]["conditions"] = again["conditions"]
    assert failures.cleared(job) == {"conditions": []}
    assert failures.cleared(make_job(status=RUNNING)) is None


def test_the_pod_cache_keeps_created_pods_until_seen_and_takes_the_truth():
    cache = PodCache()
    mine = make_pod(1, uid="pod-1")
    cache.created(mine, now=10.0)
    job_uid = ("work", mine["metadata"]["labels"]["vigil.dev/job-uid"])
    assert cache.unseen(job_uid) == [(mine, 10.0)]
    other = make_pod(2, uid="pod-2")
    dropped = cache.replace_job(job_uid, [other])
    assert [p["metadata"]["uid"] for p in dropped] == ["pod-1"], "not in a direct list: gone"
    assert [p["metadata"]["uid"] for p in cache.of_job(job_uid)] == ["pod-2"]
    assert cache.unseen(job_uid) == []
