"""The Helm chart: it lints, it grants no wildcard, and its RBAC is all the operator needs.

The operator runs here as a process with the token of the chart's ServiceAccount, so every
request it makes is authorized by the chart's ClusterRole exactly as in a cluster.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from testbed import cluster as testbed
from tests.conftest import ROOT, Kube, OperatorProcess, install_crds, token_kubeconfig, wait_until
from tests.integration.test_lifecycle import (
    FAST_BACKOFF,
    GROUP,
    PLURAL,
    VERSION,
    get,
    vigil_job,
    wait_dead_letter_label,
    wait_phase,
)

pytestmark = pytest.mark.e2e  # the operator end to end, as a process, on a real cluster

CHART = ROOT / "charts" / "vigil"


def helm(*args: str) -> str:
    result = subprocess.run([str(testbed.BIN / "helm"), *args], capture_output=True, text=True)
    assert result.returncode == 0, f"helm {' '.join(args)}: {result.stderr}"
    return result.stdout


def render(release_namespace: str) -> list[dict]:
    out = helm("template", "vigil", str(CHART), "--namespace", release_namespace, "--kube-version", "1.36.3")
    return [doc for doc in yaml.safe_load_all(out) if doc]


def test_the_chart_lints_and_grants_no_wildcard():
    helm("lint", "--strict", str(CHART), "--kube-version", "1.36.3")
    [role] = [doc for doc in render("vigil-system") if doc["kind"] == "ClusterRole"]
    for rule in role["rules"]:
        for field in ("verbs", "resources", "apiGroups"):
            assert "*" not in rule[field], f"wildcard in {field}: {rule}"
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
    operator = OperatorProcess(
        kube,
        [namespace],
        tmp_path / "operator.log",
        kubeconfig=_token_kubeconfig(kube, release_ns, "vigil", tmp_path / "kubeconfig"),
        # as the chart runs it: leading its own Lease, which its Role names
        extra_args=("--leader-elect", "--lease-namespace", release_ns, "--lease-name", "vigil"),
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
    assert "Forbidden" not in log and "403" not in log, log[-3000:]
