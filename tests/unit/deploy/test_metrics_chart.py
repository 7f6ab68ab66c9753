"""The chart serves /metrics securely by default (issue 25): HTTPS with a certificate Helm makes,
the operator allowed to review tokens, a ClusterRole that grants `get` on /metrics for Prometheus
to bind, and a ServiceMonitor that scrapes over https with its token, verifying the server;
plain HTTP only when asked for (metrics.secure=false)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.charts import helm_template

pytestmark = pytest.mark.unit


def kinds(docs: list[dict], kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == kind}


def operator_args(docs: list[dict]) -> list[str]:
    deployment = kinds(docs, "Deployment")["vigil"]
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def test_by_default_metrics_are_https_behind_token_and_access_reviews():
    docs = helm_template("metrics.serviceMonitor.enabled=true")
    args = operator_args(docs)
    assert "--metrics-cert-file=/etc/vigil/metrics/tls.crt" in args
    assert "--metrics-key-file=/etc/vigil/metrics/tls.key" in args
    assert "--metrics-insecure" not in args
    secret = kinds(docs, "Secret")["vigil-metrics-cert"]
    assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {"ca.crt", "tls.crt", "tls.key"}
    operator_rules = kinds(docs, "ClusterRole")["vigil"]["rules"]
    tokens = {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}
    assert tokens in operator_rules
    assert {
        "apiGroups": ["authorization.k8s.io"],
        "resources": ["subjectaccessreviews"],
        "verbs": ["create"],
    } in operator_rules
    reader = kinds(docs, "ClusterRole")["vigil-metrics-reader"]
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    endpoint = kinds(docs, "ServiceMonitor")["vigil"]["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "https"
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert endpoint["tlsConfig"] == {
        "ca": {"secret": {"name": "vigil-metrics-cert", "key": "ca.crt"}},
        "serverName": "vigil-metrics.vigil-system.svc",
    }
    pod = kinds(docs, "Deployment")["vigil"]["spec"]["template"]["spec"]
    assert {"name": "metrics-cert", "secret": {"secretName": "vigil-metrics-cert"}} in pod["volumes"]


def test_plain_http_only_when_asked_for():
    docs = helm_template("metrics.secure=false", "metrics.serviceMonitor.enabled=true")
    assert "--metrics-insecure" in operator_args(docs)
    assert "vigil-metrics-cert" not in kinds(docs, "Secret")
    assert "vigil-metrics-reader" not in kinds(docs, "ClusterRole")
    assert not [rule for rule in kinds(docs, "ClusterRole")["vigil"]["rules"] if "tokenreviews" in rule["resources"]]
    assert kinds(docs, "ServiceMonitor")["vigil"]["spec"]["endpoints"][0]["scheme"] == "http"
