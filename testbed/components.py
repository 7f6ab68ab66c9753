"""The control plane's components, each started with its flags and waited for until it answers:
etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok; and the ways a test
hurts them (`restart`, with SIGKILL for a crash) or looks behind them (`etcd_keys`)."""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import signal
import time
import urllib.request
from pathlib import Path

from testbed.nodes import FAKE_NODE
from testbed.pki import _client_cert, write_kubeconfig
from testbed.processes import (
    Cluster,
    ClusterError,
    _get,
    _http_ok,
    _https_ok,
    _insecure_ok,
    _wait_ports_free,
    binary,
    log,
    running_pid,
    start,
    stop,
    wait_for,
)

STAGES = Path(__file__).with_name("kwok-stages.yaml")
SERVICE_CIDR = "10.0.0.0/24"
POD_CIDR = "10.244.0.1/16"
# How long a fake node's Lease lasts without renewal (kwok renews it every quarter of that). A
# restarted kwok waits that long to take its nodes over; kube-controller-manager marks a node not
# Ready only after 50 s without a renewal.
NODE_LEASE_SECONDS = 10
# Start order; `down` stops them in reverse.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


def _ports_of(cluster: Cluster, component: str) -> list[int]:
    ports = cluster.ports
    return {
        "etcd": [ports.etcd_client, ports.etcd_peer],
        "kube-apiserver": [ports.apiserver],
        "kube-controller-manager": [ports.controller_manager],
        "kube-scheduler": [ports.scheduler],
        "kwok": [ports.kwok],
    }.get(component, [])


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
# lease sent no write after it (e2e/test_split_brain.py). Written as JSON, which is
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
