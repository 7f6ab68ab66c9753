"""The Helm chart: it lints, it grants no wildcard, and its RBAC is all the operator needs; the
API server takes everything it renders (every optional part on); install, upgrade and uninstall
work; bad values are refused naming the value.

The operator runs here as a process with the token of the chart's ServiceAccount, so every
request it makes is authorized by the chart's ClusterRole exactly as in a cluster. The chart's
own pods run on kwok's fake kubelets (they become Ready without running the image).
"""

from __future__ import annotations

import json
import re
import ssl
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from testbed import cluster as testbed
from tests.support.charts import CHART, KUBE_VERSION, helm, run_helm
from tests.support.cluster import Kube, free_port, fresh_namespace, install_crds, token_kubeconfig
from tests.support.jobs import (
    FAST_BACKOFF,
    GROUP,
    PLURAL,
    VERSION,
    get,
    vigil_job,
    wait_dead_letter_label,
    wait_phase,
)
from tests.support.operators import OperatorProcess
from tests.support.waits import deadline, wait_until
from vigil.servers.webhook import make_self_signed

pytestmark = pytest.mark.e2e  # the operator end to end, as a process, on a real cluster

HELM_WAIT = f"{deadline(120):.0f}s"  # how long `helm --wait` may wait for a rollout
# prometheus-operator's CRDs, fetched by testbed/build.sh, for the ServiceMonitor and PrometheusRule.
MONITORING_CRDS = [
    testbed.CACHE / "crds" / "prometheus-operator" / f"monitoring.coreos.com_{plural}.yaml"
    for plural in ("servicemonitors", "prometheusrules")
]


def render(release_namespace: str, *args: str, release: str = "vigil") -> list[dict]:
    # Without the CRDs: the suite applies them itself (install_crds), for every test of the cluster;
    # tests/unit/deploy/test_release.py and e2e/test_install_from_artifacts.py test the chart's.
    out = helm(
        "template", release, str(CHART), "--namespace", release_namespace, "--kube-version", KUBE_VERSION,
        "--set", "crds.enabled=false", *args,
    )  # fmt: skip
    return [doc for doc in yaml.safe_load_all(out) if doc]


def as_list(objects: list[dict]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})


def values_file(path: Path, values: dict) -> Path:
    path.write_text(yaml.safe_dump(values))
    return path


def on_kwok(namespace: str) -> dict:
    """Values for a release whose pods run on the bed's fake nodes, and whose cluster-wide
    admission (the webhook and the heartbeat policy) is limited to its own namespace, so that it
    cannot slow or refuse what other tests do meanwhile."""
    only_here = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    return {
        "crds": {"enabled": False},  # the suite's own (install_crds): a release may not take them over
        "nodeSelector": {"type": "kwok"},
        "tolerations": [{**testbed.FAKE_NODE_TAINT, "operator": "Equal"}],
        "webhook": {"namespaceSelector": only_here},
        "heartbeat": {"policy": {"namespaceSelector": only_here}},
    }


def test_the_chart_lints_and_grants_no_wildcard(tmp_path: Path):
    helm("lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION)
    everything = values_file(tmp_path / "everything.yaml", EVERYTHING_ON)
    helm("lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION, "-f", str(everything))
    roles = {doc["metadata"]["name"]: doc for doc in render("vigil-system") if doc["kind"] == "ClusterRole"}
    # The operator's, the one Prometheus binds, and the uninstall hook's (it strips Vigil's finalizer)
    assert set(roles) == {"vigil", "vigil-metrics-reader", "vigil-release-finalizers"}
    for role in roles.values():
        for rule in role["rules"]:
            for field in ("verbs", "resources", "apiGroups", "nonResourceURLs"):
                assert "*" not in rule.get(field, []), f"wildcard in {field}: {rule}"
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule


def _token_kubeconfig(kube: Kube, namespace: str, service_account: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount, with a bound token."""
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))
    token = kube.core.create_namespaced_service_account_token(service_account, namespace, request).status.token
    return token_kubeconfig(kube, token, path)


def test_the_operator_runs_with_nothing_but_the_charts_rbac(kube: Kube, namespace: str, tmp_path: Path):
    install_crds(kube)
    release_ns = f"vigil-{uuid.uuid4().hex[:8]}"
    kube.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=release_ns)))
    rbac = [doc for doc in render(release_ns) if doc["kind"] != "Deployment"]
    kube.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": rbac}))
    ca = ssl.create_default_context(cadata=make_self_signed(tmp_path / "certs").decode())
    metrics_port, beat_port = free_port(), free_port()
    kubeconfig = _token_kubeconfig(kube, release_ns, "vigil", tmp_path / "kubeconfig")
    operator = OperatorProcess(
        kube,
        [namespace],
        tmp_path / "operator.log",
        kubeconfig=kubeconfig,
        # as the chart runs it: leading its own Lease, which its Role names; metrics over HTTPS
        extra_args=(
            "--leader-elect",
            "--lease-namespace",
            release_ns,
            "--lease-name",
            "vigil",
            "--metrics-address",
            f"127.0.0.1:{metrics_port}",
            "--metrics-cert-file",
            str(tmp_path / "certs" / "tls.crt"),
            "--metrics-key-file",
            str(tmp_path / "certs" / "tls.key"),
            # and beats to the leader, whose issuer keys every service account may read
            "--beat-address",
            f"127.0.0.1:{beat_port}",
            "--beat-cert-file",
            str(tmp_path / "certs" / "tls.crt"),
            "--beat-key-file",
            str(tmp_path / "certs" / "tls.key"),
            "--heartbeat-url",
            f"https://127.0.0.1:{beat_port}/v1/heartbeat",
            "--heartbeat-ca-file",
            str(tmp_path / "certs" / "ca.crt"),
        ),  # fmt: skip
    )
    operator.start()
    try:
        custom = kube.custom
        # Exercises every write: status, pods, events, the dead-letter label, pod and job deletion.
        custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            vigil_job("poison", "7", "1s", retry={"maxAttempts": 3, "nonRetryableExitCodes": [7]}),
        )
        custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            vigil_job(
                "expiring",
                exit_code=None,
                run_for=None,
                attemptDeadlineSeconds=1,
                ttlSecondsAfterFinished=1,
                retry={"maxAttempts": 1, "backoff": FAST_BACKOFF},
            ),
        )
        wait_phase(kube, namespace, "poison", "DeadLettered")
        wait_dead_letter_label(kube, namespace, "poison")
        wait_until(lambda: get(kube, namespace, "expiring") is None, 60, "the expired job to be deleted by its TTL")
        # The chart lets the operator review a scraper's token: its own (not a metrics reader) is
        # 403, a verdict of the API server; without the review rules it would be 503.
        token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
        request = urllib.request.Request(f"https://127.0.0.1:{metrics_port}/metrics")
        request.add_header("Authorization", f"Bearer {token}")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=deadline(10), context=ca)
        assert refused.value.code == 403, refused.value.read()
        # The issuer's keys, which beats to the leader are checked against, read with the
        # chart's RBAC alone (the cluster's default issuer-discovery binding).
        wait_until(lambda: "service-account issuer" in operator.log_path.read_text(), 30, "the issuer's keys fetched")
    finally:
        operator.stop()
        kube.kubectl(
            "delete",
            "-f",
            "-",
            "--ignore-not-found",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": rbac}),
        )
        kube.core.delete_namespace(release_ns)
    log = operator.log_path.read_text()
    # (403 after a comma is a log line's milliseconds, not a status)
    assert "Forbidden" not in log and not re.search(r"(?<!,)\b403\b", log), log[-3000:]


# ----------------------------------------------------------------- every optional part, on the API server

EVERYTHING_ON = {
    "replicas": 3,
    "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}},
    "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "Vigil"}},
    "podDisruptionBudget": {"enabled": True, "minAvailable": 2},
    "serviceAccount": {"annotations": {"example.com/role": "vigil"}},
    "podAnnotations": {"example.com/team": "batch"},
    "podLabels": {"example.com/tier": "control"},
    "commonLabels": {"example.com/owner": "platform"},
    "topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}
    ],
    "operator": {"watchNamespaces": ["team-*", "batch"], "logLevel": "debug"},
}


def install_monitoring_crds(kube: Kube) -> None:
    missing = [str(path) for path in MONITORING_CRDS if not path.exists()]
    if missing:
        pytest.fail(f"prometheus-operator CRDs not found ({', '.join(missing)}): run testbed/build.sh")
    for path in MONITORING_CRDS:
        kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    for path in MONITORING_CRDS:
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        kube.kubectl("wait", "--for=condition=Established", f"--timeout={deadline(60):.0f}s", f"crd/{name}")


@pytest.fixture
def release_namespace(kube: Kube) -> Iterator[str]:
    with fresh_namespace(kube, "vigil-rel-", release=False) as name:
        yield name


def test_every_optional_part_is_accepted_by_the_api_server(kube: Kube, release_namespace: str, tmp_path: Path):
    install_crds(kube)
    install_monitoring_crds(kube)
    values = values_file(tmp_path / "values.yaml", {**EVERYTHING_ON, "heartbeat": {"namespaces": [release_namespace]}})
    release = "team-a"  # not containing the chart's name: objects are "team-a-vigil"
    objects = render(release_namespace, "-f", str(values), release=release)
    kinds = {doc["kind"] for doc in objects}
    assert {
        "ServiceMonitor", "PrometheusRule", "ConfigMap", "PodDisruptionBudget", "Deployment", "Service",
        "ClusterRole", "Role", "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy",
    } <= kinds, kinds  # fmt: skip

    # Everything namespaced is in the release's namespace and named after the release; what refers
    # to the release's objects across namespaces names that namespace.
    cluster_scoped = {
        "ClusterRole", "ClusterRoleBinding", "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }  # fmt: skip
    for doc in objects:
        meta = doc["metadata"]
        if doc["kind"] in cluster_scoped:
            assert "namespace" not in meta, doc["kind"]
            assert meta["name"].startswith("team-a-vigil"), (doc["kind"], meta["name"])
        else:
            assert meta["namespace"] == release_namespace, (doc["kind"], meta["name"])
        assert meta["labels"]["app.kubernetes.io/instance"] == release, (doc["kind"], meta["name"])
        assert meta["labels"]["example.com/owner"] == "platform", (doc["kind"], meta["name"])
    by_kind = {(doc["kind"], doc["metadata"]["name"]): doc for doc in objects}
    binding = by_kind["ClusterRoleBinding", "team-a-vigil"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "team-a-vigil", "namespace": release_namespace}]
    monitor = by_kind["ServiceMonitor", "team-a-vigil"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [release_namespace]}
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    metrics_service = by_kind["Service", "team-a-vigil-metrics"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= metrics_service["metadata"]["labels"].items()
    assert (
        not monitor["spec"]["selector"]["matchLabels"].items()
        <= by_kind["Service", "team-a-vigil-webhook"]["metadata"]["labels"].items()
    )
    assert [p["name"] for p in metrics_service["spec"]["ports"]] == ["metrics"]
    hook = by_kind["ValidatingWebhookConfiguration", "team-a-vigil"]["webhooks"][0]
    assert hook["clientConfig"]["service"]["namespace"] == release_namespace
    lease_role = by_kind["Role", "team-a-vigil-leader-election"]
    assert lease_role["rules"][0]["resourceNames"] == ["team-a-vigil"]
    deployment = by_kind["Deployment", "team-a-vigil"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--lease-name=team-a-vigil" in container["args"]
    # The webhook answers from the leader's pod alone: the pod the leader marks with its Lease's name.
    webhook_selector = by_kind["Service", "team-a-vigil-webhook"]["spec"]["selector"]
    assert webhook_selector == {**deployment["spec"]["selector"]["matchLabels"], "vigil.dev/leader": "team-a-vigil"}
    assert "--metrics-address=0.0.0.0:8081" in container["args"]
    assert {"name": "metrics", "containerPort": 8081} in container["ports"]
    assert by_kind["PodDisruptionBudget", "team-a-vigil"]["spec"]["minAvailable"] == 2
    assert "maxUnavailable" not in by_kind["PodDisruptionBudget", "team-a-vigil"]["spec"]
    rule = by_kind["PrometheusRule", "team-a-vigil"]
    assert rule["spec"]["groups"], "the PrometheusRule has no rules"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    dashboard = by_kind["ConfigMap", "team-a-vigil-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "Vigil"}

    # The API server validates all of it (schemas of the CRDs included), storing nothing.
    out = kube.kubectl("apply", "--dry-run=server", "-f", "-", input=as_list(objects)).stdout
    assert out.count("(server dry run)") == len(objects), out


def test_the_pods_are_safe_by_default_and_spread_over_nodes():
    [deployment] = [doc for doc in render("vigil-system") if doc["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    [term] = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert {p["name"] for p in container["ports"]} == {"health", "metrics", "webhook", "beats"}
    # The user's affinity replaces the default; one replica gets no PodDisruptionBudget.
    pool = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["ops"]}]}
    node_affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [pool]}}}
    custom = render("vigil-system", "--set-json", f"affinity={json.dumps(node_affinity)}", "--set", "replicas=1")
    assert [doc["spec"]["template"]["spec"]["affinity"] for doc in custom if doc["kind"] == "Deployment"] == [
        node_affinity
    ]
    assert "PodDisruptionBudget" not in {doc["kind"] for doc in custom}


# ------------------------------------------------------------------------------- install, upgrade, uninstall


def helm_on(kube: Kube, *args: str) -> str:
    return helm(*args, "--kubeconfig", str(kube.kubeconfig))


def deployment_of(kube: Kube, namespace: str, name: str) -> client.V1Deployment | None:
    try:
        return client.AppsV1Api(kube.api).read_namespaced_deployment(name, namespace)
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise


def test_install_upgrade_and_uninstall(kube: Kube, tmp_path: Path):
    install_crds(kube)
    namespace = f"vigil-inst-{uuid.uuid4().hex[:8]}"
    release = f"vigil-{uuid.uuid4().hex[:6]}"  # contains the chart's name: objects are named as the release
    values = values_file(tmp_path / "values.yaml", on_kwok(namespace))
    apps = client.AppsV1Api(kube.api)
    started = time.monotonic()
    try:
        # kwok makes the pods Ready, so helm can wait for the rollout as in a real cluster.
        notes = helm_on(
            kube, "install", release, str(CHART), "-n", namespace, "--create-namespace", "-f", str(values),
            "--wait", "--timeout", HELM_WAIT,
        )  # fmt: skip
        assert "kubectl get vj,vq -A" in notes and f"lease {release}" in notes and f"{release}-metrics" in notes, notes
        deployment = apps.read_namespaced_deployment(release, namespace)
        assert (deployment.spec.replicas, deployment.status.ready_replicas) == (2, 2)
        pods = kube.core.list_namespaced_pod(namespace, label_selector=f"app.kubernetes.io/instance={release}").items
        assert len({pod.spec.node_name for pod in pods}) == 2, "the anti-affinity did not spread the replicas"
        pdb = client.PolicyV1Api(kube.api).read_namespaced_pod_disruption_budget(release, namespace)
        assert pdb.spec.max_unavailable == 1
        assert kube.core.read_namespaced_service(f"{release}-metrics", namespace).spec.ports[0].name == "metrics"
        assert "--log-level=info" in deployment.spec.template.spec.containers[0].args

        # An upgrade that changes a value rolls the Deployment.
        helm_on(
            kube, "upgrade", release, str(CHART), "-n", namespace, "-f", str(values),
            "--set", "operator.logLevel=debug", "--set", "resources.limits.memory=768Mi",
            "--wait", "--timeout", HELM_WAIT,
        )  # fmt: skip
        upgraded = apps.read_namespaced_deployment(release, namespace)
        container = upgraded.spec.template.spec.containers[0]
        assert "--log-level=debug" in container.args and "--log-level=info" not in container.args
        assert container.resources.limits["memory"] == "768Mi"
        assert upgraded.metadata.generation > deployment.metadata.generation
        assert upgraded.status.updated_replicas == 2
        history = json.loads(helm_on(kube, "history", release, "-n", namespace, "-o", "json"))
        assert [entry["status"] for entry in history] == ["superseded", "deployed"]

        # The cluster-scoped objects, to look for after the uninstall.
        manifest = [
            doc for doc in yaml.safe_load_all(helm_on(kube, "get", "manifest", release, "-n", namespace)) if doc
        ]
        assert len(manifest) >= 12
    finally:
        uninstalled = run_helm(
            "uninstall", release, "-n", namespace, "--wait", "--timeout", HELM_WAIT,
            "--kubeconfig", str(kube.kubeconfig),
        )  # fmt: skip
    assert uninstalled.returncode == 0, uninstalled.stderr
    try:
        # Everything the release made is gone, namespaced or not; the CRDs (and so the jobs) stay.
        for doc in manifest:
            kind, name = doc["kind"], doc["metadata"]["name"]
            args = ["get", kind, name, "--ignore-not-found", "-o", "name"]
            if "namespace" in doc["metadata"]:
                args += ["-n", doc["metadata"]["namespace"]]
            assert kube.kubectl(*args).stdout.strip() == "", f"{kind}/{name} outlived helm uninstall"
        wait_until(lambda: not kube.core.list_namespaced_pod(namespace).items, 60, "the release's pods to be deleted")
        for crd in ("vigiljobs.vigil.dev", "vigilqueues.vigil.dev"):
            assert (
                kube.kubectl("get", "crd", crd, "-o", "name").stdout.strip()
                == f"customresourcedefinition.apiextensions.k8s.io/{crd}"
            )
    finally:
        kube.core.delete_namespace(namespace, propagation_policy="Background")
    print(f"install, upgrade and uninstall took {time.monotonic() - started:.1f}s")


# ------------------------------------------------------------------------------- bad values


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--set", "replicas=-1"], ["/replicas", "minimum"]),
        (["--set", "operator.logLevel=loud"], ["/operator/logLevel", "'debug', 'info', 'warning', 'error'"]),
        (["--set", "webhook.failurePolicy=Sometimes"], ["/webhook/failurePolicy", "'Ignore', 'Fail'"]),
        (["--set", "operator.workers=many"], ["/operator/workers", "want integer"]),
        (["--set", "replica=3"], ["additional properties 'replica' not allowed"]),
        (["--set", "metrics.serviceMonitor.interval=often"], ["/metrics/serviceMonitor/interval"]),
        (["--set", "podDisruptionBudget.maxUnavailable=0"], ["/podDisruptionBudget/maxUnavailable"]),
        (
            ["--set", "replicas=2", "--set", "leaderElection.enabled=false"],
            ["replicas=2 needs leaderElection.enabled=true", "or replicas=1"],
        ),
        (
            ["--set", "leaderElection.renewDeadlineSeconds=20"],
            ["leaderElection.leaseDurationSeconds (15) must be greater than leaderElection.renewDeadlineSeconds (20)"],
        ),
        (["--set", "metrics.port=8080"], ["metrics.port (8080) is already taken by operator.healthPort"]),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) and value[0].startswith("--") else None,
)
def test_bad_values_are_refused_naming_the_value(kube: Kube, args: list[str], expected: list[str]):
    namespace = f"vigil-bad-{uuid.uuid4().hex[:8]}"
    result = run_helm(
        "install", "vigil", str(CHART), "-n", namespace, "--create-namespace", "--kubeconfig", str(kube.kubeconfig),
        *args,
    )  # fmt: skip
    assert result.returncode != 0, f"helm install {' '.join(args)} was accepted"
    for text in expected:
        assert text in result.stderr, result.stderr
    # Refused before anything reached the cluster.
    assert kube.kubectl("get", "namespace", namespace, "--ignore-not-found", "-o", "name").stdout == ""


def test_the_documented_crd_upgrade_works_and_client_side_apply_would_not(kube: Kube):
    """docs/upgrading.md: with crds.enabled=false, `kubectl apply --server-side -f crds/`, because
    client-side apply's last-applied annotation cannot hold the VigilJob CRD."""
    install_crds(kube)
    out = kube.kubectl("apply", "--server-side", "-f", str(CHART / "files" / "crds")).stdout
    assert "vigiljobs.vigil.dev serverside-applied" in out, out
    client_side = kube.kubectl("apply", "--dry-run=server", "-f", str(CHART / "files" / "crds"), check=False)
    assert client_side.returncode != 0 and "Too long" in client_side.stderr, client_side.stderr
