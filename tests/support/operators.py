"""`vigil operator` as the end-to-end tests run it: a separate process, as it runs for real, that
a test can SIGKILL, freeze or stop at any instant; and the same with leader election on."""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import threading
from pathlib import Path

from kubernetes import client

from tests.support.cluster import Kube
from tests.support.waits import deadline

# Short election timings, so that a takeover takes seconds: lease 4 s, renew deadline 3 s, retry 1 s.
LEASE = ["--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "1"]
LEASE_NAME = "vigil-operator"  # the default --lease-name


class OperatorProcess:
    """`vigil operator` as a separate process, as it runs for real; killable at any instant."""

    def __init__(
        self,
        kube: Kube,
        namespaces: list[str],
        log_path: Path,
        kubeconfig: Path | None = None,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        tree: Path | None = None,
    ):
        self.kube, self.namespaces, self.log_path = kube, namespaces, log_path
        self.extra_args = extra_args  # more flags of `vigil operator`
        self.env = env or {}  # more environment, e.g. the POD_NAME the downward API gives in a pod
        self.kubeconfig = kubeconfig or kube.kubeconfig  # whose identity the operator acts with
        # Another source tree of Vigil (a previous release, extracted by e2e/test_upgrade.py) to run
        # instead of this checkout: its operator/ first on the path, with this virtualenv's Python
        # and libraries; its own flags are what extra_args must speak.
        self.tree = tree
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        level = ["--log-level", os.environ.get("VIGIL_TEST_OPERATOR_LOG_LEVEL", "info")]
        env = {**os.environ, **self.env, "KUBECONFIG": str(self.kubeconfig)}
        if self.tree is None:
            args = [str(Path(sys.executable).with_name("vigil")), "operator", *level]
        else:
            # PYTHONPATH comes before the editable install's path entry, so `vigil` is the tree's.
            args = [sys.executable, "-m", "vigil.cli", "operator", *level]
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.tree / "operator"), env.get("PYTHONPATH")]))
        for pattern in self.namespaces:
            args += ["--namespace", pattern]
        args += self.extra_args
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.tree if self.tree is not None else None
            )

    def kill(self) -> None:
        """SIGKILL: no cleanup, no goodbye, as when a node dies under it."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(deadline(30))
            except subprocess.TimeoutExpired:
                self.kill()

    def memory(self) -> dict[str, int]:
        """VmRSS and VmHWM (the peak) of the operator process, in bytes."""
        assert self.proc is not None
        found = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0]) * 1024
        return found

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def electing(kube: Kube, namespace: str, log_path: Path, **options) -> OperatorProcess:
    """An operator process that campaigns for the namespace's Lease (`LEASE` timings); `options`
    go to OperatorProcess (env, say)."""
    return OperatorProcess(
        kube, [namespace], log_path, extra_args=("--leader-elect", "--lease-namespace", namespace, *LEASE), **options
    )


def identity(operator: OperatorProcess) -> str | None:
    """The identity the process campaigns under, from its first log line about the election."""
    for line in operator.log().splitlines():
        if "leader election on" in line and " as " in line:
            return line.split(" as ", 1)[1].split(":", 1)[0]
    return None


def holder(kube: Kube, namespace: str, name: str = LEASE_NAME) -> str | None:
    """Who holds the namespace's Lease, or None (no Lease, or released)."""
    try:
        lease = client.CoordinationV1Api(kube.api).read_namespaced_lease(name, namespace)
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise
    return lease.spec.holder_identity or None


def counted_beats(metrics_port: int, outcome: str = "counted") -> float:
    """vigil_heartbeat_posts_total{outcome=...} on an operator's /metrics (0 if none yet)."""
    return metric_sample(metrics_port, f'vigil_heartbeat_posts_total{{outcome="{outcome}"}}')


_scrapers: dict[int, http.client.HTTPConnection] = {}
_scraping = threading.Lock()


def metrics_text(metrics_port: int, accept: str | None = None) -> str | None:
    """An operator's plain-HTTP /metrics, or None if it does not answer. Scraped on one kept-alive
    connection per port, as Prometheus scrapes: the operator bounds new connections a second from
    one address, and a test polling a sample would otherwise open one every poll. `accept`: the
    Accept header (OpenMetrics, say); none, Prometheus' text format."""
    with _scraping:
        for _ in (1, 2):  # a kept-alive connection the server closed meanwhile: once more
            connection = _scrapers.get(metrics_port)
            if connection is None:
                connection = _scrapers[metrics_port] = http.client.HTTPConnection("127.0.0.1", metrics_port, timeout=2)
            try:
                connection.request("GET", "/metrics", headers={"Accept": accept} if accept else {})
                return connection.getresponse().read().decode()
            except (OSError, http.client.HTTPException):
                connection.close()
                del _scrapers[metrics_port]
        return None


def metric_sample(metrics_port: int, sample: str) -> float:
    """One sample, as printed (`name{labels}`), of an operator's plain-HTTP /metrics (0 if absent)."""
    for line in (metrics_text(metrics_port) or "").splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def beat_args(certs: Path, port: int, beats_url: str, address: str = "127.0.0.1") -> tuple[str, ...]:
    """`vigil operator`'s flags for its beat server on address:port (with the serving
    certificate in `certs`: ca.crt, tls.crt, tls.key) and for the beats it tells pods to send to
    `beats_url`."""
    return (
        "--beat-address", f"{address}:{port}",
        "--beat-cert-file", str(certs / "tls.crt"),
        "--beat-key-file", str(certs / "tls.key"),
        "--heartbeat-url", beats_url,
        "--heartbeat-ca-file", str(certs / "ca.crt"),
    )  # fmt: skip
