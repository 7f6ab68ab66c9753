"""The operator's own certificates (`vigil operator --self-managed-certs-secret`), the decisions
alone: given what the Secret holds and the time, what it should hold. No API, no files
(`vigil.servers.certsecret` does those).

One CA (ECDSA P-256, 10 years) signs a serving certificate per server (1 year): the webhook's
(also the beats': the same Service) and the metrics'. A leaf that expires within 30 days, does
not name the Service's names, does not match its key or was not signed by the CA is re-issued
with the stored CA, so what the API server trusts (caBundle) and the pods' CA never change for
a renewal. Only a CA that is missing, unreadable or near its own end is replaced, and then every
leaf with it.

The Secret's keys: ca.crt, ca.key, and <server>.crt, <server>.key for each server.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_VALIDITY = dt.timedelta(days=3650)
LEAF_VALIDITY = dt.timedelta(days=365)
RENEW_BEFORE = dt.timedelta(days=30)
# Issued an hour back: a node whose clock lags a little still finds the certificate valid.
BACKDATE = dt.timedelta(hours=1)
CA_KEYS = ("ca.crt", "ca.key")


@dataclass(frozen=True)
class Leaf:
    """A server's certificate: its name in the Secret (`<name>.crt`, `<name>.key`) and the DNS
    names it must carry."""

    name: str
    dns_names: tuple[str, ...]

    @property
    def keys(self) -> tuple[str, str]:
        return f"{self.name}.crt", f"{self.name}.key"


def service_names(service: str, namespace: str) -> tuple[str, ...]:
    """The names a client may use for a Service (the chart's genSignedCert gave the same)."""
    return (service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local")


@dataclass(frozen=True)
class Managed:
    """What `--self-managed-certs-secret` and its companions say."""

    secret: str
    namespace: str
    directory: Path
    leaves: tuple[Leaf, ...]
    webhook_configuration: str | None = None  # whose every webhook's caBundle is kept the CA

    def files(self, leaf: str) -> tuple[str, str]:
        return str(self.directory / f"{leaf}.crt"), str(self.directory / f"{leaf}.key")

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.crt"


@dataclass(frozen=True)
class Plan:
    """`data`: the Secret's data as it should be (PEM bytes by key); `changed`: whether that
    differs from what it holds (to be written); `reasons`: why, one line each, no key material."""

    data: dict[str, bytes]
    changed: bool
    reasons: tuple[str, ...] = field(default=())


def decide(held: Mapping[str, bytes] | None, leaves: Sequence[Leaf], now: dt.datetime, ca_name: str) -> Plan:
    """What the Secret should hold at `now`; `held` None: there is no Secret."""
    if held is None:
        return _issue({}, leaves, now, ca_name, ("no Secret yet: a new CA and certificates",))
    reasons: list[str] = []
    ca = _load_pair(held, *CA_KEYS, "the CA", reasons)
    if ca is not None:
        ca_cert, _ = ca
        if not _is_ca(ca_cert):
            reasons.append("the CA: ca.crt is not a CA certificate (basicConstraints CA:TRUE)")
            ca = None
        elif _not_after(ca_cert) - RENEW_BEFORE <= now:
            reasons.append(f"the CA: expires {_not_after(ca_cert):%Y-%m-%d}, within {RENEW_BEFORE.days} days")
            ca = None
    if ca is None:
        reasons.append("a new CA, and every certificate with it (the caBundle changes)")
        return _issue(dict(held), leaves, now, ca_name, tuple(reasons))
    data = dict(held)
    changed = False
    for leaf in leaves:
        why = _leaf_problem(held, leaf, ca[0], now)
        if why is not None:
            reasons.append(f"{leaf.name}: {why}: re-issued with the stored CA")
            data.update(_leaf_pem(leaf, ca, now))
            changed = True
    return Plan(data, changed, tuple(reasons))


def _issue(
    data: dict[str, bytes], leaves: Sequence[Leaf], now: dt.datetime, ca_name: str, reasons: tuple[str, ...]
) -> Plan:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    data.update({"ca.crt": _cert_pem(cert), "ca.key": _key_pem(key)})
    for leaf in leaves:
        data.update(_leaf_pem(leaf, (cert, key), now))
    return Plan(data, True, reasons)


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """Signatures (ECDSA: a TLS server signs its handshake); a CA also signs certificates and CRLs."""
    return x509.KeyUsage(
        digital_signature=True,
        key_cert_sign=ca,
        crl_sign=ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        encipher_only=False,
        decipher_only=False,
    )


def _leaf_pem(
    leaf: Leaf, ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], now: dt.datetime
) -> dict[str, bytes]:
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, leaf.dns_names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(min(now + LEAF_VALIDITY, _not_after(ca_cert)))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in leaf.dns_names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    crt, key_name = leaf.keys
    return {crt: _cert_pem(cert), key_name: _key_pem(key)}


def _leaf_problem(held: Mapping[str, bytes], leaf: Leaf, ca: x509.Certificate, now: dt.datetime) -> str | None:
    """Why the stored leaf will not do, or None."""
    problems: list[str] = []
    pair = _load_pair(held, *leaf.keys, leaf.name, problems)
    if pair is None:
        return problems[0].split(": ", 1)[1]
    cert, _ = pair
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return "not signed by the stored CA"
    if _not_after(cert) - RENEW_BEFORE <= now:
        return f"expires {_not_after(cert):%Y-%m-%d}, within {RENEW_BEFORE.days} days"
    if cert.not_valid_before_utc > now:
        return f"not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M}"
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        carried = set(names.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        carried = set()
    if missing := [n for n in leaf.dns_names if n not in carried]:
        return f"does not name {', '.join(missing)}"
    return None


def _load_pair(
    held: Mapping[str, bytes], crt: str, key: str, what: str, problems: list[str]
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None:
    """The certificate and key under `crt` and `key`, if both are there, parse, and match; else
    None, with what is wrong appended to `problems` as "<what>: <problem>"."""
    if crt not in held or key not in held:
        problems.append(f"{what}: {' and '.join(k for k in (crt, key) if k not in held)} missing")
        return None
    try:
        cert = x509.load_pem_x509_certificate(held[crt])
    except ValueError:
        problems.append(f"{what}: {crt} is not a PEM certificate")
        return None
    try:
        private = serialization.load_pem_private_key(held[key], password=None)
    except (ValueError, TypeError):
        problems.append(f"{what}: {key} is not an unencrypted PEM private key")
        return None
    if not isinstance(private, ec.EllipticCurvePrivateKey):
        problems.append(f"{what}: {key} is not an ECDSA key")
        return None
    if private.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) != cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo):
        problems.append(f"{what}: {key} is not the key of {crt}")
        return None
    return cert, private


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _not_after(cert: x509.Certificate) -> dt.datetime:
    return cert.not_valid_after_utc


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
