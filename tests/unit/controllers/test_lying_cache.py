"""The shell against a cache that lies, without a cluster.

A fake API server holds the truth: the job, and its pods as they really are. The controller's
cache is fed a corrupted view of that truth, chosen by hypothesis at every step: updates dropped
(a stalled watch), stale snapshots delivered late, the pod missing altogether, a deleted pod
lingering, the freshness signal on or off. Whatever the cache says:

- an attempt whose agent really beats is never declared Lost, its pod never marked superseded
  or deleted, and no second attempt starts;
- under NoOverlap, no pod of a new attempt is created while a pod of an earlier one really
  exists and has not finished;
- an attempt whose agent really is silent is declared Lost once the operator hears and the
  timeout has passed: the checks do not stop true verdicts.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.builders import make_job, merge_patch
from tests.support.clock import FakeClock
from tests.support.controllers import job_controller
from vigil import api
from vigil.kube.errors import Conflict

pytestmark = pytest.mark.unit

HEARTBEAT = {"intervalSeconds": 1, "timeoutSeconds": 6, "startupGraceSeconds": 0, "required": True}
KEY = ("work", "ledger")


class FakeApi:
    """The truth, with the calls the controller makes. Pods are kept by name."""

    def __init__(self, job: dict[str, Any]):
        self.job = job
        self.pods: dict[str, dict[str, Any]] = {}
        self.version = 100
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.superseded: list[str] = []

    def bump(self) -> str:
        self.version += 1
        return str(self.version)

    async def patch_job_status(self, namespace, name, resource_version, status):
        if resource_version and resource_version != self.job["metadata"]["resourceVersion"]:
            raise Conflict("stale")
        self.job = {**self.job, "status": merge_patch(self.job.get("status") or {}, status)}
        self.job["metadata"] = {**self.job["metadata"], "resourceVersion": self.bump()}
        return copy.deepcopy(self.job)

    async def create_pod(self, namespace, manifest):
        name = manifest["metadata"]["name"]
        if name in self.pods:
            return None
        pod = copy.deepcopy(manifest)
        pod["metadata"].update(uid=f"uid-{name}", resourceVersion=self.bump())
        pod["status"] = {"phase": "Pending"}
        self.pods[name] = pod
        self.created.append(name)
        return copy.deepcopy(pod)

    async def list_job_pods(self, namespace, job_uid):
        return [copy.deepcopy(p) for p in self.pods.values()]

    async def read_pod(self, namespace, name):
        pod = self.pods.get(name)
        return copy.deepcopy(pod) if pod else None

    async def delete_pod(self, namespace, name, uid, grace_seconds=None):
        self.deleted.append(name)
        self.pods.pop(name, None)

    async def annotate_pod(self, namespace, name, uid, annotations):
        if api.ANNOTATION_SUPERSEDED in annotations:
            self.superseded.append(name)

    async def release_pod(self, namespace, name, uid):
        pass

    async def post_event(self, job, event):
        pass

    async def patch_event(self, namespace, event):
        return True

    async def patch_job_labels(self, namespace, name, resource_version, labels):
        return None

    async def delete_job(self, namespace, name, uid):
        pass

    async def read_job(self, namespace, name):
        return copy.deepcopy(self.job)

    def run(self, name: str, beat: str | None = None) -> dict[str, Any]:
        """The pod running on a node, beating `beat`: a new version of the truth."""
        pod = self.pods[name]
        pod["spec"]["nodeName"] = "node-a"
        pod["status"] = {"phase": "Running"}
        if beat is not None:
            pod["metadata"].setdefault("annotations", {})[api.ANNOTATION_HEARTBEAT] = beat
        pod["metadata"]["resourceVersion"] = self.bump()
        return copy.deepcopy(pod)


class World:
    def __init__(self, guarantee: str):
        self.fake = FakeApi(make_job(spec={"heartbeat": HEARTBEAT, "guarantee": guarantee}))
        self.clock = FakeClock()
        self.pods_fresh = True
        self.controller = job_controller(self.fake, self.clock, pods_fresh=lambda: self.pods_fresh)
        self.controller.handlers.job_seen(copy.deepcopy(self.fake.job))

    def reconcile(self) -> None:
        asyncio.run(self.controller.reconciler.reconcile(KEY))
        self.controller.handlers.job_seen(copy.deepcopy(self.fake.job))

    def deliver(self, pod: dict[str, Any]) -> None:
        self.controller.handlers.pod_changed(copy.deepcopy(pod))


# What the watch does with each new truth: deliver it, drop it, deliver an older snapshot, lose
# the pod from the cache, or deliver it twice.
watch_behaviour = st.sampled_from(["deliver", "drop", "stale", "forget", "duplicate"])
step = st.tuples(watch_behaviour, st.floats(min_value=0.3, max_value=4.0), st.booleans())


def _feed(world: World, behaviour: str, truth: dict[str, Any], stale: dict[str, Any] | None) -> None:
    if behaviour == "deliver":
        world.deliver(truth)
    elif behaviour == "duplicate":
        world.deliver(truth)
        world.deliver(truth)
    elif behaviour == "stale" and stale is not None:
        world.deliver(stale)
    elif behaviour == "forget":
        world.controller.view.pods.gone(
            (truth["metadata"]["namespace"], truth["metadata"]["labels"][api.LABEL_JOB_UID]), truth["metadata"]["uid"]
        )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["AtLeastOnce", "NoOverlap"]), st.lists(step, min_size=5, max_size=40))
def test_a_beating_attempt_is_never_killed_whatever_the_cache_says(guarantee, steps):
    world = World(guarantee)
    world.reconcile()  # reserves attempt 1 and creates its pod
    assert world.fake.created == ["ledger-1"]
    first = world.fake.run("ledger-1", beat="0")
    world.deliver(first)
    world.reconcile()
    previous = first
    for number, (behaviour, seconds, fresh) in enumerate(steps, start=1):
        world.clock.tick(seconds)
        world.pods_fresh = fresh
        truth = world.fake.run("ledger-1", beat=str(number))  # the agent beats, whatever the operator sees
        _feed(world, behaviour, truth, previous)
        previous = truth
        world.reconcile()
        assert world.fake.deleted == [] and world.fake.superseded == [], f"healthy pod killed at step {number}"
        assert world.fake.created == ["ledger-1"], "no second attempt for a healthy one"
        history = world.fake.job["status"].get("history") or []
        assert not [r for r in history if r["outcome"] == "Lost"], history


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=1, max_size=25))
def test_no_overlap_never_starts_while_an_earlier_pod_really_exists(steps):
    world = World("NoOverlap")
    world.reconcile()
    world.deliver(world.fake.run("ledger-1", beat="0"))
    world.reconcile()
    # The attempt fails its heartbeat: the agent goes silent for good, but its pod lingers in
    # truth (a node that does not answer: the deletion never completes).
    lingering = copy.deepcopy(world.fake.pods["ledger-1"])
    for behaviour, seconds, fresh in steps:
        world.clock.tick(seconds)
        world.pods_fresh = fresh
        if "ledger-1" not in world.fake.pods and world.fake.deleted:
            # Vigil deleted it, but the pod stays terminating in truth.
            lingering["metadata"]["deletionTimestamp"] = "2025-03-01T12:10:00Z"
            lingering["metadata"]["resourceVersion"] = world.fake.bump()
            world.fake.pods["ledger-1"] = lingering
        _feed(world, behaviour if behaviour != "stale" else "forget", world.fake.pods["ledger-1"], None)
        world.reconcile()
        assert "ledger-2" not in world.fake.created, "attempt 2 started while attempt 1's pod still exists"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(watch_behaviour, st.booleans()), min_size=1, max_size=10))
def test_a_silent_attempt_is_still_declared_lost_once_the_operator_hears(lies):
    world = World("AtLeastOnce")
    world.reconcile()
    world.deliver(world.fake.run("ledger-1", beat="0"))
    world.reconcile()
    for behaviour, fresh in lies:  # the agent never beats again; the cache lies meanwhile (< timeout)
        world.clock.tick(0.5)
        world.pods_fresh = fresh
        _feed(world, behaviour, world.fake.pods["ledger-1"], None)
        world.reconcile()
    world.pods_fresh = True
    world.clock.tick(HEARTBEAT["timeoutSeconds"] + 1)
    world.reconcile()
    history = world.fake.job["status"].get("history") or []
    assert [r["outcome"] for r in history] == ["Lost"], world.fake.job["status"]
    assert world.fake.superseded == ["ledger-1"] and world.fake.deleted == ["ledger-1"]
