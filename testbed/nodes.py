"""The bed's nodes. kwok's fake nodes, made through the API and tainted so that only pods that
tolerate them land there; and the real node (a kubelet with containerd, brought up by
testbed/node.py): its names, paths and network, and its teardown, which `testbed.cluster down`
runs too before it stops the control plane.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from pathlib import Path

from testbed.processes import Cluster, ClusterError, kubectl, log, running_pid, stop

FAKE_NODE = "kwok.x-k8s.io/node"  # the annotation (and taint key) of the nodes kwok manages
FAKE_NODE_TAINT = {"key": FAKE_NODE, "value": "fake", "effect": "NoSchedule"}
API_SERVICE_IP = "10.0.0.1"  # the first address of testbed.components.SERVICE_CIDR: the kubernetes Service


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


# --- the real node: its place ---------------------------------------------------------------


def node_name(cluster: Cluster) -> str:
    return f"{cluster.name}-real-node"


def home(cluster: Cluster) -> Path:
    return cluster.dir / "node"


def socket_path(cluster: Cluster) -> Path:
    return home(cluster) / "containerd.sock"


def _net_id(cluster: Cluster) -> int:
    return int(hashlib.sha256(cluster.name.encode()).hexdigest(), 16) % 250 + 1


def bridge(cluster: Cluster) -> str:
    return f"vigil-{hashlib.sha256(cluster.name.encode()).hexdigest()[:8]}"  # at most 15 characters


def subnet(cluster: Cluster) -> str:
    return f"10.200.{_net_id(cluster)}.0/24"


def gateway(cluster: Cluster) -> str:
    return f"10.200.{_net_id(cluster)}.1"


def _run(*args: str, check: bool = True, input: bytes | None = None, timeout: float = 300) -> str:
    done = subprocess.run(list(args), capture_output=True, input=input, timeout=timeout)
    if check and done.returncode:
        error = done.stderr.decode(errors="replace").strip()
        raise ClusterError(f"{' '.join(args)} failed ({done.returncode}): {error}")
    return done.stdout.decode(errors="replace")


def ctr(cluster: Cluster, *args: str, timeout: float = 300) -> str:
    return _run("ctr", "--address", str(socket_path(cluster)), "--namespace", "k8s.io", *args, timeout=timeout)


def _dnat_rule(cluster: Cluster) -> list[str]:
    return [
        "PREROUTING", "-s", subnet(cluster), "-d", API_SERVICE_IP, "-p", "tcp", "--dport", "443",
        "-m", "comment", "--comment", f"vigil testbed {cluster.name}: kubernetes Service",
        "-j", "DNAT", "--to-destination", f"127.0.0.1:{cluster.ports.apiserver}",
    ]  # fmt: skip


# --- the real node: its teardown ------------------------------------------------------------


def _network_down(cluster: Cluster) -> None:
    rule = _dnat_rule(cluster)
    while subprocess.run(["iptables", "-t", "nat", "-C", *rule], capture_output=True).returncode == 0:
        _run("iptables", "-t", "nat", "-D", *rule)
    subprocess.run(["ip", "link", "del", bridge(cluster)], capture_output=True)
    shutil.rmtree(home(cluster) / "cni-ipam", ignore_errors=True)


def _sandbox_netns(cluster: Cluster) -> set[str]:
    """The network namespaces (/var/run/netns/cni-*) of the pods containerd holds."""
    found: set[str] = set()
    try:
        for container in ctr(cluster, "containers", "ls", "-q", timeout=30).split():
            info = json.loads(ctr(cluster, "containers", "info", container, timeout=30))
            for space in ((info.get("Spec") or {}).get("linux") or {}).get("namespaces") or []:
                if space.get("type") == "network" and str(space.get("path", "")).startswith("/var/run/netns/"):
                    found.add(space["path"])
    except (ClusterError, subprocess.TimeoutExpired, ValueError):
        pass
    return found


def _drain(cluster: Cluster, netns: set[str], timeout: float = 30) -> None:
    """Deletes the node's pods (the kubelet stops them through the CRI, which tears their network
    down: the veth, the IP, the network namespace) and waits a while for that to be done."""
    try:
        kubectl(
            cluster, "delete", "pods", "--all-namespaces", "--field-selector", f"spec.nodeName={node_name(cluster)}",
            "--grace-period=1", "--wait=false",
        )  # fmt: skip
    except ClusterError as err:
        log(f"real node: could not delete its pods ({err}); stopping their containers directly")
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            tasks = ctr(cluster, "tasks", "ls", timeout=10).splitlines()[1:]
        except (ClusterError, subprocess.TimeoutExpired):
            return
        # Every container stopped (sandboxes included), and every pod's network torn down.
        if not any("RUNNING" in task for task in tasks) and not any(Path(path).exists() for path in netns):
            return
        time.sleep(0.5)


def _remove_containers(cluster: Cluster) -> None:
    """Kills and deletes whatever containers containerd still holds, so that no shim and no
    process of a pod outlives the node."""
    try:
        for line in ctr(cluster, "tasks", "ls", timeout=30).splitlines()[1:]:
            task = line.split()[0]
            subprocess.run(
                ["ctr", "--address", str(socket_path(cluster)), "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", task],
                capture_output=True,
                timeout=30,
            )
            subprocess.run(
                ["ctr", "--address", str(socket_path(cluster)), "-n", "k8s.io", "tasks", "delete", "--force", task],
                capture_output=True,
                timeout=30,
            )
        for container in ctr(cluster, "containers", "ls", "-q", timeout=30).split():
            subprocess.run(
                ["ctr", "--address", str(socket_path(cluster)), "-n", "k8s.io", "containers", "delete", container],
                capture_output=True,
                timeout=30,
            )
    except (ClusterError, subprocess.TimeoutExpired) as err:
        log(f"real node: could not remove every container: {err}")


def _unmount_below(path: Path) -> None:
    """Unmounts what the kubelet and containerd mounted under `path` (volumes, rootfs, netns)."""
    try:
        mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    except OSError:
        return
    for mount in sorted((m for m in mounts if m.startswith(str(path) + "/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", mount], capture_output=True)


def down(cluster: Cluster) -> None:
    """Stops the node's pods, the kubelet and containerd, and removes the bridge and the DNAT
    rule. Safe to call when nothing runs."""
    node = home(cluster)
    if not node.exists():
        return
    kubelet_ran = running_pid(cluster, "kubelet") is not None
    containerd_ran = running_pid(cluster, "containerd") is not None
    netns = _sandbox_netns(cluster) if containerd_ran else set()
    if kubelet_ran and containerd_ran and running_pid(cluster, "kube-apiserver"):
        _drain(cluster, netns)
    stop(cluster, "kubelet")
    if containerd_ran:
        _remove_containers(cluster)
    stop(cluster, "containerd")
    for path in netns:  # what the kubelet did not tear down (no CNI DEL ran for it)
        if Path(path).exists():
            subprocess.run(["ip", "netns", "delete", Path(path).name], capture_output=True)
    _network_down(cluster)
    _unmount_below(node)
    if running_pid(cluster, "kube-apiserver"):
        try:
            kubectl(cluster, "delete", "node", node_name(cluster), "--ignore-not-found", "--wait=false")
        except ClusterError as err:
            log(f"real node: could not delete the Node object: {err}")
    if kubelet_ran or containerd_ran:
        log(f"real node {node_name(cluster)} is down")
