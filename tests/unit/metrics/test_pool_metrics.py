"""The gauges of VigilWorkerPools (vigil.metrics.collectors.PoolCollector): read at each scrape
from the pool controller's pools and pods and the leader's lease state, labelled by namespace and
pool only, the status's figures on a replica without a lease state, and gone with the pool."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import generate_latest

from tests.support.clock import FakeClock
from vigil import api
from vigil.controllers.pools import PoolController
from vigil.core.pools import PoolLoad, keep_pool_pod
from vigil.kube.seen import Delta
from vigil.metrics import Metrics
from vigil.metrics.collectors import POOL_GAUGES, PoolCollector, pool_numbers

pytestmark = pytest.mark.unit

GAUGES = [name for _, name, _ in POOL_GAUGES]


def pool(name: str = "etl", uid: str = "pool-uid", status: dict | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.POOL_KIND,
        "metadata": {"name": name, "namespace": "team-a", "uid": uid, "generation": 1, "resourceVersion": "5"},
        "spec": {"template": {"spec": {"containers": [{"name": "w", "image": "etl:1"}]}}, **spec},
        "status": status or {},
    }


def pod(
    name: str, *, phase: str = "Running", ready: bool = True, deleting: bool = False, owner: str = "pool-uid"
) -> dict[str, Any]:
    """A worker pod of the pool `etl` as the API server sends it, trimmed as the pool pods' watch trims it."""
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": "team-a",
        "uid": f"uid-{name}",
        "resourceVersion": "7",
        "labels": {api.LABEL_POOL: "etl", "app": "etl"},
        "ownerReferences": [
            {"apiVersion": api.API_VERSION, "kind": api.POOL_KIND, "name": "etl", "uid": owner, "controller": True}
        ],
    }
    if deleting:
        metadata["deletionTimestamp"] = "2026-03-01T12:00:00Z"
    status = {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    kept = keep_pool_pod({"metadata": metadata, "spec": {"nodeName": "n1"}, "status": status})
    assert kept is not None
    return kept


PODS = [
    pod("etl-a"),
    pod("etl-b"),
    pod("etl-c", phase="Pending", ready=False),  # a worker, not Ready yet
    pod("etl-d", deleting=True),  # going: not a worker any more
    pod("etl-e", phase="Failed", ready=False),  # ended: replaced
    pod("etl-f", owner="older-pool-uid"),  # a pod of an older pool of that name, going with it
]


def value(m: Metrics, name: str, pool: str = "etl") -> float | None:
    return m.registry.get_sample_value(name, {"namespace": "team-a", "pool": pool})


def test_a_pools_numbers_count_its_live_workers_its_ready_slots_and_the_lease_states_load():
    body = pool(maxReplicas=4, slotsPerWorker=3, status={"desiredReplicas": 3, "slotsUsed": 1, "backlog": 1})
    assert pool_numbers(body, PODS, PoolLoad(queued=7, running=5, busy={"etl-a": 3, "etl-b": 2})) == {
        "workers": 3,
        "workersReady": 2,
        "slots": 6,
        "slotsUsed": 5,  # the lease state's, not the status's (written at most every few seconds)
        "backlog": 7,
        "desiredWorkers": 3,
        "maxWorkers": 4,
    }


def test_without_a_lease_state_the_tasks_are_the_status_and_before_any_status_absent():
    with_status = pool(status={"desiredReplicas": 2, "slotsUsed": 2, "backlog": 9})
    numbers = pool_numbers(with_status, PODS[:2], None)
    assert numbers == {
        "workers": 2,
        "workersReady": 2,
        "slots": 2,  # slotsPerWorker's default, 1
        "slotsUsed": 2,
        "backlog": 9,
        "desiredWorkers": 2,
        "maxWorkers": 10,  # maxReplicas's default
    }
    assert pool_numbers(pool(), [], None) == {"workers": 0, "workersReady": 0, "slots": 0, "maxWorkers": 10}


def test_a_scrape_shows_each_pool_labelled_by_namespace_and_pool_and_never_a_pod():
    pools = {("team-a", "etl"): pool(maxReplicas=4, slotsPerWorker=2, status={"desiredReplicas": 4})}
    load = {("team-a", "etl"): PoolLoad(queued=12, running=4, busy={"etl-a": 2, "etl-b": 2})}
    m = Metrics()
    m.collect_from(PoolCollector(lambda: pools, lambda ns, name: PODS, lambda ns, name: load.get((ns, name))))
    assert value(m, "vigil_pool_workers") == 3
    assert value(m, "vigil_pool_workers_ready") == 2
    assert value(m, "vigil_pool_slots") == 4
    assert value(m, "vigil_pool_slots_used") == 4
    assert value(m, "vigil_pool_backlog") == 12
    assert value(m, "vigil_pool_desired_workers") == 4
    assert value(m, "vigil_pool_max_workers") == 4
    load[("team-a", "etl")] = PoolLoad(queued=3, running=4)  # read at the scrape, never kept
    assert value(m, "vigil_pool_backlog") == 3
    text = generate_latest(m.registry)
    assert b"etl-a" not in text and b"pod=" not in text, "never labelled by pod"


def test_a_pools_series_follow_the_pool_controllers_pools_and_go_with_a_deleted_pool():
    # A controller that does not run (a replica standing by): the watches still feed it.
    controller = PoolController(None, clock=FakeClock(), metrics=Metrics(), beat_channel=None)  # type: ignore[arg-type]
    m = Metrics()
    m.collect_from(
        PoolCollector(
            lambda: controller.pools,
            lambda namespace, name: controller.pods.get((namespace, name), {}).values(),
            lambda namespace, name: None,  # no lease state here
        )
    )
    controller.pool_delta(Delta("upsert", pool(status={"desiredReplicas": 2, "backlog": 5, "slotsUsed": 1})))
    controller.pool_delta(Delta("upsert", pool("other", uid="other-uid")))
    for each in PODS:
        controller.pod_delta(Delta("upsert", each))
    assert value(m, "vigil_pool_workers") == 3 and value(m, "vigil_pool_backlog") == 5
    assert value(m, "vigil_pool_workers", pool="other") == 0
    assert value(m, "vigil_pool_backlog", pool="other") is None, "no figure before the leader wrote one"
    controller.pod_delta(Delta("delete", PODS[0]))
    assert value(m, "vigil_pool_workers") == 2
    controller.pool_delta(Delta("delete", pool()))
    text = generate_latest(m.registry).decode()
    assert 'pool="etl"' not in text, "the deleted pool's series are gone"
    assert 'vigil_pool_workers{namespace="team-a",pool="other"} 0.0' in text
    for name in GAUGES:  # every family is described, with or without a pool
        assert f"# TYPE {name} gauge" in text
