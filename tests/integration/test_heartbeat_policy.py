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
from tests.support.cluster import Kube, fresh_namespace, simulated_pod_spec, token_kubeconfig
from tests.support.waits import wait_until
from vigil import api

pytestmark = pytest.mark.integration

ALLOWED = "may only change the vigil.dev/heartbeat and vigil.dev/checkpoint annotations"
ALL_VERBS = ("get", "patch", "create", "delete")
ALL_POD_RESOURCES = ("pods", "pods/status")


def render_policy(release: str, namespaces: list[str], values: Path) -> list[dict]:
    """The policies and bindings, bound to the test's namespaces only so parallel tests are untouched."""
    only = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}]}
    values.write_text(
        json.dumps({"heartbeat": {"serviceAccountNames": [JOB_ACCOUNT], "policy": {"namespaceSelector": only}}})
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
    # Helm orders what it renders by kind, so the two policies come before their bindings.
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ValidatingAdmissionPolicy"] * 2 + ["ValidatingAdmissionPolicyBinding"] * 2
    return docs


@pytest.fixture
def other_namespace(kube: Kube) -> Iterator[str]:
    """A second namespace, for a pod of the same name as the test's."""
    with fresh_namespace(kube, "t-other-", release=False) as name:
        yield name


@pytest.fixture
def policy(kube: Kube, namespace: str, other_namespace: str, tmp_path: Path) -> Iterator[list[dict]]:
    release = f"vigil-hb-{uuid.uuid4().hex[:6]}"
    docs = render_policy(release, [namespace, other_namespace], tmp_path / "values.json")
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
    kube.kubectl("apply", "-f", "-", input=manifest)
    try:
        yield docs
    finally:
        kube.kubectl("delete", "-f", "-", "--ignore-not-found", input=manifest)


def as_token(kube: Kube, token: str, path: Path) -> client.CoreV1Api:
    return client.CoreV1Api(config.new_client_from_config(config_file=str(token_kubeconfig(kube, token, path))))


def refusal(call, what: str = "the request", status: int = 403) -> str:
    """The API server's message when `call` is refused with `status`; fails if it is allowed."""
    try:
        call()
    except client.ApiException as err:
        assert err.status == status, f"{what}: {err.status}: {err.body}"
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
        "deleting its pod": lambda: a.delete_namespaced_pod("job-a", namespace),
        "creating a pod": lambda: a.create_namespaced_pod(
            namespace, {"metadata": {"name": "job-c"}, "spec": simulated_pod_spec()[1]}
        ),
    }
    for what, call in refused.items():
        message = refusal(call, what)
        assert ALLOWED in message, f"{what}: {message}"
    # Over the limits: refused as invalid, naming the limit.
    for key, value in {
        CHECKPOINT_ANNOTATION: big[:-2] + 'xx"}',
        HEARTBEAT_ANNOTATION: "9" * (api.MAX_HEARTBEAT_CHARS + 1),
    }.items():
        message = refusal(patch_own(**{key: value}), f"{key} of {len(value)} characters", status=422)
        assert f"{key} is over" in message, message
    at_the_limit = "9" * api.MAX_HEARTBEAT_CHARS
    patch_own(**{HEARTBEAT_ANNOTATION: at_the_limit})()  # the limit itself is allowed

    # A token of the same account that is not bound to a pod has no pod to speak for.
    unbound = as_token(kube, pod_token(kube, namespace, None), tmp_path / "unbound.kubeconfig")
    message = refusal(annotate(unbound, namespace, "job-a", **{HEARTBEAT_ANNOTATION: "5:abc"}))
    assert "not bound to a pod" in message and ALLOWED in message
    assert kube.core.read_namespaced_pod("job-a", namespace).metadata.annotations[HEARTBEAT_ANNOTATION] == at_the_limit


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


def test_the_token_speaks_only_for_its_own_pod_not_one_of_the_same_name_elsewhere_or_since(
    kube: Kube, namespace: str, other_namespace: str, tmp_path: Path, policy
):
    """A pod is its namespace, name and UID: a same-named pod in another namespace (where some
    RoleBinding lets the job account patch pods), or a new pod of the same name, is not the pod
    the token was bound to."""
    grant_heartbeat_rbac(kube, namespace)
    victim_account = "victim"
    grant_heartbeat_rbac(kube, other_namespace, account=victim_account)
    rbac = client.RbacAuthorizationV1Api(kube.api)
    # A binding in the victim's namespace that also names the attacker's account (a careless one).
    rbac.patch_namespaced_role_binding(
        f"{victim_account}-heartbeat",
        other_namespace,
        {"subjects": [{"kind": "ServiceAccount", "name": victim_account, "namespace": other_namespace},
                      {"kind": "ServiceAccount", "name": JOB_ACCOUNT, "namespace": namespace}]},
    )  # fmt: skip
    own = create_job_pod(kube, namespace, "job-a")
    create_job_pod(kube, other_namespace, "job-a", account=victim_account)
    a = as_token(kube, pod_token(kube, namespace, own), tmp_path / "a.kubeconfig")
    wait_until(
        lambda: _refused(annotate(a, other_namespace, "job-a", **{HEARTBEAT_ANNOTATION: "1:probe"})),
        60,
        "the policy to take effect",
    )
    message = refusal(annotate(a, other_namespace, "job-a", **{CHECKPOINT_ANNOTATION: '{"step":9}'}))
    assert "not in the service account's namespace" in message and ALLOWED in message
    victims = kube.core.read_namespaced_pod("job-a", other_namespace).metadata.annotations or {}
    assert CHECKPOINT_ANNOTATION not in victims
    annotate(a, namespace, "job-a", **{HEARTBEAT_ANNOTATION: "2:own"})()  # its own pod, still

    # The pod deleted and made again under the same name: another pod, the old token speaks for none.
    kube.core.delete_namespaced_pod("job-a", namespace, grace_period_seconds=0)
    wait_until(lambda: not kube.core.list_namespaced_pod(namespace).items, 30, "the pod to go")
    create_job_pod(kube, namespace, "job-a")
    try:
        annotate(a, namespace, "job-a", **{HEARTBEAT_ANNOTATION: "3:stale"})()
    except client.ApiException as err:
        assert err.status in (401, 403), f"{err.status}: {err.body}"  # the token refused, or the policy
    else:
        pytest.fail("a token bound to a deleted pod patched the new pod of its name")


def test_the_grant_of_the_docs_goes_with_the_policy(kube: Kube, namespace: str, policy):
    """docs/heartbeat-rbac.md: the RoleBinding is owned by the policy, so deleting the policy (as
    helm uninstall does) deletes the grant; job tokens never keep unrestricted pod patch."""
    [heartbeat_policy] = [doc for doc in policy if doc["kind"] == "ValidatingAdmissionPolicy"][:1]
    name = heartbeat_policy["metadata"]["name"]
    admission = client.AdmissionregistrationV1Api(kube.api)
    uid = admission.read_validating_admission_policy(name).metadata.uid
    grant_heartbeat_rbac(kube, namespace)
    rbac = client.RbacAuthorizationV1Api(kube.api)
    owner = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "name": name,
        "uid": uid,
    }
    rbac.patch_namespaced_role_binding(
        f"{JOB_ACCOUNT}-heartbeat", namespace, {"metadata": {"ownerReferences": [owner]}}
    )
    admission.delete_validating_admission_policy(name)

    def binding_gone() -> bool:
        try:
            rbac.read_namespaced_role_binding(f"{JOB_ACCOUNT}-heartbeat", namespace)
        except client.ApiException as err:
            return err.status == 404
        return False

    wait_until(binding_gone, 30, "the garbage collector to delete the binding owned by the deleted policy")
