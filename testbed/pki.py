"""The test bed's PKI (openssl): a CA, the API server's serving certificate, a client certificate
per component (each the user the default RBAC bootstrap policy expects), the service-account key,
and the kubeconfigs that use them."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from testbed.processes import Cluster, ClusterError


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if result.returncode:
        raise ClusterError(f"openssl {' '.join(args[:2])} failed: {result.stderr.strip()}")


def _client_cert(pki: Path, name: str, subject: str) -> None:
    _openssl(
        "req",
        "-new",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        subject,
        cwd=pki,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "3650",
        "-out",
        f"{name}.crt",
        cwd=pki,
    )


def make_pki(pki: Path) -> None:
    """A CA, the apiserver's serving cert, client certs per component, the service-account key."""
    if (pki / "done").exists():
        return
    if shutil.which("openssl") is None:
        raise ClusterError("openssl is missing: install it (apt-get install openssl).")
    pki.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "3650",
        "-subj",
        "/CN=vigil-testbed-ca",
        cwd=pki,
    )
    (pki / "serving.ext").write_text(
        "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
        "extendedKeyUsage=serverAuth\n"
    )
    _openssl(
        "req",
        "-new",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "apiserver.key",
        "-out",
        "apiserver.csr",
        "-subj",
        "/CN=kube-apiserver",
        cwd=pki,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        "apiserver.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "3650",
        "-extfile",
        "serving.ext",
        "-out",
        "apiserver.crt",
        cwd=pki,
    )
    # Each component authenticates as the user the default RBAC bootstrap policy expects.
    _client_cert(pki, "admin", "/O=system:masters/CN=vigil-testbed-admin")
    _client_cert(pki, "controller-manager", "/CN=system:kube-controller-manager")
    _client_cert(pki, "scheduler", "/CN=system:kube-scheduler")
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    (pki / "done").write_text("")


def write_kubeconfig(cluster: Cluster, path: Path, user: str) -> None:
    pki = cluster.pki
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": f"vigil-{cluster.name}",
                "cluster": {"server": cluster.server, "certificate-authority": str(pki / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate": str(pki / f"{user}.crt"), "client-key": str(pki / f"{user}.key")},
            }
        ],
        "contexts": [{"name": f"vigil-{cluster.name}", "context": {"cluster": f"vigil-{cluster.name}", "user": user}}],
        "current-context": f"vigil-{cluster.name}",
    }
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML: every client reads it
