"""tls.managedByOperator, rendered (install.yaml's mode, release/dist.sh): the chart renders no key,
no cert Secret and no caBundle, and tells the operator to make its certificates into
`<fullname>-certs`; its grants are that Secret by name (and `create`, which RBAC cannot limit by
name) and the webhook configuration by name, nothing wider. Off (the default), Helm makes the
certificates as before and the operator is granted none of it."""

from __future__ import annotations

import base64

import pytest

from tests.support.charts import CHART, KUBE_VERSION, helm_template, run_helm

pytestmark = pytest.mark.unit

MANAGED = "tls.managedByOperator=true"


def by_kind(docs: list[dict], *kinds: str) -> list[dict]:
    return [doc for doc in docs if doc["kind"] in kinds]


def named(docs: list[dict], kind: str, name: str) -> list[dict]:
    return [doc for doc in docs if doc["kind"] == kind and doc["metadata"]["name"] == name]


def operator_args(docs: list[dict]) -> list[str]:
    [deployment] = by_kind(docs, "Deployment")
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def all_rules(docs: list[dict]) -> list[dict]:
    return [rule for doc in by_kind(docs, "Role", "ClusterRole") for rule in doc.get("rules") or []]


@pytest.mark.parametrize(
    "extra", [(), ("operator.watchNamespaces={team-a}",), ("metrics.serviceMonitor.enabled=true",)]
)
def test_managed_renders_no_key_no_cert_secret_and_no_caBundle(extra: tuple[str, ...]):
    docs = helm_template(MANAGED, *extra)
    assert by_kind(docs, "Secret") == [], "a Secret rendered: its keys would be the same for every user"
    for doc in docs:
        text = repr(doc)
        assert "-----BEGIN" not in text and "LS0tLS1CRUdJT" not in text, doc["metadata"]["name"]
    [webhooks] = by_kind(docs, "ValidatingWebhookConfiguration")
    assert all("caBundle" not in w["clientConfig"] for w in webhooks["webhooks"])
    [deployment] = by_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert [v["name"] for v in pod["volumes"]] == ["tmp"], "only the writable /tmp the certificates go to"
    for monitor in by_kind(docs, "ServiceMonitor"):
        assert monitor["spec"]["endpoints"][0]["tlsConfig"]["ca"] == {
            "secret": {"name": "vigil-certs", "key": "ca.crt"}
        }


def test_managed_tells_the_operator_its_secret_services_and_webhook_and_no_files():
    args = operator_args(helm_template(MANAGED))
    assert {
        "--self-managed-certs-secret=vigil-certs",
        "--cert-dir=/tmp/vigil-certs",
        "--webhook-service=vigil-webhook",
        "--webhook-configuration=vigil",
        "--metrics-service=vigil-metrics",
    } <= set(args), args
    assert not [a for a in args if a.startswith(("--webhook-cert", "--webhook-key", "--beat-cert", "--beat-key",
                                                "--heartbeat-ca", "--metrics-cert", "--metrics-key"))]  # fmt: skip
    assert "--metrics-insecure" not in args
    assert "--heartbeat-url=https://vigil-webhook.vigil-system.svc:8443/v1/heartbeat" in args


def test_managed_without_webhook_or_secure_metrics_names_only_what_is_served():
    args = operator_args(helm_template(MANAGED, "webhook.enabled=false"))
    assert "--metrics-service=vigil-metrics" in args
    assert not [a for a in args if a.startswith(("--webhook-service", "--webhook-configuration"))]
    args = operator_args(helm_template(MANAGED, "metrics.secure=false"))
    assert "--metrics-insecure" in args and not [a for a in args if a.startswith("--metrics-service")]


@pytest.mark.parametrize("extra", [(), ("operator.watchNamespaces={team-a,team-b}",)])
def test_managed_grants_the_one_secret_and_the_one_webhook_configuration(extra: tuple[str, ...]):
    docs = helm_template(MANAGED, *extra)
    [role] = named(docs, "Role", "vigil-certs")
    assert role["metadata"]["namespace"] == "vigil-system"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["vigil-certs"], "verbs": ["get", "update"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    ]
    [cluster_role] = named(docs, "ClusterRole", "vigil-certs")
    assert cluster_role["rules"] == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingwebhookconfigurations"],
            "resourceNames": ["vigil"],
            "verbs": ["get", "update"],
        }
    ]
    subject = [{"kind": "ServiceAccount", "name": "vigil", "namespace": "vigil-system"}]
    [binding] = named(docs, "RoleBinding", "vigil-certs")
    [cluster_binding] = named(docs, "ClusterRoleBinding", "vigil-certs")
    assert binding["metadata"]["namespace"] == "vigil-system"
    assert (binding["roleRef"]["kind"], binding["roleRef"]["name"], binding["subjects"]) == (
        "Role",
        "vigil-certs",
        subject,
    )
    assert (cluster_binding["roleRef"]["name"], cluster_binding["subjects"]) == ("vigil-certs", subject)
    # Nowhere else may the operator read Secrets or touch webhook configurations, nor any verb be a wildcard.
    for rule in all_rules(docs):
        assert "*" not in rule.get("verbs", []) and "*" not in rule.get("resources", []), rule
        if "secrets" in rule.get("resources", []) and set(rule["verbs"]) & {"get", "list", "watch", "update"}:
            assert rule.get("resourceNames") == ["vigil-certs"], rule
        if "validatingwebhookconfigurations" in rule.get("resources", []):
            assert rule.get("resourceNames") == ["vigil"], rule


def test_managed_without_webhook_grants_no_webhook_configuration():
    docs = helm_template(MANAGED, "webhook.enabled=false")
    assert named(docs, "Role", "vigil-certs") and not named(docs, "ClusterRole", "vigil-certs")


def test_off_helm_makes_the_certificates_and_the_operator_is_granted_none():
    docs = helm_template()
    secrets = {doc["metadata"]["name"]: doc for doc in by_kind(docs, "Secret")}
    assert set(secrets) == {"vigil-webhook-cert", "vigil-metrics-cert"}
    assert base64.b64decode(secrets["vigil-webhook-cert"]["data"]["tls.key"]).startswith(b"-----BEGIN")
    [webhooks] = by_kind(docs, "ValidatingWebhookConfiguration")
    assert webhooks["webhooks"][0]["clientConfig"]["caBundle"] == secrets["vigil-webhook-cert"]["data"]["ca.crt"]
    args = operator_args(docs)
    assert "--webhook-cert-file=/etc/vigil/webhook/tls.crt" in args
    assert not [a for a in args if a.startswith(("--self-managed", "--cert-dir", "--webhook-service"))]
    assert not [d for d in docs if d["metadata"]["name"] == "vigil-certs"]
    assert not [
        r for r in all_rules(docs) if {"secrets", "validatingwebhookconfigurations"} & set(r.get("resources", []))
    ]


def test_managed_and_cert_manager_together_are_refused():
    result = run_helm(
        "template", "vigil", str(CHART), "-n", "vigil-system", "--kube-version", KUBE_VERSION,
        "--set", MANAGED, "--set", "webhook.certManager.enabled=true",
    )  # fmt: skip
    assert result.returncode != 0 and "tls.managedByOperator and webhook.certManager.enabled" in result.stderr
