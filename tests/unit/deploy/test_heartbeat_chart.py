"""The chart turns on beats to the leader: the URL is the webhook Service's, the certificate the
pods are told to trust is the one the webhook serves, and the name in the URL is one it covers."""

from __future__ import annotations

import base64

from cryptography import x509

from tests.support.charts import helm_template

URL = "--heartbeat-url=https://vigil-webhook.vigil-system.svc/v1/heartbeat"
CA = "--heartbeat-ca-file=/etc/vigil/webhook/ca.crt"


def rendered(*sets: str) -> tuple[list[str], list[dict]]:
    docs = helm_template(*sets)
    (deployment,) = [doc for doc in docs if doc["kind"] == "Deployment"]
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"], docs


def test_by_default_the_pods_beat_to_the_webhook_service_with_its_ca() -> None:
    args, docs = rendered()
    assert URL in args and CA in args
    (service,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "vigil-webhook"]
    assert service["spec"]["selector"]["vigil.dev/leader"] == "vigil"  # the leader alone answers 200
    assert [p["port"] for p in service["spec"]["ports"]] == [443]  # the URL names no port
    (secret,) = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "vigil-webhook-cert"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    serving = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    assert serving.issuer == ca.subject  # what the pods are told to trust signed what is served
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "vigil-webhook.vigil-system.svc" in names.get_values_for_type(x509.DNSName)


def test_without_the_webhook_or_when_turned_off_every_beat_patches_its_pod() -> None:
    for sets in (("heartbeat.leaderChannel=false",), ("webhook.enabled=false",)):
        args, _ = rendered(*sets)
        leader_flags = ("--heartbeat-url", "--heartbeat-ca-file", "--heartbeat-audience")
        assert not [a for a in args if a.startswith(leader_flags)], sets


def test_the_stamp_budget_reaches_the_operator() -> None:
    args, _ = rendered()
    assert "--heartbeat-stamp-writes-per-second=10" in args
    args, _ = rendered("heartbeat.stampWritesPerSecond=4")
    assert "--heartbeat-stamp-writes-per-second=4" in args


def test_the_connection_limit_follows_the_memory_limit_unless_set() -> None:
    args, _ = rendered()
    assert not [a for a in args if a.startswith("--beat-connections")]  # the operator derives it
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
