"""A task array's finished, released pods: held as a version alone, never looked at again, and
never brought back by a late event; a plain job's pods are held whole as before."""

from __future__ import annotations

import asyncio
import tracemalloc
from typing import Any

import pytest

from tests.support.clock import FakeClock
from tests.support.controllers import job_controller
from vigil.controllers.jobs.podcache import PodCache
from vigil.core import podstate

pytestmark = pytest.mark.unit

JOB = ("ns", "job-uid")
OWNER = {"apiVersion": "vigil.dev/v1beta1", "kind": "VigilJob", "name": "a", "uid": "job-uid", "controller": True}


def task_pod(index: int, version: int, phase: str = "Succeeded", tracked: bool = False, task: bool = True) -> dict:
    labels = {"vigil.dev/job-uid": "job-uid", "vigil.dev/attempt": "1"}
    if task:
        labels["vigil.dev/task-index"] = str(index)
    metadata: dict[str, Any] = {
        "name": f"a-{index}-1",
        "namespace": "ns",
        "uid": f"pod-{index}",
        "resourceVersion": str(version),
        "labels": labels,
        "ownerReferences": [OWNER],
        "creationTimestamp": "2026-12-07T10:00:00Z",
    }
    if tracked:
        metadata["finalizers"] = ["vigil.dev/attempt-tracking"]
    terminated = {"exitCode": 0, "reason": "Completed", "finishedAt": "2026-12-07T10:00:02Z"}
    status = {"phase": phase, "containerStatuses": [{"name": "c", "state": {"terminated": terminated}}]}
    return podstate.strip_pod({"metadata": metadata, "spec": {"nodeName": "n"}, "status": status})


def test_a_finished_released_task_pod_is_held_as_its_version_and_a_late_event_does_not_bring_it_back():
    cache = PodCache()
    assert cache.watched(task_pod(0, 10, tracked=True))
    assert [p["metadata"]["uid"] for p in cache.of_job(JOB)] == ["pod-0"], "finished but tracked: held whole"
    assert cache.watched(task_pod(0, 11))  # released
    assert cache.of_job(JOB) == [] and cache.is_settled(JOB, "pod-0") and len(cache) == 1
    assert cache.get(JOB, "pod-0") is None and cache.by_uid("pod-0") is None
    # A late event from before the release (the watch behind a direct read) changes nothing.
    assert not cache.watched(task_pod(0, 10, tracked=True))
    assert not cache.watched(task_pod(0, 9, phase="Running", tracked=True))
    assert cache.of_job(JOB) == [] and cache.is_settled(JOB, "pod-0")
    assert cache.watched(task_pod(0, 12)), "a newer version moves the version held"
    assert not cache.watched(task_pod(0, 11, tracked=True))


def test_a_plain_jobs_pod_and_a_running_task_pod_are_held_whole():
    cache = PodCache()
    cache.watched(task_pod(0, 10, task=False))  # a job's attempt, finished and released
    cache.watched(task_pod(1, 10, phase="Running"))  # a task's running pod (not yet tracked: still whole)
    assert sorted(p["metadata"]["uid"] for p in cache.of_job(JOB)) == ["pod-0", "pod-1"]
    assert not cache.is_settled(JOB, "pod-0") and not cache.is_settled(JOB, "pod-1")


def test_settled_pods_go_with_their_deletion_a_relist_without_them_and_their_job():
    cache = PodCache()
    for i in range(3):
        cache.watched(task_pod(i, 10 + i))
    cache.gone(JOB, "pod-0")
    assert not cache.is_settled(JOB, "pod-0") and len(cache) == 2
    cache.replace_job(JOB, [task_pod(1, 20)])  # pod-2 is no longer there
    assert cache.is_settled(JOB, "pod-1") and not cache.is_settled(JOB, "pod-2") and len(cache) == 1
    assert cache.drop_job(JOB) == [], "nothing of a settled pod is left to release"
    assert len(cache) == 0


def test_ten_thousand_settled_pods_cost_a_fraction_of_holding_them_whole():
    """docs/capacity-planning.md: the operator's memory per finished task. Each pod is decoded
    inside the measurement and only the cache keeps it, as the watch hands pods over."""

    def held(task: bool) -> float:
        tracemalloc.start()
        cache = PodCache()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(10_000):
            cache.watched(task_pod(i, 100 + i, task=task))
        size = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        assert len(cache) == 10_000
        return size / 10_000

    settled, whole = held(task=True), held(task=False)  # a plain job's finished pods are kept whole
    print(f"bytes per finished pod held: a task's {settled:.0f}, a plain job's {whole:.0f}")
    assert settled * 5 < whole, (settled, whole)


def test_the_watch_showing_a_settled_task_pod_forgets_it_in_the_detector_and_brings_no_look():
    c = job_controller(None, FakeClock(), pod_batch_seconds=0, workers=0)
    c.handlers.pod_changed(task_pod(0, 10, phase="Running", tracked=True))
    assert "pod-0" in c.view.looked_at and len(c.view.tracker) == 1

    async def take_all() -> None:
        while len(c.queue):
            key = await c.queue.get()
            c.queue.done(key)

    asyncio.run(take_all())
    c.handlers.pod_changed(task_pod(0, 11))  # finished and released
    assert c.view.pods.is_settled(JOB, "pod-0")
    assert "pod-0" not in c.view.looked_at and len(c.view.tracker) == 0
    assert len(c.queue) == 0, "no look for a pod whose outcome status holds already"
