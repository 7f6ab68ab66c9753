"""Vigil side by side with the batch/v1 Job controller: the same jobs, the same bed, one run.

    .venv/bin/python -m bench.compare --jobs 1000 --workloads all-succeed,fail-twice,queued --out bench/results/

For each workload, N batch/v1 Jobs (the Job controller of kube-controller-manager) and then N
VigilJobs (a `vigil operator` process the bench starts, with the admin kubeconfig, as users run
it) are submitted by 8 client threads into a fresh namespace each, one side after the other, all at
once (a burst, which keeps the machine's CPU busy) or, with `--rate R`, as a steady stream of R a
second (the load a cluster lives with: throughput follows the rate, and latency is what differs);
every pod runs for about 1 s on a kwok node and exits as the workload says. One watch of pods
and one of the jobs per run time everything on the bench's own monotonic clock. Printed as a
markdown table (and written to <out>/<timestamp>.md and .json): makespan, throughput,
p50/p95/p99 of submit -> pod created and submit -> finished, CPU seconds and peak RSS of the
operator and of kube-controller-manager, the CPU seconds of every other process of the bed
(kube-apiserver, etcd, kube-scheduler, kwok) and of the bench itself, the whole machine's busy CPU
(from /proc/stat: on this shared machine, what bounds throughput), and per job by verb and
resource the API requests, the API server's time serving them and the watch events it sent,
with the ratio Vigil / native of every figure. `--profile` adds py-spy's profile of the
operator and kube-apiserver's own (pprof), with the CPU each kind of status write costs it.

By default the bench brings up (or reuses) a local test bed of its own (name `bench`, port base
27443) with enough kwok nodes that pod capacity (110 pods a node) is never the limit, and leaves
it running (`python3 -m testbed.cluster down --name bench` stops it). `--kubeconfig PATH` runs
against another cluster instead (e.g. the test suite's); the /proc figures need it to be a local
test bed, else they are reported missing. See bench/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import math
import os
import platform
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import urllib3  # noqa: E402
from kubernetes import client, config  # noqa: E402

from testbed import cluster as testbed  # noqa: E402

WORKLOADS = ("all-succeed", "fail-twice", "queued")
KINDS = ("native", "vigil")
POD_CAPACITY = 110  # pods a kwok node of the test bed takes (its node-initialize stage)
# kube-apiserver is profiled (--profile) in chunks of this many seconds, back to back over a run.
SERVER_PROFILE_CHUNK = 10
RUN_FOR = "1s"
FAIL_SHARE = 0.3  # fail-twice: this share of the jobs fails on attempts 1 and 2
# The Job controller's default pod-failure backoff: 10 s, doubling, at most 6 min; Vigil's retry
# policy is set to the same curve without jitter for fail-twice, so both sides wait alike.
BACKOFF = {"initialSeconds": 10, "factor": 2, "maxSeconds": 360, "jitter": 0}
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


# --- the cluster ---------------------------------------------------------------------------------


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
        raise SystemExit(f"{testbed.STAGES} changed: update STAGES_ATTEMPT_LINE in bench/compare.py")
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
        testbed.STAGES = bench_stages()  # start_kwok reads it when it starts kwok
    if all(testbed.running_pid(cluster, c) for c in testbed.COMPONENTS):
        if needs_bench_stages and kwok_config(cluster) != str(testbed.STAGES):
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
    for name in ("vigiljobs.vigil.dev", "vigilqueues.vigil.dev"):
        deadline = time.monotonic() + 60
        while not any(
            c.type == "Established" and c.status == "True"
            for c in (ext.read_custom_resource_definition(name).status.conditions or [])
        ):
            if time.monotonic() > deadline:
                raise SystemExit(f"CRD {name} not established after 60 s")
            time.sleep(0.2)


# --- /proc ---------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds every process of the machine has used since boot, all cores together (the
    first line of /proc/stat, less idle and iowait): the bed, the operator, the bench and the rest."""
    with open("/proc/stat") as f:
        ticks = [int(t) for t in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


class Sampler(threading.Thread):
    """VmRSS of some processes every 0.5 s; `peak` is the largest seen, in MiB."""

    def __init__(self, pids: dict[str, int]):
        super().__init__(daemon=True)
        self.pids, self.peak = pids, dict.fromkeys(pids, 0.0)
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            self.sample()
            self.halt.wait(0.5)

    def sample(self) -> None:
        for name, pid in self.pids.items():
            with contextlib.suppress(OSError):
                self.peak[name] = max(self.peak[name], status_kib(pid, "VmRSS") / 1024)

    def stop(self) -> dict[str, float]:
        self.halt.set()
        self.join()
        self.sample()
        return self.peak


# --- apiserver_request_total ---------------------------------------------------------------------

LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def server_figures(api: Api) -> dict[str, dict[tuple[str, str], float]]:
    """The API server's own account of its work, from one scrape of its /metrics, each summed by
    (verb, resource[/subresource]): `requests` (apiserver_request_total), `request_seconds`
    (apiserver_request_duration_seconds_sum: time spent serving, waits included), and by ("WATCH",
    resource): `watch_events` and `watch_bytes` (apiserver_watch_events_total and _sizes_sum: every
    event encoded and sent to every watcher)."""
    wanted = {
        "apiserver_request_total{": "requests",
        "apiserver_request_duration_seconds_sum{": "request_seconds",
        "apiserver_watch_events_total{": "watch_events",
        "apiserver_watch_events_sizes_sum{": "watch_bytes",
    }
    figures: dict[str, dict[tuple[str, str], float]] = {name: {} for name in wanted.values()}
    for line in api.get("/metrics").decode().splitlines():
        prefix = line[: line.find("{") + 1]
        if prefix not in wanted:
            continue
        labels_part, _, value = line.rpartition(" ")
        labels = dict(LABEL.findall(labels_part))
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        key = (labels.get("verb", "WATCH"), resource)
        if wanted[prefix] == "request_seconds" and key[0] == "WATCH":
            continue  # a watch's duration is how long it stayed open, not work
        into = figures[wanted[prefix]]
        into[key] = into.get(key, 0.0) + float(value)
    return figures


def growth(before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    """What each counter gained between two scrapes (counters only grow, so the rest is left out)."""
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v > before.get(k, 0.0)}


WRITE_VERBS = {"POST", "PUT", "PATCH", "DELETE", "APPLY", "DELETECOLLECTION"}


# --- watches -------------------------------------------------------------------------------------


class Watch(threading.Thread):
    """One watch of a collection; calls on_event(type, object, arrival) for each event, arrival on
    the bench's monotonic clock. Resumes from the last resourceVersion if the server ends it."""

    def __init__(self, api: Api, path: str, on_event):
        super().__init__(daemon=True)
        self.api, self.path, self.on_event = api, path, on_event
        self.ready = threading.Event()
        self.halt = threading.Event()
        self.version = ""
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                query = {"watch": "1", "timeoutSeconds": "1800", "allowWatchBookmarks": "true"}
                if self.version:
                    query["resourceVersion"] = self.version
                resp = self.api.http.request(
                    "GET",
                    f"{self.api.host}{self.path}?{urllib.parse.urlencode(query)}",
                    headers=self.api.headers,
                    preload_content=False,
                    timeout=urllib3.Timeout(connect=10, read=None),
                    retries=False,
                )
                if resp.status != 200:
                    raise RuntimeError(f"watch {self.path}: {resp.status} {resp.read()[:200]!r}")
                self.ready.set()
                buffer = b""
                for chunk in resp.stream(65536, decode_content=True):
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line.strip():
                            self.handle(json.loads(line))
                    if self.halt.is_set():
                        break
                resp.release_conn()
        except BaseException as err:  # reported by the run, not lost in a thread
            if not self.halt.is_set():
                self.error = err
                self.ready.set()

    def handle(self, event: dict) -> None:
        now = time.monotonic()
        obj = event.get("object") or {}
        self.version = (obj.get("metadata") or {}).get("resourceVersion") or self.version
        if event.get("type") == "ERROR":
            self.version = ""  # expired: start over (the run's objects arrive again as ADDED)
            return
        if event.get("type") != "BOOKMARK":
            self.on_event(event["type"], obj, now)

    def stop(self) -> None:
        self.halt.set()


@dataclass
class Timeline:
    """What the watches saw of one run, on the bench's clock."""

    submitted: dict[str, float] = field(default_factory=dict)
    pod_created: dict[str, float] = field(default_factory=dict)  # job -> its first pod's arrival
    pods: set[str] = field(default_factory=set)  # every pod seen (attempts)
    finished: dict[str, float] = field(default_factory=dict)
    outcome: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_pod(self, kind: str, pod: dict, now: float) -> None:
        meta = pod.get("metadata") or {}
        owners = [o["name"] for o in meta.get("ownerReferences") or [] if o.get("kind") in ("Job", "VigilJob")]
        if not owners:
            return
        with self.lock:
            self.pods.add(meta.get("name", ""))
            self.pod_created.setdefault(owners[0], now)

    def on_native_job(self, kind: str, job: dict, now: float) -> None:
        for cond in (job.get("status") or {}).get("conditions") or []:
            if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
                with self.lock:
                    name = job["metadata"]["name"]
                    if name not in self.finished:
                        self.finished[name] = now
                        self.outcome[name] = "Succeeded" if cond["type"] == "Complete" else "Failed"

    def on_vigil_job(self, kind: str, job: dict, now: float) -> None:
        phase = (job.get("status") or {}).get("phase")
        if phase in ("Succeeded", "DeadLettered"):
            with self.lock:
                name = job["metadata"]["name"]
                if name not in self.finished:
                    self.finished[name] = now
                    self.outcome[name] = "Succeeded" if phase == "Succeeded" else "Failed"


# --- the workloads -------------------------------------------------------------------------------


def pod_spec() -> dict:
    """A pod for a kwok node, as tests/support/cluster.py's simulated_pod_spec() makes it."""
    return {
        "containers": [{"name": "main", "image": "registry.invalid/vigil/sim:none"}],
        "nodeSelector": {"type": "kwok"},
        "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
    }


def fails(workload: str, i: int) -> bool:
    return workload == "fail-twice" and (i % 10) < round(FAIL_SHARE * 10)


def annotations(workload: str, i: int) -> dict:
    # The same annotations on both sides: kwok's vigil-sim stages run and finish every pod alike.
    return {"sim.vigil.dev/exit-code": "1,1,0" if fails(workload, i) else "0", "sim.vigil.dev/run-for": RUN_FOR}


def native_job(workload: str, i: int) -> dict:
    spec: dict[str, Any] = {
        "template": {
            "metadata": {"annotations": annotations(workload, i)},
            "spec": {**pod_spec(), "restartPolicy": "Never"},
        }
    }
    if workload == "fail-twice":
        # Indexed with one completion: the only shape whose pods carry their attempt number
        # (the per-index failure count, with backoffLimitPerIndex); 3 attempts as Vigil's.
        spec.update(completionMode="Indexed", completions=1, parallelism=1, backoffLimitPerIndex=2)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"job-{i}"}, "spec": spec}


def vigil_job(workload: str, i: int) -> dict:
    spec: dict[str, Any] = {
        "template": {"metadata": {"annotations": annotations(workload, i)}, "spec": pod_spec()},
        "heartbeat": {"required": False},
    }
    if workload == "fail-twice":
        spec["retry"] = {"maxAttempts": 3, "backoff": BACKOFF}
    if workload == "queued":
        spec["queue"] = "bench"
    return {"apiVersion": "vigil.dev/v1alpha1", "kind": "VigilJob", "metadata": {"name": f"job-{i}"}, "spec": spec}


# --- the operator --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sum_samples(text: str, names: Iterable[str]) -> dict[str, float]:
    """For each name, the sum of its samples in a Prometheus text exposition (0 when absent). A name
    may carry labels as printed (`vigil_jobs{phase="Running"}`): then that one sample."""
    totals = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        for name in totals:
            if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
                totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


class Operator:
    """`vigil operator` for one namespace, with the given kubeconfig, as users run it."""

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        log_path: Path,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ):
        self.metrics_port, self.health_port = free_port(), free_port()
        vigil = Path(sys.executable).with_name("vigil")
        args = [str(vigil), "operator", "-n", namespace, "--log-level", "warning"]
        # Plain HTTP on 127.0.0.1: the bench reads its own operator's metrics, nobody else can.
        args += ["--metrics-address", f"127.0.0.1:{self.metrics_port}", "--metrics-insecure"]
        args += ["--health-address", f"127.0.0.1:{self.health_port}", *extra]
        self.log_path = log_path
        with open(log_path, "ab") as out:
            self.proc = subprocess.Popen(
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {}), "KUBECONFIG": str(kubeconfig)},
            )
        self.pid = self.proc.pid

    def wait_ready(self, timeout: float = 60) -> None:
        http = urllib3.PoolManager()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"vigil operator exited ({self.proc.returncode}); see {self.log_path}")
            with contextlib.suppress(urllib3.exceptions.HTTPError):
                if http.request("GET", f"http://127.0.0.1:{self.health_port}/readyz", timeout=2).status == 200:
                    return
            time.sleep(0.2)
        raise SystemExit(f"vigil operator not ready after {timeout:.0f} s; see {self.log_path}")

    def metric(self, name: str) -> float:
        """The sum of every sample of `name` on the operator's /metrics (0 when absent); `name` may carry
        its labels as printed, e.g. `vigil_jobs{phase="Running"}`, for that one sample."""
        return self.metrics(name)[name]

    def metrics(self, *names: str) -> dict[str, float]:
        """`metric` for each of `names`, from one scrape of /metrics."""
        text = urllib3.PoolManager().request("GET", f"http://127.0.0.1:{self.metrics_port}/metrics").data.decode()
        return sum_samples(text, names)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# Frames where a thread waits rather than works: on a loaded machine a thread that has just been
# woken is runnable (not idle to py-spy) while still on top of its wait, so these are left out.
WAITS = (
    "EpollSelector.select",
    "SSLSocket.read",  # the synchronous client waiting for the API server's answer
    "_worker (",  # a pool thread waiting for work
    "poll_wait_for_socket",
    "Condition.wait",
    "Event.wait",
    "Thread._wait_for_tstate_lock",
)


def py_spy() -> Path:
    """The py-spy beside this Python (the `bench` extra), or SystemExit saying how to install it:
    called when the arguments are read, not after a run's slow start."""
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        raise SystemExit(f"--profile needs py-spy, which is not at {spy}: pip install -e '.[bench]'")
    return spy


class Profiler:
    """py-spy (the `bench` extra) sampling the operator for the run; `top` reads its stacks."""

    def __init__(self, pid: int, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        spy = py_spy()
        self.proc = subprocess.Popen(
            [str(spy), "record", "--pid", str(pid), "--rate", "100", "--function", "--nonblocking"]
            + ["--format", "raw", "--output", str(path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        self.proc.send_signal(2)  # SIGINT: py-spy writes what it sampled and exits
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def top(self, count: int) -> dict[str, list[tuple[str, float]]]:
        """The functions with the most samples, as shares of every sample of a working thread: `self`
        (on top of the stack, any code) and `total` (anywhere in it, Vigil's own functions)."""
        own: dict[str, int] = {}
        inclusive: dict[str, int] = {}
        total = 0
        if not self.path.exists():
            return {"self": [], "total": []}
        for line in self.path.read_text().splitlines():
            stack, _, samples = line.rpartition(" ")
            if not stack or not samples.isdigit():
                continue
            n = int(samples)
            frames = [f for f in stack.split(";") if not f.startswith("process ") and not f.startswith("thread ")]
            if not frames or frames[-1].startswith(WAITS):
                continue
            total += n
            own[frames[-1]] = own.get(frames[-1], 0) + n
            for frame in set(frames):
                if "vigil/" in frame:  # where in Vigil's own code the time goes
                    inclusive[frame] = inclusive.get(frame, 0) + n

        def best(table: dict[str, int]) -> list[tuple[str, float]]:
            ranked = sorted(table.items(), key=lambda kv: -kv[1])[:count]
            return [(frame, round(n / total, 4)) for frame, n in ranked]

        return {"samples": total, "self": best(own), "total": best(inclusive)}


class ServerProfiler(threading.Thread):
    """CPU profiles of kube-apiserver (Go's pprof, /debug/pprof/profile) back to back, in chunks
    of SERVER_PROFILE_CHUNK seconds, from the start of a run until the chunk running when it is
    stopped ends; merged into one profile at `path` (the run's window, give or take a chunk). The
    bench's own bed serves pprof when it runs with VIGIL_APISERVER_PROFILING=1."""

    def __init__(self, api: Api, path: Path):
        super().__init__(daemon=True)
        self.api, self.path = api, path
        self.halt = threading.Event()
        self.chunks: list[Path] = []
        self.error: str | None = None
        self.seconds = 0.0

    def run(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while not self.halt.is_set():
            try:
                data = self.api.get(
                    f"/debug/pprof/profile?seconds={SERVER_PROFILE_CHUNK}", timeout=SERVER_PROFILE_CHUNK + 30
                )
            except Exception as err:  # noqa: BLE001 - reported with the results, the run goes on
                self.error = f"no API server profile ({err}); the bed must run with VIGIL_APISERVER_PROFILING=1"
                return
            chunk = self.path.with_suffix(f".{len(self.chunks)}.pprof")
            chunk.write_bytes(data)
            self.chunks.append(chunk)
            self.seconds += SERVER_PROFILE_CHUNK

    def stop(self) -> None:
        self.halt.set()
        self.join(SERVER_PROFILE_CHUNK + 60)
        if self.chunks:
            merged = subprocess.run(
                ["go", "tool", "pprof", "-proto", *map(str, self.chunks)], capture_output=True, check=False
            )
            if merged.returncode == 0:
                self.path.write_bytes(merged.stdout)
                for chunk in self.chunks:
                    chunk.unlink()
            else:
                self.error = f"go tool pprof could not merge the profiles: {merged.stderr.decode()[:200]}"

    def summary(self, count: int = 12) -> dict[str, Any]:
        """The profile's CPU seconds, its top functions by cumulative time (callees included), and
        the CPU seconds of each request handler in SERVER_HANDLERS (what one kind of write costs
        the server, divided by the count of those writes in the report)."""
        if self.error or not self.path.exists():
            return {"error": self.error or "no profile written"}
        text = subprocess.run(
            ["go", "tool", "pprof", "-top", "-cum", "-nodecount=5000", str(self.path)],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        out: dict[str, Any] = {"file": str(self.path), "seconds": self.seconds, "cum": [], "handlers": {}}
        for line in text.splitlines():
            total = re.search(r"Total samples = ([\d.]+)(m?s)", line)
            if total:
                out["cpu_seconds"] = float(total.group(1)) / (1000 if total.group(2) == "ms" else 1)
            parts = line.split()
            if len(parts) < 6 or not parts[4].endswith("%"):
                continue
            function = " ".join(parts[5:])
            if len(out["cum"]) < count:
                out["cum"].append((function, float(parts[4].rstrip("%")) / 100))
            for request, handler in SERVER_HANDLERS.items():
                if handler == function:
                    seconds = re.fullmatch(r"([\d.]+)(m?s)", parts[3])
                    if seconds:
                        out["handlers"][request] = float(seconds.group(1)) / (1000 if seconds.group(2) == "ms" else 1)
        return out


# The server-side functions that carry out one kind of write, whole (decode, admission, validation,
# managed fields, the etcd round trip, encoding), for the profile's cost per write.
SERVER_HANDLERS = {
    "PATCH vigiljobs/status": "k8s.io/apiextensions-apiserver/pkg/registry/customresource.(*StatusREST).Update",
    "PUT jobs/status": "k8s.io/kubernetes/pkg/registry/batch/job/storage.(*StatusREST).Update",
    "PATCH pods/status": "k8s.io/kubernetes/pkg/registry/core/pod/storage.(*StatusREST).Update",
}


# --- one run -------------------------------------------------------------------------------------


def due_after(i: int, rate: float) -> float:
    """When job i of a steady stream is due, in seconds after the first: an open loop, so a side
    that falls behind meets the same arrivals as one that keeps up (a late submission goes at once)."""
    return i / rate


def default_timeout(jobs: int, rate: float | None) -> float:
    """Seconds a side may take: 2 minutes, plus a fifth of a second a job, plus the stream's length."""
    return 120 + jobs / 5 + (jobs / rate if rate else 0.0)


def percentile(values: list[float], p: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


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


def run_side(
    api: Api,
    cluster: testbed.Cluster | None,
    kind: str,
    workload: str,
    jobs: int,
    threads: int,
    timeout: float,
    workdir: Path,
    profile: Path | None = None,
    operator_args: tuple[str, ...] = (),
    rate: float | None = None,
) -> dict:
    namespace = f"bench-{kind}-{workload}-{uuid.uuid4().hex[:4]}"
    log(f"{kind} / {workload}: {jobs} jobs in namespace {namespace}")
    create_namespace(api, namespace)
    operator = None
    timeline = Timeline()
    watches: list[Watch] = []
    try:
        if kind == "vigil":
            if workload == "queued":
                api.custom.create_namespaced_custom_object(
                    "vigil.dev",
                    "v1alpha1",
                    namespace,
                    "vigilqueues",
                    {
                        "apiVersion": "vigil.dev/v1alpha1",
                        "kind": "VigilQueue",
                        "metadata": {"name": "bench"},
                        "spec": {"maxRunning": jobs, "maxQueued": max(10000, 2 * jobs)},
                    },
                )
            operator = Operator(api.kubeconfig, namespace, workdir / f"operator-{workload}.log", operator_args)
            operator.wait_ready()
        jobs_path = (
            f"/apis/batch/v1/namespaces/{namespace}/jobs"
            if kind == "native"
            else f"/apis/vigil.dev/v1alpha1/namespaces/{namespace}/vigiljobs"
        )
        on_job = timeline.on_native_job if kind == "native" else timeline.on_vigil_job
        watches = [
            Watch(api, f"/api/v1/namespaces/{namespace}/pods", timeline.on_pod),
            Watch(api, jobs_path, on_job),
        ]
        for w in watches:
            w.start()
        for w in watches:
            w.ready.wait(30)
            if w.error:
                raise w.error
        time.sleep(2)  # let the operator's start-up writes settle before the counters are read

        pids = {}
        if cluster:
            for component in testbed.COMPONENTS:
                pid = testbed.running_pid(cluster, component)
                if pid:
                    pids[component] = pid
            pids["bench"] = os.getpid()  # its submissions and watches share the machine too
        if operator:
            pids["operator"] = operator.pid
        server_before = server_figures(api)
        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        machine_before = machine_busy_seconds()
        sampler = Sampler(pids)
        sampler.start()
        profiler = Profiler(operator.pid, profile / f"profile-{workload}.txt") if operator and profile else None
        server_profiler = None
        if profile and cluster:
            where = profile / f"apiserver-{kind}-{workload}.pprof"
            server_profiler = ServerProfiler(api, where)
            server_profiler.start()

        bodies = [
            (f"job-{i}", native_job(workload, i) if kind == "native" else vigil_job(workload, i)) for i in range(jobs)
        ]

        def submit(item: tuple[int, tuple[str, dict]]) -> None:
            i, (name, body) = item
            if rate:  # pacing the stream, not waiting for a condition
                time.sleep(max(0.0, began + due_after(i, rate) - time.monotonic()))
            timeline.submitted[name] = time.monotonic()
            if kind == "native":
                api.batch.create_namespaced_job(namespace, body, _preload_content=False)
            else:
                api.custom.create_namespaced_custom_object(
                    "vigil.dev", "v1alpha1", namespace, "vigiljobs", body, _preload_content=False
                )

        began = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(submit, enumerate(bodies)))
        submitted = time.monotonic()
        log(f"{kind} / {workload}: submitted in {submitted - began:.1f} s")
        deadline = began + timeout
        last_report = began
        while len(timeline.finished) < jobs and time.monotonic() < deadline:
            for w in watches:
                if w.error:
                    raise w.error
            if operator and operator.proc.poll() is not None:
                raise SystemExit(f"vigil operator exited ({operator.proc.returncode}); see {operator.log_path}")
            if time.monotonic() - last_report > 10:
                last_report = time.monotonic()
                log(
                    f"{kind} / {workload}: {len(timeline.pod_created)} with a pod, "
                    f"{len(timeline.finished)} of {jobs} finished ({last_report - began:.0f} s)"
                )
            time.sleep(0.1)
        ended = time.monotonic()
        cpu_after = {name: cpu_seconds(pid) for name, pid in pids.items()}
        machine_busy = machine_busy_seconds() - machine_before
        if profiler:
            profiler.stop()
        peak = sampler.stop()
        server_after = server_figures(api)
        uncertain = operator.metric("vigil_attempts_uncertain_total") if operator else None
        if server_profiler:
            server_profiler.stop()  # the chunk under way ends after the run: a few seconds of quiet
    finally:
        for w in watches:
            w.stop()
        if operator:
            # The operator releases its pods' finalizers: it runs until the namespace is gone.
            try:
                cleanup = delete_namespace(api, namespace, timeout=max(300, jobs / 2))
            finally:
                operator.stop()
                release_vigil_pods(api, namespace)
        else:
            cleanup = delete_namespace(api, namespace, timeout=max(300, jobs / 2))
    log(f"{kind} / {workload}: namespace deleted in {cleanup:.0f} s")

    finished = [n for n in timeline.submitted if n in timeline.finished]
    server = {figure: growth(server_before[figure], after) for figure, after in server_after.items()}
    delta = server["requests"]
    last_finish = max(timeline.finished.values()) if timeline.finished else math.nan
    makespan = last_finish - began if len(finished) == jobs else math.nan
    to_pod = [timeline.pod_created[n] - timeline.submitted[n] for n in timeline.submitted if n in timeline.pod_created]
    to_end = [timeline.finished[n] - timeline.submitted[n] for n in finished]
    controller = "operator" if kind == "vigil" else "kube-controller-manager"
    result: dict[str, Any] = {
        "kind": kind,
        "workload": workload,
        "namespace": namespace,
        "jobs": jobs,
        "finished": len(finished),
        "succeeded": sum(1 for n in finished if timeline.outcome.get(n) == "Succeeded"),
        "pods_per_job": len(timeline.pods) / jobs,
        "rate_jobs_per_second": rate,
        "submit_seconds": submitted - began,
        "window_seconds": ended - began,
        "makespan_seconds": makespan,
        "throughput_jobs_per_second": jobs / makespan if makespan == makespan else math.nan,
        "cleanup_seconds": cleanup,
    }
    for label, values in (("submit_to_pod", to_pod), ("submit_to_finished", to_end)):
        for p in (50, 95, 99):
            result[f"{label}_p{p}_seconds"] = percentile(values, p)
    for name in pids:
        key = name.replace("kube-", "").replace("-", "_")
        result[f"{key}_cpu_seconds"] = cpu_after[name] - cpu_before[name]
        result[f"{key}_peak_rss_mib"] = peak[name]
    if cluster:  # the bed runs on this machine: the whole machine's CPU is the bed's and the bench's
        cores = os.cpu_count() or 1
        result["machine_busy_cpu_seconds"] = machine_busy
        result["machine_busy_share"] = machine_busy / (cores * (ended - began))
        result["machine_cpu_ms_per_job"] = machine_busy * 1000 / jobs
    if controller in pids:
        result["controller_cpu_seconds"] = cpu_after[controller] - cpu_before[controller]
        result["controller_peak_rss_mib"] = peak[controller]
    if "kube-controller-manager" in pids:
        result["controller_manager_vmhwm_mib"] = status_kib(pids["kube-controller-manager"], "VmHWM") / 1024
    result["api_requests_per_job"] = sum(delta.values()) / jobs
    result["api_writes_per_job"] = sum(v for (verb, _), v in delta.items() if verb in WRITE_VERBS) / jobs
    result["api_requests_by_verb_resource"] = {f"{verb} {res}": v for (verb, res), v in sorted(delta.items())}
    for figure in ("request_seconds", "watch_events", "watch_bytes"):
        by = server[figure]
        result[f"api_{figure}_by_verb_resource"] = {f"{verb} {res}": by[verb, res] for verb, res in sorted(by)}
    if uncertain is not None:
        result["vigil_attempts_uncertain_total"] = uncertain
    if profiler:
        result["profile"] = {"file": str(profiler.path), "top": profiler.top(15)}
    if server_profiler:
        result["apiserver_profile"] = server_profiler.summary()
        result["apiserver_profile"]["requests"] = result["api_requests_by_verb_resource"]
    return result


# --- the report ----------------------------------------------------------------------------------

ROWS = [
    ("jobs finished", "finished", "{:.0f}"),
    ("pods per job (attempts)", "pods_per_job", "{:.2f}"),
    ("makespan (first submit → last finished), s", "makespan_seconds", "{:.1f}"),
    ("throughput, jobs/s", "throughput_jobs_per_second", "{:.1f}"),
    ("submit → pod created p50, s", "submit_to_pod_p50_seconds", "{:.2f}"),
    ("submit → pod created p95, s", "submit_to_pod_p95_seconds", "{:.2f}"),
    ("submit → pod created p99, s", "submit_to_pod_p99_seconds", "{:.2f}"),
    ("submit → finished p50, s", "submit_to_finished_p50_seconds", "{:.2f}"),
    ("submit → finished p95, s", "submit_to_finished_p95_seconds", "{:.2f}"),
    ("submit → finished p99, s", "submit_to_finished_p99_seconds", "{:.2f}"),
    ("controller CPU s (operator / kube-controller-manager)", "controller_cpu_seconds", "{:.1f}"),
    ("controller peak RSS MiB (VmRSS sampled every 0.5 s)", "controller_peak_rss_mib", "{:.0f}"),
    ("kube-controller-manager CPU s (whole process)", "controller_manager_cpu_seconds", "{:.1f}"),
    ("kube-apiserver CPU s", "apiserver_cpu_seconds", "{:.1f}"),
    ("kube-apiserver peak RSS MiB", "apiserver_peak_rss_mib", "{:.0f}"),
    ("etcd CPU s", "etcd_cpu_seconds", "{:.1f}"),
    ("kube-scheduler CPU s", "scheduler_cpu_seconds", "{:.1f}"),
    ("kwok CPU s (every simulated kubelet)", "kwok_cpu_seconds", "{:.1f}"),
    ("the bench's own CPU s (submissions and watches)", "bench_cpu_seconds", "{:.1f}"),
    ("machine CPU s, every process (/proc/stat)", "machine_busy_cpu_seconds", "{:.1f}"),
    ("machine CPU busy, share of all cores over the run", "machine_busy_share", "{:.0%}"),
    ("machine CPU ms per job", "machine_cpu_ms_per_job", "{:.1f}"),
    ("API requests per job (all clients)", "api_requests_per_job", "{:.1f}"),
    ("API writes per job (POST/PUT/PATCH/DELETE)", "api_writes_per_job", "{:.1f}"),
]
# Figures every complete run has (the CI smoke checks them).
REQUIRED = [key for _, key, _ in ROWS]


# Below this share of the machine's CPU over a run, a side was not bound by the CPU.
CPU_BOUND_SHARE = 0.9


def not_cpu_bound(native: dict, vigil: dict) -> str | None:
    """A line for the report when a side kept the machine less than CPU_BOUND_SHARE busy: its
    makespan then holds waits and its throughput is not what the CPU allows, so the ratio of
    throughputs misleads and CPU per job is the figure to compare. A paced stream (`--rate`) is
    meant to leave the CPU room: there the waits are the arrivals, and latency is what to read."""
    idle = [
        f"{name} {side['machine_busy_share']:.0%}"
        for name, side in (("native", native), ("Vigil", vigil))
        if side.get("machine_busy_share", 1.0) < CPU_BOUND_SHARE
    ]
    if not idle:
        return None
    busy = f"machine busy {', '.join(idle)} over the run (below {CPU_BOUND_SHARE:.0%})"
    if rate := native.get("rate_jobs_per_second"):
        return (
            f"Not bound by the CPU, as a stream of {rate:g} jobs/s is meant to be: {busy}. Both sides waited "
            "for arrivals, so throughput follows the rate; compare latency and machine CPU per job."
        )
    return (
        f"Not bound by the CPU: {busy}. That side waited on something else (backoff, or a stall of the bed), "
        "so compare machine CPU per job rather than throughput."
    )


def fmt(value: Any, pattern: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return pattern.format(value)


def ratio(vigil: Any, native: Any) -> float:
    try:
        return vigil / native if native else math.nan
    except TypeError:
        return math.nan


def table(native: dict, vigil: dict) -> str:
    n = native["jobs"]
    lines = [
        f"| {native['workload']}, N = {n:,} | native Job controller | Vigil | Vigil / native |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, key, pattern in ROWS:
        lines.append(
            f"| {label} | {fmt(native.get(key), pattern)} | {fmt(vigil.get(key), pattern)} | "
            f"{fmt(ratio(vigil.get(key), native.get(key)), '{:.2f}')} |"
        )
    return "\n".join(lines)


def requests_table(native: dict, vigil: dict) -> str:
    """Per job, by verb and resource: requests, the API server's time serving them, and the watch
    events it encoded and sent (to every watcher) with their bytes."""
    n = native["jobs"]
    figures = [
        ("requests", "api_requests_by_verb_resource", 1.0, "{:.2f}"),
        ("server ms", "api_request_seconds_by_verb_resource", 1000.0, "{:.1f}"),
        ("watch events", "api_watch_events_by_verb_resource", 1.0, "{:.1f}"),
        ("watch KiB", "api_watch_bytes_by_verb_resource", 1 / 1024, "{:.1f}"),
    ]
    figures = [f for f in figures if f[1] in native and f[1] in vigil]  # results from before some figures
    keys = set().union(*(set(side[f[1]]) for f in figures for side in (native, vigil)))

    def per_job(side: dict, figure: str, key: str, scale: float) -> float:
        return side[figure].get(key, 0.0) * scale / n

    def weight(key: str) -> float:  # the busiest first: requests plus the server's seconds, per job
        return -sum(per_job(side, figure, key, 1.0) for side in (native, vigil) for _, figure, *_ in figures[:2])

    header = " | ".join(f"{name}: native | Vigil | V/n" for name, *_ in figures)
    lines = [
        f"| per job, {native['workload']} (verb resource) | {header} |",
        "| --- |" + " ---: |" * (3 * len(figures)),
    ]
    for k in sorted(keys, key=weight):
        cells = []
        shown = False
        for _, figure, scale, pattern in figures:
            a, b = per_job(native, figure, k, scale), per_job(vigil, figure, k, scale)
            shown = shown or max(a, b) >= 0.005
            cells += [fmt(a, pattern), fmt(b, pattern), fmt(ratio(b, a), "{:.2f}")]
        if shown:
            lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def profile_text(profile: dict) -> str:
    top = profile["top"]
    lines = [
        f"py-spy, the operator during the Vigil run ({top.get('samples', 0)} samples of working threads at "
        f"100 Hz, waits left out; stacks in {profile['file']})",
        "",
        "| # | function (self) | self | Vigil's function (anywhere in the stack) | total |",
        "| ---: | --- | ---: | --- | ---: |",
    ]
    for i, (own, inclusive) in enumerate(zip(top["self"], top["total"], strict=False), 1):
        lines.append(f"| {i} | `{own[0]}` | {own[1]:.1%} | `{inclusive[0]}` | {inclusive[1]:.1%} |")
    return "\n".join(lines)


def server_profile_text(native: dict, vigil: dict) -> str:
    """The two API server profiles side by side: CPU seconds, the top functions by cumulative share
    (where the time goes, callees included), and the CPU each kind of status write costs."""
    if "error" in native or "error" in vigil:
        return f"kube-apiserver profile: {native.get('error') or vigil.get('error')}"
    lines = [
        f"kube-apiserver CPU profile over each run, in {SERVER_PROFILE_CHUNK} s chunks ({native['seconds']:.0f} s "
        f"native, {vigil['seconds']:.0f} s Vigil; pprof files "
        f"{native['file']}, {vigil['file']}): {native.get('cpu_seconds', math.nan):.1f} CPU-s native, "
        f"{vigil.get('cpu_seconds', math.nan):.1f} CPU-s Vigil",
        "",
        "| # | native: function (cumulative) | share | Vigil: function (cumulative) | share |",
        "| ---: | --- | ---: | --- | ---: |",
    ]
    for i, (a, b) in enumerate(zip(native["cum"], vigil["cum"], strict=False), 1):
        lines.append(f"| {i} | `{a[0]}` | {a[1]:.1%} | `{b[0]}` | {b[1]:.1%} |")
    lines += ["", "| side | request (its handler, the etcd round trip included) | CPU-s | requests | CPU ms each |"]
    lines.append("| --- | --- | ---: | ---: | ---: |")
    for name, side in (("native", native), ("Vigil", vigil)):
        for request, seconds in side["handlers"].items():
            count = side.get("requests", {}).get(request, 0)
            handler = SERVER_HANDLERS[request].rsplit("/", 1)[-1]
            each = fmt(seconds * 1000 / count if count else math.nan, "{:.2f}")
            lines.append(f"| {name} | {request} (`{handler}`) | {seconds:.2f} | {count:.0f} | {each} |")
    return "\n".join(lines)


def setup_text(meta: dict) -> str:
    return "\n".join(
        [
            f"- when: {meta['started']} (UTC); commit {meta['commit']}; {meta['machine']}",
            f"- cluster: {meta['cluster']}; Kubernetes {meta['kubernetes']}; {meta['nodes']} kwok nodes "
            f"({POD_CAPACITY} pods each)",
            f"- baseline: kube-controller-manager {meta['kcm_flags']}",
            f"- Vigil: `vigil operator {meta.get('operator_args') or '(defaults)'}`",
            f"- load average at start: {meta['loadavg']}",
            "- each side ran alone (one after the other, each in its own namespace, deleted and gone before the "
            "next run): apiserver_request_total has no client label, so its delta is every client's requests "
            "during the run (the bench's submissions and watches, kube-scheduler, kwok, kube-controller-manager, "
            "and the operator on the Vigil side)",
            "- every pod: kwok's vigil-sim stages, run-for 1s (finish-at has whole seconds, so 0-1 s of "
            "running), annotation exit-code '0' (fail-twice: '1,1,0' for 30% of jobs, i.e. exit 1 on attempts "
            "1 and 2); native fail-twice Jobs are Indexed with completions 1 and backoffLimitPerIndex 2, their "
            "attempt read by kwok from batch.kubernetes.io/job-index-failure-count; VigilJobs: "
            "heartbeat.required false, fail-twice retry maxAttempts 3 with the Job controller's backoff "
            "(10 s doubling, no jitter); queued: VigilJobs through a VigilQueue with maxRunning = N against "
            "plain Jobs (no queue in the native controller without Kueue)",
            f"- submissions: {pace_text(meta.get('rate'), meta.get('threads', 8))}",
            "- times on the bench's monotonic clock: submit = just before the create request; pod "
            "created = the first pod's ADDED event on one pod watch; finished = the job's first event with "
            "Complete/Failed (Job) or phase Succeeded/DeadLettered (VigilJob) on one job watch",
            "- CPU: utime+stime delta from /proc over the run (first submit → last finished); RSS: VmRSS sampled "
            "every 0.5 s, max over the run; the operator is started (and ready) before the run, so its start-up "
            "is not counted",
        ]
    )


def pace_text(rate: float | None, threads: int) -> str:
    if not rate:
        return f"all at once, by {threads} client threads (a burst: both sides are bound by the machine's CPU)"
    return (
        f"a steady stream of {rate:g} jobs/s (job i due i/{rate:g} s after the first, open loop), by "
        f"{threads} client threads"
    )


def no_nan(value: Any) -> Any:
    """JSON has no NaN: a missing figure is null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: no_nan(v) for k, v in value.items()}
    return value


def git_commit() -> str:
    result = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--", "operator"], capture_output=True, text=True
    )
    return (result.stdout.strip() or "unknown") + (" (with uncommitted changes in operator/)" if dirty.stdout else "")


def kcm_flags(cluster: testbed.Cluster | None) -> str:
    pid = testbed.running_pid(cluster, "kube-controller-manager") if cluster else None
    if not pid:
        return "flags unknown (not a local test bed)"
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    flags = [a for a in args if a.startswith(("--kube-api-qps", "--kube-api-burst"))]
    return " ".join(flags) if flags else "--kube-api-qps/--kube-api-burst at their defaults (20/30)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1000, help="N: jobs per side and workload (default 1000)")
    parser.add_argument(
        "--workloads", "--workload", default="all-succeed", help=f"comma-separated, of {', '.join(WORKLOADS)}"
    )
    parser.add_argument("--kinds", default="native,vigil", help="which sides to run (default both)")
    parser.add_argument("--threads", type=int, default=8, help="client threads that submit (default 8)")
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="submit a steady stream of this many jobs a second instead of all at once (default: all at once)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="where the .md and .json go")
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds a side may take (default 120 + N/5, + N/R with --rate)"
    )
    parser.add_argument("--kubeconfig", type=Path, help="run against this cluster instead of the bench's own")
    parser.add_argument(
        "--use-existing-cluster", action="store_true", help="run against $KUBECONFIG instead of the bench's own"
    )
    parser.add_argument("--name", default="bench", help="the bench's own test bed (default bench)")
    parser.add_argument("--port-base", type=int, default=27443, help="its port base (default 27443)")
    parser.add_argument("--nodes", type=int, default=None, help="kwok nodes (default: N/110 + 1, at least 3)")
    parser.add_argument(
        "--profile", action="store_true", help="sample the operator with py-spy (pip install -e '.[bench]')"
    )
    parser.add_argument(
        "--operator-args", default="", help="more arguments for `vigil operator`, e.g. '--workers 8' (default none)"
    )
    args = parser.parse_args(argv)
    if args.profile:
        py_spy()  # before the bed starts, not after the run
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if bad := [w for w in workloads if w not in WORKLOADS] + [k for k in kinds if k not in KINDS]:
        parser.error(f"unknown workload or kind: {', '.join(bad)}")
    if args.rate is not None and args.rate <= 0:
        parser.error(f"--rate must be a number of jobs a second above 0, not {args.rate:g}")
    timeout = args.timeout or default_timeout(args.jobs, args.rate)
    nodes = args.nodes or nodes_for(args.jobs)

    kubeconfig = args.kubeconfig
    if args.use_existing_cluster and not kubeconfig:
        if not os.environ.get("KUBECONFIG"):
            parser.error("--use-existing-cluster needs $KUBECONFIG")
        kubeconfig = Path(os.environ["KUBECONFIG"])
    if kubeconfig:
        cluster = testbed_of(kubeconfig)
        if "fail-twice" in workloads:
            log(
                "note: fail-twice needs kwok to count Job pods' attempts (the bench's stages); on another "
                "cluster, native fail-twice Jobs fail on every attempt"
            )
        if cluster:
            names = testbed.create_nodes(cluster, nodes)
            testbed.wait_for(
                f"{nodes} Ready kwok nodes", lambda: testbed._nodes_ready(cluster, names), 120, cluster, "kwok"
            )
    else:
        if args.profile:  # a bed brought up now serves pprof; one already up must be brought down first
            os.environ["VIGIL_APISERVER_PROFILING"] = "1"
        cluster = own_cluster(args.name, args.port_base, nodes, "fail-twice" in workloads)
        kubeconfig = cluster.kubeconfig
    api = Api(kubeconfig, args.threads)
    install_crds(api)
    version = json.loads(api.get("/version")).get("gitVersion", "unknown")
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    meta = {
        "started": started,
        "commit": git_commit(),
        "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.system()} "
        f"{platform.release()}",
        "cluster": f"local test bed {cluster.name!r}" if cluster else f"kubeconfig {kubeconfig}",
        "kubernetes": version,
        "nodes": len(api.core.list_node(label_selector="type=kwok").items),
        "kcm_flags": kcm_flags(cluster),
        "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "jobs": args.jobs,
        "threads": args.threads,
        "rate": args.rate,
        "workloads": workloads,
        "operator_args": args.operator_args,
    }
    workdir = Path(tempfile.mkdtemp(prefix="vigil-bench-"))
    log(f"operator logs in {workdir}")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    profile = args.out / f"{stamp}-profile" if args.profile else None
    results: dict[str, dict[str, dict]] = {}
    for workload in workloads:
        results[workload] = {}
        for kind in kinds:
            results[workload][kind] = run_side(
                api,
                cluster,
                kind,
                workload,
                args.jobs,
                args.threads,
                timeout,
                workdir,
                profile,
                tuple(shlex.split(args.operator_args)),
                args.rate,
            )
            partial = args.out / f"{stamp}.partial.json"  # what has run so far, should a later run fail
            args.out.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps(no_nan({"meta": meta, "results": results}), indent=1) + "\n")

    pace = f", {args.rate:g} jobs/s" if args.rate else ""
    report = [f"# Vigil vs the batch/v1 Job controller, N = {args.jobs:,}{pace}", "", setup_text(meta), ""]
    for workload in workloads:
        sides = results[workload]
        if set(sides) == set(KINDS):
            report += [table(sides["native"], sides["vigil"]), ""]
            if note := not_cpu_bound(sides["native"], sides["vigil"]):
                report += [note, ""]
            report += [requests_table(sides["native"], sides["vigil"]), ""]
            if "profile" in sides["vigil"]:
                report += [profile_text(sides["vigil"]["profile"]), ""]
            if "apiserver_profile" in sides["vigil"] and "apiserver_profile" in sides["native"]:
                profiles = sides["native"]["apiserver_profile"], sides["vigil"]["apiserver_profile"]
                report += [server_profile_text(*profiles), ""]
            if "vigil_attempts_uncertain_total" in sides["vigil"]:
                report += [
                    f"vigil_attempts_uncertain_total: {sides['vigil']['vigil_attempts_uncertain_total']:.0f}",
                    "",
                ]
        else:
            for kind, side in sides.items():
                shown = {k: v for k, v in side.items() if k != "profile"}
                report += [f"## {workload}, {kind}", "```json", json.dumps(no_nan(shown), indent=1), "```", ""]
                if "profile" in side:
                    report += [profile_text(side["profile"]), ""]
    text = "\n".join(report)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stamp}.md").write_text(text + "\n")
    (args.out / f"{stamp}.partial.json").unlink(missing_ok=True)
    (args.out / f"{stamp}.json").write_text(json.dumps(no_nan({"meta": meta, "results": results}), indent=1) + "\n")
    log(f"wrote {args.out / (stamp + '.md')} and .json")
    return 0 if all(s["finished"] == s["jobs"] for w in results.values() for s in w.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
