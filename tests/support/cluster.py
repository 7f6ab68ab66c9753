"""The cluster under test, as the suites that need one use it: where it is, clients for it,
namespaces of a test's own, simulated pods, and the CRDs.

The `kube` fixture (tests/support/fixtures.py) makes the one `Kube` of a session: the cluster $KUBECONFIG
points at when that is set, else the local test bed `SUITE_CLUSTER`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from kubernetes import client

from testbed import cluster as testbed
from testbed.faults import FaultProxy
from tests.support.waits import wait_until

ROOT = Path(__file__).resolve().parents[2]

# The test bed the suite starts for itself: a name and ports of its own, so that a cluster a
# developer brought up with `python -m testbed.cluster up` is left alone.
# VIGIL_TEST_CLUSTER_NAME and VIGIL_TEST_PORT_BASE let two runs of the suite share a machine.
# Under pytest-xdist (`make test` runs the cluster tests as two workers) worker gwN, N > 0, has a
# cluster of its own beside the first's: "<name>-N", its ports 10·N above the base.
PORTS_PER_WORKER = 10


def suite_cluster(environ: Mapping[str, str]) -> testbed.Cluster:
    name, base = environ.get("VIGIL_TEST_CLUSTER_NAME", "pytest"), int(environ.get("VIGIL_TEST_PORT_BASE", 17443))
    worker = int(environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    if worker:
        name, base = f"{name}-{worker}", base + PORTS_PER_WORKER * worker
    return testbed.Cluster(name, testbed.Ports.from_base(base))


SUITE_CLUSTER = suite_cluster(os.environ)


@dataclass
class Kube:
    """One cluster under test: where it is, and clients for it."""

    kubeconfig: Path
    api: client.ApiClient
    on_testbed: bool  # kwok nodes with the project's stages (false on a cluster given by $KUBECONFIG)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    @property
    def host_port(self) -> str:
        """host:port of the API server (a fault proxy's upstream)."""
        server = urlsplit(self.api.configuration.host)
        return f"{server.hostname}:{server.port}"

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        """kubectl as a user runs it: the test bed's own build, else the one on PATH."""
        built = testbed.BIN / "kubectl"
        binary = str(built) if built.exists() else shutil.which("kubectl") or "kubectl"
        result = subprocess.run(
            [binary, "--kubeconfig", str(self.kubeconfig), *args], input=input, capture_output=True, text=True
        )
        if check and result.returncode:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result


def install_crds(kube: Kube) -> None:
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    extensions = client.ApiextensionsV1Api(kube.api)

    def established(name: str) -> bool:
        # Polled here: `kubectl wait` errors out on a CRD that has no status yet.
        conditions = extensions.read_custom_resource_definition(name).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    for name in ("vigiljobs.vigil.dev", "vigilqueues.vigil.dev", "vigilworkerpools.vigil.dev"):
        wait_until(lambda name=name: established(name), 60, f"CRD {name} to be established")


# --- namespaces ------------------------------------------------------------------------------------


def release_attempt_pods(kube: Kube, namespace: str) -> None:
    """Removes Vigil's attempt-tracking finalizer from every pod of `namespace`, for a test whose
    operator has stopped before its namespace is deleted (else the namespace stays Terminating)."""
    for pod in kube.core.list_namespaced_pod(namespace).items:
        if "vigil.dev/attempt-tracking" in (pod.metadata.finalizers or []):
            patch = {"metadata": {"$deleteFromPrimitiveList/finalizers": ["vigil.dev/attempt-tracking"]}}
            try:
                kube.core.patch_namespaced_pod(pod.metadata.name, namespace, patch)
            except client.ApiException as err:
                if err.status != 404:
                    raise


@contextlib.contextmanager
def fresh_namespace(
    kube: Kube, prefix: str, labels: Mapping[str, str] | None = None, release: bool = True
) -> Iterator[str]:
    """A new namespace `<prefix><random>`, ready for pods (its default ServiceAccount exists),
    deleted afterwards. `release`: its pods' attempt-tracking finalizers are removed first, for a
    test whose own operator is stopped by then (nobody else would remove them)."""
    name = f"{prefix}{uuid.uuid4().hex[:10]}"
    kube.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=dict(labels or {}))))
    try:
        # Pods are refused until the namespace's default ServiceAccount exists.
        wait_until(lambda: kube.core.list_namespaced_service_account(name).items, 30, f"ServiceAccount in {name}")
        yield name
    finally:
        try:
            if release:
                release_attempt_pods(kube, name)
        finally:
            kube.core.delete_namespace(name, propagation_policy="Background")


# --- pods ------------------------------------------------------------------------------------------


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


def read_pod(kube: Kube, namespace: str, name: str) -> client.V1Pod | None:
    """The pod, or None when there is no such pod."""
    try:
        return kube.core.read_namespaced_pod(name, namespace)
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise


def pod_phase(kube: Kube, namespace: str, name: str) -> str | None:
    """The pod's phase, or None when there is no such pod."""
    pod = read_pod(kube, namespace, name)
    return pod.status.phase if pod is not None else None


def event_reasons(kube: Kube, namespace: str, name: str) -> set[str]:
    """The reasons of the events about the object called `name` in `namespace`."""
    selector = f"involvedObject.name={name}"
    return {e.reason for e in kube.core.list_namespaced_event(namespace, field_selector=selector).items}


# --- identities and addresses ----------------------------------------------------------------------


def token_kubeconfig(kube: Kube, token: str, path: Path, server: str | None = None) -> Path:
    """A kubeconfig for the cluster under test that authenticates with a bearer token."""
    conf = kube.api.configuration
    cluster = {"server": server or conf.host, "certificate-authority": conf.ssl_ca_cert}
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return path


def proxy_to_api_server(kube: Kube, name: str, home: Path | None = None) -> FaultProxy:
    """A fault proxy (`testbed.faults`) on a free local port in front of the cluster's API server;
    its state in `home` (default ~/.cache/vigil/faults/<name>). The caller stops it."""
    return FaultProxy.start(name, 0, kube.host_port, home=home)


def free_port() -> int:
    """A local port nothing listens on (bound, then closed): for a server to come, or for a
    client to find nobody there."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def show_log(path: Path, lines: int = 150) -> None:
    """The last lines of a process's log on the terminal, for a test that failed (CI keeps no files)."""
    tail = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []
    print(f"--- last lines of {path}", *tail, sep="\n", file=sys.__stderr__)
