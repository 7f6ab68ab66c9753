"""Fixtures shared by the integration and end-to-end suites.

`kube` is one real cluster for the whole session: the cluster $KUBECONFIG points at (a kind
cluster, say) when that is set, or else the local test bed, started here when it is not
running and stopped again at the end if this session started it. `namespace` is a fresh
namespace per test, deleted after it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
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
# VIGIL_TEST_CLUSTER_NAME and VIGIL_TEST_PORT_BASE let two runs of the suite share a machine.
SUITE_CLUSTER = testbed.Cluster(
    os.environ.get("VIGIL_TEST_CLUSTER_NAME", "pytest"),
    testbed.Ports.from_base(int(os.environ.get("VIGIL_TEST_PORT_BASE", 17443))),
)


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


def holds(check: Callable[[], None], seconds: float, interval: float = 0.5) -> None:
    """Runs check() (which asserts) over and over for `seconds`: for the claims that something
    does not happen for a while, where waiting the whole while is the point, not a guess."""
    deadline = time.monotonic() + seconds
    while True:
        check()
        if time.monotonic() >= deadline:
            return
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


def pod_phase(kube: Kube, namespace: str, name: str) -> str | None:
    """The pod's phase, or None when there is no such pod."""
    try:
        return kube.core.read_namespaced_pod(name, namespace).status.phase
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise


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


ROOT = Path(__file__).resolve().parent.parent


def install_crds(kube: Kube) -> None:
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    extensions = client.ApiextensionsV1Api(kube.api)

    def established(name: str) -> bool:
        # Polled here: `kubectl wait` errors out on a CRD that has no status yet.
        conditions = extensions.read_custom_resource_definition(name).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    for name in ("vigiljobs.vigil.dev", "vigilqueues.vigil.dev"):
        wait_until(lambda name=name: established(name), 60, f"CRD {name} to be established")


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


class OperatorProcess:
    """`vigil operator` as a separate process, as it runs for real; killable at any instant."""

    def __init__(
        self,
        kube: Kube,
        namespaces: list[str],
        log_path: Path,
        kubeconfig: Path | None = None,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ):
        self.kube, self.namespaces, self.log_path = kube, namespaces, log_path
        self.extra_args = extra_args  # more flags of `vigil operator`
        self.env = env or {}  # more environment, e.g. the POD_NAME the downward API gives in a pod
        self.kubeconfig = kubeconfig or kube.kubeconfig  # whose identity the operator acts with
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        vigil = Path(sys.executable).with_name("vigil")
        args = [str(vigil), "operator", "--log-level", os.environ.get("VIGIL_TEST_OPERATOR_LOG_LEVEL", "info")]
        for pattern in self.namespaces:
            args += ["--namespace", pattern]
        args += self.extra_args
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env, "KUBECONFIG": str(self.kubeconfig)},
            )

    def kill(self) -> None:
        """SIGKILL: no cleanup, no goodbye, as when a node dies under it."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="session")
def vigil(
    kube: Kube, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[OperatorProcess]:
    """The CRDs installed and one operator for the session, watching the test namespaces (t-*)."""
    install_crds(kube)
    operator = OperatorProcess(kube, ["t-*"], tmp_path_factory.mktemp("operator") / "operator.log")
    operator.start()
    try:
        yield operator
    finally:
        operator.stop()
        if request.session.testsfailed:  # CI keeps no files: show what the operator said
            tail = operator.log_path.read_text(errors="replace").splitlines()[-120:]
            print(f"--- last lines of {operator.log_path}", *tail, sep="\n", file=sys.__stderr__)


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
