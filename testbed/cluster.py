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

# This module is the commands. The parts are testbed.processes (a cluster's directory, ports and
# processes), testbed.pki, testbed.components (each component's flags, and `restart`) and
# testbed.nodes (kwok's nodes, and the real node's teardown). Every name the suites, the benches
# and testbed/ use is re-exported here: `from testbed import cluster as testbed; testbed.up(...)`.

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

from testbed.components import (
    AUDIT_LOG_BACKUPS,
    AUDIT_LOG_MAX_MB,
    AUDIT_POLICY,
    COMPONENTS,
    NODE_LEASE_SECONDS,
    POD_CIDR,
    SERVICE_CIDR,
    STAGES,
    etcd_keys,
    restart,
    start_apiserver,
    start_controller_manager,
    start_etcd,
    start_kwok,
    start_scheduler,
)
from testbed.nodes import FAKE_NODE, FAKE_NODE_TAINT, _nodes_ready, create_nodes, fake_node
from testbed.nodes import down as real_node_down
from testbed.pki import make_pki, write_kubeconfig
from testbed.processes import (
    BIN,
    CACHE,
    Cluster,
    ClusterError,
    Ports,
    _pid_alive,
    binary,
    kubectl,
    log,
    running_pid,
    start,
    stop,
    wait_for,
)

__all__ = [
    "AUDIT_LOG_BACKUPS",
    "AUDIT_LOG_MAX_MB",
    "AUDIT_POLICY",
    "BIN",
    "CACHE",
    "COMPONENTS",
    "FAKE_NODE",
    "FAKE_NODE_TAINT",
    "NODE_LEASE_SECONDS",
    "POD_CIDR",
    "SERVICE_CIDR",
    "STAGES",
    "Cluster",
    "ClusterError",
    "Ports",
    "_nodes_ready",
    "_pid_alive",
    "binary",
    "create_nodes",
    "down",
    "etcd_keys",
    "fake_node",
    "kubectl",
    "log",
    "main",
    "make_pki",
    "restart",
    "running_pid",
    "start",
    "start_apiserver",
    "start_controller_manager",
    "start_etcd",
    "start_kwok",
    "start_scheduler",
    "status",
    "stop",
    "up",
    "wait_for",
    "write_kubeconfig",
]


def _default_service_account(cluster: Cluster) -> bool:
    try:
        kubectl(cluster, "get", "serviceaccount", "default", "-n", "default")
        return True
    except ClusterError:
        return False


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
    real_node_down(cluster)
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
