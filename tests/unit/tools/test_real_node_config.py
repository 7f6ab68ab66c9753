"""testbed/node.py's configuration of the real node, without starting it: what this machine needs
in the kubelet's and containerd's configuration, the node kept to the pods that ask for it, and
names and addresses of its own per cluster."""

from __future__ import annotations

import pytest

from testbed import node
from testbed.cluster import Cluster, ClusterError, Ports

pytestmark = pytest.mark.unit

CLUSTER = Cluster("a-rather-long-cluster-name", Ports.from_base(29443))

# The lines of `containerd config default` (1.6) that node.py rewrites, among others it leaves.
DEFAULT_CONFIG = """version = 2
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[debug]
  address = ""

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    restrict_oom_score_adj = false
    sandbox_image = "registry.k8s.io/pause:3.6"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/opt/cni/bin"
      conf_dir = "/etc/cni/net.d"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
            SystemdCgroup = true
  [plugins."io.containerd.internal.v1.opt"]
    path = "/opt/containerd"
"""


def test_only_a_pod_that_tolerates_the_taint_and_selects_the_label_lands_on_the_node():
    config = node._kubelet_config(CLUSTER)
    assert config["registerWithTaints"] == [node.TAINT]
    assert node.TAINT["effect"] == "NoSchedule"
    (toleration,) = node.POD_PLACEMENT["tolerations"]
    assert (toleration["key"], toleration["value"], toleration["effect"]) == (
        node.TAINT["key"],
        node.TAINT["value"],
        node.TAINT["effect"],
    )
    assert node.POD_PLACEMENT["nodeSelector"] == {node.LABEL: "true"}


def test_the_kubelet_is_configured_for_this_machine_and_listens_on_its_own_ports():
    config = node._kubelet_config(CLUSTER)
    for key, value in {
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "readOnlyPort": 0,
    }.items():
        assert config[key] == value, key
    assert config["port"] == 29449 and config["healthzPort"] == 29450  # past the cluster's own, before the demo's
    # No port of the kubelet is a port of another xdist worker's cluster (10 ports apart): one was,
    # and a restart of that cluster's etcd found its port taken by this kubelet's healthz.
    base = CLUSTER.ports.apiserver
    others = {port for worker in range(-9, 10) if worker for port in range(base + 10 * worker, base + 10 * worker + 6)}
    assert not {config["port"], config["healthzPort"]} & others
    assert config["address"] == node.gateway(CLUSTER)
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["containerRuntimeEndpoint"] == f"unix://{node.socket_path(CLUSTER)}"


def test_containerd_gets_the_node_s_own_paths_and_what_this_machine_needs(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(node, "_run", lambda *args, **kwargs: DEFAULT_CONFIG)
    text = node._containerd_config(CLUSTER, "localhost/vigil-pause:abc")
    home = node.home(CLUSTER)
    for line in (
        f'root = "{home / "containerd-root"}"',
        f'state = "{home / "containerd-state"}"',
        f'  address = "{node.socket_path(CLUSTER)}"',
        "restrict_oom_score_adj = true",
        'sandbox_image = "localhost/vigil-pause:abc"',
        "SystemdCgroup = false",
        f'bin_dir = "{node.CNI_BIN}"',
        f'conf_dir = "{home / "cni"}"',
    ):
        assert line in text, line
    assert '[debug]\n  address = ""' in text  # the other addresses untouched
    assert "/run/containerd" not in text and "/etc/cni" not in text


def test_a_containerd_default_config_of_another_shape_is_refused_not_half_rewritten(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setattr(node, "_run", lambda *args, **kwargs: DEFAULT_CONFIG.replace("restrict_oom_score_adj", "x"))
    with pytest.raises(ClusterError, match="restrict_oom_score_adj"):
        node._containerd_config(CLUSTER, "localhost/vigil-pause:abc")


def test_each_cluster_has_a_bridge_and_subnet_of_its_own_with_a_valid_interface_name():
    other = Cluster("default", Ports.from_base(16443))
    assert len(node.bridge(CLUSTER)) <= 15  # Linux's limit on an interface name
    assert node.bridge(CLUSTER) != node.bridge(other)
    assert node.subnet(CLUSTER) != node.subnet(other)
    assert node.gateway(CLUSTER).startswith(node.subnet(CLUSTER).rsplit(".", 1)[0] + ".")
    cni = node._cni_config(CLUSTER)["plugins"][0]
    assert cni["bridge"] == node.bridge(CLUSTER)
    assert cni["ipam"]["ranges"] == [[{"subnet": node.subnet(CLUSTER), "gateway": node.gateway(CLUSTER)}]]
    # The DNAT rule stands in for kube-proxy for that subnet alone, towards this cluster's API server.
    rule = node._dnat_rule(CLUSTER)
    assert rule[rule.index("-s") + 1] == node.subnet(CLUSTER)
    assert rule[-1] == "127.0.0.1:29443"
