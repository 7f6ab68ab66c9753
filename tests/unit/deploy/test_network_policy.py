"""The chart's NetworkPolicy (templates/networkpolicy.yaml), rendered with helm: ingress to the
operator's pods only on the ports that must be reached, from the sources the values name, and on
by default."""

from __future__ import annotations

import pytest

from tests.support.charts import CHART, KUBE_VERSION, helm_template, run_helm

pytestmark = pytest.mark.unit

PROMETHEUS_PODS = {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}


def prometheus_in(namespace: str) -> list[dict]:
    """Prometheus pods of that namespace alone: kubernetes.io/metadata.name is set by the API server
    to the namespace's name, so no tenant can put it on a namespace of its own."""
    pinned = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    return [{"namespaceSelector": pinned, "podSelector": PROMETHEUS_PODS}]


PROMETHEUS = prometheus_in("monitoring")
EVERY_POD = [{"namespaceSelector": {}}]  # every pod of the cluster, and nothing from outside its pods


def pods_of(*namespaces: str) -> list[dict]:
    selector = {"key": "kubernetes.io/metadata.name", "operator": "In", "values": list(namespaces)}
    return [{"namespaceSelector": {"matchExpressions": [selector]}}]


def policy_and_deployment(*sets: str, jsons: tuple[str, ...] = ()) -> tuple[dict | None, dict]:
    docs = helm_template(*sets, jsons=jsons)
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


def test_by_default_the_webhook_is_open_beats_come_from_pods_metrics_from_prometheus_and_nothing_else():
    policy, deployment = policy_and_deployment()
    assert policy is not None, "the NetworkPolicy is on by default"
    assert policy["metadata"] == {**policy["metadata"], "name": "vigil", "namespace": "vigil-system"}
    assert policy["spec"]["podSelector"] == deployment["spec"]["selector"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress: the API server, wherever it is
    # The webhook from anywhere (the API server's address differs per distribution), the beats from
    # the cluster's pods (every namespace may run jobs when all are watched), the metrics from
    # the Prometheus of the monitoring namespace.
    assert rules(policy) == {9443: [], 9444: EVERY_POD, 8081: PROMETHEUS}
    # Every port the container declares is in a rule, but the health port: the kubelet probes it
    # from the node, which NetworkPolicy always admits.
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    declared = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert set(rules(policy)) == set(declared.values()) - {declared["health"]}
    assert declared["beats"] == 9444


def test_the_beat_port_admits_the_pods_of_the_watched_namespaces_when_they_are_named():
    policy, _ = policy_and_deployment("operator.watchNamespaces={team-a,team-b}")
    assert policy is not None and rules(policy)[9444] == pods_of("team-a", "team-b")
    # A glob cannot be a selector: with one, the jobs may be in any namespace, so every pod.
    for watched in ("{team-*}", "{batch,team-?}", "{batch,team-[ab]}"):
        policy, _ = policy_and_deployment(f"operator.watchNamespaces={watched}")
        assert policy is not None and rules(policy)[9444] == EVERY_POD, watched
    # The webhook and metrics rules do not follow the watched namespaces.
    policy, _ = policy_and_deployment("operator.watchNamespaces={team-a}")
    assert policy is not None and rules(policy)[9443] == [] and rules(policy)[8081] == PROMETHEUS


def test_the_beat_sources_can_be_given():
    nodes = {"ipBlock": {"cidr": "10.0.0.0/16"}}  # job pods on the host network beat from their node
    for watched in ("{team-a}", "{team-*}"):
        policy, _ = policy_and_deployment(
            f"operator.watchNamespaces={watched}", "networkPolicy.beats.from[0].ipBlock.cidr=10.0.0.0/16"
        )
        assert policy is not None and rules(policy)[9444] == [nodes], watched
    policy, _ = policy_and_deployment(jsons=("networkPolicy.beats.from=[]",))
    assert policy is not None and rules(policy)[9444] == []  # every source, when asked for


def test_the_metrics_default_is_pinned_to_the_monitoring_namespace_which_can_be_named():
    policy, _ = policy_and_deployment("networkPolicy.metrics.prometheusNamespace=openshift-monitoring")
    assert policy is not None and rules(policy)[8081] == prometheus_in("openshift-monitoring")
    # The label alone is not a source: a tenant can put it on a pod of its own.
    for peer in rules(policy)[8081]:
        assert peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
    policy, _ = policy_and_deployment(jsons=("networkPolicy.metrics.from=[]",))
    assert policy is not None and rules(policy)[8081] == []  # every source, when asked for


def test_the_rules_follow_the_ports_and_the_sources_given():
    policy, _ = policy_and_deployment(
        "webhook.port=10443",
        "heartbeat.port=10444",
        "metrics.port=9090",
        "operator.healthPort=9091",
        "networkPolicy.webhook.from[0].ipBlock.cidr=10.0.0.0/24",
        "networkPolicy.beats.from[0].namespaceSelector.matchLabels.team=jobs",
        "networkPolicy.metrics.from[0].namespaceSelector.matchLabels.team=monitoring",
        "networkPolicy.health.extraFrom[0].podSelector.matchLabels.role=checker",
    )
    assert policy is not None
    assert rules(policy) == {
        10443: [{"ipBlock": {"cidr": "10.0.0.0/24"}}],
        10444: [{"namespaceSelector": {"matchLabels": {"team": "jobs"}}}],
        9090: [{"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}],
        9091: [{"podSelector": {"matchLabels": {"role": "checker"}}}],
    }


def test_a_port_not_served_gets_no_rule_and_with_none_served_nothing_is_admitted():
    policy, _ = policy_and_deployment("heartbeat.leaderChannel=false")
    assert policy is not None and rules(policy) == {9443: [], 8081: PROMETHEUS}
    policy, _ = policy_and_deployment("webhook.enabled=false")  # the beats need the webhook's Service
    assert policy is not None and rules(policy) == {8081: PROMETHEUS}
    policy, _ = policy_and_deployment("webhook.enabled=false", "metrics.enabled=false")
    assert policy is not None and policy["spec"]["ingress"] == []  # isolated: only the node gets in


def test_it_can_be_turned_off():
    policy, _ = policy_and_deployment("networkPolicy.enabled=false")
    assert policy is None


@pytest.mark.parametrize("rule", ["webhook", "beats", "metrics"])
def test_an_empty_source_is_refused_at_install(rule: str):
    # The API server refuses a peer that selects nothing; the schema says so before anything is installed.
    result = run_helm(
        "template", "vigil", str(CHART), "--kube-version", KUBE_VERSION,
        "--set-json", f"networkPolicy.{rule}.from=[{{}}]",
    )  # fmt: skip
    assert result.returncode != 0 and f"/networkPolicy/{rule}/from/0" in result.stderr, result.stderr


def test_a_misspelt_key_is_refused_at_install():
    result = run_helm(
        "template", "vigil", str(CHART), "--kube-version", KUBE_VERSION, "--set", "networkPolicy.beat.enabled=true"
    )
    assert result.returncode != 0 and "additional properties 'beat' not allowed" in result.stderr, result.stderr
    result = run_helm(
        "template", "vigil", str(CHART), "--kube-version", KUBE_VERSION,
        "--set", "networkPolicy.metrics.prometheusNamespaces=mon",
    )  # fmt: skip
    assert result.returncode != 0 and "prometheusNamespaces" in result.stderr, result.stderr
