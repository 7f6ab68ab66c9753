"""The leader marks its own pod (`vigil.dev/leader: <lease>`) and the webhook's Service selects
that mark, so one replica answers admission (docs/admission.md). Two `vigil operator
--leader-elect` processes stand in for the two replicas of the chart, each told its pod's name
as the downward API tells it (POD_NAME, POD_NAMESPACE); the "pods" are kwok pods, so the
EndpointSlice controller gives the Service their addresses as it would in a cluster.

A SIGKILLed leader cannot unmark its pod (as a deposed leader, fenced, cannot): the new leader
unmarks it. A leader stopped with SIGTERM unmarks its own pod before it releases the Lease.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from kubernetes import client

from tests.support.cluster import Kube, install_crds, simulated_pod_spec
from tests.support.operators import LEASE_NAME, OperatorProcess, electing, holder
from tests.support.waits import deadline, wait_until

pytestmark = pytest.mark.e2e

MARK = "vigil.dev/leader"
# The EndpointSlice controller follows a label change within a second when idle; CI, at load 6,
# once took more than 30 s.
ENDPOINTS_SECONDS = 90


def replica_pod(kube: Kube, namespace: str, name: str) -> None:
    """A pod for a replica to run 'in': kwok runs it (and makes it Ready) until deleted."""
    _, spec = simulated_pod_spec(exit_code=None)
    kube.core.create_namespaced_pod(
        namespace, {"metadata": {"name": name, "labels": {"app.kubernetes.io/name": "vigil"}}, "spec": spec}
    )


def replica(kube: Kube, namespace: str, pod: str, log_dir: Path) -> OperatorProcess:
    return electing(kube, namespace, log_dir / f"{pod}.log", env={"POD_NAME": pod, "POD_NAMESPACE": namespace})


def marked(kube: Kube, namespace: str) -> set[str]:
    pods = kube.core.list_namespaced_pod(namespace, label_selector=f"{MARK}={LEASE_NAME}").items
    return {pod.metadata.name for pod in pods}


def served_by(kube: Kube, namespace: str, service: str) -> set[str]:
    """The pods behind the Service, as its EndpointSlices list them (ready ones only)."""
    slices = client.DiscoveryV1Api(kube.api).list_namespaced_endpoint_slice(
        namespace, label_selector=f"kubernetes.io/service-name={service}"
    )
    return {
        endpoint.target_ref.name
        for piece in slices.items
        for endpoint in piece.endpoints or []
        if endpoint.target_ref and (endpoint.conditions is None or endpoint.conditions.ready is not False)
    }


def wait_served(kube: Kube, namespace: str, expected: set[str]) -> None:
    seen: list[set[str]] = []

    def served() -> bool:
        seen.append(served_by(kube, namespace, "webhook"))
        return seen[-1] == expected

    try:
        wait_until(served, ENDPOINTS_SECONDS, f"the Service to select {sorted(expected)} alone")
    except pytest.fail.Exception:
        pytest.fail(f"the Service selected {sorted(seen[-1])} for {ENDPOINTS_SECONDS}s, not {sorted(expected)} alone")


def standing_by(operator: OperatorProcess) -> int:
    """How many times the process (its log, across restarts) has begun to stand by."""
    return operator.log().count("standing by")


def test_only_the_leaders_pod_serves_the_webhook_through_a_kill_and_a_graceful_stop(
    kube: Kube, own_namespace: str, tmp_path: Path
):
    namespace = own_namespace
    install_crds(kube)
    for pod in ("op-a", "op-b"):
        replica_pod(kube, namespace, pod)
    # The chart's webhook Service, as it selects: the operator's pods, and the leader's mark.
    kube.core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "webhook"},
            "spec": {
                "selector": {"app.kubernetes.io/name": "vigil", MARK: LEASE_NAME},
                "ports": [{"name": "https", "port": 443, "targetPort": 9443}],
            },
        },
    )
    a, b = replica(kube, namespace, "op-a", tmp_path), replica(kube, namespace, "op-b", tmp_path)
    a.start()
    try:
        wait_until(lambda: marked(kube, namespace) == {"op-a"}, 30, "the first leader to mark its pod")
        wait_served(kube, namespace, {"op-a"})
        b.start()
        wait_until(lambda: standing_by(b) == 1, 30, "the second to stand by")
        assert marked(kube, namespace) == {"op-a"}, "a standby marked its pod"

        # A crash: op-a keeps its mark (nothing runs to remove it) until op-b leads and removes it.
        a.kill()
        wait_until(lambda: marked(kube, namespace) == {"op-b"}, 30, "the new leader to mark op-b and unmark op-a")
        wait_served(kube, namespace, {"op-b"})

        # A graceful stop: op-b unmarks its own pod before it releases the Lease; op-a (back as a
        # standby) takes over at once and marks its pod.
        a.start()
        wait_until(lambda: standing_by(a) == 2, 30, "op-a to stand by again")
        b.proc.send_signal(signal.SIGTERM)
        assert b.proc.wait(deadline(30)) == 0
        assert "op-b" not in marked(kube, namespace), "the stopped leader left its mark"
        wait_until(lambda: marked(kube, namespace) == {"op-a"}, 30, "op-a to lead and mark its pod")
        wait_served(kube, namespace, {"op-a"})
        assert holder(kube, namespace).startswith("op-a_"), holder(kube, namespace)
    finally:
        a.stop()
        b.stop()
