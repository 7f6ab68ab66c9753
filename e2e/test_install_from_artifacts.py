"""Vigil installed from its release artifacts alone, as a platform engineer with a cluster and no
checkout would: `make dist` runs once, its files are copied into an empty directory, and every
tool runs there (no checkout on the path, no virtualenv: the system's python3 runs the plugin).

- the artifacts agree on the version, SHA256SUMS checks, krew.yaml names the archive's sha256, the
  kustomize base builds to install.yaml's objects, and kubectl-vigil runs under `python3 -I`;
- the image archive loaded into the bed's real node (containerd, as `ctr images import` or `kind
  load image-archive` would) gives the chart's default image; `helm install` of the packaged chart
  with the placement a user would set (nodeSelector and toleration of the real node) brings the
  operator up there, and a VigilJob from the plain image runs to Succeeded on that node, its agent
  injected from the same image; `kubectl vigil status` from the zipapp reads it;
- `helm uninstall` leaves nothing that can wedge a namespace (no finalizer, no webhook or admission
  policy, no Role, ClusterRole or binding of the release), the namespaces delete, and the CRDs and
  the job stay (crds.keep);
- install.yaml and the kustomize base carry no private key and no caBundle (tls.managedByOperator):
  the operator makes its own;
- `kubectl apply --server-side` of the kustomize base, with an overlay that places the operator on
  the real node, runs a job too: the operator made the Secret vigil-certs, the webhook's caBundle
  is its CA, and the webhook answers through it (a dry run over a full queue is refused with 429);
  deleting what it made (the documented uninstall) leaves the same nothing;
- an upgrade from 0.1.0's chart (its fixture's, tests/support/previous.py, whose CRDs Helm's
  crds/ directory made outside the release): a plain `helm upgrade` is refused,
  `--take-ownership` adopts the CRDs (docs/upgrading.md).

VIGIL_TEST_DIST=<dir> uses a dist/ already made (`make dist`) instead of making one (about 2 minutes
when the image is built, 40 s when it is not).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tarfile
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

import vigil
from testbed import node as real_node_bed
from testbed.nodes import FAKE_NODE_TAINT
from tests.support import previous
from tests.support.agents import grant_heartbeat_rbac
from tests.support.charts import BIN
from tests.support.cluster import ROOT, SUITE_CLUSTER, Kube
from tests.support.fixtures import RealNode
from tests.support.jobs import GROUP, PLURAL, VERSION, pods_of
from tests.support.waits import deadline, wait_until
from tests.support.webhooks import admission_review

pytestmark = pytest.mark.e2e

V = vigil.__version__
IMAGE = f"localhost/vigil:{V}"  # the chart's default, the archive's one name
CRDS = ("vigiljobs.vigil.dev", "vigilqueues.vigil.dev", "vigilworkerpools.vigil.dev")
# A user's PATH: the system's tools, no virtualenv, no checkout.
USER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
SYSTEM_PYTHON = shutil.which("python3", path=USER_ENV["PATH"])
GREETING = "hello from the released artifacts"


def run(*command: object, cwd: Path, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(c) for c in command], cwd=cwd, env=USER_ENV, capture_output=True, text=True, timeout=deadline(timeout)
    )
    if check:
        assert result.returncode == 0, f"{' '.join(map(str, command))} failed ({result.returncode}):\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files of `make dist`, alone in an empty directory outside the checkout."""
    given = os.environ.get("VIGIL_TEST_DIST")
    if given:
        built = Path(given)
    else:
        built = tmp_path_factory.mktemp("made") / "dist"
        result = subprocess.run(
            ["make", "--no-print-directory", "dist"], cwd=ROOT, env={**os.environ, "DIST": str(built)},
            capture_output=True, text=True, timeout=deadline(900),
        )  # fmt: skip
        assert result.returncode == 0, f"make dist failed ({result.returncode}):\n{result.stderr[-4000:]}"
    user = tmp_path_factory.mktemp("user")
    for path in built.iterdir():
        (shutil.copytree if path.is_dir() else shutil.copy2)(path, user / path.name)
    assert not (user / "charts").exists() and not (user / "operator").exists()
    return user


def test_the_artifacts_agree_and_check(artifacts: Path):
    names = {p.name for p in artifacts.iterdir()}
    assert {
        f"vigil-{V}.tgz", "install.yaml", "kustomize", f"vigil-image-{V}.oci.tar", "image-tags.txt",
        "kubectl-vigil", f"kubectl-vigil-{V}.tar.gz", "krew.yaml", "SHA256SUMS",
    } <= names, names  # fmt: skip
    checked = run("sha256sum", "--check", "--strict", "SHA256SUMS", cwd=artifacts).stdout
    assert checked.count(": OK") == len([p for p in artifacts.rglob("*") if p.is_file()]) - 1, checked

    chart = yaml.safe_load(run(BIN / "helm", "show", "chart", f"vigil-{V}.tgz", cwd=artifacts).stdout)
    assert (chart["version"], chart["appVersion"]) == (V, V)
    assert (artifacts / "image-tags.txt").read_text().splitlines()[0] == IMAGE

    docs = [d for d in yaml.safe_load_all((artifacts / "install.yaml").read_text()) if d]
    crds = {d["metadata"]["name"]: d for d in docs if d["kind"] == "CustomResourceDefinition"}
    assert sorted(crds) == sorted(CRDS)
    assert all(d["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep" for d in crds.values())
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["metadata"]["namespace"] == "vigil-system"
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE
    assert not [d for d in docs if "helm.sh/hook" in (d["metadata"].get("annotations") or {})], "a hook in install.yaml"
    kustomized_text = run(BIN / "kubectl", "kustomize", "kustomize", cwd=artifacts).stdout
    kustomized = [d for d in yaml.safe_load_all(kustomized_text) if d]
    # No key made at build time, which every user applying the file would share: no PEM block, as
    # text or base64 ("-----BEGIN" is "LS0tLS1CRUdJT..."), no Secret with data, no caBundle. (A bare
    # grep "PRIVATE KEY" would match the CRDs' own description of projected volumes' PEM blocks.)
    for name, text, objects in (
        ("install.yaml", (artifacts / "install.yaml").read_text(), docs),
        ("the kustomize base", kustomized_text + (artifacts / "kustomize" / "install.yaml").read_text(), kustomized),
    ):
        assert "-----BEGIN" not in text and "LS0tLS1CRUdJT" not in text, f"{name} carries a PEM block"
        assert "caBundle:" not in text, f"{name} carries a caBundle"
        assert not [d for d in objects if d["kind"] == "Secret" and (d.get("data") or d.get("stringData"))], name
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--self-managed-certs-secret=vigil-certs" in args, args
    assert sorted((d["kind"], d["metadata"]["name"]) for d in kustomized) == sorted(
        (d["kind"], d["metadata"]["name"]) for d in docs
    )

    krew = yaml.safe_load((artifacts / "krew.yaml").read_text())
    assert (krew["apiVersion"], krew["kind"], krew["metadata"]["name"]) == (
        "krew.googlecontainertools.github.com/v1alpha2", "Plugin", "vigil",
    )  # fmt: skip
    (platform,) = krew["spec"]["platforms"]
    archive = artifacts / f"kubectl-vigil-{V}.tar.gz"
    assert platform["sha256"] == run("sha256sum", archive.name, cwd=artifacts).stdout.split()[0]
    assert platform["uri"].endswith(f"/v{V}/{archive.name}") and krew["spec"]["version"] == f"v{V}"
    with tarfile.open(archive) as tar:
        assert tar.getnames() == [platform["bin"]] == ["kubectl-vigil"]

    # One file that a plain python3 runs: the system's (no virtualenv), isolated (-I: no user site,
    # no PYTHONPATH), with the version of the release inside.
    assert SYSTEM_PYTHON and not SYSTEM_PYTHON.startswith(str(ROOT)), SYSTEM_PYTHON
    helped = run(SYSTEM_PYTHON, "-I", "kubectl-vigil", "--help", cwd=artifacts)
    assert "dlq" in helped.stdout and "redrive" in helped.stdout, helped.stdout
    with zipfile.ZipFile(artifacts / "kubectl-vigil") as app:
        assert f'__version__ = "{V}"' in app.read("vigil/__init__.py").decode()
        assert not [n for n in app.namelist() if n.endswith((".so", ".pyd"))]


# ------------------------------------------------------------------------- on the bed's real node


def load_the_image_archive(artifacts: Path) -> None:
    """The archive into the real node's containerd, as a user loads it into a node; the name the
    chart defaults to must come from the archive, so it is removed first."""
    if IMAGE in real_node_bed.ctr(SUITE_CLUSTER, "images", "ls", "-q").split():
        real_node_bed.ctr(SUITE_CLUSTER, "images", "rm", IMAGE)
    real_node_bed.ctr(SUITE_CLUSTER, "images", "import", str(artifacts / f"vigil-image-{V}.oci.tar"))
    present = real_node_bed.ctr(SUITE_CLUSTER, "images", "ls", "-q").split()
    assert IMAGE in present, f"the archive imported no {IMAGE}: {present}"


def no_vigil_on_the_cluster(kube: Kube) -> None:
    """A first install meets a cluster without Vigil: the CRDs the suite's other files applied
    (install_crds) are deleted first; those files apply them again before they run."""
    for crd in CRDS:
        kube.kubectl("delete", "crd", crd, "--ignore-not-found", "--wait=true", "--timeout=120s")


def the_job(name: str, node: RealNode) -> dict:
    """A VigilJob from the plain image (no Python, nothing of Vigil) on the real node; the default
    heartbeat, so the operator injects its agent from the released image."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "VigilJob",
        "metadata": {"name": name},
        "spec": {
            "heartbeat": {"intervalSeconds": 2, "timeoutSeconds": 10},
            "retry": {"maxAttempts": 1},
            "template": {
                "spec": {
                    **node.placement,
                    "serviceAccountName": "vigil-job",  # the chart's (heartbeat.namespaces)
                    "securityContext": {"runAsUser": 65532, "runAsNonRoot": True},
                    "terminationGracePeriodSeconds": 5,
                    "containers": [
                        {
                            "name": "main",
                            "image": node.plain_image,
                            "imagePullPolicy": "Never",
                            "command": ["/bin/sh", "-c", f"echo '{GREETING}'; sleep 3"],
                        }
                    ],
                }
            },
        },
    }


def phase_of(kube: Kube, namespace: str, name: str) -> str | None:
    job = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return (job.get("status") or {}).get("phase")


def run_a_job_to_success(kube: Kube, artifacts: Path, node: RealNode, namespace: str) -> None:
    name = f"released-{uuid.uuid4().hex[:6]}"
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, the_job(name, node))
    try:
        wait_until(lambda: phase_of(kube, namespace, name) in ("Succeeded", "Failed", "DeadLettered"), 180, name)
    finally:
        print(kube.kubectl("get", "vigiljob,pods", "-n", namespace, "-o", "wide", check=False).stdout)
    assert phase_of(kube, namespace, name) == "Succeeded", kube.kubectl(
        "describe", "vigiljob", name, "-n", namespace
    ).stdout
    job = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    (pod,) = pods_of(kube, namespace, job)
    assert pod.spec.node_name == node.name, "the job did not run on the real node"
    agents = [c for c in (pod.spec.init_containers or []) if c.name == "vigil-agent"]
    assert agents and agents[0].image == IMAGE, "the agent was not injected from the released image"
    # kubectl vigil from the zipapp, with the system's python3, in the artifacts' directory.
    status = run(
        SYSTEM_PYTHON, "-I", "kubectl-vigil", "--kubeconfig", kube.kubeconfig, "-n", namespace, "status", name,
        cwd=artifacts,
    )  # fmt: skip
    assert "Succeeded" in status.stdout, status.stdout


def nothing_left_to_wedge(kube: Kube, instance: str, namespaces: list[str]) -> None:
    """After an uninstall: no finalizer on what Vigil touched, no admission object and no RBAC
    labelled with the release, and the namespaces delete; the CRDs stay (kept)."""
    for namespace in namespaces:
        for pod in kube.core.list_namespaced_pod(namespace).items:
            assert not pod.metadata.finalizers, f"pod {namespace}/{pod.metadata.name}: {pod.metadata.finalizers}"
        for plural in ("vigiljobs", "vigilqueues"):
            for obj in kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)["items"]:
                assert not obj["metadata"].get("finalizers"), f"{plural} {obj['metadata']['name']}"
    selector = f"app.kubernetes.io/instance={instance}"
    cluster_kinds = (
        "validatingwebhookconfigurations,mutatingwebhookconfigurations,validatingadmissionpolicies,"
        "validatingadmissionpolicybindings,clusterroles,clusterrolebindings"
    )
    left = kube.kubectl("get", cluster_kinds, "-l", selector, "-o", "name").stdout.split()
    left += kube.kubectl("get", "roles,rolebindings", "-A", "-l", selector, "-o", "name").stdout.split()
    assert left == [], f"left by the uninstall: {left}"
    for crd in CRDS:
        assert kube.kubectl("get", "crd", crd, "-o", "name").stdout.strip(), f"CRD {crd} was deleted"
    for namespace in namespaces:
        kube.core.delete_namespace(namespace)
    for namespace in namespaces:
        wait_until(
            lambda ns=namespace: not kube.kubectl("get", "namespace", ns, "--ignore-not-found", "-o", "name").stdout,
            90,
            f"namespace {namespace} to be deleted (something holds it)",
        )


def values_for(node: RealNode, jobs: str) -> dict:
    """What a user sets to land on the real node, watching one namespace; admission limited to it,
    so that the suite's other tests on this cluster are not slowed or refused."""
    only_jobs = {"matchLabels": {"kubernetes.io/metadata.name": jobs}}
    return {
        **node.placement,
        "replicas": 1,  # one real node; a second replica would only share it
        "operator": {"watchNamespaces": [jobs]},
        "webhook": {"namespaceSelector": only_jobs},
        "heartbeat": {"namespaces": [jobs], "policy": {"namespaceSelector": only_jobs}},
    }


@pytest.fixture
def jobs_namespace(kube: Kube) -> Iterator[str]:
    name = f"vigil-jobs-{uuid.uuid4().hex[:8]}"
    kube.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    wait_until(lambda: kube.core.list_namespaced_service_account(name).items, 30, f"ServiceAccount in {name}")
    yield name
    kube.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=false", check=False)


def test_helm_install_from_the_artifacts_runs_a_job_and_uninstalls_clean(
    kube: Kube, real_node: RealNode, artifacts: Path, jobs_namespace: str, tmp_path: Path
):
    load_the_image_archive(artifacts)
    no_vigil_on_the_cluster(kube)
    release, namespace = f"vigil-{uuid.uuid4().hex[:6]}", f"vigil-system-{uuid.uuid4().hex[:6]}"
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(values_for(real_node, jobs_namespace)))
    helm = (BIN / "helm", "--kubeconfig", kube.kubeconfig)
    wait = ("--wait", "--timeout", f"{deadline(180):.0f}s")
    installed = run(
        *helm, "install", release, f"vigil-{V}.tgz", "-n", namespace, "--create-namespace", "-f", values, *wait,
        cwd=artifacts, check=False,
    )  # fmt: skip
    try:
        assert installed.returncode == 0, f"helm install failed:\n{installed.stderr}\n{operator_state(kube, namespace)}"
        # The release as Helm stores it (a Secret, at most 1 MiB): the CRDs are in it, with the chart.
        secret = kube.core.read_namespaced_secret(f"sh.helm.release.v1.{release}.v1", namespace)
        stored = len(base64.b64decode(secret.data["release"]))
        print(f"helm's release Secret holds {stored / 1024:.0f} KiB of the 1024 KiB it may")
        assert stored < 1024 * 1024 * 0.8, f"the release Secret ({stored} bytes) is near Helm's 1 MiB limit"
        deployment = client.AppsV1Api(kube.api).read_namespaced_deployment(release, namespace)
        assert deployment.spec.template.spec.containers[0].image == IMAGE
        (operator,) = kube.core.list_namespaced_pod(
            namespace, label_selector=f"app.kubernetes.io/instance={release}"
        ).items
        assert operator.spec.node_name == real_node.name
        for crd in CRDS:
            meta = kube.kubectl("get", "crd", crd, "-o", "json").stdout
            assert json.loads(meta)["metadata"]["annotations"]["meta.helm.sh/release-name"] == release

        run_a_job_to_success(kube, artifacts, real_node, jobs_namespace)
    finally:
        if installed.returncode != 0 or sys.exc_info()[0] is not None:
            print(operator_state(kube, namespace))
        uninstalled = run(*helm, "uninstall", release, "-n", namespace, *wait, cwd=artifacts, check=False)
    assert uninstalled.returncode == 0, f"helm uninstall failed:\n{uninstalled.stderr}"
    nothing_left_to_wedge(kube, release, [namespace, jobs_namespace])
    # The kept CRDs keep the jobs: a reinstall finds them.
    assert kube.kubectl("get", "crd", CRDS[0], "-o", "name").stdout


def operator_state(kube: Kube, namespace: str) -> str:
    out = kube.kubectl("get", "pods,deployments", "-n", namespace, "-o", "wide", check=False).stdout
    logs = kube.kubectl("logs", "-n", namespace, "-l", "app.kubernetes.io/name=vigil", "--tail", "60", check=False)
    events = kube.kubectl("get", "events", "-n", namespace, "--sort-by", ".lastTimestamp", check=False).stdout
    return f"{out}\n{logs.stdout}{logs.stderr}\n{events[-3000:]}"


def test_kubectl_apply_of_the_kustomize_base_runs_a_job_and_deletes_clean(
    kube: Kube, real_node: RealNode, artifacts: Path, jobs_namespace: str, tmp_path: Path
):
    """install.yaml through the kustomize base, with a user's overlay: the operator placed on the
    real node, one replica, watching the jobs' namespace (the file's defaults watch all)."""
    load_the_image_archive(artifacts)
    no_vigil_on_the_cluster(kube)
    overlay = artifacts / f"overlay-{uuid.uuid4().hex[:6]}"
    overlay.mkdir()
    only_jobs = {"matchLabels": {"kubernetes.io/metadata.name": jobs_namespace}}
    patches = [
        {
            "target": {"kind": "Deployment", "name": "vigil"},
            "patch": yaml.safe_dump(
                [
                    {"op": "replace", "path": "/spec/replicas", "value": 1},
                    {
                        "op": "add",
                        "path": "/spec/template/spec/nodeSelector",
                        "value": real_node.placement["nodeSelector"],
                    },
                    {
                        "op": "add",
                        "path": "/spec/template/spec/tolerations",
                        "value": real_node.placement["tolerations"],
                    },
                    # install.yaml's operator watches every namespace; this one the jobs' alone.
                    {
                        "op": "add",
                        "path": "/spec/template/spec/containers/0/args/-",
                        "value": f"--namespace={jobs_namespace}",
                    },
                ]
            ),
        },
        {
            "target": {"kind": "ValidatingWebhookConfiguration", "name": "vigil"},
            "patch": yaml.safe_dump([{"op": "replace", "path": "/webhooks/0/namespaceSelector", "value": only_jobs}]),
        },
    ]
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": ["../kustomize"],
                "patches": patches,
            }
        )
    )
    kubectl = (BIN / "kubectl", "--kubeconfig", kube.kubeconfig)
    rendered = run(*kubectl, "kustomize", overlay.name, cwd=artifacts).stdout
    (tmp_path / "applied.yaml").write_text(rendered)
    # The jobs' service account may patch its pods (the beats): docs/heartbeat-rbac.md, which the
    # chart's heartbeat.namespaces does for a Helm user.
    grant_heartbeat_rbac(kube, jobs_namespace)
    try:
        run(*kubectl, "apply", "--server-side", "-f", tmp_path / "applied.yaml", cwd=artifacts)
        wait_until(
            lambda: (
                (
                    client.AppsV1Api(kube.api).read_namespaced_deployment("vigil", "vigil-system").status.ready_replicas
                    or 0
                )
                >= 1
            ),
            180,
            "the operator of install.yaml to be ready",
        )
        the_operator_made_its_certificates(kube, jobs_namespace)
        run_a_job_to_success(kube, artifacts, real_node, jobs_namespace)
    finally:
        print(operator_state(kube, "vigil-system"))
        # The documented uninstall without Helm: stop the operator, then delete what the file made
        # but the CRDs. (`vigil release-finalizers` is for pods of jobs still running: a finished
        # attempt's pod keeps no finalizer, which nothing_left_to_wedge checks.)
        run(*kubectl, "-n", "vigil-system", "scale", "deployment", "vigil", "--replicas=0", cwd=artifacts, check=False)
        wait_until(
            lambda: (
                not kube.core.list_namespaced_pod("vigil-system", label_selector="app.kubernetes.io/name=vigil").items
            ),
            90,
            "the operator's pods to stop",
        )
        without_crds = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] != "CustomResourceDefinition"]
        (tmp_path / "delete.yaml").write_text(yaml.safe_dump_all(without_crds))
        run(*kubectl, "delete", "--ignore-not-found", "--wait=true", "-f", tmp_path / "delete.yaml", cwd=artifacts)
    nothing_left_to_wedge(kube, "vigil", [jobs_namespace])


def the_operator_made_its_certificates(kube: Kube, jobs_namespace: str) -> None:
    """install.yaml's operator made the Secret vigil-certs (a CA, and a pair for the webhook and the
    metrics) and put its CA in the webhook's caBundle; its servers present those certificates, which
    a client trusting that CA alone accepts for the Services' names, and the webhook answers a review
    with them (a job over a full queue: 429).

    The review is posted to the leader's pod as the API server would send it, not through the API
    server: the bed runs no kube-proxy, so the API server cannot reach a Service's ClusterIP (a
    webhook behind one is never called here; failurePolicy Ignore admits instead)."""
    secret = kube.core.read_namespaced_secret("vigil-certs", "vigil-system")
    assert set(secret.data) >= {"ca.crt", "ca.key", "webhook.crt", "webhook.key", "metrics.crt", "metrics.key"}
    ca_pem = base64.b64decode(secret.data["ca.crt"]).decode()
    assert ca_pem.startswith("-----BEGIN CERTIFICATE-----")

    def bundles() -> list[str | None]:
        configuration = client.AdmissionregistrationV1Api(kube.api).read_validating_webhook_configuration("vigil")
        return [w.client_config.ca_bundle for w in configuration.webhooks]

    # Set before the servers started, so before the pod was ready; polled all the same.
    wait_until(lambda: bundles() == [secret.data["ca.crt"]], 30, "the webhook's caBundle to be the Secret's ca.crt")

    (leader,) = kube.core.list_namespaced_pod("vigil-system", label_selector="vigil.dev/leader=vigil").items
    trusting_the_ca = ssl.create_default_context(cadata=ca_pem)  # that CA alone (cadata: no system roots)
    with tls_to(leader.status.pod_ip, 8081, "vigil-metrics.vigil-system.svc", trusting_the_ca) as metrics:
        assert metrics.version() in ("TLSv1.2", "TLSv1.3")

    full = f"full-{uuid.uuid4().hex[:6]}"
    queue = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VigilQueue", "metadata": {"name": full}}
    kube.custom.create_namespaced_custom_object(
        GROUP, VERSION, jobs_namespace, "vigilqueues", {**queue, "spec": {"maxQueued": 0}}
    )

    def answer() -> dict:
        review = json.dumps(admission_review(jobs_namespace, "probe", full)).encode()
        with tls_to(leader.status.pod_ip, 9443, "vigil-webhook.vigil-system.svc", trusting_the_ca) as tls:
            connection = http.client.HTTPConnection(leader.status.pod_ip, 9443, timeout=10)
            connection.sock = tls  # HTTP over the checked TLS connection
            connection.request("POST", "/validate-vigiljob", review, {"Content-Type": "application/json"})
            response = connection.getresponse()
            assert response.status == 200, response.status
            return json.loads(response.read())["response"]

    # The operator sees the queue through its watch a moment later; then every review is refused.
    def refusal() -> dict | None:
        given = answer()
        return None if given["allowed"] else given

    refused = wait_until(refusal, 60, "the webhook to refuse a job over a full queue")
    assert refused["status"]["code"] == 429 and f'queue "{full}"' in refused["status"]["message"], refused
    kube.custom.delete_namespaced_custom_object(GROUP, VERSION, jobs_namespace, "vigilqueues", full)


def tls_to(address: str, port: int, name: str, context: ssl.SSLContext) -> ssl.SSLSocket:
    """A TLS connection to address:port whose certificate must chain to `context`'s CA and name `name`."""
    return context.wrap_socket(socket.create_connection((address, port), timeout=10), server_hostname=name)


def test_an_upgrade_from_0_1_0s_chart_takes_over_its_crds(kube: Kube, artifacts: Path, tmp_path: Path):
    """docs/upgrading.md, "From 0.1.0, once": 0.1.0's chart created the CRDs from Helm's crds/
    directory, outside the release, so a plain `helm upgrade` to this chart is refused (Helm will
    not adopt objects it did not make) and `--take-ownership` adopts them. On kwok's nodes: this
    is about Helm and the CRDs, not the operator's pods."""
    # The previous release's chart, as its user has it (tests/support/previous.py).
    old = previous.extract(tmp_path / "v0.1.0")
    no_vigil_on_the_cluster(kube)
    namespace, release = f"vigil-up-{uuid.uuid4().hex[:6]}", "vigil"
    only_here = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "nodeSelector": {"type": "kwok"},
                "tolerations": [{**FAKE_NODE_TAINT, "operator": "Equal"}],
                "webhook": {"namespaceSelector": only_here},
                "heartbeat": {"policy": {"namespaceSelector": only_here}},
            }
        )
    )
    helm = (BIN / "helm", "--kubeconfig", kube.kubeconfig)
    wait = ("--wait", "--timeout", f"{deadline(120):.0f}s")
    run(*helm, "install", release, old / "charts" / "vigil", "-n", namespace, "--create-namespace", "-f", values,
        *wait, cwd=artifacts)  # fmt: skip
    try:
        versions = kube.kubectl("get", "crd", CRDS[0], "-o", "jsonpath={.spec.versions[*].name}").stdout.split()
        assert versions == ["v1alpha1"], versions
        plain = run(*helm, "upgrade", release, f"vigil-{V}.tgz", "-n", namespace, "-f", values, *wait,
                    cwd=artifacts, check=False)  # fmt: skip
        assert plain.returncode != 0 and "invalid ownership metadata" in plain.stderr, plain.stderr
        run(*helm, "upgrade", release, f"vigil-{V}.tgz", "-n", namespace, "-f", values, "--take-ownership", *wait,
            cwd=artifacts)  # fmt: skip
        crd = json.loads(kube.kubectl("get", "crd", CRDS[0], "-o", "json").stdout)
        storage = [v["name"] for v in crd["spec"]["versions"] if v["storage"]]
        assert storage == ["v1beta1"] and {v["name"] for v in crd["spec"]["versions"]} == {"v1alpha1", "v1beta1"}
        assert crd["metadata"]["annotations"]["meta.helm.sh/release-name"] == release
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        history = json.loads(run(*helm, "history", release, "-n", namespace, "-o", "json", cwd=artifacts).stdout)
        assert [(h["chart"], h["status"]) for h in history][-1] == (f"vigil-{V}", "deployed"), history
    finally:
        uninstalled = run(*helm, "uninstall", release, "-n", namespace, *wait, cwd=artifacts, check=False)
        kube.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=false", check=False)
    assert uninstalled.returncode == 0, uninstalled.stderr
    assert kube.kubectl("get", "crd", CRDS[0], "-o", "name").stdout.strip(), "the uninstall deleted the kept CRD"
