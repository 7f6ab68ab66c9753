"""What Vigil leaves behind must never block anyone: no finalizer outlives its reason.

Each test is what a careless or hostile tenant (or an administrator uninstalling Vigil) does, and
what must follow:

- a namespace deleted under running and finished jobs is gone within seconds (every path where a
  job is gone releases its pods);
- `helm uninstall` with running jobs: the chart's pre-delete hook (`vigil release-finalizers`,
  with the hook's own RBAC, as the chart renders it: kwok's nodes run no container, so the test
  runs the hook's command as a process, with the hook's token) leaves no pod Terminating, and the
  namespace's deletion completes;
- under OwnerReferencesPermissionEnforcement (on in the bed's API server) the operator creates
  pods with nothing but the chart's namespaced Roles, and an account without
  `vigiljobs/finalizers: update` cannot set blockOwnerDeletion on a job.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config

from tests.support.charts import CHART, KUBE_VERSION, helm
from tests.support.cluster import (
    Kube,
    fresh_namespace,
    install_crds,
    release_attempt_pods,
    simulated_pod_spec,
    token_kubeconfig,
)
from tests.support.jobs import create, vigil_job, wait_phase
from tests.support.operators import OperatorProcess
from tests.support.waits import deadline, wait_until

pytestmark = pytest.mark.e2e

FINALIZER = "vigil.dev/attempt-tracking"


@contextlib.contextmanager
def doomed_namespace(kube: Kube, prefix: str) -> Iterator[str]:
    """A fresh namespace that the test deletes itself (whatever is left goes at the end)."""
    name = f"{prefix}{uuid.uuid4().hex[:10]}"
    kube.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        wait_until(lambda: kube.core.list_namespaced_service_account(name).items, 30, f"ServiceAccount in {name}")
        yield name
    finally:
        release_attempt_pods(kube, name)  # a failed test's leftovers must not hang the bed
        with contextlib.suppress(client.ApiException):  # 404: the test deleted it
            kube.core.delete_namespace(name, propagation_policy="Background")


def namespace_gone(kube: Kube, name: str) -> bool:
    try:
        kube.core.read_namespace(name)
    except client.ApiException as err:
        return err.status == 404
    return False


def tracked_pods(kube: Kube, namespace: str) -> list[str]:
    return sorted(
        pod.metadata.name
        for pod in kube.core.list_namespaced_pod(namespace).items
        if FINALIZER in (pod.metadata.finalizers or [])
    )


def test_a_namespace_deleted_under_running_and_finished_jobs_is_gone_in_seconds(kube: Kube, vigil: OperatorProcess):
    """The session's operator watches t-*: its jobs' pods are released whether the job's deletion,
    a look's 404 or a pod's last event comes first."""
    with doomed_namespace(kube, "t-gone-") as namespace:
        create(kube, namespace, vigil_job("finished", exit_code="0", run_for="1s"))
        for name in ("running-a", "running-b"):
            create(kube, namespace, vigil_job(name, exit_code=None, run_for=None))
        wait_phase(kube, namespace, "finished", "Succeeded")
        for name in ("running-a", "running-b"):
            wait_phase(kube, namespace, name, "Running")
        assert len(tracked_pods(kube, namespace)) == 2, "the running attempts' pods are held by the finalizer"
        started = time.monotonic()
        kube.core.delete_namespace(namespace, propagation_policy="Background")
        wait_until(lambda: namespace_gone(kube, namespace), 30, f"namespace {namespace} to be deleted")
        print(f"namespace deleted under running jobs: gone in {time.monotonic() - started:.1f}s")


# --------------------------------------------------------------------- helm uninstall with running jobs


def render(release: str, release_namespace: str, watched: str) -> list[dict]:
    out = helm(
        "template", release, str(CHART), "--namespace", release_namespace, "--kube-version", KUBE_VERSION,
        "--set", f"operator.watchNamespaces={{{watched}}}",
    )  # fmt: skip
    return [doc for doc in yaml.safe_load_all(out) if doc]


RBAC_KINDS = {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}


def is_hook(doc: dict) -> bool:
    return "helm.sh/hook" in (doc["metadata"].get("annotations") or {})


def as_list(docs: list[dict]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})


def account_kubeconfig(kube: Kube, namespace: str, account: str, path: Path) -> Path:
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))
    token = kube.core.create_namespaced_service_account_token(account, namespace, request).status.token
    return token_kubeconfig(kube, token, path)


def test_uninstalling_with_running_jobs_leaves_no_pod_or_namespace_stuck(kube: Kube, tmp_path: Path):
    install_crds(kube)
    release = f"left-{uuid.uuid4().hex[:6]}"  # objects are "<release>-vigil"
    fullname = f"{release}-vigil"
    with (
        fresh_namespace(kube, "vigil-left-", release=False) as release_namespace,
        doomed_namespace(kube, "o-left-") as namespace,
    ):
        objects = render(release, release_namespace, namespace)
        operator_rbac = [doc for doc in objects if doc["kind"] in RBAC_KINDS and not is_hook(doc)]
        hook_rbac = [doc for doc in objects if doc["kind"] in RBAC_KINDS and is_hook(doc)]
        [hook_job] = [doc for doc in objects if doc["kind"] == "Job" and is_hook(doc)]
        # watchNamespaces names the namespace: nothing of the operator's is cluster-wide but the
        # metrics' token and access reviews, which no Role can grant (and the role a scraper is
        # bound to, which grants a GET of /metrics alone).
        cluster_wide = [doc for doc in operator_rbac if doc["kind"].startswith("Cluster")]
        names = {doc["metadata"]["name"] for doc in cluster_wide}
        assert names == {f"{fullname}-metrics-auth", f"{fullname}-metrics-reader"}, cluster_wide
        roles = {doc["metadata"]["name"]: doc for doc in cluster_wide if doc["kind"] == "ClusterRole"}
        assert roles[f"{fullname}-metrics-reader"]["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
        reviews = roles[f"{fullname}-metrics-auth"]
        assert reviews["rules"] == [
            {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
            {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
        ], reviews
        kube.kubectl("apply", "-f", "-", input=as_list(operator_rbac + hook_rbac))

        operator = OperatorProcess(
            kube,
            [namespace],
            tmp_path / "operator.log",
            kubeconfig=account_kubeconfig(kube, release_namespace, fullname, tmp_path / "operator.kubeconfig"),
            extra_args=("--leader-elect", "--lease-namespace", release_namespace, "--lease-name", fullname),
        )
        operator.start()
        try:
            for name in ("running-a", "running-b"):
                create(kube, namespace, vigil_job(name, exit_code=None, run_for=None))
            # Pods made with blockOwnerDeletion under OwnerReferencesPermissionEnforcement, with the
            # chart's Roles alone.
            for name in ("running-a", "running-b"):
                wait_phase(kube, namespace, name, "Running")
        finally:
            operator.stop()  # what the uninstall does to the operator
        log = operator.log()
        assert "Forbidden" not in log, log[-3000:]
        assert tracked_pods(kube, namespace) == ["running-a-1", "running-b-1"]

        # Without the finalizers update rule, no one may point a pod at a job with blockOwnerDeletion.
        refused_blocking_owner(kube, namespace, tmp_path)

        # The hook's command, exactly as the chart's Job runs it, with the hook's token.
        [container] = hook_job["spec"]["template"]["spec"]["containers"]
        hook_account = hook_job["spec"]["template"]["spec"]["serviceAccountName"]
        hook_kubeconfig = account_kubeconfig(kube, release_namespace, hook_account, tmp_path / "hook.kubeconfig")
        vigil = Path(sys.executable).with_name("vigil")
        done = subprocess.run(
            [str(vigil), *container["args"]],
            env={"KUBECONFIG": str(hook_kubeconfig), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=deadline(60),
        )
        assert done.returncode == 0, done.stderr
        assert f"released 2 pods ({namespace})" in done.stdout, done.stdout + done.stderr
        assert tracked_pods(kube, namespace) == []

        started = time.monotonic()
        kube.core.delete_namespace(namespace, propagation_policy="Background")
        wait_until(lambda: namespace_gone(kube, namespace), 30, f"namespace {namespace} to be deleted")
        print(f"after the hook's command: namespace gone in {time.monotonic() - started:.1f}s")
        kube.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=false", input=as_list(hook_rbac))


def refused_blocking_owner(kube: Kube, namespace: str, tmp_path: Path) -> None:
    """An account that may create pods but not update vigiljobs/finalizers is refused a pod whose
    owner reference to a job blocks the owner's deletion: the admission plugin is on."""
    account = "creates-pods"
    kube.core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    rbac = client.RbacAuthorizationV1Api(kube.api)
    rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}
    rbac.create_namespaced_role(namespace, {"metadata": {"name": account}, "rules": [rule]})
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": account},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        },
    )
    job = kube.custom.get_namespaced_custom_object("vigil.dev", "v1beta1", namespace, "vigiljobs", "running-a")
    owner = {
        "apiVersion": "vigil.dev/v1beta1", "kind": "VigilJob", "name": "running-a", "uid": job["metadata"]["uid"],
        "controller": True, "blockOwnerDeletion": True,
    }  # fmt: skip
    core = client.CoreV1Api(
        config.new_client_from_config(
            config_file=str(account_kubeconfig(kube, namespace, account, tmp_path / "creator.kubeconfig"))
        )
    )
    pod = {"metadata": {"name": "blocker", "ownerReferences": [owner]}, "spec": simulated_pod_spec()[1]}

    def plugins_refusal() -> str:
        """The plugin's 403; "" while RBAC, which takes a moment to see the new binding, refuses."""
        try:
            core.create_namespaced_pod(namespace, pod)
        except client.ApiException as err:
            assert err.status == 403, err.body
            return err.body if "blockOwnerDeletion" in err.body else ""
        pytest.fail("a pod blocking its job's deletion was created without vigiljobs/finalizers update")

    message = wait_until(plugins_refusal, 10, "the admission plugin's refusal")
    assert "cannot set blockOwnerDeletion" in message, message
