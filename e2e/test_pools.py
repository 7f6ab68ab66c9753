"""VigilWorkerPool end to end on the bed: `vigil operator` with a pull endpoint (its beat server)
keeps a pool's worker pods: minReplicas of them, each labelled vigil.dev/pool, controlled by the
pool, with no finalizer, given the pull protocol's environment and a projected token (docs/pull.md,
"The pool's pods"); a deleted worker is replaced; `kubectl scale` (the /scale subresource) sets how
many; deleting the pool takes its pods with it (garbage collection). The API server refuses a pool
whose bounds cross, or whose name cannot be a label value. The kwok pods run nothing: no worker
pulls here, so the pool's load is none and it keeps its minimum (or spec.replicas).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.support.cluster import Kube, free_port, install_crds
from tests.support.jobs import GROUP, VERSION
from tests.support.operators import beat_args
from tests.support.pools import POOLS, pool_pods, read_pool, worker_pool
from tests.support.waits import wait_until
from vigil.core.manifest import BEAT_TOKEN_DIR, BEAT_TOKEN_VOLUME
from vigil.servers.webhook import make_self_signed

pytestmark = pytest.mark.e2e


@pytest.fixture
def pulling_operator(own_operator, tmp_path: Path) -> int:
    """An operator for own_namespace with a beat server, so with a pull endpoint; its port."""
    make_self_signed(tmp_path / "certs")
    port = free_port()
    own_operator(extra_args=beat_args(tmp_path / "certs", port, f"https://127.0.0.1:{port}/v1/heartbeat"))
    return port


def test_a_pool_keeps_its_workers_replaces_them_scales_and_goes_with_its_pods(
    kube: Kube, own_namespace: str, pulling_operator: int
) -> None:
    ns, port = own_namespace, pulling_operator
    created = kube.custom.create_namespaced_custom_object(
        GROUP, VERSION, ns, POOLS, worker_pool("etl", minReplicas=2, slotsPerWorker=3)
    )
    uid = created["metadata"]["uid"]
    assert created["spec"]["maxReplicas"] == 10 and created["spec"]["heartbeat"] == {
        "intervalSeconds": 5,
        "timeoutSeconds": 30,
    }, "the API server fills in the defaults"

    # minReplicas 2: two workers, as docs/pull.md says they are made.
    pods = wait_until(lambda: len(pool_pods(kube, ns, "etl")) == 2 and pool_pods(kube, ns, "etl"), 30, "2 workers")
    for pod in pods:
        meta = pod.metadata
        assert meta.name.startswith("etl-") and len(meta.name) == len("etl-") + 5
        assert meta.labels == {"app": "etl", "vigil.dev/pool": "etl"}
        [owner] = meta.owner_references
        assert (owner.kind, owner.name, owner.uid, owner.controller, owner.block_owner_deletion) == (
            "VigilWorkerPool",
            "etl",
            uid,
            True,
            True,
        )
        assert not meta.finalizers, "no finalizer: deleting the pool or the namespace never waits on Vigil"
        [container] = pod.spec.containers
        env = {e.name: e for e in container.env}
        assert env["VIGIL_PULL_URL"].value == f"https://127.0.0.1:{port}/v1/pull"
        assert "BEGIN CERTIFICATE" in env["VIGIL_PULL_CA"].value
        assert env["VIGIL_PULL_TOKEN_FILE"].value == f"{BEAT_TOKEN_DIR}/token"
        assert (env["VIGIL_POOL"].value, env["VIGIL_POOL_SLOTS"].value) == ("etl", "3")
        for variable, path in (
            ("VIGIL_POD_NAME", "metadata.name"),
            ("VIGIL_POD_NAMESPACE", "metadata.namespace"),
            ("VIGIL_POD_UID", "metadata.uid"),
        ):
            assert env[variable].value_from.field_ref.field_path == path
        assert [(m.mount_path, m.read_only) for m in container.volume_mounts if m.name == BEAT_TOKEN_VOLUME] == [
            (BEAT_TOKEN_DIR, True)
        ]
        [volume] = [v for v in pod.spec.volumes if v.name == BEAT_TOKEN_VOLUME]
        token = volume.projected.sources[0].service_account_token
        assert (token.audience, token.path) == ("vigil.dev", "token")

    def status() -> dict[str, Any]:
        return read_pool(kube, ns, "etl").get("status") or {}

    wait_until(lambda: status().get("readyReplicas") == 2 and status().get("replicas") == 2, 30, "2 ready in status")
    written = status()
    assert written["desiredReplicas"] == 2 and written["slots"] == 6 and written["selector"] == "vigil.dev/pool=etl"
    assert {c["type"]: c["status"] for c in written["conditions"]} == {"Ready": "True", "AtMaximum": "False"}
    table = kube.kubectl("get", "vwp", "etl", "-n", ns).stdout.split("\n")[0].split()
    assert table == ["NAME", "DESIRED", "READY", "SLOTS", "USED", "BACKLOG", "AGE"]

    # A worker deleted is replaced, by a pod of another name.
    gone = pods[0].metadata.name
    kube.core.delete_namespaced_pod(gone, ns)

    def names() -> set[str]:
        return {p.metadata.name for p in pool_pods(kube, ns, "etl")}

    wait_until(lambda: len(names()) == 2 and gone not in names(), 30, "the deleted worker replaced")

    # kubectl scale goes through /scale: spec.replicas 3, three workers, status.replicas 3.
    kube.kubectl("scale", "vigilworkerpool/etl", "--replicas=3", "-n", ns)
    assert read_pool(kube, ns, "etl")["spec"]["replicas"] == 3
    wait_until(lambda: len(pool_pods(kube, ns, "etl")) == 3, 30, "3 workers after kubectl scale")
    wait_until(lambda: status().get("replicas") == 3 and status().get("desiredReplicas") == 3, 30, "status 3")
    scale = json.loads(
        kube.kubectl("get", "--raw", f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{POOLS}/etl/scale").stdout
    )
    assert scale["spec"]["replicas"] == 3 and scale["status"] == {"replicas": 3, "selector": "vigil.dev/pool=etl"}

    # Down to 1 through /scale too: clamped to minReplicas, 2; the idle worker goes at once
    # (spec.replicas: no scale-down delay).
    kube.kubectl("scale", "vwp/etl", "--replicas=1", "-n", ns)
    wait_until(lambda: len(pool_pods(kube, ns, "etl")) == 2, 30, "2 workers (minReplicas) after scaling to 1")
    wait_until(lambda: status().get("replicas") == 2 and status().get("desiredReplicas") == 2, 30, "status 2")

    # The pool deleted: its pods go with it (the garbage collector), nothing holds them.
    kube.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, POOLS, "etl")
    wait_until(
        lambda: not kube.core.list_namespaced_pod(ns, label_selector="vigil.dev/pool=etl").items,
        60,
        "the pool's pods gone with it",
    )


def test_the_api_server_refuses_crossed_bounds_and_a_name_too_long_for_a_label(kube: Kube, own_namespace: str) -> None:
    install_crds(kube)
    with pytest.raises(client.ApiException) as refused:
        kube.custom.create_namespaced_custom_object(
            GROUP, VERSION, own_namespace, POOLS, worker_pool("crossed", minReplicas=5, maxReplicas=2)
        )
    assert refused.value.status == 422
    assert "spec.minReplicas must not be greater than spec.maxReplicas" in refused.value.body
    with pytest.raises(client.ApiException) as refused:
        kube.custom.create_namespaced_custom_object(
            GROUP, VERSION, own_namespace, POOLS, worker_pool("beat", heartbeat={"intervalSeconds": 20})
        )
    assert "at least twice" in refused.value.body
    with pytest.raises(client.ApiException) as refused:
        kube.custom.create_namespaced_custom_object(GROUP, VERSION, own_namespace, POOLS, worker_pool("p" * 64))
    assert refused.value.status == 422 and "vigil.dev/pool label" in refused.value.body
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, own_namespace, POOLS, worker_pool("p" * 63))
