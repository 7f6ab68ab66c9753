"""`vigil operator` refuses bad flags before it touches a cluster: exit code 2, and a message that
says what to fix."""

from __future__ import annotations

import pytest

from vigil import cli
from vigil.core.queueing.book import QueueSpec

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("pace", ["-0.1", "1.5"])
def test_a_pod_watch_pace_out_of_range_is_refused_with_its_bounds(pace: str, capsys: pytest.CaptureFixture[str]):
    assert cli.main(["operator", "--pod-watch-pace", pace]) == 2
    assert f"--pod-watch-pace must be between 0 and 1 seconds, not {float(pace):g}" in capsys.readouterr().err


@pytest.mark.parametrize("rate", ["0", "-2"])
def test_a_stamp_budget_that_is_not_positive_is_refused(rate: str, capsys: pytest.CaptureFixture[str]):
    assert cli.main(["operator", "--heartbeat-stamp-writes-per-second", rate]) == 2
    assert (
        f"--heartbeat-stamp-writes-per-second must be a positive rate, not {float(rate):g}" in capsys.readouterr().err
    )


@pytest.mark.parametrize("count", ["0", "-5"])
def test_a_connection_limit_below_one_is_refused(count: str, capsys: pytest.CaptureFixture[str]):
    assert cli.main(["operator", "--beat-connections", count]) == 2
    assert f"--beat-connections must be at least 1, not {count}" in capsys.readouterr().err


def test_a_webhook_address_without_its_certificate_is_refused(capsys: pytest.CaptureFixture[str]):
    assert cli.main(["operator", "--webhook-address", "0.0.0.0:9443"]) == 2
    assert "--webhook-address needs --webhook-cert-file and --webhook-key-file" in capsys.readouterr().err


def test_release_finalizers_refuses_a_deployment_not_given_as_namespace_slash_name(capsys: pytest.CaptureFixture[str]):
    assert cli.main(["release-finalizers", "--stop-deployment", "vigil"]) == 2
    assert "--stop-deployment takes NAMESPACE/NAME, not 'vigil'" in capsys.readouterr().err


def test_a_metrics_address_without_a_certificate_is_refused_unless_insecure_is_asked_for(
    capsys: pytest.CaptureFixture[str],
):
    assert cli.main(["operator", "--metrics-address", "0.0.0.0:8081"]) == 2
    err = capsys.readouterr().err
    assert "--metrics-address needs --metrics-cert-file and --metrics-key-file" in err and "--metrics-insecure" in err


@pytest.mark.parametrize(
    ("flags", "refusal"),
    [
        (["--default-queue-max-running", "0"], "--default-queue-max-running must be between 1 and 1000000, not 0"),
        (
            ["--default-queue-max-running", "5", "--default-queue-retry-budget", "1.5"],
            "--default-queue-retry-budget must be between 0 and 1 (1: no budget), not 1.5",
        ),
        (["--default-queue-retry-budget", "0.5"], "--default-queue-retry-budget needs --default-queue-max-running"),
    ],
)
def test_a_default_queue_policy_out_of_range_is_refused_with_what_to_fix(
    flags: list[str], refusal: str, capsys: pytest.CaptureFixture[str]
):
    assert cli.main(["operator", *flags]) == 2
    assert refusal in capsys.readouterr().err


def test_the_default_queue_policy_takes_a_vigilqueues_default_budget():
    assert cli.default_queue_policy(100, None) == QueueSpec(max_running=100, retry_budget=0.2)


# The args the chart passes with tls.managedByOperator (templates/deployment.yaml).
SELF_MANAGED = [
    "operator", "--webhook-address=0.0.0.0:9443", "--beat-address=0.0.0.0:9444",
    "--heartbeat-url=https://vigil-webhook.vigil-system.svc:8443/v1/heartbeat", "--metrics-address=0.0.0.0:8081",
    "--self-managed-certs-secret=vigil-certs", "--cert-dir=/tmp/vigil-certs", "--webhook-service=vigil-webhook",
    "--webhook-configuration=vigil", "--metrics-service=vigil-metrics",
]  # fmt: skip


def test_self_managed_certificates_point_every_server_at_the_files_the_operator_writes(
    monkeypatch: pytest.MonkeyPatch,
):
    from vigil import manager
    from vigil.kube import config

    ran: list[manager.OperatorSettings] = []
    monkeypatch.setenv("POD_NAMESPACE", "vigil-system")
    monkeypatch.setattr(config, "load", lambda: object())
    monkeypatch.setattr(manager, "run_operator", lambda settings, credentials: ran.append(settings) or 0)
    assert cli.main(SELF_MANAGED) == 0
    [settings] = ran
    managed = settings.certificates
    assert managed is not None
    assert (managed.secret, managed.namespace, managed.webhook_configuration) == (
        "vigil-certs",
        "vigil-system",
        "vigil",
    )
    assert {leaf.name: leaf.dns_names[2] for leaf in managed.leaves} == {
        "webhook": "vigil-webhook.vigil-system.svc",
        "metrics": "vigil-metrics.vigil-system.svc",
    }
    assert settings.webhook == ("0.0.0.0:9443", "/tmp/vigil-certs/webhook.crt", "/tmp/vigil-certs/webhook.key")
    assert settings.beat_server == ("0.0.0.0:9444", "/tmp/vigil-certs/webhook.crt", "/tmp/vigil-certs/webhook.key")
    assert settings.metrics_tls == ("/tmp/vigil-certs/metrics.crt", "/tmp/vigil-certs/metrics.key")
    assert settings.beat_channel is not None and settings.beat_channel.ca_pem == ""  # filled in at start


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        (["--webhook-cert-file=/x/tls.crt"], "--self-managed-certs-secret makes the certificates: leave out "
                                             "--webhook-cert-file"),
        (["--heartbeat-ca-file=/x/ca.crt"], "leave out --heartbeat-ca-file"),
        ("no webhook service", "with --webhook-address or --beat-address needs --webhook-service"),
        ("no metrics service", "with a secure --metrics-address needs --metrics-service"),
        ("no namespace", "keeps its Secret in $POD_NAMESPACE"),
    ],
)  # fmt: skip
def test_self_managed_certificates_refuse_what_would_not_be_coherent(
    change: object, refusal: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    args = list(SELF_MANAGED)
    monkeypatch.setenv("POD_NAMESPACE", "vigil-system")
    if change == "no webhook service":
        args.remove("--webhook-service=vigil-webhook")
    elif change == "no metrics service":
        args.remove("--metrics-service=vigil-metrics")
    elif change == "no namespace":
        monkeypatch.delenv("POD_NAMESPACE")
        monkeypatch.setattr(cli, "SERVICE_ACCOUNT_NAMESPACE", "/nonexistent/namespace")
    else:
        args += change  # type: ignore[operator]
    assert cli.main(args) == 2
    assert refusal in capsys.readouterr().err
