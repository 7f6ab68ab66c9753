"""One real node beside the kwok nodes: a kubelet (built by testbed/build.sh from the same
Kubernetes module as the control plane) with containerd (Debian's package), so that a test can run
real containers in a real pod: Vigil's injected agent as a native sidecar, say.

    python -m testbed.node up [--name default]      start containerd and the kubelet for the cluster
    python -m testbed.node import IMAGE...          copy podman images into the node's containerd
    python -m testbed.node status
    python -m testbed.node down                     stop them (`testbed.cluster down` does it too)

Everything lives in $VIGIL_CACHE/clusters/<name>/node/: containerd's root, state, socket and
config, the CNI config and IP allocations, the kubelet's root, certificates, configuration and
pod logs. Nothing is pulled: no registry is reachable here, so images come from podman (`podman
save` + `ctr images import`), the pod sandbox's pause image is built here from this machine's
`sleep`, and pods say `imagePullPolicy: Never`.

The node is `<cluster>-real-node`, labelled vigil.dev/real-node=true and tainted
vigil.dev/real-node=true:NoSchedule: only a pod that tolerates the taint (and selects the label)
lands on it. Its pods are on a bridge of their own (`vigil-<hash>`, a /24 of 10.200.0.0/16 per
cluster); the API server's Service address (10.0.0.1:443, what in-cluster clients use) is sent to
the API server on 127.0.0.1 by one DNAT rule for that subnet, as kube-proxy would (there is no
kube-proxy). The kubelet listens on that bridge's address (10.200.N.1, on this machine) and
registers it as its InternalIP, the address kube-apiserver dials for `kubectl logs` and `exec`
(testbed/components.py); it refuses a loopback one.

Needs root (containerd, the bridge, iptables). Standard library only, like testbed/cluster.py.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from testbed.nodes import (
    _dnat_rule,
    _run,
    bridge,
    ctr,
    down,
    gateway,
    home,
    node_name,
    socket_path,
    subnet,
)
from testbed.pki import _client_cert, write_kubeconfig
from testbed.processes import Cluster, ClusterError, _get, binary, log, running_pid, start, wait_for

LABEL = "vigil.dev/real-node"
TAINT = {"key": LABEL, "value": "true", "effect": "NoSchedule"}
# What a pod puts in its spec to land on the real node.
POD_PLACEMENT = {
    "nodeSelector": {LABEL: "true"},
    "tolerations": [{"key": LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
}
CNI_BIN = Path("/usr/lib/cni")  # Debian's containernetworking-plugins (podman's dependency)
PAUSE_REPOSITORY = "localhost/vigil-pause"
COMPONENTS = ("containerd", "kubelet")  # start order; `down` stops them in reverse


def kubelet_port(cluster: Cluster) -> int:
    # The cluster's own ports are base .. base+5; the kubelet takes base+6 and its healthz base+7,
    # within the block of 10 each xdist worker's cluster has (tests/support/cluster.py). base+20,
    # as before, was the etcd client port of the cluster two workers up: restarting that etcd
    # while this kubelet waited to bind its healthz there left it unable to start.
    return cluster.ports.apiserver + 6


def _require() -> None:
    if os.geteuid() != 0:
        raise ClusterError("the real node needs root (containerd, a bridge, an iptables rule)")
    missing = [tool for tool in ("containerd", "ctr", "iptables", "ip", "podman") if shutil.which(tool) is None]
    if missing or not (CNI_BIN / "bridge").exists():
        raise ClusterError(
            f"missing {', '.join(missing) or CNI_BIN / 'bridge'}: run testbed/build.sh (it installs containerd)"
        )
    binary("kubelet")


# --- images ---------------------------------------------------------------------------------


def _libraries(binary: str) -> list[str]:
    shown = _run("ldd", binary)
    return [word for line in shown.splitlines() for word in line.split() if word.startswith("/")]


def _image_from_files(
    repository: str, files: dict[str, str], changes: tuple[str, ...], folders: tuple[str, ...] = ()
) -> str:
    """An image of `files` (path inside -> path on this machine) and the shared libraries each
    binary loads, with `podman import` and its `changes` (no registry, no package, a second);
    tagged with a hash of what goes in, so it is made once per content; its name."""
    files = {**files, **{lib: lib for host in set(files.values()) for lib in _libraries(host)}}
    digest = hashlib.sha256()
    for inside, host in sorted(files.items()):
        digest.update(inside.encode() + b"\0" + Path(host).read_bytes())
    for folder in folders:
        digest.update(b"dir\0" + folder.encode())
    name = f"{repository}:{digest.hexdigest()[:12]}"
    if subprocess.run(["podman", "image", "exists", name]).returncode == 0:
        return name
    with tempfile.TemporaryDirectory() as tmp:
        tarball = Path(tmp) / "image.tar"
        with tarfile.open(tarball, "w") as tar:
            for folder in folders:
                entry = tarfile.TarInfo(folder)
                entry.type, entry.mode = tarfile.DIRTYPE, 0o1777
                tar.addfile(entry)
            for inside, host in sorted(files.items()):
                data = Path(host).read_bytes()
                entry = tarfile.TarInfo(inside.lstrip("/"))
                entry.size, entry.mode = len(data), 0o755
                tar.addfile(entry, io.BytesIO(data))
        changes_args = [arg for change in changes for arg in ("--change", change)]
        _run("podman", "import", *changes_args, str(tarball), name, timeout=120)
    return name


def pause_image() -> str:
    """The sandbox image: this machine's `sleep infinity` as /pause (no registry has one to pull)."""
    return _image_from_files(PAUSE_REPOSITORY, {"/pause": "/bin/sleep"}, ('ENTRYPOINT ["/pause"]', 'CMD ["infinity"]'))


# An image with no Python and nothing of Vigil, for a job beside the injected agent: this
# machine's own sleep, touch, mv, sed and dash (as /bin/sh), and sleep again as /pause (the pod's
# infrastructure process, which the agent must not take for the job). It runs the scripts of
# examples/any-image/ (written for busybox) unchanged: the tests and `make up REAL_NODE=1` use it
# where busybox cannot be pulled.
PLAIN_REPOSITORY = "localhost/vigil-test-plain"
PLAIN_TOOLS = {
    "/bin/sleep": "/bin/sleep",
    "/bin/touch": "/usr/bin/touch",
    "/bin/mv": "/bin/mv",  # a checkpoint renamed into place
    "/bin/sed": "/bin/sed",  # examples/any-image/ read their checkpoint with it
    "/bin/sh": "/bin/dash",
    "/pause": "/bin/sleep",
}


def plain_image() -> str:
    """The plain image above; /tmp and /var/run/vigil (where a liveness file lives) writable."""
    return _image_from_files(
        PLAIN_REPOSITORY, PLAIN_TOOLS, ("ENTRYPOINT []", 'CMD ["/bin/sh"]'), folders=("tmp", "var/run/vigil")
    )


def _podman_id(image: str) -> str:
    return _run("podman", "image", "inspect", "--format", "{{.Id}}", image).strip()


def import_images(cluster: Cluster, images: list[str]) -> None:
    """Copies podman images into the node's containerd (namespace k8s.io, the kubelet's), under
    the same names; a pod then runs them with imagePullPolicy: Never. An image imported before
    with the same podman image ID is not copied again (Vigil's image takes a minute or more)."""
    if not running_pid(cluster, "containerd"):
        raise ClusterError(f"the real node of {cluster.name!r} is not running: `python -m testbed.node up` first")
    record = home(cluster) / "imported.json"
    imported = json.loads(record.read_text()) if record.exists() else {}
    present = set(ctr(cluster, "images", "ls", "-q").split())
    for image in images:
        began, image_id = time.monotonic(), _podman_id(image)
        if image in present and imported.get(image) == image_id:
            continue
        with tempfile.TemporaryDirectory(dir=home(cluster)) as tmp:
            archive = Path(tmp) / "image.tar"
            _run("podman", "save", "--format", "docker-archive", "--output", str(archive), image)
            ctr(cluster, "images", "import", str(archive))
        imported[image] = image_id
        record.write_text(json.dumps(imported, indent=2))
        log(f"real node: imported {image} into containerd in {time.monotonic() - began:.1f}s")


# --- configuration ---------------------------------------------------------------------------


def _containerd_config(cluster: Cluster, sandbox_image: str) -> str:
    """`containerd config default` with the node's own paths and what this machine needs."""
    node = home(cluster)
    text = _run("containerd", "config", "default")
    changes = [
        (r'^root = ".*"$', f'root = "{node / "containerd-root"}"'),
        (r'^state = ".*"$', f'state = "{node / "containerd-state"}"'),
        (r'^(\s*)address = "/run/containerd/containerd.sock"$', rf'\1address = "{socket_path(cluster)}"'),
        # This machine refuses a negative oom_score_adj even to root: without this, every sandbox
        # fails with runc's "can't get final child's PID from pipe: EOF".
        (r"^(\s*)restrict_oom_score_adj = .*$", r"\1restrict_oom_score_adj = true"),
        (r'^(\s*)sandbox_image = ".*"$', rf'\1sandbox_image = "{sandbox_image}"'),
        (r"^(\s*)SystemdCgroup = .*$", r"\1SystemdCgroup = false"),
        (r'^(\s*)bin_dir = ".*"$', rf'\1bin_dir = "{CNI_BIN}"'),
        (r'^(\s*)conf_dir = ".*"$', rf'\1conf_dir = "{node / "cni"}"'),
        (r'^(\s*)path = "/opt/containerd"$', rf'\1path = "{node / "containerd-opt"}"'),
    ]
    for pattern, replacement in changes:
        text, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
        if count != 1:
            raise ClusterError(f"containerd's default config has {count} lines like {pattern!r}, not one")
    return text


def _cni_config(cluster: Cluster) -> dict:
    return {
        "cniVersion": "0.4.0",
        "name": f"vigil-{cluster.name}",
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge(cluster),
                "isGateway": True,
                "ipMasq": False,  # pods talk to this machine only (the API server)
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(home(cluster) / "cni-ipam"),
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "ranges": [[{"subnet": subnet(cluster), "gateway": gateway(cluster)}]],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def _kubelet_config(cluster: Cluster) -> dict:
    node, port = home(cluster), kubelet_port(cluster)
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": gateway(cluster),  # the node's IP (see up())
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": port + 1,
        # kube-apiserver comes with a client certificate of the bed's CA (kubectl logs, exec);
        # what it may do is asked of the API server (SubjectAccessReview), as on a real cluster.
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(cluster.pki / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{socket_path(cluster)}",
        # This machine: cgroup v1 (hybrid), swap, and no systemd; the kubelet shares it with others.
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "podLogsDir": str(node / "pod-logs"),
        "registerWithTaints": [TAINT],
        "maxPods": 20,
        # The disk is shared and may be fuller than a kubelet likes: no evictions, no image GC
        # (the images were imported, nothing could pull them again).
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "rotateCertificates": False,
        "resolvConf": "/etc/resolv.conf",
    }


# --- the host's network ------------------------------------------------------------------------


def _network_up(cluster: Cluster) -> None:
    """The pods' bridge (made here, before the CNI plugin would, so that it may route to
    127.0.0.1) and the DNAT rule that stands in for kube-proxy for the kubernetes Service."""
    name = bridge(cluster)
    if subprocess.run(["ip", "link", "show", name], capture_output=True).returncode:
        _run("ip", "link", "add", name, "type", "bridge")
    addresses = _run("ip", "-o", "-4", "addr", "show", "dev", name)
    if f"{gateway(cluster)}/24" not in addresses:
        _run("ip", "addr", "add", f"{gateway(cluster)}/24", "dev", name)
    _run("ip", "link", "set", name, "up")
    Path(f"/proc/sys/net/ipv4/conf/{name}/route_localnet").write_text("1")
    rule = _dnat_rule(cluster)
    if subprocess.run(["iptables", "-t", "nat", "-C", *rule], capture_output=True).returncode:
        _run("iptables", "-t", "nat", "-A", *rule)


# --- up and down ---------------------------------------------------------------------------------


def _node(cluster: Cluster) -> dict | None:
    return _get(cluster, f"/api/v1/nodes/{node_name(cluster)}")


def _ready(cluster: Cluster) -> bool:
    node = _node(cluster)
    conditions = ((node or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def running(cluster: Cluster) -> bool:
    return all(running_pid(cluster, c) for c in COMPONENTS)


def up(cluster: Cluster, images: list[str] | None = None) -> None:
    """Starts containerd and the kubelet for a running cluster, waits until the node is Ready,
    and imports `images`."""
    began = time.monotonic()
    _require()
    apiserver = running_pid(cluster, "kube-apiserver")
    if not apiserver:
        raise ClusterError(f"cluster {cluster.name!r} is not running: `python -m testbed.cluster up` first")
    if b"--kubelet-preferred-address-types" not in Path(f"/proc/{apiserver}/cmdline").read_bytes():
        raise ClusterError(
            f"cluster {cluster.name!r} runs a kube-apiserver started before the bed had a real node (it cannot "
            "reach a kubelet for `kubectl logs`): "
            f"`python -m testbed.cluster restart kube-apiserver --name {cluster.name}`"
        )
    node = home(cluster)
    for sub in ("cni", "kubelet", "pod-logs"):
        (node / sub).mkdir(parents=True, exist_ok=True)
    name = node_name(cluster)

    sandbox = pause_image()
    (node / "containerd.toml").write_text(_containerd_config(cluster, sandbox))
    (node / "cni" / "10-vigil.conflist").write_text(json.dumps(_cni_config(cluster), indent=2))
    _network_up(cluster)
    start(cluster, "containerd", ["containerd", "--config", str(node / "containerd.toml"), "--log-level", "warn"])
    wait_for(
        "containerd's socket",
        lambda: (
            subprocess.run(["ctr", "--address", str(socket_path(cluster)), "version"], capture_output=True).returncode
            == 0
        ),
        60,
        cluster,
        "containerd",
    )
    import_images(cluster, [sandbox])

    user = f"kubelet-{name}"
    if not (cluster.pki / f"{user}.crt").exists():
        _client_cert(cluster.pki, user, f"/O=system:nodes/CN=system:node:{name}")
    kubeconfig = node / "kubelet.kubeconfig"
    write_kubeconfig(cluster, kubeconfig, user)
    (node / "kubelet.yaml").write_text(json.dumps(_kubelet_config(cluster), indent=2))  # JSON is YAML
    start(
        cluster,
        "kubelet",
        [
            binary("kubelet"),
            f"--config={node / 'kubelet.yaml'}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={node / 'kubelet'}",
            f"--cert-dir={node / 'kubelet' / 'pki'}",
            f"--hostname-override={name}",
            # The node's InternalIP, what kube-apiserver dials (--kubelet-preferred-address-types):
            # the pods' gateway, an address of this machine (the kubelet refuses a loopback one).
            f"--node-ip={gateway(cluster)}",
            f"--node-labels={LABEL}=true",
            "--v=1",
        ],
    )
    wait_for(f"node {name} to be Ready", lambda: _ready(cluster), 120, cluster, "kubelet")
    import_images(cluster, images or [])
    took = time.monotonic() - began
    log(f"real node {name} is Ready in {took:.1f}s (logs: {cluster.logs}/kubelet.log and containerd.log)")


def status(cluster: Cluster) -> bool:
    for component in COMPONENTS:
        pid = running_pid(cluster, component)
        print(f"{component:26} {f'running (pid {pid})' if pid else 'stopped'}")
    print(f"{'node':26} {node_name(cluster)} ({'Ready' if _ready(cluster) else 'not Ready'})")
    print(f"{'containerd socket':26} {socket_path(cluster)}")
    return running(cluster) and _ready(cluster)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.node", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["up", "down", "status", "import"])
    parser.add_argument("images", nargs="*", help="up, import: podman images to copy into the node's containerd")
    parser.add_argument("--name", default=os.environ.get("VIGIL_CLUSTER", "default"), help="the cluster's name")
    args = parser.parse_intermixed_args(argv)  # images before or after --name
    cluster = Cluster.load(args.name)
    if cluster is None:
        log(f"ERROR: no cluster {args.name!r}: `python -m testbed.cluster up --name {args.name}` first")
        return 1
    try:
        if args.command == "up":
            up(cluster, args.images)
        elif args.command == "import":
            import_images(cluster, args.images)
        elif args.command == "down":
            down(cluster)
        else:
            return 0 if status(cluster) else 3
    except ClusterError as err:
        log(f"ERROR: {err}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
