"""The chart's grants, rendered: the operator may update its jobs' finalizers (the pods'
blockOwnerDeletion needs it under OwnerReferencesPermissionEnforcement); with watchNamespaces
naming namespaces it is granted pods in those alone; the uninstall hook is minimal and runs the
command the docs name; the heartbeat policy holds a token to its own pod's namespace and UID and
caps the two annotations at vigil.api's limits; a grant to patch pods never ships without it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.charts import CHART, KUBE_VERSION, helm_template, run_helm
from vigil import api

pytestmark = pytest.mark.unit

HOOK = "vigil-release-finalizers"


def by_kind(docs: list[dict], *kinds: str) -> list[dict]:
    return [doc for doc in docs if doc["kind"] in kinds]


def grants(rules: list[dict[str, Any]], resource: str) -> set[str]:
    return {verb for rule in rules if resource in rule["resources"] for verb in rule["verbs"]}


def operator_roles(docs: list[dict]) -> list[dict]:
    """The operator's own Roles and ClusterRoles (not the Lease's, not the hook's)."""
    return [doc for doc in by_kind(docs, "Role", "ClusterRole") if doc["metadata"]["name"] == "vigil"]


def test_the_operator_may_update_its_jobs_finalizers_wherever_it_may_create_pods():
    for docs in (helm_template(), helm_template("operator.watchNamespaces={team-a,team-b}")):
        for role in operator_roles(docs):
            assert "create" in grants(role["rules"], "pods")
            assert grants(role["rules"], "vigiljobs/finalizers") == {"update"}, role["metadata"]
            assert grants(role["rules"], "events") == {"create", "patch"}, "a repeat patches its Event's count"


def test_named_watch_namespaces_get_roles_there_and_nothing_cluster_wide():
    docs = helm_template("operator.watchNamespaces={team-a,team-b}")
    # Cluster-wide only what cannot be namespaced: the reviews of secure metrics (TokenReviews and
    # SubjectAccessReviews are cluster-scoped), and the metrics reader's role for Prometheus.
    cluster_wide = by_kind(docs, "ClusterRole", "ClusterRoleBinding")
    assert {doc["metadata"]["name"] for doc in cluster_wide} <= {"vigil-metrics-auth", "vigil-metrics-reader"}
    [auth] = [
        doc for doc in cluster_wide if doc["kind"] == "ClusterRole" and doc["metadata"]["name"] == "vigil-metrics-auth"
    ]
    assert {res for rule in auth["rules"] for res in rule["resources"]} == {"tokenreviews", "subjectaccessreviews"}
    assert all(rule["verbs"] == ["create"] for rule in auth["rules"])
    roles = operator_roles(docs)
    assert sorted(role["metadata"]["namespace"] for role in roles) == ["team-a", "team-b"]
    for role in roles:
        assert {"create", "patch", "delete"} <= grants(role["rules"], "pods")
    bindings = [doc for doc in by_kind(docs, "RoleBinding") if doc["metadata"]["name"] == "vigil"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "vigil", "namespace": "vigil-system"}]
    # The leader still labels its own pod, in the release namespace only.
    [lease] = [doc for doc in by_kind(docs, "Role") if doc["metadata"]["name"] == "vigil-leader-election"]
    assert lease["metadata"]["namespace"] == "vigil-system"
    assert grants(lease["rules"], "pods") == {"list", "patch"}


@pytest.mark.parametrize("namespaces", [None, "{team-*}", "{batch,team-*}"])
def test_all_namespaces_or_a_glob_keep_the_grants_cluster_wide(namespaces: str | None):
    docs = helm_template(*([f"operator.watchNamespaces={namespaces}"] if namespaces else []))
    [role] = [doc for doc in by_kind(docs, "ClusterRole") if doc["metadata"]["name"] == "vigil"]
    assert {"create", "patch", "delete"} <= grants(role["rules"], "pods")
    assert not [doc for doc in by_kind(docs, "Role") if doc["metadata"]["name"] == "vigil"]


def hook_objects(docs: list[dict]) -> list[dict]:
    return [doc for doc in docs if (doc["metadata"].get("annotations") or {}).get("helm.sh/hook") == "pre-delete"]


@pytest.mark.parametrize(
    ("sets", "scopes"),
    [((), [None]), (("operator.watchNamespaces={team-a,team-b}",), ["team-a", "team-b"])],
    ids=["all namespaces", "named namespaces"],
)
def test_the_uninstall_hook_stops_the_operator_and_releases_the_finalizers_with_rbac_of_its_own(sets, scopes):
    hook = hook_objects(helm_template(*sets))
    [job] = by_kind(hook, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == HOOK and pod["restartPolicy"] == "Never"
    [container] = pod["containers"]
    expected = ["release-finalizers", "--log-format=json", "--stop-deployment=vigil-system/vigil", "--stop-timeout=120"]
    assert container["args"] == expected + [f"--namespace={ns}" for ns in scopes if ns]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # Its account, roles and bindings are hooks too, created before the Job (a lower weight).
    [account] = by_kind(hook, "ServiceAccount")
    assert account["metadata"]["name"] == HOOK
    for doc in by_kind(hook, "ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"):
        assert int(doc["metadata"]["annotations"]["helm.sh/hook-weight"]) < 0, doc["metadata"]["name"]
    # Minimal: pods listed and patched where the operator worked; its Deployment read and scaled.
    pod_roles = [doc for doc in by_kind(hook, "Role", "ClusterRole") if doc["metadata"]["name"] == HOOK]
    assert sorted(doc["metadata"].get("namespace") for doc in pod_roles) == scopes
    for role in pod_roles:
        assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch"]}]
    [operator] = [doc for doc in by_kind(hook, "Role") if doc["metadata"]["name"] == f"{HOOK}-operator"]
    assert operator["metadata"]["namespace"] == "vigil-system"
    assert grants(operator["rules"], "deployments") == {"get"}
    assert grants(operator["rules"], "deployments/scale") == {"patch"}
    assert all(rule.get("resourceNames") == ["vigil"] for rule in operator["rules"] if "pods" not in rule["resources"])
    assert grants(operator["rules"], "pods") == {"list"}


def test_the_uninstall_hook_can_be_turned_off():
    assert not hook_objects(helm_template("uninstall.releaseFinalizers=false"))


def policy(docs: list[dict], name: str) -> dict:
    [found] = [doc for doc in by_kind(docs, "ValidatingAdmissionPolicy") if doc["metadata"]["name"] == name]
    return found


def test_the_heartbeat_policy_holds_a_token_to_its_own_pods_namespace_and_uid():
    spec = policy(helm_template(), "vigil-heartbeat")["spec"]
    expressions = " ".join(v["expression"] for v in spec["validations"] + spec["variables"])
    assert "authentication.kubernetes.io/pod-uid" in expressions
    assert "oldObject.metadata.uid == variables.podUID" in expressions
    assert "request.namespace == variables.accountNamespace" in expressions


def test_the_annotation_limits_are_vigils_and_apply_to_every_writer():
    spec = policy(helm_template(), "vigil-annotation-limits")["spec"]
    assert [c["name"] for c in spec["matchConditions"]] == ["carries-vigil-annotations"], "no account condition"
    limits = {
        v["message"].split(" is over ")[0].removeprefix("refused: "): v["expression"] for v in spec["validations"]
    }
    assert limits.keys() == {api.ANNOTATION_HEARTBEAT, api.ANNOTATION_CHECKPOINT}
    assert limits[api.ANNOTATION_HEARTBEAT].endswith(f"<= {api.MAX_HEARTBEAT_CHARS}")
    assert limits[api.ANNOTATION_CHECKPOINT].endswith(f"<= {api.MAX_CHECKPOINT_BYTES}")


def test_a_grant_to_patch_pods_never_ships_without_the_policy_that_narrows_it():
    result = run_helm(
        "template", "vigil", str(CHART), "--kube-version", KUBE_VERSION,
        "--set", "heartbeat.namespaces={team-a}", "--set", "heartbeat.policy.create=false",
    )  # fmt: skip
    assert result.returncode != 0
    assert "heartbeat.namespaces grants the job accounts patch" in result.stderr
    assert "keep heartbeat.policy.create=true" in result.stderr


def test_the_operator_keeps_worker_pools_with_the_least_it_needs():
    # VigilWorkerPools read and watched, their status patched, their finalizers updated (the
    # worker pods' blockOwnerDeletion), wherever the operator works; no write to the spec, which
    # is the user's (and /scale's).
    for docs in (helm_template(), helm_template("operator.watchNamespaces={team-a,team-b}")):
        for role in operator_roles(docs):
            assert grants(role["rules"], "vigilworkerpools") == {"get", "list", "watch"}, role["metadata"]
            assert grants(role["rules"], "vigilworkerpools/status") == {"patch"}
            assert grants(role["rules"], "vigilworkerpools/finalizers") == {"update"}
            assert {"create", "delete", "list", "watch"} <= grants(role["rules"], "pods")
            assert not [rule for rule in role["rules"] if "*" in rule["resources"] or "*" in rule["verbs"]]
