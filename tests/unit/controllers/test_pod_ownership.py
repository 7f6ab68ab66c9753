"""A pod is a job's only when namespace, owner UID and label agree (issue 25, finding 4), and
the pod watch keeps no pod that belongs to no job: the controller against a fake API server,
fed a tenant's forged pods through the watch's path (`JobEvents.pod_changed`)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from tests.support.builders import JOB_UID, make_job, make_pod
from tests.support.clock import FakeClock
from tests.support.controllers import job_controller
from vigil import api

pytestmark = pytest.mark.unit

KEY = ("work", "ledger")
# Attempt 1 failed; attempt 2 waits for its backoff (an hour): no pod runs, so a decision on
# what the cache shows needs no direct read first (core.doubt).
BACKING_OFF = {
    "phase": "BackingOff",
    "attempts": 1,
    "roundAttempts": 1,
    "startedAt": "2025-03-01T12:00:00Z",
    "nextAttemptAt": "2099-03-01T13:00:00Z",
    "history": [
        {
            "number": 1,
            "podName": "ledger-1",
            "outcome": "Failed",
            "exitCode": 1,
            "startedAt": "2025-03-01T12:00:00Z",
            "finishedAt": "2025-03-01T12:00:10Z",
        }
    ],
}


class FakeApi:
    """The truth: job A backing off, its failed pod in its namespace. Records status patches."""

    def __init__(self) -> None:
        self.job = make_job(spec={"heartbeat": {"required": False}}, status=BACKING_OFF)
        self.pod = make_pod(1, uid="pod-1", phase="Failed", exit_code=1)
        self.patches: list[dict[str, Any]] = []

    async def patch_job_status(self, namespace, name, resource_version, status):
        self.patches.append(status)
        self.job = {**self.job, "status": {**self.job["status"], **status}}
        return copy.deepcopy(self.job)

    async def list_job_pods(self, namespace, job_uid):
        return [copy.deepcopy(self.pod)] if namespace == "work" else []

    async def read_pod(self, namespace, name):
        return copy.deepcopy(self.pod) if (namespace, name) == ("work", "ledger-1") else None

    async def read_job(self, namespace, name):
        return copy.deepcopy(self.job) if (namespace, name) == KEY else None

    async def post_event(self, *event):
        pass

    async def patch_event(self, *event):
        return True

    async def release_pod(self, namespace, name, uid):
        pass


def forged_success(namespace: str = "attacker") -> dict[str, Any]:
    """A finished pod elsewhere carrying job A's UID in its label and its owner reference, of the
    attempt after A's current one (a pod of an attempt that status does not hold yet is taken
    as that attempt's start: "the pod first")."""
    pod = make_pod(2, uid="forged", phase="Succeeded", exit_code=0)
    pod["metadata"]["namespace"] = namespace
    return pod


def world() -> tuple[FakeApi, Any]:
    fake = FakeApi()
    controller = job_controller(fake, FakeClock(), pods_fresh=lambda: True)
    controller.handlers.listed = True
    controller.handlers.job_seen(copy.deepcopy(fake.job))
    controller.handlers.pod_changed(copy.deepcopy(fake.pod))
    return fake, controller


def test_a_forged_succeeded_pod_in_another_namespace_does_not_finish_the_job():
    fake, controller = world()
    controller.handlers.pod_changed(forged_success())
    assert controller.view.pods.of_job(("work", JOB_UID)) == [controller.view.pods.get(("work", JOB_UID), "pod-1")]
    assert controller.view.pods.jobs() == [("work", JOB_UID)], "the forgery is kept nowhere"
    asyncio.run(controller.reconciler.reconcile(KEY))
    assert all(patch.get("phase") != "Succeeded" for patch in fake.patches), fake.patches
    assert controller.view.jobs[KEY]["status"]["phase"] == "BackingOff"


def test_the_same_pod_in_the_jobs_namespace_would_finish_it():
    """The control: the attack above fails because of the namespace, nothing else."""
    fake, controller = world()
    fake.pod = forged_success("work")
    controller.handlers.pod_changed(copy.deepcopy(fake.pod))
    asyncio.run(controller.reconciler.reconcile(KEY))
    assert any(patch.get("phase") == "Succeeded" for patch in fake.patches)


@pytest.mark.parametrize(
    "disagreement",
    ["label names another job", "owner is another job", "no owner", "owner not a VigilJob", "owner not controller"],
)
def test_a_pod_whose_label_and_owner_disagree_is_ignored_and_not_cached(disagreement: str):
    fake, controller = world()
    pod = make_pod(2, uid="odd", phase="Succeeded", exit_code=0)
    refs = pod["metadata"].get("ownerReferences") or []
    if disagreement == "label names another job":
        pod["metadata"]["labels"][api.LABEL_JOB_UID] = "another-job"
    elif disagreement == "owner is another job":
        refs[0]["uid"] = "another-job"
    elif disagreement == "no owner":
        del pod["metadata"]["ownerReferences"]
    elif disagreement == "owner not a VigilJob":
        refs[0].update(apiVersion="batch/v1", kind="Job")
    else:
        refs[0]["controller"] = False
    controller.handlers.pod_changed(pod)
    assert all(
        p["metadata"]["uid"] != "odd" for job in controller.view.pods.jobs() for p in controller.view.pods.of_job(job)
    )
    asyncio.run(controller.reconciler.reconcile(KEY))
    assert all(patch.get("phase") != "Succeeded" for patch in fake.patches), fake.patches
