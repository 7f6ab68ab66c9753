"""The operator's own certificates, decided (vigil.core.certs), on a fake clock: no Secret makes a
CA and a certificate per server; a valid Secret is kept as it is; a leaf near its end, or naming
other Services, is re-issued with the same CA (so the webhook's caBundle and the pods' CA never
change for a renewal); a malformed Secret is said to be so, and repaired."""

from __future__ import annotations

import datetime as dt
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tests.support.clock import WALL_START
from vigil.core import certs

pytestmark = pytest.mark.unit

NOW = WALL_START
WEBHOOK = certs.Leaf("webhook", certs.service_names("vigil-webhook", "vigil-system"))
METRICS = certs.Leaf("metrics", certs.service_names("vigil-metrics", "vigil-system"))
LEAVES = (WEBHOOK, METRICS)


def cert(data: dict[str, bytes], key: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(data[key])


def fresh() -> dict[str, bytes]:
    return certs.decide(None, LEAVES, NOW, "vigil-certs-ca").data


def test_no_secret_makes_a_ca_and_a_certificate_per_server_that_tls_accepts(tmp_path: Path):
    plan = certs.decide(None, LEAVES, NOW, "vigil-certs-ca")
    assert plan.changed and plan.reasons
    assert set(plan.data) == {"ca.crt", "ca.key", "webhook.crt", "webhook.key", "metrics.crt", "metrics.key"}
    ca = cert(plan.data, "ca.crt")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert ca.not_valid_after_utc - NOW >= dt.timedelta(days=3649)
    for leaf in LEAVES:
        served = cert(plan.data, f"{leaf.name}.crt")
        served.verify_directly_issued_by(ca)
        names = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert names.get_values_for_type(x509.DNSName) == list(leaf.dns_names)
        assert dt.timedelta(days=364) <= served.not_valid_after_utc - NOW <= dt.timedelta(days=366)
        # What a client of the Service does: trust the CA alone, check the name, complete a handshake.
        (tmp_path / "c").write_bytes(plan.data[f"{leaf.name}.crt"])
        (tmp_path / "k").write_bytes(plan.data[f"{leaf.name}.key"])
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server.load_cert_chain(tmp_path / "c", tmp_path / "k")
        client = ssl.create_default_context(cadata=plan.data["ca.crt"].decode())
        assert_handshake(server, client, f"{leaf.dns_names[0]}.vigil-system.svc")


def assert_handshake(server: ssl.SSLContext, client: ssl.SSLContext, name: str) -> None:
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    tls_client = client.wrap_bio(c_in, c_out, server_hostname=name)
    tls_server = server.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        done = 0
        for end in (tls_client, tls_server):
            try:
                end.do_handshake()
                done += 1
            except ssl.SSLWantReadError:
                pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if done == 2:
            return
    raise AssertionError("no handshake")


def test_a_valid_secret_is_kept_as_it_is():
    held = fresh()
    later = NOW + dt.timedelta(days=300)
    plan = certs.decide(held, LEAVES, later, "vigil-certs-ca")
    assert not plan.changed and plan.data == held and plan.reasons == ()


@pytest.mark.parametrize("days", [336, 364, 400])
def test_a_leaf_within_30_days_of_its_end_is_reissued_with_the_same_ca(days: int):
    held = fresh()
    plan = certs.decide(held, LEAVES, NOW + dt.timedelta(days=days), "vigil-certs-ca")
    assert plan.changed
    assert plan.data["ca.crt"] == held["ca.crt"] and plan.data["ca.key"] == held["ca.key"]
    for leaf in LEAVES:
        renewed = cert(plan.data, f"{leaf.name}.crt")
        renewed.verify_directly_issued_by(cert(held, "ca.crt"))
        assert renewed.not_valid_after_utc > NOW + dt.timedelta(days=days + 300)
    assert any("within 30 days" in reason for reason in plan.reasons), plan.reasons


def test_a_leaf_naming_another_service_is_reissued_and_the_other_kept():
    held = fresh()
    moved = certs.Leaf("webhook", certs.service_names("vigil-webhook", "elsewhere"))
    plan = certs.decide(held, (moved, METRICS), NOW, "vigil-certs-ca")
    assert plan.changed and plan.data["ca.crt"] == held["ca.crt"]
    assert plan.data["metrics.crt"] == held["metrics.crt"] and plan.data["webhook.crt"] != held["webhook.crt"]
    names = cert(plan.data, "webhook.crt").extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "vigil-webhook.elsewhere.svc" in names.get_values_for_type(x509.DNSName)
    assert plan.reasons == ("webhook: does not name vigil-webhook.elsewhere, vigil-webhook.elsewhere.svc, "
                            "vigil-webhook.elsewhere.svc.cluster.local: re-issued with the stored CA",)  # fmt: skip


def test_a_server_added_later_gets_its_certificate_from_the_same_ca():
    held = certs.decide(None, (WEBHOOK,), NOW, "vigil-certs-ca").data
    plan = certs.decide(held, LEAVES, NOW, "vigil-certs-ca")
    assert plan.changed and plan.data["ca.crt"] == held["ca.crt"] and plan.data["webhook.crt"] == held["webhook.crt"]
    assert plan.reasons == ("metrics: metrics.crt and metrics.key missing: re-issued with the stored CA",)


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        ({"webhook.key": b"not a key"}, "webhook: webhook.key is not an unencrypted PEM private key"),
        (
            {"webhook.crt": b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"},
            "webhook.crt is not a PEM",
        ),
        ("swap", "webhook: webhook.key is not the key of webhook.crt"),
        ("foreign", "webhook: not signed by the stored CA"),
    ],
)
def test_a_malformed_leaf_is_said_to_be_and_reissued_with_the_stored_ca(damage: object, said: str):
    held = fresh()
    broken = dict(held)
    if damage == "swap":
        broken["webhook.key"] = held["metrics.key"]
    elif damage == "foreign":
        other = fresh()
        broken["webhook.crt"], broken["webhook.key"] = other["webhook.crt"], other["webhook.key"]
    else:
        broken.update(damage)  # type: ignore[call-overload]
    plan = certs.decide(broken, LEAVES, NOW, "vigil-certs-ca")
    assert plan.changed and plan.data["ca.crt"] == held["ca.crt"]
    assert any(reason.startswith(said) or said in reason for reason in plan.reasons), plan.reasons
    cert(plan.data, "webhook.crt").verify_directly_issued_by(cert(held, "ca.crt"))
    assert plan.data["metrics.crt"] == held["metrics.crt"]


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        ({"ca.crt": b"garbage"}, "the CA: ca.crt is not a PEM certificate"),
        ("no key", "the CA: ca.key missing"),
        ("leaf as ca", "the CA: ca.crt is not a CA certificate"),
    ],
)
def test_a_malformed_ca_is_said_to_be_and_replaced_with_every_leaf(damage: object, said: str):
    held = fresh()
    broken = dict(held)
    if damage == "no key":
        del broken["ca.key"]
    elif damage == "leaf as ca":
        broken["ca.crt"], broken["ca.key"] = held["webhook.crt"], held["webhook.key"]
    else:
        broken.update(damage)  # type: ignore[call-overload]
    plan = certs.decide(broken, LEAVES, NOW, "vigil-certs-ca")
    assert plan.changed and any(reason.startswith(said) for reason in plan.reasons), plan.reasons
    assert "a new CA, and every certificate with it (the caBundle changes)" in plan.reasons
    ca = cert(plan.data, "ca.crt")
    assert plan.data["ca.crt"] != held["ca.crt"]
    for leaf in LEAVES:
        cert(plan.data, f"{leaf.name}.crt").verify_directly_issued_by(ca)


def test_no_reason_carries_key_material():
    held = fresh()
    broken = {**held, "webhook.key": held["webhook.key"][:-40]}
    plan = certs.decide(broken, LEAVES, NOW, "vigil-certs-ca")
    key_body = b"".join(held["webhook.key"].splitlines()[1:-1]).decode()
    assert plan.reasons and not any(key_body[:16] in reason or "PRIVATE" in reason for reason in plan.reasons)


def test_the_keys_are_ecdsa_p256():
    data = fresh()
    for name in ("ca.key", "webhook.key", "metrics.key"):
        key = serialization.load_pem_private_key(data[name], password=None)
        assert key.curve.name == "secp256r1"  # type: ignore[union-attr]
