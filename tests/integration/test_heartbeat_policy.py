"""The chart's heartbeat admission policy, with real pod-bound tokens: a job pod's account may
change its own pod's heartbeat and checkpoint annotations, and nothing else.

The test's Role grants more than docs/heartbeat-rbac.md does (create, delete, pods/status), so
every refusal below comes from the policy, not from RBAC.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config

from tests.support.agents import (
    CHECKPOINT_ANNOTATION,
    HEARTBEAT_ANNOTATION,
    JOB_ACCOUNT,
    create_job_pod,
    grant_heartbeat_rbac,
    pod_token,
)
from tests.support.charts import CHART, KUBE_VERSION, helm
from tests.support.cluster import Kube, simulated_pod_spec, token_kubeconfig
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

ALLOWED = "may only change the vigil.dev/heartbeat and vigil.dev/checkpoint annotations"
ALL_VERBS = ("get", "patch", "create", "delete")
ALL_POD_RESOURCES = ("pods", "pods/status")


def render_policy(release: str, namespace: str, values: Path) -> list[dict]:
    """The policy and binding, bound to the test's namespace only so parallel tests are untouched."""
    values.write_text(
        json.dumps(
            {
                "heartbeat": {
                    "serviceAccountNames": [JOB_ACCOUNT],
                    "policy": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
                }
            }
        )
    )
    out = helm(
        "template",
        release,
        str(CHART),
        "--kube-version",
        KUBE_VERSION,
        "-f",
        str(values),
        "--show-only",
        "templates/heartbeat-policy.yaml",
    )
    docs = [doc for doc in yaml.safe_load_all(out) if doc]
    assert [d["kind"] for d in docs] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    return docs


@pytest.fixture
def policy(kube: Kube, namespace: str, tmp_path: Path) -> Iterator[list[dict]]:
    docs = render_policy(f"vigil-hb-{uuid.uuid4().hex[:6]}", namespace, tmp_path / "values.json")
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
    kube.kubectl("apply", "-f", "-", input=manifest)
    try:
        yield docs
    finally:
        kube.kubectl("delete", "-f", "-", "--ignore-not-found", input=manifest)


def as_token(kube: Kube, token: str, path: Path) -> client.CoreV1Api:
    return client.CoreV1Api(config.new_client_from_config(config_file=str(token_kubeconfig(kube, token, path))))


def refusal(call, what: str = "the request") -> str:
    """The API server's message when `call` is refused with 403; fails if it is allowed."""
    try:
        call()
    except client.ApiException as err:
        assert err.status == 403, f"{err.status}: {err.body}"
        return json.loads(err.body)["message"]
    pytest.fail(f"{what} was allowed")


def annotate(core: client.CoreV1Api, namespace: str, name: str, **annotations: str):
    return lambda: core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": annotations}})


def _refused(call) -> bool:
    try:
        call()
    except client.ApiException as err:
        return err.status == 403
    return False


def test_a_job_pod_may_change_only_its_own_heartbeat_and_checkpoint(kube: Kube, namespace: str, tmp_path: Path, policy):
    grant_heartbeat_rbac(kube, namespace, verbs=ALL_VERBS, resources=ALL_POD_RESOURCES)
    pod_a = create_job_pod(kube, namespace, "job-a", **{"example.com/owner": "team-a"})
    create_job_pod(kube, namespace, "job-b")
    a = as_token(kube, pod_token(kube, namespace, pod_a), tmp_path / "a.kubeconfig")
    patch_own = lambda **ann: annotate(a, namespace, "job-a", **ann)  # noqa: E731

    # The policy's status propagates to the API server's admission in a moment: wait for it.
    wait_until(
        lambda: _refused(annotate(a, namespace, "job-b", **{HEARTBEAT_ANNOTATION: "1:probe"})),
        60,
        "the policy to take effect",
    )

    # Allowed: its own heartbeat and checkpoint (2048 characters exactly is the limit).
    patch_own(**{HEARTBEAT_ANNOTATION: "2:abc"})()
    big = json.dumps({"pad": "x" * (2048 - len('{"pad":""}'))}, separators=(",", ":"))
    assert len(big) == 2048
    patch_own(**{HEARTBEAT_ANNOTATION: "3:abc", CHECKPOINT_ANNOTATION: big})()
    got = kube.core.read_namespaced_pod("job-a", namespace).metadata.annotations
    assert got[HEARTBEAT_ANNOTATION] == "3:abc" and got[CHECKPOINT_ANNOTATION] == big

    refused = {
        "pod B's heartbeat": annotate(a, namespace, "job-b", **{HEARTBEAT_ANNOTATION: "9:abc"}),
        "pod B's checkpoint": annotate(a, namespace, "job-b", **{CHECKPOINT_ANNOTATION: "{}"}),
        "another annotation": patch_own(**{HEARTBEAT_ANNOTATION: "4:abc", "vigil.dev/superseded": "x"}),
        "removing an annotation": patch_own(**{"example.com/owner": None}),
        "a label": lambda: a.patch_namespaced_pod(
            "job-a", namespace, {"metadata": {"labels": {"vigil.dev/attempt": "9"}}}
        ),
        "the spec": lambda: a.patch_namespaced_pod("job-a", namespace, {"spec": {"activeDeadlineSeconds": 5}}),
        "the status": lambda: a.patch_namespaced_pod_status(
            "job-a", namespace, {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
        ),
        "a checkpoint over 2 KiB": patch_own(**{CHECKPOINT_ANNOTATION: big[:-2] + 'xx"}'}),
        "deleting its pod": lambda: a.delete_namespaced_pod("job-a", namespace),
        "creating a pod": lambda: a.create_namespaced_pod(
            namespace, {"metadata": {"name": "job-c"}, "spec": simulated_pod_spec()[1]}
        ),
    }
    for what, call in refused.items():
        message = refusal(call, what)
        assert ALLOWED in message, f"{what}: {message}"

    # A token of the same account that is not bound to a pod has no pod to speak for.
    unbound = as_token(kube, pod_token(kube, namespace, None), tmp_path / "unbound.kubeconfig")
    message = refusal(annotate(unbound, namespace, "job-a", **{HEARTBEAT_ANNOTATION: "5:abc"}))
    assert "not bound to a pod" in message and ALLOWED in message
    assert kube.core.read_namespaced_pod("job-a", namespace).metadata.annotations[HEARTBEAT_ANNOTATION] == "3:abc"


def test_other_accounts_are_not_affected(kube: Kube, namespace: str, tmp_path: Path, policy):
    grant_heartbeat_rbac(kube, namespace, verbs=ALL_VERBS, resources=ALL_POD_RESOURCES)
    grant_heartbeat_rbac(kube, namespace, account="other", verbs=ALL_VERBS, resources=ALL_POD_RESOURCES)
    job = create_job_pod(kube, namespace, "job-a")
    create_job_pod(kube, namespace, "other-a", account="other")
    a = as_token(kube, pod_token(kube, namespace, job), tmp_path / "a.kubeconfig")
    wait_until(
        lambda: _refused(annotate(a, namespace, "other-a", **{HEARTBEAT_ANNOTATION: "1:probe"})),
        60,
        "the policy to take effect",
    )
    other = as_token(kube, pod_token(kube, namespace, None, account="other"), tmp_path / "other.kubeconfig")
    other.patch_namespaced_pod("job-a", namespace, {"metadata": {"labels": {"team": "x"}, "annotations": {"a": "b"}}})
    kube.core.patch_namespaced_pod("job-a", namespace, {"metadata": {"annotations": {"vigil.dev/superseded": "2"}}})
