"""One side of one workload, run and measured (`run_side`): its jobs submitted in a burst or a
steady stream, timed by one watch of pods and one of the jobs on the bench's monotonic clock, with
the CPU and memory of every process of the bed (/proc), the API server's own counts of its work,
and `vigil operator` started for the Vigil side."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import math
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3

from bench.bed import Api, create_namespace, delete_namespace, log, release_vigil_pods
from bench.procfs import Sampler, cpu_seconds, machine_busy_seconds, status_kib
from bench.profiles import Profiler, ServerProfiler
from bench.workloads import native_job, vigil_job
from testbed import cluster as testbed

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
                    "v1beta1",
                    namespace,
                    "vigilqueues",
                    {
                        "apiVersion": "vigil.dev/v1beta1",
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
            else f"/apis/vigil.dev/v1beta1/namespaces/{namespace}/vigiljobs"
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
                    "vigil.dev", "v1beta1", namespace, "vigiljobs", body, _preload_content=False
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
