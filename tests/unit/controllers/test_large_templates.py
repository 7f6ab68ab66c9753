"""A job whose pod template the view did not keep (a large one: `core.objects.strip_job`) is read
from the API server whole by the look that creates its pod, and only by that look; the pod has
the template the API server has then; a failed read is a failed look, retried with backoff.

The controller talks to a fake API server through the real `vigil.kube.operations.Kube`, so what
it keeps is what the real reads and writes' answers give it (`strip_job` on each)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from tests.support.builders import make_job, merge_patch
from tests.support.clock import FakeClock, settle
from tests.support.controllers import job_controller
from tests.support.templates import TYPICAL_TEMPLATE, env_template
from vigil.controllers.jobs import JobController
from vigil.controllers.jobs.reconciler import read_is_the_fence
from vigil.core import actions, failures
from vigil.core.objects import strip_job, template_dropped
from vigil.core.podstate import strip_pod
from vigil.kube.errors import ApiError, Conflict, NotFound
from vigil.kube.operations import JOBS, PODS, Kube

pytestmark = pytest.mark.unit

KEY = ("work", "ledger")
JOB_PATH = f"{JOBS.format(namespace='work')}/ledger"
POD_PATH = PODS.format(namespace="work")
LARGE_ENV = 1_000  # 26 KiB of template: past TEMPLATE_KEPT_BYTES


class FakeApiServer:
    """The requests `Kube` sends for one job and its pods, answered as the API server would;
    `failures` GETs of the job fail (500) first."""

    def __init__(self, job: dict[str, Any], failures: int = 0) -> None:
        self.job, self.failures = job, failures
        self.pods: dict[str, dict[str, Any]] = {}
        self.version = int(job["metadata"]["resourceVersion"])
        self.job_reads = 0
        self.requests: list[tuple[str, str]] = []

    def bump(self) -> str:
        self.version += 1
        return str(self.version)

    async def request(self, method: str, path: str, *, params=None, body=None, **options: Any) -> Any:
        self.requests.append((method, path))
        if path == JOB_PATH and method == "GET":
            self.job_reads += 1
            if self.failures:
                self.failures -= 1
                raise ApiError("etcd is slow", status=500, reason="InternalError")
            if self.job is None:
                raise NotFound("vigiljobs ledger not found", status=404)
            return copy.deepcopy(self.job)
        if path == f"{JOB_PATH}/status" and method == "PATCH":
            if body["metadata"]["resourceVersion"] != self.job["metadata"]["resourceVersion"]:
                raise Conflict("the object has been modified", status=409)
            self.job["status"] = merge_patch(self.job.get("status") or {}, body["status"])
            self.job["metadata"]["resourceVersion"] = self.bump()
            return copy.deepcopy(self.job)
        if path == POD_PATH and method == "POST":
            name = body["metadata"]["name"]
            if name in self.pods:
                raise Conflict("already exists", status=409, reason="AlreadyExists")
            pod = copy.deepcopy(body)
            pod["metadata"].update(uid=f"uid-{name}", resourceVersion=self.bump())
            pod["status"] = {"phase": "Pending"}
            self.pods[name] = pod
            return copy.deepcopy(pod)
        if path in (POD_PATH, "/api/v1/pods") and method == "GET":  # the job's pods; the orphan sweep's
            return {"items": [copy.deepcopy(pod) for pod in self.pods.values()]}
        if path.startswith(f"{POD_PATH}/") and method == "GET":
            name = path.rsplit("/", 1)[1]
            if name not in self.pods:
                raise NotFound(f"pods {name} not found", status=404)
            return copy.deepcopy(self.pods[name])
        if "/events" in path:
            return {}
        raise AssertionError(f"unexpected request {method} {path}")

    def env_of_pod(self, name: str) -> list[str]:
        env = self.pods[name]["spec"]["containers"][0].get("env") or []
        return [entry["name"] for entry in env if not entry["name"].startswith(("VIGIL_", "POD_"))]


def world(template: dict[str, Any], failures: int = 0, **spec: Any) -> tuple[FakeApiServer, JobController]:
    """The job stored with `template`, and a controller whose view holds it as the watch gives
    it (trimmed); no workers: each look is run by the test."""
    job = make_job(spec={"heartbeat": {"required": False}, **spec})
    job["spec"]["template"] = template
    server = FakeApiServer(job, failures)
    controller = job_controller(Kube(server), FakeClock(), workers=0)  # type: ignore[arg-type]
    controller.handlers.job_seen(strip_job(copy.deepcopy(job)))
    return server, controller


def look(controller: JobController) -> None:
    asyncio.run(controller.reconciler.reconcile(KEY))


@pytest.mark.parametrize("guarantee", ["AtLeastOnce", "NoOverlap"])
def test_the_pod_of_a_job_whose_template_was_not_kept_has_the_whole_template(guarantee: str) -> None:
    """NoOverlap: the start is in doubt too (its pods are listed after the read), so the fence
    reads the job again after that list: two reads, one pod."""
    server, controller = world(env_template(LARGE_ENV), guarantee=guarantee)
    assert template_dropped(controller.view.jobs[KEY])
    recorded: list[dict[str, Any]] = []  # the jobs events are about (the recorder's backlog holds them)
    record = controller.events.record
    controller.events.record = lambda job, *event: (recorded.append(job), record(job, *event))[1]  # type: ignore[method-assign]
    look(controller)
    assert list(server.pods) == ["ledger-1"]
    assert len(server.env_of_pod("ledger-1")) == LARGE_ENV
    # One read, and nothing more: under the pod-first rule the read is also the start's fence
    # (ConfirmVersion of the version just read would read the 26 KiB again); in doubt, the pods
    # are listed after it, and the fence reads once more. The view keeps the job trimmed still.
    assert server.job_reads == (1 if guarantee == "AtLeastOnce" else 2), server.requests
    assert template_dropped(controller.view.jobs[KEY])
    # Nothing holds the template after the look: not the view, not an event waiting to be sent.
    assert recorded and all(template_dropped(job) for job in recorded)


def test_a_small_template_costs_no_read_of_the_job_beyond_the_fence() -> None:
    server, controller = world(copy.deepcopy(TYPICAL_TEMPLATE))
    assert controller.view.jobs[KEY]["spec"]["template"] == TYPICAL_TEMPLATE
    look(controller)
    assert list(server.pods) == ["ledger-1"]
    assert server.env_of_pod("ledger-1") == [e["name"] for e in TYPICAL_TEMPLATE["spec"]["containers"][0]["env"]]
    assert server.job_reads == 1, "the ConfirmVersion fence of a start alone, as before; no second read"


def test_looks_that_create_no_pod_never_read_the_template() -> None:
    """After the start: the look that records the attempt, and the ones of a running pod."""
    server, controller = world(env_template(LARGE_ENV))
    look(controller)
    reads = server.job_reads
    pod = server.pods["ledger-1"]
    pod["status"] = {"phase": "Running"}
    pod["spec"]["nodeName"] = "node-a"
    controller.handlers.pod_changed(strip_pod(copy.deepcopy(pod)))
    for _ in range(3):
        look(controller)
    assert server.job_reads == reads, server.requests
    assert server.job["status"]["phase"] == "Running" and list(server.pods) == ["ledger-1"]


def test_the_pod_has_the_template_the_api_server_has_now_not_the_one_the_view_heard_of() -> None:
    """The view heard of a version whose template it did not keep; the job was replaced since
    by a version with another template (the template is immutable under the CRD's rule, so
    this is a stored object of an older CRD, or a restore): the pod is made of the current one,
    and the decision is fenced on the version read."""
    server, controller = world(env_template(LARGE_ENV))
    edited = env_template(LARGE_ENV + 7)
    server.job["spec"]["template"] = edited
    server.job["metadata"]["resourceVersion"] = server.bump()
    look(controller)
    assert len(server.env_of_pod("ledger-1")) == LARGE_ENV + 7
    assert controller.view.jobs[KEY]["metadata"]["resourceVersion"] == server.job["metadata"]["resourceVersion"]


def test_a_new_job_of_the_same_name_is_not_started_from_the_old_ones_look() -> None:
    server, controller = world(env_template(LARGE_ENV))
    server.job = {**server.job, "metadata": {**server.job["metadata"], "uid": "another-uid"}}
    look(controller)
    assert server.pods == {}
    assert controller.view.jobs[KEY]["metadata"]["uid"] == "another-uid"
    assert len(controller.queue) == 1, "the new job is looked at on its own"


def test_a_job_gone_at_the_read_is_forgotten_and_nothing_is_made() -> None:
    server, controller = world(env_template(LARGE_ENV))
    server.job = None  # type: ignore[assignment]
    look(controller)
    assert server.pods == {} and KEY not in controller.view.jobs


def test_a_failed_read_fails_the_look_and_the_worker_retries_it_with_backoff() -> None:
    async def scenario() -> tuple[FakeApiServer, list[str]]:
        job = make_job(spec={"heartbeat": {"required": False}})
        job["spec"]["template"] = env_template(LARGE_ENV)
        server = FakeApiServer(job, failures=1)
        clock = FakeClock()
        controller = job_controller(Kube(server), clock, workers=1)  # type: ignore[arg-type]
        controller.handlers.job_seen(strip_job(copy.deepcopy(job)))
        await controller.start()
        await settle()
        assert server.pods == {}, "no pod before the read succeeds"
        conditions = (server.job.get("status") or {}).get("conditions") or []
        reasons = [c["reason"] for c in conditions if c["type"] == failures.CONDITION]
        assert await clock.until(lambda: server.pods, within=5), "retried within the first backoff (1 s, jittered)"
        await controller.stop()
        return server, reasons

    server, reasons = asyncio.run(scenario())
    assert reasons == ["ReconcileFailed"], "the failure is shown on the job, as any failed look's"
    assert len(server.env_of_pod("ledger-1")) == LARGE_ENV
    assert server.job_reads == 2, "the failed read, then the read that is also the fence"


def test_only_a_first_confirmation_of_the_version_just_read_is_dropped() -> None:
    create = actions.CreatePod(manifest={"metadata": {"name": "ledger-1"}})
    fenced = actions.Decision((actions.ConfirmVersion("7"), create))
    assert read_is_the_fence(fenced, "7").actions == (create,)
    assert read_is_the_fence(fenced, "8") == fenced, "another version: the fence stays, and will fail"
    later = actions.Decision((actions.EmitEvent("Normal", "Started", "m"), actions.ConfirmVersion("7"), create))
    assert read_is_the_fence(later, "7") == later
    assert read_is_the_fence(actions.Decision(), "7") == actions.Decision()
