"""The chart's NetworkPolicy (templates/networkpolicy.yaml), rendered with helm: ingress to the
operator's pods only on the ports that must be reached, from the sources the values name, and on
by default."""

from __future__ import annotations

import pytest

from tests.support.charts import CHART, KUBE_VERSION, helm_template, run_helm

pytestmark = pytest.mark.unit

PROMETHEUS = [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]


def policy_and_deployment(*sets: str) -> tuple[dict | None, dict]:
    docs = helm_template(*sets)
    policies = [doc for doc in docs if doc["kind"] == "NetworkPolicy"]
    [deployment] = [doc for doc in docs if doc["kind"] == "Deployment"]
    assert len(policies) <= 1
    return (policies[0] if policies else None), deployment


def rules(policy: dict) -> dict[int, list]:
    """port -> the rule's sources ([]: every source)."""
    found = {}
    for rule in policy["spec"]["ingress"]:
        [port] = rule["ports"]
        assert port["protocol"] == "TCP"
        found[port["port"]] = rule["from"]
    return found


def test_by_default_the_webhook_is_open_the_metrics_are_prometheus_only_and_nothing_else_is_reachable():
    policy, deployment = policy_and_deployment()
    assert policy is not None, "the NetworkPolicy is on by default"
    assert policy["metadata"] == {**policy["metadata"], "name": "vigil", "namespace": "vigil-system"}
    assert policy["spec"]["podSelector"] == deployment["spec"]["selector"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress: the API server, wherever it is
    assert rules(policy) == {9443: [], 8081: PROMETHEUS}
    # Every port the container declares is in a rule, but the health port: the kubelet probes it
    # from the node, which NetworkPolicy always admits.
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    declared = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert set(rules(policy)) == set(declared.values()) - {declared["health"]}


def test_the_rules_follow_the_ports_and_the_sources_given():
    policy, _ = policy_and_deployment(
        "webhook.port=10443",
        "metrics.port=9090",
        "operator.healthPort=9091",
        "networkPolicy.webhook.from[0].ipBlock.cidr=10.0.0.0/24",
        "networkPolicy.metrics.from[0].namespaceSelector.matchLabels.team=monitoring",
        "networkPolicy.health.extraFrom[0].podSelector.matchLabels.role=checker",
    )
    assert policy is not None
    assert rules(policy) == {
        10443: [{"ipBlock": {"cidr": "10.0.0.0/24"}}],
        9090: [{"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}],
        9091: [{"podSelector": {"matchLabels": {"role": "checker"}}}],
    }


def test_a_port_not_served_gets_no_rule_and_with_none_served_nothing_is_admitted():
    policy, _ = policy_and_deployment("webhook.enabled=false")
    assert policy is not None and rules(policy) == {8081: PROMETHEUS}
    policy, _ = policy_and_deployment("webhook.enabled=false", "metrics.enabled=false")
    assert policy is not None and policy["spec"]["ingress"] == []  # isolated: only the node gets in


def test_it_can_be_turned_off():
    policy, _ = policy_and_deployment("networkPolicy.enabled=false")
    assert policy is None


def test_an_empty_source_is_refused_at_install():
    # The API server refuses a peer that selects nothing; the schema says so before anything is installed.
    result = run_helm(
        "template", "vigil", str(CHART), "--kube-version", KUBE_VERSION, "--set-json", "networkPolicy.webhook.from=[{}]"
    )
    assert result.returncode != 0 and "/networkPolicy/webhook/from/0" in result.stderr, result.stderr
