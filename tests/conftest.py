"""Fixtures shared by the integration and end-to-end suites.

`kube` is one real cluster for the whole session: the cluster $KUBECONFIG points at (a kind
cluster, say) when that is set, or else the local test bed, started here when it is not
running and stopped again at the end if this session started it. `namespace` is a fresh
namespace per test, deleted after it.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client, config

from testbed import cluster as testbed

# The test bed the suite starts for itself: a name and ports of its own, so that a cluster a
# developer brought up with `python -m testbed.cluster up` is left alone.
SUITE_CLUSTER = testbed.Cluster("pytest", testbed.Ports.from_base(int(os.environ.get("VIGIL_TEST_PORT_BASE", 17443))))


@dataclass
class Kube:
    """One cluster under test: where it is, and clients for it."""

    kubeconfig: Path
    api: client.ApiClient
    on_testbed: bool  # kwok nodes with the project's stages (false on a cluster given by $KUBECONFIG)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)


def wait_until(condition: Callable[[], object], timeout: float, what: str, interval: float = 0.2):
    """Polls condition() until it returns something truthy, which is returned; fails with `what`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def simulated_pod_spec(exit_code: str | None = "0", run_for: str | None = None) -> tuple[dict, dict]:
    """Annotations and pod spec for a pod that runs on a kwok node and finishes as told."""
    annotations = {}
    if exit_code is not None:
        annotations["sim.vigil.dev/exit-code"] = exit_code
    if run_for is not None:
        annotations["sim.vigil.dev/run-for"] = run_for
    spec = {
        "containers": [{"name": "main", "image": "registry.invalid/vigil/sim:none"}],
        "nodeSelector": {"type": "kwok"},
        "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
    }
    return annotations, spec


@pytest.fixture(scope="session")
def kube() -> Iterator[Kube]:
    given = os.environ.get("KUBECONFIG")
    started_here = False
    if given:
        kubeconfig = Path(given)
    else:
        if not all(testbed.running_pid(SUITE_CLUSTER, c) for c in testbed.COMPONENTS):
            testbed.up(SUITE_CLUSTER, nodes=3)
            started_here = True
        kubeconfig = SUITE_CLUSTER.kubeconfig
    api = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        yield Kube(kubeconfig=kubeconfig, api=api, on_testbed=not given)
    finally:
        api.close()
        if started_here and not os.environ.get("VIGIL_KEEP_CLUSTER"):
            testbed.down(SUITE_CLUSTER)


@pytest.fixture
def namespace(kube: Kube) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    kube.core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"vigil.dev/test": "true"}))
    )
    # Pods are refused until the namespace's default ServiceAccount exists.
    wait_until(lambda: kube.core.list_namespaced_service_account(name).items, 30, f"ServiceAccount in {name}")
    try:
        yield name
    finally:
        kube.core.delete_namespace(name, propagation_policy="Background")
