"""The cluster as the bench sees it: its clients (`Api`), the bench's own test bed brought up or
reused with enough kwok nodes (and kwok's stages that count Job pods' attempts), Vigil's CRDs, and
the namespaces a run lives in."""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys
import time
from pathlib import Path

import urllib3
from kubernetes import client, config

from testbed import cluster as testbed
from testbed import components

ROOT = Path(__file__).resolve().parent.parent
POD_CAPACITY = 110  # pods a kwok node of the test bed takes (its node-initialize stage)
FAILURE_COUNT = "batch.kubernetes.io/job-index-failure-count"
STAGES_ATTEMPT_LINE = '{{ $attempt := get (.metadata.labels | default dict) "vigil.dev/attempt" | default "1" | atoi }}'
# The bench's kwok stages: the test bed's, except that a pod without Vigil's attempt label takes
# its attempt number from the Job controller's per-index failure count (+1), so that one
# annotation `sim.vigil.dev/exit-code: "1,1,0"` means "fail twice, then succeed" on both sides.
STAGES_ATTEMPT_BENCH = (
    '{{ $attempt := get (.metadata.labels | default dict) "vigil.dev/attempt" | default "0" | atoi }}'
    "{{ if eq $attempt 0 }}{{ $attempt = add1 (get (.metadata.annotations | default dict) "
    f'"{FAILURE_COUNT}" | default "0" | atoi) }}}}{{{{ end }}}}'
)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Api:
    """The cluster as the bench sees it: kubernetes clients and a lean HTTP pool (watches, /metrics)."""

    def __init__(self, kubeconfig: Path, threads: int = 8):
        self.kubeconfig = kubeconfig
        conf = client.Configuration()
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=conf)
        conf.connection_pool_maxsize = max(threads, 4)
        self.conf = conf
        self.client = client.ApiClient(conf)
        self.core = client.CoreV1Api(self.client)
        self.batch = client.BatchV1Api(self.client)
        self.custom = client.CustomObjectsApi(self.client)
        self.host = conf.host.rstrip("/")
        self.headers = {}
        token = (conf.api_key or {}).get("authorization") or (conf.api_key or {}).get("BearerToken")
        if token:
            self.headers["Authorization"] = token if token.startswith("Bearer") else f"Bearer {token}"
        self.http = urllib3.PoolManager(
            num_pools=4,
            maxsize=8,
            cert_reqs="CERT_REQUIRED" if conf.verify_ssl else "CERT_NONE",
            ca_certs=conf.ssl_ca_cert,
            cert_file=conf.cert_file,
            key_file=conf.key_file,
        )

    def get(self, path: str, timeout: float = 30) -> bytes:
        resp = self.http.request("GET", self.host + path, headers=self.headers, timeout=timeout, retries=False)
        if resp.status != 200:
            raise RuntimeError(f"GET {path}: {resp.status} {resp.data[:200]!r}")
        return resp.data

    def kubectl(self, *args: str) -> str:
        built = testbed.BIN / "kubectl"
        binary = str(built) if built.exists() else "kubectl"
        result = subprocess.run([binary, "--kubeconfig", str(self.kubeconfig), *args], capture_output=True, text=True)
        if result.returncode:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout


def testbed_of(kubeconfig: Path) -> testbed.Cluster | None:
    """The local test bed whose admin kubeconfig this is, if any (its processes are then in /proc)."""
    clusters = testbed.CACHE / "clusters"
    for path in clusters.glob("*/kubeconfig"):
        with contextlib.suppress(OSError):
            if path.resolve() == kubeconfig.resolve():
                return testbed.Cluster.load(path.parent.name)
    return None


def nodes_for(jobs: int) -> int:
    """kwok nodes so that every job's pod could run at once, with a spare node."""
    return max(3, math.ceil(jobs / POD_CAPACITY) + 1)


def bench_stages() -> Path:
    text = testbed.STAGES.read_text()
    if STAGES_ATTEMPT_LINE not in text:
        raise SystemExit(f"{testbed.STAGES} changed: update STAGES_ATTEMPT_LINE in bench/bed.py")
    path = testbed.CACHE / "bench-kwok-stages.yaml"
    path.write_text(
        "# Written by bench/compare.py from testbed/kwok-stages.yaml: Job pods count attempts too.\n"
        + text.replace(STAGES_ATTEMPT_LINE, STAGES_ATTEMPT_BENCH)
    )
    return path


def kwok_config(cluster: testbed.Cluster) -> str | None:
    pid = testbed.running_pid(cluster, "kwok")
    if not pid:
        return None
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return next((a.split("=", 1)[1] for a in args if a.startswith("--config=")), None)


def own_cluster(name: str, port_base: int, nodes: int, needs_bench_stages: bool) -> testbed.Cluster:
    """Brings the bench's test bed up (or reuses it), with `nodes` kwok nodes at least, and kwok
    running the bench's stages when fail-twice needs them (kwok is restarted if it runs others)."""
    cluster = testbed.Cluster(name, testbed.Ports.from_base(port_base))
    if needs_bench_stages:
        components.STAGES = bench_stages()  # start_kwok reads it when it starts kwok
    if all(testbed.running_pid(cluster, c) for c in testbed.COMPONENTS):
        if needs_bench_stages and kwok_config(cluster) != str(components.STAGES):
            log("restarting kwok with the bench's stages (Job pods count their attempts)")
            testbed.restart(cluster, "kwok")
        names = testbed.create_nodes(cluster, nodes)
        testbed.wait_for(
            f"{nodes} Ready kwok nodes", lambda: testbed._nodes_ready(cluster, names), 120, cluster, "kwok"
        )
    else:
        testbed.up(cluster, nodes=nodes)
    return cluster


def install_crds(api: Api) -> None:
    api.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    ext = client.ApiextensionsV1Api(api.client)
    for name in ("vigiljobs.vigil.dev", "vigilqueues.vigil.dev", "vigilworkerpools.vigil.dev"):
        deadline = time.monotonic() + 60
        while not any(
            c.type == "Established" and c.status == "True"
            for c in (ext.read_custom_resource_definition(name).status.conditions or [])
        ):
            if time.monotonic() > deadline:
                raise SystemExit(f"CRD {name} not established after 60 s")
            time.sleep(0.2)


def create_namespace(api: Api, name: str) -> None:
    api.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    deadline = time.monotonic() + 60
    while not api.core.list_namespaced_service_account(name).items:  # pods are refused until it exists
        if time.monotonic() > deadline:
            raise SystemExit(f"no default ServiceAccount in {name} after 60 s")
        time.sleep(0.2)


def delete_namespace(api: Api, name: str, timeout: float) -> float:
    """Deletes the namespace and waits until it is gone; returns the seconds it took."""
    began = time.monotonic()
    with contextlib.suppress(client.ApiException):
        api.core.delete_namespace(name, propagation_policy="Background")
    while time.monotonic() - began < timeout:
        try:
            api.core.read_namespace(name)
        except client.ApiException as err:
            if err.status == 404:
                return time.monotonic() - began
            raise
        time.sleep(1)
    raise SystemExit(f"namespace {name} still there {timeout:.0f} s after its deletion")


def release_vigil_pods(api: Api, namespace: str) -> None:
    """Drops Vigil's finalizer from the pods left in `namespace` (only when its operator is gone)."""
    patch = {"metadata": {"$deleteFromPrimitiveList/finalizers": ["vigil.dev/attempt-tracking"]}}
    for pod in api.core.list_namespaced_pod(namespace).items:
        if "vigil.dev/attempt-tracking" in (pod.metadata.finalizers or []):
            with contextlib.suppress(client.ApiException):
                api.core.patch_namespaced_pod(pod.metadata.name, namespace, patch)
