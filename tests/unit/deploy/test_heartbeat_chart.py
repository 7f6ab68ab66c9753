"""The chart turns on beats to the leader: a server of their own on a port of their own, behind
the webhook's Service (which selects the leader's pod alone) on a port of its own; the URL the
pods are told names that port, the certificate they are told to trust is the one the beat server
serves, and the name in the URL is one it covers."""

from __future__ import annotations

import base64
from urllib.parse import urlsplit

import pytest
from cryptography import x509

from tests.support.charts import CHART, KUBE_VERSION, helm_template, run_helm

pytestmark = pytest.mark.unit

CA = "--heartbeat-ca-file=/etc/vigil/webhook/ca.crt"
# Every flag that turns on or shapes the beat server and the pods' channel to it.
BEAT_FLAGS = (
    "--beat-address", "--beat-cert-file", "--beat-key-file", "--beat-connections", "--heartbeat-url",
    "--heartbeat-ca-file", "--heartbeat-audience",
)  # fmt: skip


def rendered(*sets: str) -> tuple[list[str], list[dict]]:
    docs = helm_template(*sets)
    (deployment,) = [doc for doc in docs if doc["kind"] == "Deployment"]
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"], docs


def flag(args: list[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(f"{name}=")]
    return value


def webhook_service(docs: list[dict]) -> dict:
    (service,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "vigil-webhook"]
    return service


def container(docs: list[dict]) -> dict:
    (deployment,) = [doc for doc in docs if doc["kind"] == "Deployment"]
    return deployment["spec"]["template"]["spec"]["containers"][0]


def test_by_default_the_pods_beat_to_a_port_of_its_own_behind_the_leaders_service() -> None:
    args, docs = rendered()
    url = urlsplit(flag(args, "--heartbeat-url"))
    assert (url.scheme, url.hostname, url.path) == ("https", "vigil-webhook.vigil-system.svc", "/v1/heartbeat")
    service = webhook_service(docs)
    assert service["spec"]["selector"]["vigil.dev/leader"] == "vigil"  # the leader alone answers 200
    ports = {p["port"]: p for p in service["spec"]["ports"]}
    # The URL's port is the Service's beat port, which leads to the beat server's, not the webhook's.
    assert url.port == 8443 and ports[8443]["name"] == "beats" and ports[8443]["targetPort"] == 9444
    assert flag(args, "--beat-address") == "0.0.0.0:9444"
    assert {"name": "beats", "containerPort": 9444} in container(docs)["ports"]
    # The API server's reviews still go to 443, the webhook's server.
    assert ports[443]["targetPort"] == 9443 and flag(args, "--webhook-address") == "0.0.0.0:9443"
    hook = next(d for d in docs if d["kind"] == "ValidatingWebhookConfiguration")["webhooks"][0]
    assert hook["clientConfig"]["service"]["port"] == 443
    assert set(ports) == {443, 8443}
    # The beat server serves the webhook's certificate, from the Secret the pod mounts.
    assert flag(args, "--beat-cert-file") == "/etc/vigil/webhook/tls.crt"
    assert flag(args, "--beat-key-file") == "/etc/vigil/webhook/tls.key"
    assert CA in args
    mounts = {m["mountPath"]: m["name"] for m in container(docs)["volumeMounts"]}
    (deployment,) = [doc for doc in docs if doc["kind"] == "Deployment"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mounts["/etc/vigil/webhook"]]["secret"]["secretName"] == "vigil-webhook-cert"
    (secret,) = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "vigil-webhook-cert"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    serving = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    assert serving.issuer == ca.subject  # what the pods are told to trust signed what is served
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert url.hostname in names.get_values_for_type(x509.DNSName)


def test_with_cert_manager_the_certificate_covers_the_urls_name() -> None:
    args, docs = rendered("webhook.certManager.enabled=true")
    (certificate,) = [d for d in docs if d["kind"] == "Certificate" and d["metadata"]["name"] == "vigil-webhook"]
    assert certificate["spec"]["secretName"] == "vigil-webhook-cert"
    assert urlsplit(flag(args, "--heartbeat-url")).hostname in certificate["spec"]["dnsNames"]


def test_the_beat_port_and_the_per_source_bound_follow_the_values() -> None:
    args, docs = rendered()
    assert flag(args, "--beat-connections-per-source") == "128"
    args, docs = rendered("heartbeat.port=7000", "heartbeat.maxConnectionsPerSource=300")
    assert flag(args, "--beat-address") == "0.0.0.0:7000"
    assert flag(args, "--beat-connections-per-source") == "300"
    assert {"name": "beats", "containerPort": 7000} in container(docs)["ports"]
    beats = next(p for p in webhook_service(docs)["spec"]["ports"] if p["name"] == "beats")
    assert beats["targetPort"] == 7000
    assert urlsplit(flag(args, "--heartbeat-url")).port == beats["port"]


def test_without_the_webhook_or_when_turned_off_every_beat_patches_its_pod() -> None:
    for sets in (("heartbeat.leaderChannel=false",), ("webhook.enabled=false",)):
        args, docs = rendered(*sets, "heartbeat.maxConnections=12000")
        assert not [a for a in args if a.startswith(BEAT_FLAGS)], sets  # no beat server, no URL for the pods
        assert "beats" not in {p["name"] for p in container(docs)["ports"]}, sets
        services = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "vigil-webhook"]
        assert all([p["name"] for p in s["spec"]["ports"]] == ["https"] for s in services), sets


@pytest.mark.parametrize("taken", ["operator.healthPort", "metrics.port", "webhook.port"])
def test_the_beat_port_cannot_be_another_servers(taken: str) -> None:
    result = run_helm(
        "template", "vigil", str(CHART), "--kube-version", KUBE_VERSION, "--set", f"{taken}=9444",
    )  # fmt: skip
    assert result.returncode != 0
    assert f"heartbeat.port (9444) is already taken by {taken}" in result.stderr, result.stderr
    # Without beats to the leader there is no beat server, so the port is free.
    assert run_helm(
        "template", "vigil", str(CHART), "--kube-version", KUBE_VERSION, "--set", f"{taken}=9444",
        "--set", "heartbeat.leaderChannel=false",
    ).returncode == 0  # fmt: skip


def test_the_stamp_budget_reaches_the_operator() -> None:
    args, _ = rendered()
    assert "--heartbeat-stamp-writes-per-second=10" in args
    args, _ = rendered("heartbeat.stampWritesPerSecond=4")
    assert "--heartbeat-stamp-writes-per-second=4" in args


def test_the_connection_limit_follows_the_memory_limit_unless_set() -> None:
    args, _ = rendered()
    assert not [a for a in args if a.startswith("--beat-connections=")]  # the operator derives it
    args, _ = rendered("heartbeat.maxConnections=12000")
    assert "--beat-connections=12000" in args


def test_by_default_the_injected_agent_is_the_operators_own_image() -> None:
    args, docs = rendered()
    (deployment,) = [doc for doc in docs if doc["kind"] == "Deployment"]
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert f"--agent-image={image}" in args  # one image to build, push and trust
    args, _ = rendered("image.repository=registry.example/vigil", "image.tag=1.2.3")
    assert "--agent-image=registry.example/vigil:1.2.3" in args
    args, _ = rendered("heartbeat.agentImage=registry.example/agent:7")
    assert "--agent-image=registry.example/agent:7" in args


def test_without_injection_jobs_bring_their_own_agent() -> None:
    args, _ = rendered("heartbeat.injectAgent=false")
    assert not [a for a in args if a.startswith("--agent-image")]
