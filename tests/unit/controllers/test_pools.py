"""The VigilWorkerPool controller on a fake clock and a fake API server: a pool's pods created and
deleted as its decision says, its status written first and only when it changed, a deleted pod
never counted twice (its watch's echo comes after the delete), nothing done to pods while the pod
watch cannot be believed, a poke that brings a look, and a failed create shown in the status."""

from __future__ import annotations

import asyncio
import copy
import random
from typing import Any

import pytest

from tests.support.clock import FakeClock
from vigil import api
from vigil.controllers.pools import RESYNC_SECONDS, PoolController
from vigil.core.manifest import BeatChannel
from vigil.core.pools import PoolLoad, keep_pool_pod
from vigil.kube.errors import Conflict, Refused
from vigil.kube.seen import Delta
from vigil.metrics import Metrics

pytestmark = pytest.mark.unit

CHANNEL = BeatChannel("https://vigil.vigil-system.svc:8443/v1/heartbeat", "CA")
TEMPLATE = {"spec": {"containers": [{"name": "worker", "image": "etl:1"}]}}


def pool(resource_version: str = "10", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.POOL_KIND,
        "metadata": {
            "name": "etl",
            "namespace": "team-a",
            "uid": "pool-uid",
            "generation": 1,
            "resourceVersion": resource_version,
        },
        "spec": {"template": TEMPLATE, **spec},
        "status": {},
    }


class Api:
    """The API server as the controller sees it: status patches and pod creates answered at
    once (a created pod Running and Ready), deletes recorded."""

    def __init__(self) -> None:
        self.statuses: list[dict[str, Any]] = []
        self.created: list[dict[str, Any]] = []
        self.deleted: list[tuple[str, str]] = []
        self.version = 100
        self.refuse_creates: Exception | None = None
        self.conflict_status = False
        self.body = pool()  # the pool as the API server has it

    def set_pool(self, body: dict[str, Any]) -> dict[str, Any]:
        self.body = copy.deepcopy(body)
        return body

    async def patch_pool_status(self, namespace: str, name: str, resource_version: str, status: dict) -> dict:
        if self.conflict_status:
            raise Conflict("the object has been modified", status=409)
        self.statuses.append(status)
        self.version += 1
        self.body["metadata"]["resourceVersion"] = str(self.version)
        self.body["status"] = status
        return copy.deepcopy(self.body)

    async def create_pool_pod(self, namespace: str, manifest: dict) -> dict | None:
        if self.refuse_creates is not None:
            raise self.refuse_creates
        self.version += 1
        pod = copy.deepcopy(manifest)
        pod["metadata"].update(
            uid=f"uid-{manifest['metadata']['name']}",
            resourceVersion=str(self.version),
            creationTimestamp="2026-03-01T12:00:00Z",
        )
        pod["status"] = {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-03-01T12:00:00Z"}],
        }
        self.created.append(pod)
        return keep_pool_pod(copy.deepcopy(pod))

    async def delete_pod(self, namespace: str, name: str, uid: str | None, grace_seconds: int | None = None) -> None:
        self.deleted.append((name, uid or ""))


async def started(
    spec: dict[str, Any] | None = None, **options: Any
) -> tuple[FakeClock, Api, PoolController, dict[str, Any]]:
    clock, kube = FakeClock(), Api()
    options.setdefault("beat_channel", CHANNEL)
    controller = PoolController(
        kube,  # type: ignore[arg-type]
        clock=clock,
        metrics=Metrics(),
        rng=random.Random(0),
        **options,
    )
    body = kube.set_pool(pool(**(spec or {"minReplicas": 2})))
    controller.pool_delta(Delta("upsert", body))
    await controller.start()
    return clock, kube, controller, body


def echo(controller: PoolController, kube: Api) -> None:
    """The pod watch delivers every pod created so far (as the API server created it)."""
    for pod in kube.created:
        kept = keep_pool_pod(copy.deepcopy(pod))
        assert kept is not None
        controller.pod_delta(Delta("upsert", kept))


def test_a_pool_gets_its_pods_and_status_and_a_resync_makes_no_more():
    async def scenario() -> None:
        clock, kube, controller, _ = await started()
        await clock.advance(0.1)
        assert len(kube.created) == 2
        assert kube.statuses and kube.statuses[0]["desiredReplicas"] == 2
        assert all(p["metadata"]["labels"][api.LABEL_POOL] == "etl" for p in kube.created)
        echo(controller, kube)
        await clock.advance(3 * RESYNC_SECONDS)
        assert len(kube.created) == 2, "the pods it created count at once, and the watch's echo is no news"
        assert kube.statuses[-1]["replicas"] == 2 and kube.statuses[-1]["readyReplicas"] == 2
        await controller.stop()

    asyncio.run(scenario())


def test_a_deleted_pod_is_not_counted_again_when_the_watch_echoes_it_unchanged():
    async def scenario() -> None:
        clock, kube, controller, _ = await started({"minReplicas": 1, "replicas": 3})
        await clock.advance(0.1)
        echo(controller, kube)
        assert len(kube.created) == 3
        controller.pool_delta(Delta("upsert", kube.set_pool(pool("500", minReplicas=1, replicas=1))))
        await clock.advance(1.0)
        assert len(kube.deleted) == 2
        echo(controller, kube)  # the pods as they were before the delete: no deletionTimestamp yet
        await clock.advance(3 * RESYNC_SECONDS)
        assert len(kube.deleted) == 2, "no third worker deleted for the two still shown"
        assert len(kube.created) == 3
        for pod in kube.created:  # now the watch shows them gone
            if (pod["metadata"]["name"], pod["metadata"]["uid"]) in kube.deleted:
                kept = keep_pool_pod(copy.deepcopy(pod))
                assert kept is not None
                controller.pod_delta(Delta("delete", kept))
        await clock.advance(3 * RESYNC_SECONDS)
        assert len(kube.deleted) == 2 and len(kube.created) == 3
        await controller.stop()

    asyncio.run(scenario())


def test_busy_workers_stay_and_a_poke_brings_a_look():
    load = {"value": PoolLoad()}

    async def scenario() -> None:
        clock, kube, controller, _ = await started(
            {"minReplicas": 1, "maxReplicas": 5, "slotsPerWorker": 2}, pool_load=lambda ns, name: load["value"]
        )
        await clock.advance(0.1)
        echo(controller, kube)
        assert len(kube.created) == 1
        load["value"] = PoolLoad(queued=7, running=1)
        controller.poke("team-a", "etl")
        await clock.advance(2.5)
        assert len(kube.created) == 4, "ceil(8 / 2) workers, without waiting for the resync"
        await controller.stop()

    asyncio.run(scenario())


def test_nothing_is_done_to_pods_while_the_pod_watch_cannot_be_believed():
    fresh = {"value": False}

    async def scenario() -> None:
        clock, kube, controller, _ = await started(pods_fresh=lambda: fresh["value"])
        await clock.advance(5.0)
        assert kube.created == [] and kube.statuses == []
        fresh["value"] = True
        await clock.advance(1.5)
        assert len(kube.created) == 2
        await controller.stop()

    asyncio.run(scenario())


def test_a_failed_create_is_retried_and_shown_in_the_ready_condition():
    async def scenario() -> None:
        clock, kube, controller, _ = await started()
        kube.refuse_creates = Refused("pods is forbidden: exceeded quota", status=403)
        await clock.advance(0.1)
        assert kube.created == []
        await clock.advance(5.0)
        ready = {c["type"]: c for c in kube.statuses[-1]["conditions"]}["Ready"]
        assert ready["reason"] == "PodCreateFailed" and "exceeded quota" in ready["message"]
        kube.refuse_creates = None
        await clock.advance(30.0)
        assert len(kube.created) == 2
        ready = {c["type"]: c for c in kube.statuses[-1]["conditions"]}["Ready"]
        assert ready["reason"] != "PodCreateFailed"
        await controller.stop()

    asyncio.run(scenario())


def test_a_conflict_on_the_status_voids_the_look():
    async def scenario() -> None:
        clock, kube, controller, _ = await started()
        kube.conflict_status = True
        await clock.advance(2.0)
        assert kube.created == [], "no pod on a decision taken on a pool that changed"
        await controller.stop()

    asyncio.run(scenario())


def test_no_beat_channel_no_pods():
    async def scenario() -> None:
        clock, kube, controller, _ = await started(beat_channel=None)
        await clock.advance(1.0)
        assert kube.created == []
        ready = {c["type"]: c for c in kube.statuses[-1]["conditions"]}["Ready"]
        assert ready["reason"] == "NoPullEndpoint"
        await controller.stop()

    asyncio.run(scenario())


def test_a_pool_deleted_is_forgotten():
    async def scenario() -> None:
        clock, kube, controller, body = await started()
        controller.pool_delta(Delta("delete", body))
        await clock.advance(3 * RESYNC_SECONDS)
        assert kube.created == [] and kube.statuses == []
        await controller.stop()

    asyncio.run(scenario())


def test_a_worker_that_took_a_task_while_the_look_wrote_is_kept():
    calls = {"n": 0}

    def load(namespace: str, name: str) -> PoolLoad:
        calls["n"] += 1  # the two looks' own reads find every worker idle; the one before the delete, busy
        return PoolLoad() if calls["n"] <= 2 else PoolLoad(running=1, busy={pod: 1 for pod in names})

    names: list[str] = []

    async def scenario() -> None:
        clock, kube, controller, _ = await started({"minReplicas": 1, "replicas": 2}, pool_load=load)
        await clock.advance(0.1)
        names.extend(p["metadata"]["name"] for p in kube.created)
        echo(controller, kube)
        controller.pool_delta(Delta("upsert", kube.set_pool(pool("500", minReplicas=1, replicas=1))))
        await clock.advance(1.0)
        assert kube.deleted == [], "asked again before the delete: it is busy now"
        await controller.stop()

    asyncio.run(scenario())
