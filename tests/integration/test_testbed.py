"""The test bed is a real Kubernetes: the guarantees Vigil will build on hold on it."""

from __future__ import annotations

import datetime as dt
import subprocess
import time

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.support.cluster import Kube, pod_phase, simulated_pod_spec
from tests.support.waits import deadline, wait_until

pytestmark = pytest.mark.integration


def _pod(
    name: str,
    exit_code: str | None = "0",
    run_for: str | None = None,
    labels: dict | None = None,
    extra_annotations: dict | None = None,
) -> dict:
    annotations, spec = simulated_pod_spec(exit_code, run_for)
    annotations.update(extra_annotations or {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations},
        "spec": {**spec, "restartPolicy": "Never"},
    }


def _gone(kube: Kube, namespace: str, name: str) -> bool:
    try:
        kube.core.read_namespaced_pod(name, namespace)
    except ApiException as err:
        if err.status == 404:
            return True
        raise
    return False


def test_native_job_runs_to_complete_on_kwok_nodes(kube: Kube, namespace: str):
    """apiserver + scheduler + the Job controller + kwok and its stages, together."""
    _, spec = simulated_pod_spec(exit_code=None)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "native"},
        "spec": {"backoffLimit": 0, "template": {"spec": {**spec, "restartPolicy": "Never"}}},
    }
    batch = client.BatchV1Api(kube.api)
    batch.create_namespaced_job(namespace, job)

    def complete():
        status = batch.read_namespaced_job_status("native", namespace).status
        return any(c.type == "Complete" and c.status == "True" for c in status.conditions or [])

    wait_until(complete, 60, "the Job's Complete condition")
    pods = kube.core.list_namespaced_pod(namespace, label_selector="job-name=native").items
    assert len(pods) == 1
    assert pods[0].spec.node_name.startswith("kwok-node-")
    assert pods[0].status.container_statuses[0].state.terminated.exit_code == 0


def test_pod_finishes_with_the_exit_code_of_its_attempt(kube: Kube, namespace: str):
    codes = "3,5,0"
    for attempt, phase, code in [("1", "Failed", 3), ("2", "Failed", 5), ("3", "Succeeded", 0), ("9", "Succeeded", 0)]:
        kube.core.create_namespaced_pod(namespace, _pod(f"a{attempt}", codes, labels={"vigil.dev/attempt": attempt}))
        wait_until(
            lambda a=attempt: pod_phase(kube, namespace, f"a{a}") in ("Succeeded", "Failed"),
            30,
            f"pod a{attempt} to finish",
        )
        pod = kube.core.read_namespaced_pod(f"a{attempt}", namespace)
        assert pod.status.phase == phase
        assert pod.status.container_statuses[0].state.terminated.exit_code == code


def test_pod_without_simulation_annotations_keeps_running(kube: Kube, namespace: str):
    kube.core.create_namespaced_pod(namespace, _pod("plain", exit_code=None))
    wait_until(lambda: pod_phase(kube, namespace, "plain") == "Running", 30, "pod to run")
    finisher = _pod("finisher", "0", run_for="2s")
    kube.core.create_namespaced_pod(namespace, finisher)
    wait_until(lambda: pod_phase(kube, namespace, "finisher") == "Succeeded", 30, "the timed pod to finish")
    # The timed pod started after the plain one and has finished: the plain one is still running.
    assert pod_phase(kube, namespace, "plain") == "Running"


def test_run_for_is_not_restarted_by_updates_to_the_pod(kube: Kube, namespace: str):
    kube.core.create_namespaced_pod(namespace, _pod("timed", "0", run_for="4s"))
    wait_until(lambda: pod_phase(kube, namespace, "timed") == "Running", 30, "pod to run")
    started = time.monotonic()
    # Heartbeat-like updates every 0.5 s must not push the finish back.
    while pod_phase(kube, namespace, "timed") == "Running" and time.monotonic() - started < deadline(20):
        kube.core.patch_namespaced_pod(
            "timed", namespace, {"metadata": {"annotations": {"vigil.dev/heartbeat": str(time.time())}}}
        )
        time.sleep(0.5)  # the updates' pace, as an agent beats: the workload, not a wait
    elapsed = time.monotonic() - started
    assert pod_phase(kube, namespace, "timed") == "Succeeded"
    assert 2.5 <= elapsed <= deadline(8), f"finished after {elapsed:.1f}s, expected about 4s"


def test_deleted_pods_go_away_linger_or_stay_terminating_as_annotated(kube: Kube, namespace: str):
    kube.core.create_namespaced_pod(namespace, _pod("quick", exit_code=None))
    kube.core.create_namespaced_pod(
        namespace, _pod("slow", exit_code=None, extra_annotations={"sim.vigil.dev/delete-delay": "4s"})
    )
    kube.core.create_namespaced_pod(
        namespace, _pod("stuck", exit_code=None, extra_annotations={"sim.vigil.dev/never-terminate": "true"})
    )
    for name in ("quick", "slow", "stuck"):
        wait_until(lambda n=name: pod_phase(kube, namespace, n) == "Running", 30, f"{name} to run")
    for name in ("quick", "slow", "stuck"):
        kube.core.delete_namespaced_pod(name, namespace)
    deleted = time.monotonic()
    wait_until(lambda: _gone(kube, namespace, "quick"), 15, "the plain pod to go away")
    assert not _gone(kube, namespace, "slow"), "the lingering pod went away before its delay"
    wait_until(lambda: _gone(kube, namespace, "slow"), 20, "the lingering pod to go away")
    assert time.monotonic() - deleted >= 3
    stuck = kube.core.read_namespaced_pod("stuck", namespace)
    assert stuck.metadata.deletion_timestamp is not None, "the never-terminating pod is Terminating"
    kube.core.delete_namespaced_pod("stuck", namespace, grace_period_seconds=0)
    wait_until(lambda: _gone(kube, namespace, "stuck"), 15, "a force delete to remove the stuck pod")


WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.testbed.vigil.dev"},
    "spec": {
        "group": "testbed.vigil.dev",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["size"],
                                "properties": {
                                    "size": {"type": "integer", "minimum": 1},
                                    "color": {"type": "string", "default": "blue"},
                                },
                            },
                            "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
                        },
                    }
                },
            }
        ],
    },
}


def test_crd_is_served_validated_and_has_a_status_subresource(kube: Kube, namespace: str):
    ext = client.ApiextensionsV1Api(kube.api)
    try:
        ext.create_custom_resource_definition(WIDGET_CRD)
    except ApiException as err:
        if err.status != 409:
            raise

    def established():
        crd = ext.read_custom_resource_definition("widgets.testbed.vigil.dev")
        return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])

    wait_until(established, 30, "the CRD to be Established")
    custom = client.CustomObjectsApi(kube.api)
    args = ("testbed.vigil.dev", "v1", namespace, "widgets")

    def create(body):
        return custom.create_namespaced_custom_object(*args, body)

    with pytest.raises(ApiException) as refused:
        wait_until(lambda: _served(custom, args), 30, "the widgets resource to be served")
        create(
            {"apiVersion": "testbed.vigil.dev/v1", "kind": "Widget", "metadata": {"name": "bad"}, "spec": {"size": 0}}
        )
    assert refused.value.status == 422
    assert "spec.size" in refused.value.body

    made = create(
        {"apiVersion": "testbed.vigil.dev/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"size": 2}}
    )
    assert made["spec"]["color"] == "blue", "schema defaults are applied"
    generation = made["metadata"]["generation"]

    # A status write goes through the subresource and leaves spec (and generation) alone ...
    updated = custom.patch_namespaced_custom_object_status(
        *args, "w", {"status": {"phase": "Ready"}, "spec": {"size": 9}}
    )
    assert updated["status"]["phase"] == "Ready"
    assert updated["spec"]["size"] == 2
    assert updated["metadata"]["generation"] == generation
    # ... and a write to the main resource ignores status.
    updated = custom.patch_namespaced_custom_object(*args, "w", {"spec": {"size": 3}, "status": {"phase": "Lost"}})
    assert updated["spec"]["size"] == 3
    assert updated["status"]["phase"] == "Ready"
    assert updated["metadata"]["generation"] == generation + 1


def _served(custom: client.CustomObjectsApi, args) -> bool:
    try:
        custom.list_namespaced_custom_object(*args)
        return True
    except ApiException as err:
        if err.status == 404:
            return False
        raise


def test_lease_update_with_a_stale_resource_version_is_refused(kube: Kube, namespace: str):
    coord = client.CoordinationV1Api(kube.api)
    now = dt.datetime.now(dt.UTC)
    lease = coord.create_namespaced_lease(
        namespace,
        client.V1Lease(
            metadata=client.V1ObjectMeta(name="leader"),
            spec=client.V1LeaseSpec(holder_identity="a", lease_duration_seconds=15, acquire_time=now, renew_time=now),
        ),
    )
    stale = lease.metadata.resource_version

    lease.spec.holder_identity = "b"
    renewed = coord.replace_namespaced_lease("leader", namespace, lease)
    assert renewed.metadata.resource_version != stale

    lease.metadata.resource_version = stale
    lease.spec.holder_identity = "c"
    with pytest.raises(ApiException) as conflict:
        coord.replace_namespaced_lease("leader", namespace, lease)
    assert conflict.value.status == 409
    assert coord.read_namespaced_lease("leader", namespace).spec.holder_identity == "b"


def test_deleting_an_owner_garbage_collects_its_pods(kube: Kube, namespace: str):
    owner = kube.core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"))
    )
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    for name in ("owned-1", "owned-2"):
        pod = _pod(name, exit_code=None)
        pod["metadata"]["ownerReferences"] = [ref]
        kube.core.create_namespaced_pod(namespace, pod)
    bystander = kube.core.create_namespaced_pod(namespace, _pod("bystander", exit_code=None))

    kube.core.delete_namespaced_config_map("owner", namespace, propagation_policy="Background")
    wait_until(
        lambda: _gone(kube, namespace, "owned-1") and _gone(kube, namespace, "owned-2"),
        60,
        "the garbage collector to delete the owned pods",
    )
    assert kube.core.read_namespaced_pod("bystander", namespace).metadata.uid == bystander.metadata.uid


def test_down_stops_every_process_it_started():
    """A cluster of its own (other name, other ports): up, then down leaves nothing running."""
    from testbed import cluster as testbed

    own = testbed.Cluster("pytest-down", testbed.Ports.from_base(18443))
    testbed.up(own, nodes=1)
    try:
        pids = {c: testbed.running_pid(own, c) for c in testbed.COMPONENTS}
        assert all(pids.values()), pids
    finally:
        testbed.down(own)
    assert not any(testbed._pid_alive(pid) for pid in pids.values())
    leftovers = subprocess.run(["pgrep", "-f", str(own.dir)], capture_output=True, text=True).stdout.split()
    assert leftovers == [], f"processes of the cluster still run: {leftovers}"
    assert not (own.dir / "etcd").exists(), "down removes the data unless asked to keep it"


def test_a_restarted_kwok_runs_pods_as_soon_as_restart_returns():
    """kwok takes its nodes' Leases over only once they expire (NODE_LEASE_SECONDS): `restart`
    waits for that, so that a benchmark or test that follows does not stall on pods nobody moves."""
    from kubernetes import config

    from testbed import cluster as testbed

    own = testbed.Cluster("pytest-down", testbed.Ports.from_base(18443))
    testbed.up(own, nodes=1)
    try:
        testbed.restart(own, "kwok")
        core = client.CoreV1Api(config.new_client_from_config(config_file=str(own.kubeconfig)))
        core.create_namespaced_pod("default", _pod("after-restart", exit_code="0", run_for="60s"))
        wait_until(
            lambda: core.read_namespaced_pod("after-restart", "default").status.phase == "Running",
            10,
            "the pod to run right after kwok's restart",
        )
    finally:
        testbed.down(own)
