"""Which pods Vigil's finalizer holds for no reason any more: only the API server's answer makes a
pod an orphan, and a pod whose job the operator holds is never even asked about."""

from __future__ import annotations

from typing import Any

import pytest

from vigil.core import orphans

pytestmark = pytest.mark.unit


def pod(job_uid: str | None = "job-a", tracked: bool = True, name: str = "p") -> dict[str, Any]:
    refs = [{"apiVersion": "vigil.dev/v1beta1", "kind": "VigilJob", "name": "a", "uid": job_uid, "controller": True}]
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "finalizers": ["vigil.dev/attempt-tracking"] if tracked else ["example.com/keep"],
            "ownerReferences": refs if job_uid is not None else [],
        }
    }


def job(uid: str) -> dict[str, Any]:
    return {"metadata": {"name": "a", "namespace": "ns", "uid": uid}}


def test_only_tracked_pods_of_unknown_jobs_are_worth_asking_about():
    known = {("ns", "job-known")}.__contains__  # jobs are known by (namespace, UID)
    found = orphans.candidates(
        [
            pod("job-known", name="of-a-known-job"),
            pod("job-gone", name="of-an-unknown-job"),
            pod("job-gone", tracked=False, name="without-the-finalizer"),
            pod(None, name="without-an-owner"),
        ],
        known,
    )
    assert [p["metadata"]["name"] for p in found] == ["of-an-unknown-job", "without-an-owner"]


def test_a_pod_is_an_orphan_only_when_the_api_server_has_no_job_of_its_owners_uid():
    assert orphans.orphaned(pod("job-a"), None), "the job's 404"
    assert orphans.orphaned(pod("job-a"), job("job-b")), "a new job of the same name is not the pod's"
    assert not orphans.orphaned(pod("job-a"), job("job-a")), "its job exists (maybe being deleted): its look decides"
    assert orphans.orphaned(pod(None), None), "no job can ever release a pod that names none"


def test_the_sweep_runs_every_interval_lengthened_by_its_jitter_only():
    assert orphans.next_sweep_in(300, 0.0) == 300
    assert 300 < orphans.next_sweep_in(300, 0.999) < 300 * (1 + orphans.SWEEP_JITTER)
