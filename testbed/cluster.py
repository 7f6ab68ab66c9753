"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok (fake nodes and kubelets), from binaries built by testbed/build.sh.

    python -m testbed.cluster up [--nodes 3] [--port-base 16443] [--name default] [--durable]
    python -m testbed.cluster status
    python -m testbed.cluster restart kube-apiserver|etcd|... [--kill]
    python -m testbed.cluster down [--keep-data]

Everything lives in $VIGIL_CACHE/clusters/<name>/ (pki, etcd data, logs, pid files,
kubeconfig). `down` stops only the processes whose pid files it wrote. Standard library only,
so the pytest fixtures can drive it from any virtualenv.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("VIGIL_CACHE", Path.home() / ".cache" / "vigil"))
BIN = CACHE / "bin"
STAGES = Path(__file__).with_name("kwok-stages.yaml")
SERVICE_CIDR = "10.0.0.0/24"
POD_CIDR = "10.244.0.1/16"
FAKE_NODE = "kwok.x-k8s.io/node"  # the annotation (and taint key) of the nodes kwok manages
FAKE_NODE_TAINT = {"key": FAKE_NODE, "value": "fake", "effect": "NoSchedule"}
# How long a fake node's Lease lasts without renewal (kwok renews it every quarter of that). A
# restarted kwok waits that long to take its nodes over; kube-controller-manager marks a node not
# Ready only after 50 s without a renewal.
NODE_LEASE_SECONDS = 10
# Start order; `down` stops them in reverse.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


class ClusterError(RuntimeError):
    """A step of bringing the cluster up failed; the message says what to look at."""


def log(msg: str) -> None:
    print(f"[testbed {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Ports:
    """All ports of one cluster, derived from one base so two clusters can run side by side."""

    apiserver: int
    etcd_client: int
    etcd_peer: int
    controller_manager: int
    scheduler: int
    kwok: int

    @classmethod
    def from_base(cls, base: int) -> Ports:
        return cls(base, base + 1, base + 2, base + 3, base + 4, base + 5)


@dataclass(frozen=True)
class Cluster:
    name: str
    ports: Ports

    @property
    def dir(self) -> Path:
        return CACHE / "clusters" / self.name

    @property
    def pki(self) -> Path:
        return self.dir / "pki"

    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    @property
    def pids(self) -> Path:
        return self.dir / "pids"

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def audit_log(self) -> Path:
        """kube-apiserver's audit log (JSON lines): one event per write, see AUDIT_POLICY."""
        return self.logs / "audit.log"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    def save(self, durable: bool = False) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "cluster.json").write_text(
            json.dumps({"name": self.name, "port_base": self.ports.apiserver, "durable": durable})
        )

    @staticmethod
    def saved(name: str) -> dict:
        """What `up` recorded about the cluster `name` (empty when it never ran)."""
        path = CACHE / "clusters" / name / "cluster.json"
        return json.loads(path.read_text()) if path.exists() else {}

    @classmethod
    def load(cls, name: str) -> Cluster | None:
        data = cls.saved(name)
        return cls(data["name"], Ports.from_base(data["port_base"])) if data else None


# --- binaries ---------------------------------------------------------------------------


def binary(name: str) -> str:
    path = BIN / name
    if not path.exists():
        raise ClusterError(f"{path} is missing: run testbed/build.sh first (it builds the control plane).")
    return str(path)


# --- PKI (openssl) --------------------------------------------------------------------------


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


# --- processes ------------------------------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours is not running.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot: with the pid, a unique identity."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def running_pid(cluster: Cluster, component: str) -> int | None:
    """The pid of the component if the very process `start` launched still runs."""
    pidfile = cluster.pids / f"{component}.pid"
    if not pidfile.exists():
        return None
    pid, _, started = pidfile.read_text().partition(" ")
    # Guard against pid reuse: same pid and same start time, or it is another process.
    if not _pid_alive(int(pid)) or _start_time(int(pid)) != started.strip():
        return None
    return int(pid)


def start(cluster: Cluster, component: str, command: list[str], env: dict[str, str] | None = None) -> None:
    """Starts a process of the cluster in its own session, logging to logs/<component>.log."""
    if running_pid(cluster, component):
        log(f"{component}: already running")
        return
    cluster.logs.mkdir(parents=True, exist_ok=True)
    cluster.pids.mkdir(parents=True, exist_ok=True)
    logfile = cluster.logs / f"{component}.log"
    with open(logfile, "ab") as out:
        proc = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    (cluster.pids / f"{component}.pid").write_text(f"{proc.pid} {_start_time(proc.pid)}")
    log(f"{component}: started (pid {proc.pid}), log {logfile}")


def stop(cluster: Cluster, component: str, timeout: float = 15.0, sig: int = signal.SIGTERM) -> None:
    """Stops the component with `sig` (SIGKILL after `timeout`) and waits until it is gone."""
    pid = running_pid(cluster, component)
    pidfile = cluster.pids / f"{component}.pid"
    if pid:
        os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
            while _pid_alive(pid):
                time.sleep(0.05)
        log(f"{component}: stopped (pid {pid})")
    pidfile.unlink(missing_ok=True)


def _ports_of(cluster: Cluster, component: str) -> list[int]:
    ports = cluster.ports
    return {
        "etcd": [ports.etcd_client, ports.etcd_peer],
        "kube-apiserver": [ports.apiserver],
        "kube-controller-manager": [ports.controller_manager],
        "kube-scheduler": [ports.scheduler],
        "kwok": [ports.kwok],
    }.get(component, [])


def _wait_ports_free(ports: list[int], timeout: float = 15.0) -> None:
    """Waits until nothing listens on `ports` any more. A killed multi-threaded process shows as a
    zombie as soon as its main thread exits, while its other threads may still hold its sockets:
    starting its successor then would fail with "address already in use"."""
    deadline = time.monotonic() + timeout
    for port in ports:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind(("127.0.0.1", port))
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise ClusterError(
                            f"port {port} is still in use {timeout:.0f}s after its process stopped"
                        ) from None
            time.sleep(0.05)


def wait_for(what: str, check, timeout: float, cluster: Cluster, component: str) -> None:
    """Polls check() until it is true; fails early if the component died, pointing at its log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if component and not running_pid(cluster, component):
            tail = _tail(cluster.logs / f"{component}.log")
            raise ClusterError(f"{component} exited while waiting for {what}. Last log lines:\n{tail}")
        time.sleep(0.25)
    raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}; see {cluster.logs / (component + '.log')}")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# --- health checks --------------------------------------------------------------------------


def _admin_tls(cluster: Cluster) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(cluster.pki / "ca.crt"))
    ctx.load_cert_chain(str(cluster.pki / "admin.crt"), str(cluster.pki / "admin.key"))
    return ctx


def _https_ok(cluster: Cluster, url: str) -> bool:
    try:
        with urllib.request.urlopen(url, context=_admin_tls(cluster), timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _get(cluster: Cluster, path: str) -> dict | None:
    """A GET of the API as admin, its JSON; None if it failed."""
    try:
        with urllib.request.urlopen(f"{cluster.server}{path}", context=_admin_tls(cluster), timeout=5) as resp:
            return json.load(resp)
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _insecure_ok(url: str) -> bool:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def kubectl(cluster: Cluster, *args: str, input: str | None = None) -> str:
    result = subprocess.run(
        [binary("kubectl"), "--kubeconfig", str(cluster.kubeconfig), *args], input=input, capture_output=True, text=True
    )
    if result.returncode:
        raise ClusterError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


# --- the components -------------------------------------------------------------------------


def start_etcd(cluster: Cluster, durable: bool) -> None:
    p = cluster.ports
    args = [
        "--name=vigil",
        f"--data-dir={cluster.dir / 'etcd'}",
        f"--listen-client-urls=http://127.0.0.1:{p.etcd_client}",
        f"--advertise-client-urls=http://127.0.0.1:{p.etcd_client}",
        f"--listen-peer-urls=http://127.0.0.1:{p.etcd_peer}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{p.etcd_peer}",
        f"--initial-cluster=vigil=http://127.0.0.1:{p.etcd_peer}",
        "--quota-backend-bytes=4294967296",
        "--log-level=warn",
    ]
    if not durable:
        args.append("--unsafe-no-fsync")  # tests only: a crash of the machine may lose writes
    start(cluster, "etcd", [binary("etcd"), *args])
    wait_for("etcd health", lambda: _http_ok(f"http://127.0.0.1:{p.etcd_client}/health"), 60, cluster, "etcd")


# The audit policy of the test bed: every write (who, which object, when received, the answer),
# at level Metadata (no bodies), nothing for reads and watches, which are most requests and say
# nothing about who changed what. A test tells who wrote from `user.username` and `userAgent`
# (Vigil's clients name their process's holder identity there), e.g. that a leader that lost its
# lease sent no write after it (tests/e2e/test_split_brain.py). Written as JSON, which is
# YAML too.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],  # ResponseComplete (or Panic) carries the same times and the code
    "rules": [
        {"level": "Metadata", "verbs": ["create", "update", "patch", "delete", "deletecollection"]},
        {"level": "None"},
    ],
}
AUDIT_LOG_MAX_MB = 100  # rotated at this size, keeping AUDIT_LOG_BACKUPS older files: at most 300 MB
AUDIT_LOG_BACKUPS = 2


def start_apiserver(cluster: Cluster) -> None:
    pki, p = cluster.pki, cluster.ports
    if not (pki / "apiserver-kubelet-client.crt").exists():  # made here: older beds have no such cert
        _client_cert(pki, "apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client")
    policy = cluster.dir / "audit-policy.yaml"
    policy.write_text(json.dumps(AUDIT_POLICY, indent=2) + "\n")
    cluster.logs.mkdir(parents=True, exist_ok=True)
    start(
        cluster,
        "kube-apiserver",
        [
            binary("kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{p.etcd_client}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={p.apiserver}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--authorization-mode=Node,RBAC",
            # Added to the default plugins, as some distributions (OpenShift among them) do: an
            # owner reference with blockOwnerDeletion is then allowed only to who may update the
            # owner's finalizers, so every test runs under the stricter rule.
            "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
            "--endpoint-reconciler-type=none",  # no loopback Endpoints for the kubernetes Service
            # On SIGTERM, answer 429 + Retry-After until in-flight requests drain, then close
            # watches after 2 s; without it shutdown waits up to --request-timeout (60 s) for them.
            "--shutdown-send-retry-after=true",
            "--allow-privileged=true",
            # `kubectl logs` and `exec` on the real node (testbed/node.py): dial the kubelet at the
            # node's InternalIP (127.0.0.1; the node's hostname resolves nowhere), as a client of
            # the bed's CA in system:masters (the kubelet asks the API server what it may do).
            "--kubelet-preferred-address-types=InternalIP,Hostname,ExternalIP",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            # pprof at /debug/pprof (cluster-admin only) when asked: the bench profiles the API server.
            f"--profiling={'true' if os.environ.get('VIGIL_APISERVER_PROFILING') == '1' else 'false'}",
            f"--audit-policy-file={policy}",
            f"--audit-log-path={cluster.audit_log}",
            "--audit-log-format=json",
            f"--audit-log-maxsize={AUDIT_LOG_MAX_MB}",
            f"--audit-log-maxbackup={AUDIT_LOG_BACKUPS}",
            "--v=1",
        ],
    )
    wait_for(
        "kube-apiserver /readyz", lambda: _https_ok(cluster, f"{cluster.server}/readyz"), 120, cluster, "kube-apiserver"
    )


def start_controller_manager(cluster: Cluster) -> None:
    pki, p = cluster.pki, cluster.ports
    kubeconfig = cluster.dir / "controller-manager.kubeconfig"
    write_kubeconfig(cluster, kubeconfig, "controller-manager")
    start(
        cluster,
        "kube-controller-manager",
        [
            binary("kube-controller-manager"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={p.controller_manager}",
            "--leader-elect=false",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            "--use-service-account-credentials=true",  # each controller acts as its own identity
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            # Its client limit as production clusters raise it (the default, 20 qps burst 30,
            # throttles the Job controller so hard that any comparison with it flatters Vigil).
            f"--kube-api-qps={os.environ.get('VIGIL_KCM_API_QPS', '500')}",
            f"--kube-api-burst={os.environ.get('VIGIL_KCM_API_BURST', '1000')}",
            "--v=1",
        ],
    )
    wait_for(
        "kube-controller-manager /healthz",
        lambda: _insecure_ok(f"https://127.0.0.1:{p.controller_manager}/healthz"),
        60,
        cluster,
        "kube-controller-manager",
    )


def start_scheduler(cluster: Cluster) -> None:
    p = cluster.ports
    kubeconfig = cluster.dir / "scheduler.kubeconfig"
    write_kubeconfig(cluster, kubeconfig, "scheduler")
    start(
        cluster,
        "kube-scheduler",
        [
            binary("kube-scheduler"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={p.scheduler}",
            "--leader-elect=false",
            "--v=1",
        ],
    )
    wait_for(
        "kube-scheduler /healthz",
        lambda: _insecure_ok(f"https://127.0.0.1:{p.scheduler}/healthz"),
        60,
        cluster,
        "kube-scheduler",
    )


def start_kwok(cluster: Cluster) -> None:
    p = cluster.ports
    started = time.time()
    start(
        cluster,
        "kwok",
        [
            binary("kwok"),
            f"--kubeconfig={cluster.kubeconfig}",
            f"--config={STAGES}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={FAKE_NODE}=fake",
            f"--cidr={POD_CIDR}",
            "--node-ip=127.0.0.1",
            # Nodes keep a Lease, renewed every 10 s, as a kubelet does. Without this flag kwok
            # holds none (its default of 40 s applies only with a KwokConfiguration in --config),
            # so only the node-heartbeat stage (every 10-20 min) kept the nodes alive: the node
            # lifecycle controller saw every node not-Ready each 55 s and marked all their pods
            # NotReady, which kwok then undid (EndpointSlices emptied, pod events for nothing).
            f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
            f"--server-address=127.0.0.1:{p.kwok}",
        ],
    )
    wait_for("kwok /healthz", lambda: _http_ok(f"http://127.0.0.1:{p.kwok}/healthz"), 60, cluster, "kwok")
    # A kwok started while its nodes' Leases are still held (a restart, or `up` on kept data)
    # takes them over only once they expire, and until then moves no pod on those nodes: the
    # first 40 s of a benchmark after a restart ran with the CPU a third idle. Wait for it here,
    # so that what runs next does not take that pause for slowness of its own. (On a fresh bed
    # there are no nodes yet: nothing to wait for.)
    wait_for(
        "kwok to renew every fake node's Lease",
        lambda: _node_leases_renewed_since(cluster, started),
        NODE_LEASE_SECONDS + 30,
        cluster,
        "kwok",
    )


def _node_leases_renewed_since(cluster: Cluster, since: float) -> bool:
    """Whether the Lease of every fake node was renewed after `since` (a time.time())."""
    nodes = _get(cluster, "/api/v1/nodes")
    leases = _get(cluster, "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases")
    if nodes is None or leases is None:
        return False
    fake = {
        node["metadata"]["name"]
        for node in nodes["items"]
        if (node["metadata"].get("annotations") or {}).get(FAKE_NODE) == "fake"
    }
    renewed = {
        lease["metadata"]["name"]
        for lease in leases["items"]
        if (at := (lease.get("spec") or {}).get("renewTime"))
        and dt.datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp() > since
    }
    return fake <= renewed


def fake_node(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {FAKE_NODE: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            },
        },
        # The taint keeps real workloads off fake nodes (on kind too); test pods tolerate it.
        "spec": {"taints": [FAKE_NODE_TAINT]},
    }


def create_nodes(cluster: Cluster, count: int) -> list[str]:
    names = [f"kwok-node-{i}" for i in range(count)]
    manifest = {"apiVersion": "v1", "kind": "List", "items": [fake_node(n) for n in names]}
    kubectl(cluster, "apply", "-f", "-", input=json.dumps(manifest))
    return names


def _nodes_ready(cluster: Cluster, names: list[str]) -> bool:
    try:
        out = json.loads(kubectl(cluster, "get", "nodes", "-o", "json"))
    except ClusterError:
        return False
    ready = {
        n["metadata"]["name"]
        for n in out["items"]
        if any(c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", []))
    }
    return set(names) <= ready


def _default_service_account(cluster: Cluster) -> bool:
    try:
        kubectl(cluster, "get", "serviceaccount", "default", "-n", "default")
        return True
    except ClusterError:
        return False


# --- hurting it ----------------------------------------------------------------------------


def etcd_keys(cluster: Cluster, prefix: str) -> dict[str, int]:
    """The keys under `prefix` as etcd itself has them, with each one's mod revision: what is
    stored, whatever the API server's watch cache (which serves lists too) believes. For
    telling a lost watch event from a lost write."""
    encode = lambda raw: base64.b64encode(raw.encode()).decode()  # noqa: E731
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)  # every key that starts with prefix
    body = json.dumps({"key": encode(prefix), "range_end": encode(end), "keys_only": True}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{cluster.ports.etcd_client}/v3/kv/range", data=body, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        kvs = json.load(answer).get("kvs") or []
    return {base64.b64decode(kv["key"]).decode(): int(kv.get("mod_revision", 0)) for kv in kvs}


def _etcd_durable(cluster: Cluster) -> bool:
    """Whether etcd fsyncs: read from the running process's flags, else from what `up` recorded."""
    pid = running_pid(cluster, "etcd")
    if pid:
        try:
            return b"--unsafe-no-fsync" not in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            pass
    return bool(Cluster.saved(cluster.name).get("durable"))


def restart(cluster: Cluster, component: str, *, kill: bool = False, timeout: float = 120.0) -> float:
    """Stops a component (SIGTERM, or SIGKILL with kill=True: a crash) and starts it again with
    the same flags; returns once kube-apiserver's /readyz answers again (and, for kwok, once it
    holds its nodes' Leases again: see start_kwok), with the seconds taken.

    etcd keeps its data across a restart either way: it runs on the same data dir, and
    --unsafe-no-fsync only skips fdatasync, while every acknowledged write has already been
    written to the WAL file (the page cache outlives the process). Only a crash of the machine
    loses writes without --durable; a restart keeps whether it was durable.
    """
    if component not in COMPONENTS:
        raise ClusterError(f"unknown component {component!r}: one of {', '.join(COMPONENTS)}")
    began = time.monotonic()
    durable = _etcd_durable(cluster)
    stop(cluster, component, sig=signal.SIGKILL if kill else signal.SIGTERM)
    _wait_ports_free(_ports_of(cluster, component))
    starters = {
        "etcd": lambda: start_etcd(cluster, durable),
        "kube-apiserver": lambda: start_apiserver(cluster),
        "kube-controller-manager": lambda: start_controller_manager(cluster),
        "kube-scheduler": lambda: start_scheduler(cluster),
        "kwok": lambda: start_kwok(cluster),
    }
    starters[component]()

    def api_ready() -> bool:  # the apiserver reconnects to a restarted etcd by itself; /readyz includes etcd
        return _https_ok(cluster, f"{cluster.server}/readyz")

    wait_for("kube-apiserver /readyz", api_ready, timeout, cluster, "kube-apiserver")
    took = time.monotonic() - began
    log(f"{component}: restarted{' after SIGKILL' if kill else ''}; the API is ready again after {took:.1f}s")
    return took


# --- commands -------------------------------------------------------------------------------


def up(cluster: Cluster, nodes: int, durable: bool = False) -> Cluster:
    began = time.monotonic()
    existing = Cluster.load(cluster.name)
    if existing and existing.ports != cluster.ports and any(running_pid(existing, c) for c in COMPONENTS):
        raise ClusterError(
            f"cluster {cluster.name!r} already runs on port base {existing.ports.apiserver}; "
            "run `down` first or choose another --name."
        )
    cluster.save(durable)
    make_pki(cluster.pki)
    write_kubeconfig(cluster, cluster.kubeconfig, "admin")
    start_etcd(cluster, durable)
    start_apiserver(cluster)
    start_controller_manager(cluster)
    start_scheduler(cluster)
    start_kwok(cluster)
    names = create_nodes(cluster, nodes)
    wait_for(f"{nodes} Ready kwok nodes", lambda: _nodes_ready(cluster, names), 120, cluster, "kwok")
    # Pods are refused until the service-account controller has made the default account.
    wait_for(
        "the default ServiceAccount", lambda: _default_service_account(cluster), 60, cluster, "kube-controller-manager"
    )
    log(f"cluster {cluster.name!r} is up in {time.monotonic() - began:.1f}s: {cluster.server}")
    log(f"export KUBECONFIG={cluster.kubeconfig}")
    log(f"logs: {cluster.logs}/<component>.log")
    return cluster


def down(cluster: Cluster, keep_data: bool = False) -> None:
    """Stops what runs on the cluster (the real node, the operator and other extras first), then
    the cluster."""
    from testbed import node  # it imports this module

    node.down(cluster)
    extras = (
        sorted(p.stem for p in cluster.pids.glob("*.pid") if p.stem not in COMPONENTS) if cluster.pids.exists() else []
    )
    for component in [*extras, *reversed(COMPONENTS)]:
        stop(cluster, component)
    if not keep_data:
        shutil.rmtree(cluster.dir / "etcd", ignore_errors=True)
        log(f"cluster {cluster.name!r}: data removed (pki and logs kept in {cluster.dir})")


def status(cluster: Cluster) -> bool:
    """Prints what runs; true when every component does."""
    all_up = True
    for component in COMPONENTS:
        pid = running_pid(cluster, component)
        all_up &= pid is not None
        print(f"{component:26} {f'running (pid {pid})' if pid else 'stopped'}")
    print(f"{'kubeconfig':26} {cluster.kubeconfig}")
    print(f"{'apiserver':26} {cluster.server}")
    return all_up


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.cluster", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["up", "down", "status", "kubeconfig", "restart"])
    parser.add_argument("component", nargs="?", choices=COMPONENTS, help="restart: which component")
    parser.add_argument("--name", default=os.environ.get("VIGIL_CLUSTER", "default"))
    parser.add_argument(
        "--port-base",
        type=int,
        default=int(os.environ["VIGIL_PORT_BASE"]) if os.environ.get("VIGIL_PORT_BASE") else None,
        help="apiserver port; the others follow it ($VIGIL_PORT_BASE; default 16443, or the cluster's own)",
    )
    parser.add_argument("--nodes", type=int, default=3, help="number of kwok nodes (default 3)")
    parser.add_argument("--durable", action="store_true", help="etcd fsyncs every write (off by default: faster tests)")
    parser.add_argument("--keep-data", action="store_true", help="down: keep etcd's data")
    parser.add_argument("--kill", action="store_true", help="restart: SIGKILL instead of SIGTERM (a crash)")
    args = parser.parse_args(argv)
    if (args.command == "restart") != (args.component is not None):
        parser.error("a component goes with restart, and only with restart")

    saved = Cluster.load(args.name)
    base = args.port_base or (saved.ports.apiserver if saved else 16443)
    cluster = Cluster(args.name, Ports.from_base(base))
    try:
        if args.command == "up":
            up(cluster, args.nodes, args.durable)
            print(kubectl(cluster, "get", "nodes", "-o", "wide"), end="")
        elif args.command == "down":
            down(cluster, args.keep_data)
        elif args.command == "kubeconfig":
            print(cluster.kubeconfig)
        elif args.command == "restart":
            restart(cluster, args.component, kill=args.kill)
        else:
            return 0 if status(cluster) else 3
    except ClusterError as err:
        log(f"ERROR: {err}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
