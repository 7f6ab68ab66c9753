"""Task arrays (issue 44) side by side with a batch/v1 Indexed Job: the same tasks, the same bed, one run.

    .venv/bin/python -m bench.arrays                      # --tasks 10000 --parallelism 100
    .venv/bin/python -m bench.arrays --burst              # --burst-arrays 600 --burst-tasks 1000
    .venv/bin/python -m bench.arrays --big                # --big-tasks 100000 --big-seconds 240

Three scenarios, each with both sides (`--kinds native,vigil`), one side after the other in a fresh
namespace each, on the bench's own test bed (name `barr`, port base 28443, brought up or reused as
bench.compare does: kwok nodes, kube-controller-manager with its client limit raised, its audit log),
or on `--kubeconfig`'s cluster:

- the default, throughput: one VigilJob with `spec.tasks.count: N` against one Indexed Job of N
  completions, the same parallelism, every pod on kwok running 1 s and exiting 0 (bench.compare's
  all-succeed pods), `heartbeat.required: false` as bench.compare's VigilJobs. Reported: makespan
  and tasks/s, submit -> pod created per task (p50/p95/p99: the first pod of each index on one pod
  watch, minus the job's submission, on the bench's monotonic clock), how full the parallelism was
  kept, the controller's API writes per task (from the API server's audit log, by User-Agent:
  `vigil/...` against `kube-controller-manager/...`), every client's requests and writes per task
  (apiserver_request_total, as bench.compare), CPU seconds and peak RSS of the operator and of
  kube-controller-manager and of the rest of the bed (/proc), and the job's status size in bytes.
- `--burst`: M arrays of K tasks (VigilJobs in a paused VigilQueue, so nothing runs: the burst is
  about admission and durability) against M suspended Indexed Jobs of K completions, created all at
  once by `--burst-threads` client threads. Reported: every create's answer (2xx or not) and its
  latency as the client saw it, the API server's own time per create (audit log: received ->
  answered), whether every acknowledged object is then readable (a GET each) and still there once
  the controller has seen them all, the time until the controller has written each one's status
  (the VigilJob's phase, the Job's Suspended condition), and on Vigil's side the queue's depth
  (VigilQueue status.queued, in tasks) sampled every 0.5 s.
- `--big`: one array of `--big-tasks` tasks (parallelism `--parallelism`) against one Indexed Job of
  as many completions, each run `--big-seconds` from its submission. Reported: the controller's RSS
  before the submission and once the first `parallelism` pods exist, and its peak; the status size
  then and every 10 s; tasks succeeded in the window.

`--throughput` with `--burst` or `--big` runs the default scenario too. Written to
<out>/arrays-<scenarios>-<UTC>.md (the tables) and .json (every figure). See bench/README.md,
"Task arrays against an Indexed Job".
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime as dt
import json
import math
import os
import platform
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kubernetes import client  # noqa: E402

from bench import results_out  # noqa: E402
from bench.bed import (  # noqa: E402
    Api,
    create_namespace,
    delete_namespace,
    install_crds,
    log,
    nodes_for,
    own_cluster,
    release_vigil_pods,
    testbed_of,
)
from bench.compare import git_commit, kcm_flags  # noqa: E402
from bench.measure import WRITE_VERBS, Operator, Watch, growth, percentile, server_figures  # noqa: E402
from bench.procfs import Sampler, cpu_seconds, machine_busy_seconds, status_kib  # noqa: E402
from bench.report import fmt, no_nan, ratio  # noqa: E402
from bench.workloads import KINDS, annotations, pod_spec  # noqa: E402
from testbed import cluster as testbed  # noqa: E402

GROUP, VERSION = "vigil.dev", "v1beta1"
AUDIT_WRITES = ("create", "update", "patch", "delete", "deletecollection")
NATIVE_INDEX = "batch.kubernetes.io/job-completion-index"  # annotation and label of an Indexed Job's pod
VIGIL_INDEX = "vigil.dev/task-index"
QUEUE = "burst"


# --- the jobs ------------------------------------------------------------------------------------


def native_array(name: str, tasks: int, parallelism: int, suspend: bool = False) -> dict:
    """An Indexed Job of `tasks` completions whose pods run 1 s on kwok and exit 0."""
    spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": tasks,
        "parallelism": parallelism,
        "template": {
            "metadata": {"annotations": annotations("all-succeed", 0)},
            "spec": {**pod_spec(), "restartPolicy": "Never"},
        },
    }
    if suspend:
        spec["suspend"] = True
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec}


def vigil_array(name: str, tasks: int, parallelism: int, queue: str | None = None) -> dict:
    """A VigilJob of `tasks` tasks doing the same (bench.workloads.vigil_job's template and heartbeat)."""
    spec: dict[str, Any] = {
        "tasks": {"count": tasks, "parallelism": parallelism},
        "template": {"metadata": {"annotations": annotations("all-succeed", 0)}, "spec": pod_spec()},
        "heartbeat": {"required": False},
    }
    if queue:
        spec["queue"] = queue
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VigilJob", "metadata": {"name": name}, "spec": spec}


def create(api: Api, kind: str, namespace: str, body: dict) -> dict:
    if kind == "native":
        return api.batch.create_namespaced_job(namespace, body).to_dict()
    return api.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "vigiljobs", body)


def read(api: Api, kind: str, namespace: str, name: str) -> dict:
    """The job as the API server stores it, as JSON (camelCase keys on both sides)."""
    if kind == "native":
        return json.loads(api.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}"))
    return json.loads(api.get(f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/vigiljobs/{name}"))


def size(value: Any) -> int:
    """Bytes of `value` as compact JSON (what the API server stores and sends, give or take)."""
    return len(json.dumps(value, separators=(",", ":")).encode())


def status_parts(status: dict) -> dict[str, float]:
    """An array's status in bytes by part (docs/capacity-planning.md's table): the whole, status.tasks,
    its `active` records (and bytes per record), its `failed` records (and per record), its index
    ranges, and the rest of status.tasks (counts, progress, redrives)."""
    tasks = status.get("tasks") or {}
    active, failed = tasks.get("active") or [], tasks.get("failed") or []
    ranges = {k: v for k, v in tasks.items() if k.endswith("Indexes")}
    rest = {k: v for k, v in tasks.items() if k not in ("active", "failed") and k not in ranges}
    return {
        "status": size(status),
        "tasks": size(tasks),
        "active_records": len(active),
        "active": size(active),
        "per_active_record": size(active) / len(active) if active else math.nan,
        "failed_records": len(failed),
        "failed": size(failed),
        "per_failed_record": size(failed) / len(failed) if failed else math.nan,
        "index_ranges": size(ranges),
        "counts_and_the_rest": size(rest),
        "outside_tasks": size({k: v for k, v in status.items() if k != "tasks"}),
    }


def check_arrays_landed(created: dict) -> None:
    if not ((created.get("spec") or {}).get("tasks") or {}).get("count"):
        raise SystemExit(
            "the VigilJob CRD dropped spec.tasks (task arrays have not landed in crds/ yet): run the native side "
            "alone with --kinds native"
        )


def jobs_path(kind: str, namespace: str) -> str:
    if kind == "native":
        return f"/apis/batch/v1/namespaces/{namespace}/jobs"
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/vigiljobs"


def job_done(kind: str, job: dict) -> str | None:
    """Succeeded / Failed once the job has finished, else None."""
    status = job.get("status") or {}
    if kind == "native":
        for cond in status.get("conditions") or []:
            if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
                return "Succeeded" if cond["type"] == "Complete" else "Failed"
        return None
    phase = status.get("phase")
    return {"Succeeded": "Succeeded", "DeadLettered": "Failed"}.get(phase)


def tasks_succeeded(kind: str, job: dict) -> int:
    status = job.get("status") or {}
    if kind == "native":
        return int(status.get("succeeded") or 0)
    return int((status.get("tasks") or {}).get("succeeded") or 0)


# --- what the watches see ------------------------------------------------------------------------


@dataclass
class Tasks:
    """One array's tasks as one pod watch and one job watch saw them, on the bench's clock."""

    kind: str
    submitted: float = math.nan
    pod_created: dict[int, float] = field(default_factory=dict)  # index -> its first pod's arrival
    pods: dict[str, float] = field(default_factory=dict)  # pod -> its ADDED arrival
    ended: dict[str, float] = field(default_factory=dict)  # pod -> arrival of its terminal phase
    succeeded: set[int] = field(default_factory=set)  # indexes with a Succeeded pod
    finished: float = math.nan
    outcome: str | None = None
    status_bytes_max: int = 0
    largest_status: dict = field(default_factory=dict)
    job_events: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def index_of(self, meta: dict) -> int | None:
        key = NATIVE_INDEX if self.kind == "native" else VIGIL_INDEX
        value = (meta.get("annotations") or {}).get(key) or (meta.get("labels") or {}).get(key)
        return int(value) if value is not None else None

    def on_pod(self, kind: str, pod: dict, now: float) -> None:
        meta = pod.get("metadata") or {}
        index = self.index_of(meta)
        if index is None:
            return
        name = meta.get("name", "")
        phase = (pod.get("status") or {}).get("phase")
        with self.lock:
            self.pods.setdefault(name, now)
            self.pod_created.setdefault(index, now)
            if phase in ("Succeeded", "Failed") and name not in self.ended:
                self.ended[name] = now
                if phase == "Succeeded":
                    self.succeeded.add(index)

    def on_job(self, kind: str, job: dict, now: float) -> None:
        with self.lock:
            self.job_events += 1
            status = job.get("status") or {}
            if (bytes_ := size(status)) > self.status_bytes_max:
                self.status_bytes_max, self.largest_status = bytes_, status
            if self.outcome is None and (outcome := job_done(self.kind, job)):
                self.outcome, self.finished = outcome, now

    def in_flight_share(self, parallelism: int, until: float) -> float:
        """Pods in flight (created, not yet seen finished), on average from the submission to
        `until`, as a share of the parallelism: how full the controller kept it."""
        span = until - self.submitted
        if not span > 0:
            return math.nan
        with self.lock:
            alive = sum(min(self.ended.get(n, until), until) - t for n, t in self.pods.items() if t < until)
        return alive / span / parallelism


def watch_side(api: Api, kind: str, namespace: str, on_pod, on_job) -> list[Watch]:
    watches = [
        Watch(api, f"/api/v1/namespaces/{namespace}/pods", on_pod),
        Watch(api, jobs_path(kind, namespace), on_job),
    ]
    for w in watches:
        w.start()
    for w in watches:
        w.ready.wait(30)
        if w.error:
            raise w.error
    return watches


def check_watches(watches: list[Watch], operator: Operator | None) -> None:
    for w in watches:
        if w.error:
            raise w.error
    if operator and operator.proc.poll() is not None:
        raise SystemExit(f"vigil operator exited ({operator.proc.returncode}); see {operator.log_path}")


# --- the bed's processes -------------------------------------------------------------------------


def bed_pids(cluster: testbed.Cluster | None, operator: Operator | None) -> dict[str, int]:
    pids = {}
    if cluster:
        for component in testbed.COMPONENTS:
            if pid := testbed.running_pid(cluster, component):
                pids[component] = pid
        pids["bench"] = os.getpid()
    if operator:
        pids["operator"] = operator.pid
    return pids


def key_of(component: str) -> str:
    return component.replace("kube-", "").replace("-", "_")


@dataclass
class Usage:
    """CPU seconds and peak RSS of the bed's processes over a window, and the machine's busy CPU."""

    pids: dict[str, int]
    cpu: dict[str, float] = field(default_factory=dict)
    machine: float = 0.0
    sampler: Sampler | None = None

    def start(self) -> Usage:
        self.cpu = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self.machine = machine_busy_seconds()
        self.sampler = Sampler(self.pids)
        self.sampler.start()
        return self

    def rss_mib(self, name: str) -> float:
        pid = self.pids.get(name)
        return status_kib(pid, "VmRSS") / 1024 if pid else math.nan

    def stop(self, seconds: float, controller: str) -> dict[str, float]:
        cpu = {name: cpu_seconds(pid) - self.cpu[name] for name, pid in self.pids.items()}
        machine = machine_busy_seconds() - self.machine
        peak = self.sampler.stop() if self.sampler else {}
        out: dict[str, float] = {}
        for name in self.pids:
            out[f"{key_of(name)}_cpu_seconds"] = cpu[name]
            out[f"{key_of(name)}_peak_rss_mib"] = peak.get(name, math.nan)
        if controller in self.pids:
            out["controller_cpu_seconds"] = cpu[controller]
            out["controller_peak_rss_mib"] = peak.get(controller, math.nan)
        if "kube-apiserver" in self.pids:  # the local test bed: the machine is the bed's
            out["machine_busy_cpu_seconds"] = machine
            out["machine_busy_share"] = machine / ((os.cpu_count() or 1) * seconds) if seconds > 0 else math.nan
        return out


def controller_of(kind: str) -> str:
    return "operator" if kind == "vigil" else "kube-controller-manager"


# --- the audit log: who wrote what ---------------------------------------------------------------


def utc_stamp(when: float | None = None) -> str:
    """A wall-clock time as the audit log writes it (RFC 3339, microseconds, Z): comparable as text."""
    moment = dt.datetime.fromtimestamp(time.time() if when is None else when, dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def client_of(event: dict) -> str:
    """Which process of the bed sent a request, from its User-Agent."""
    agent = event.get("userAgent") or ""
    if agent.startswith("vigil/"):
        return "operator"
    for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
        if agent.startswith(name):
            return name
    if agent.startswith(("OpenAPI-Generator", "python-urllib3", "kubectl")):
        return "bench"
    return agent.split("/", 1)[0] or "unknown"


def audit_events(cluster: testbed.Cluster, namespace: str, since: str, until: str) -> tuple[list[dict], bool]:
    """The writes the API server answered in `namespace` between two stamps (audit log and its
    rotated files), and whether the files reach back to `since` (none rotated away)."""
    events, oldest = [], None
    for path in sorted(cluster.logs.glob("audit*.log")):
        with open(path, errors="replace") as f:
            with contextlib.suppress(ValueError, KeyError):
                first = json.loads(f.readline())["requestReceivedTimestamp"]
                oldest = first if oldest is None else min(oldest, first)
            f.seek(0)
            if utc_stamp(path.stat().st_mtime) < since:
                continue  # rotated away before the window began: nothing of it inside
            for line in f:
                if namespace not in line:
                    continue
                event = json.loads(line)
                ref = event.get("objectRef") or {}
                if (
                    event.get("stage") == "ResponseComplete"
                    and event.get("verb") in AUDIT_WRITES
                    and ref.get("namespace") == namespace
                    and since <= event.get("requestReceivedTimestamp", "") <= until
                ):
                    events.append(event)
    return events, oldest is not None and oldest <= since


def what(event: dict) -> str:
    ref = event.get("objectRef") or {}
    resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
    return f"{event.get('verb')} {resource}"


def audit_figures(
    cluster: testbed.Cluster | None, namespace: str, since: str, until: str, kind: str, tasks: int
) -> dict[str, Any]:
    """The controller's writes per task (and by verb and resource), every client's writes."""
    if not cluster:
        return {}
    events, complete = audit_events(cluster, namespace, since, until)
    controller = controller_of(kind)
    by_client = Counter(client_of(e) for e in events)
    mine = [e for e in events if client_of(e) == controller]
    status = "vigiljobs/status" if kind == "vigil" else "jobs/status"
    return {
        "audit_complete": complete,
        "writes_by_client": dict(by_client.most_common()),
        "controller_writes": len(mine),
        "controller_writes_per_task": len(mine) / tasks,
        "controller_writes_by_verb_resource": dict(Counter(what(e) for e in mine).most_common()),
        "controller_writes_refused": sum(1 for e in mine if (e.get("responseStatus") or {}).get("code", 200) >= 300),
        "controller_users": dict(Counter((e.get("user") or {}).get("username", "") for e in mine).most_common()),
        "job_status_writes": sum(1 for e in mine if what(e).split(" ", 1)[1] == status),
    }


def server_seconds(event: dict) -> float:
    """The API server's time on one request: received -> answered (its audit stages)."""

    def at(stamp: str) -> float:
        return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()

    return at(event["stageTimestamp"]) - at(event["requestReceivedTimestamp"])


# --- the default scenario: one array against one Indexed Job -------------------------------------


def start_operator(api: Api, namespace: str, workdir: Path, name: str, extra: tuple[str, ...]) -> Operator:
    operator = Operator(api.kubeconfig, namespace, workdir / f"operator-{name}.log", extra)
    operator.wait_ready()
    return operator


def cleanup(api: Api, namespace: str, operator: Operator | None, timeout: float) -> float:
    """Deletes the namespace (the operator running, to release its pods' finalizers); its seconds."""
    try:
        return delete_namespace(api, namespace, timeout=timeout)
    finally:
        if operator:
            operator.stop()
            release_vigil_pods(api, namespace)


def run_throughput(
    api: Api,
    cluster: testbed.Cluster | None,
    kind: str,
    tasks: int,
    parallelism: int,
    timeout: float,
    workdir: Path,
    operator_args: tuple[str, ...],
) -> dict[str, Any]:
    namespace = f"barr-{kind}-{uuid.uuid4().hex[:4]}"
    log(f"{kind}: one array of {tasks:,} tasks, parallelism {parallelism}, in namespace {namespace}")
    create_namespace(api, namespace)
    operator, watches = None, []
    seen = Tasks(kind)
    controller = controller_of(kind)
    try:
        if kind == "vigil":
            operator = start_operator(api, namespace, workdir, f"throughput-{tasks}", operator_args)
        watches = watch_side(api, kind, namespace, seen.on_pod, seen.on_job)
        time.sleep(2)  # the operator's start-up writes settle before the counters are read
        usage = Usage(bed_pids(cluster, operator)).start()
        server_before = server_figures(api)
        since = utc_stamp()
        body = (native_array if kind == "native" else vigil_array)("array", tasks, parallelism)
        seen.submitted = time.monotonic()
        created = create(api, kind, namespace, body)
        if kind == "vigil":
            check_arrays_landed(created)
        deadline, last_report = seen.submitted + timeout, seen.submitted
        while seen.outcome is None and time.monotonic() < deadline:
            check_watches(watches, operator)
            if time.monotonic() - last_report > 10:
                last_report = time.monotonic()
                log(
                    f"{kind}: {len(seen.pod_created):,} tasks with a pod, {len(seen.succeeded):,} of {tasks:,} "
                    f"succeeded ({last_report - seen.submitted:.0f} s)"
                )
            time.sleep(0.1)
        ended = time.monotonic()
        until = utc_stamp()
        figures = usage.stop(ended - seen.submitted, controller)
        server_after = server_figures(api)
        final = read(api, kind, namespace, "array")
    finally:
        for w in watches:
            w.stop()
        removed = cleanup(api, namespace, operator, timeout=max(300, tasks / 10))
    log(f"{kind}: namespace deleted in {removed:.0f} s")

    delta = growth(server_before["requests"], server_after["requests"])
    makespan = seen.finished - seen.submitted
    to_pod = [t - seen.submitted for t in seen.pod_created.values()]
    created_at = sorted(seen.pod_created.values())
    result: dict[str, Any] = {
        "kind": kind,
        "namespace": namespace,
        "tasks": tasks,
        "parallelism": parallelism,
        "outcome": seen.outcome,
        "succeeded_tasks": tasks_succeeded(kind, final),
        "tasks_with_a_pod": len(seen.pod_created),
        "pods": len(seen.pods),
        "pods_per_task": len(seen.pods) / tasks,
        "makespan_seconds": makespan,
        "throughput_tasks_per_second": tasks / makespan if makespan > 0 else math.nan,
        "submit_to_first_pod_seconds": created_at[0] - seen.submitted if created_at else math.nan,
        "submit_to_parallelism_pods_seconds": (
            created_at[parallelism - 1] - seen.submitted if len(created_at) >= parallelism else math.nan
        ),
        "in_flight_share": seen.in_flight_share(parallelism, seen.finished if makespan > 0 else ended),
        "cleanup_seconds": removed,
        "final_status_bytes": size(final.get("status") or {}),
        "final_object_bytes": size(final),
        "max_status_bytes_seen": seen.status_bytes_max,
        "job_watch_events": seen.job_events,
        **figures,
    }
    for p in (50, 95, 99):
        result[f"submit_to_pod_p{p}_seconds"] = percentile(to_pod, p)
    result["controller_cpu_ms_per_task"] = result.get("controller_cpu_seconds", math.nan) * 1000 / tasks
    if "machine_busy_cpu_seconds" in result:
        result["machine_cpu_ms_per_task"] = result["machine_busy_cpu_seconds"] * 1000 / tasks
    result["api_requests_per_task"] = sum(delta.values()) / tasks
    result["api_writes_per_task"] = sum(v for (verb, _), v in delta.items() if verb in WRITE_VERBS) / tasks
    result["api_requests_by_verb_resource"] = {f"{verb} {res}": v for (verb, res), v in sorted(delta.items())}
    result.update(audit_figures(cluster, namespace, since, until, kind, tasks))
    if kind == "vigil":
        result["final_status_tasks"] = {
            k: v for k, v in ((final.get("status") or {}).get("tasks") or {}).items() if k != "failed"
        }
        result["largest_status_parts"] = status_parts(seen.largest_status)
        result["final_status_parts"] = status_parts(final.get("status") or {})
    return result


THROUGHPUT_ROWS = [
    ("tasks succeeded", "succeeded_tasks", "{:,.0f}"),
    ("pods per task", "pods_per_task", "{:.3f}"),
    ("makespan (submit → job finished, on its watch), s", "makespan_seconds", "{:.1f}"),
    ("**throughput, tasks/s**", "throughput_tasks_per_second", "{:.1f}"),
    ("submit → first pod, s", "submit_to_first_pod_seconds", "{:.2f}"),
    ("submit → `parallelism` pods created, s", "submit_to_parallelism_pods_seconds", "{:.2f}"),
    ("**submit → pod created p50**, s", "submit_to_pod_p50_seconds", "{:.1f}"),
    ("submit → pod created p95, s", "submit_to_pod_p95_seconds", "{:.1f}"),
    ("**submit → pod created p99**, s", "submit_to_pod_p99_seconds", "{:.1f}"),
    ("pods in flight, mean share of the parallelism", "in_flight_share", "{:.0%}"),
    (
        "**controller API writes per task** (audit log: vigil/ or kube-controller-manager/)",
        "controller_writes_per_task",
        "{:.2f}",
    ),
    ("job status writes by the controller", "job_status_writes", "{:,.0f}"),
    ("API writes per task, every client (apiserver_request_total)", "api_writes_per_task", "{:.2f}"),
    ("API requests per task, every client", "api_requests_per_task", "{:.2f}"),
    ("**controller CPU s** (operator / kube-controller-manager)", "controller_cpu_seconds", "{:.1f}"),
    ("controller CPU ms per task", "controller_cpu_ms_per_task", "{:.2f}"),
    ("**controller peak RSS MiB**", "controller_peak_rss_mib", "{:.0f}"),
    ("kube-controller-manager CPU s (whole process)", "controller_manager_cpu_seconds", "{:.1f}"),
    ("kube-apiserver CPU s", "apiserver_cpu_seconds", "{:.1f}"),
    ("etcd CPU s", "etcd_cpu_seconds", "{:.1f}"),
    ("kube-scheduler CPU s", "scheduler_cpu_seconds", "{:.1f}"),
    ("kwok CPU s", "kwok_cpu_seconds", "{:.1f}"),
    ("the bench's own CPU s (its watches)", "bench_cpu_seconds", "{:.1f}"),
    ("machine CPU busy over the run", "machine_busy_share", "{:.0%}"),
    ("machine CPU ms per task, every process", "machine_cpu_ms_per_task", "{:.1f}"),
    ("**final status, bytes** (compact JSON)", "final_status_bytes", "{:,.0f}"),
    ("largest status on the job watch, bytes", "max_status_bytes_seen", "{:,.0f}"),
    ("final object, bytes", "final_object_bytes", "{:,.0f}"),
]
# Figures every complete throughput run has (the smoke test checks them; the /proc and audit
# figures only on a local test bed).
REQUIRED = [key for _, key, _ in THROUGHPUT_ROWS if key not in ("job_status_writes",)]


def side_table(title: str, rows: list[tuple[str, str, str]], sides: dict[str, dict]) -> str:
    native, vigil = sides.get("native", {}), sides.get("vigil", {})
    lines = [f"| {title} | Vigil | native | Vigil / native |", "| --- | ---: | ---: | ---: |"]
    for label, key, pattern in rows:
        a, b = vigil.get(key), native.get(key)
        lines.append(f"| {label} | {fmt(a, pattern)} | {fmt(b, pattern)} | {fmt(ratio(a, b), '{:.2f}')} |")
    return "\n".join(lines)


def writes_table(sides: dict[str, dict], per: float, unit: str, key: str = "controller_writes_by_verb_resource") -> str:
    """The controller's writes by verb and resource, per `unit`."""
    if not all(key in side for side in sides.values()):
        return ""
    lines = [f"| the controller's writes per {unit}, by verb and resource | Vigil | native |", "| --- | ---: | ---: |"]
    keys = sorted(set().union(*(side[key] for side in sides.values())))
    for k in keys:
        cells = [fmt(sides[s][key].get(k, 0) / per if s in sides else math.nan, "{:.3f}") for s in ("vigil", "native")]
        lines.append(f"| {k} | {' | '.join(cells)} |")
    others = {s: side.get("writes_by_client", {}) for s, side in sides.items()}
    lines += ["", "| every client's writes in the window (audit log) | Vigil | native |", "| --- | ---: | ---: |"]
    for who in sorted(set().union(*others.values())):
        lines.append(f"| {who} | {others.get('vigil', {}).get(who, 0):,} | {others.get('native', {}).get(who, 0):,} |")
    return "\n".join(lines)


# --- --burst: many arrays at once, in a paused queue -------------------------------------------


class QueueDepth(threading.Thread):
    """The VigilQueue's status every 0.5 s: (seconds since `began`, queued, running)."""

    def __init__(self, api: Api, namespace: str, began: float):
        super().__init__(daemon=True)
        self.api, self.namespace, self.began = api, namespace, began
        self.samples: list[tuple[float, int, int]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/vigilqueues/{QUEUE}"
        while not self.halt.is_set():
            with contextlib.suppress(Exception):  # a slow read is a missing sample, not a failed bench
                status = json.loads(self.api.get(path, timeout=5)).get("status") or {}
                self.samples.append(
                    (time.monotonic() - self.began, int(status.get("queued") or 0), int(status.get("running") or 0))
                )
            self.halt.wait(0.5)

    def stop(self) -> list[tuple[float, int, int]]:
        self.halt.set()
        self.join()
        return self.samples


def acknowledged_by_controller(kind: str, job: dict) -> bool:
    """The controller has written this job's status: the Job's Suspended condition, the VigilJob's phase."""
    status = job.get("status") or {}
    if kind == "native":
        return any(c.get("type") == "Suspended" and c.get("status") == "True" for c in status.get("conditions") or [])
    return bool(status.get("phase"))


def run_burst(
    api: Api,
    cluster: testbed.Cluster | None,
    kind: str,
    arrays: int,
    tasks: int,
    threads: int,
    timeout: float,
    workdir: Path,
    operator_args: tuple[str, ...],
) -> dict[str, Any]:
    namespace = f"barr-burst-{kind}-{uuid.uuid4().hex[:4]}"
    log(f"{kind}: a burst of {arrays:,} arrays of {tasks:,} tasks, in namespace {namespace}")
    create_namespace(api, namespace)
    operator, watches, depth = None, [], None
    controller = controller_of(kind)
    seen: dict[str, float] = {}  # job -> arrival of its first status written by the controller
    lock = threading.Lock()

    def on_job(_type: str, job: dict, now: float) -> None:
        if acknowledged_by_controller(kind, job):
            with lock:
                seen.setdefault(job["metadata"]["name"], now)

    answers: dict[str, tuple[int, float, float]] = {}  # job -> (HTTP code, sent, answered)
    try:
        if kind == "vigil":
            queue = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "VigilQueue",
                "metadata": {"name": QUEUE},
                "spec": {"paused": True, "maxRunning": 100, "maxQueued": min(10_000_000, 2 * arrays * tasks)},
            }
            api.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "vigilqueues", queue)
            operator = start_operator(api, namespace, workdir, f"burst-{arrays}x{tasks}", operator_args)
        watches = watch_side(api, kind, namespace, lambda *_: None, on_job)
        time.sleep(2)
        usage = Usage(bed_pids(cluster, operator)).start()
        since = utc_stamp()
        began = time.monotonic()
        if kind == "vigil":
            depth = QueueDepth(api, namespace, began)
            depth.start()

        def submit(i: int) -> None:
            name = f"array-{i}"
            body = (
                native_array(name, tasks, 10, suspend=True) if kind == "native" else vigil_array(name, tasks, 10, QUEUE)
            )
            sent = time.monotonic()
            try:
                created = create(api, kind, namespace, body)
                code = 201
                if kind == "vigil" and i == 0:
                    check_arrays_landed(created)
            except client.ApiException as err:
                code = err.status or 0
            except Exception as err:  # a connection that broke: no answer at all
                log(f"{name}: {err!r}")
                code = 0
            answers[name] = (code, sent, time.monotonic())

        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(submit, range(arrays)))
        submitted = time.monotonic()
        log(f"{kind}: {arrays:,} submitted in {submitted - began:.1f} s")
        acked = sorted(n for n, (code, *_) in answers.items() if 200 <= code < 300)

        # Readable: a GET of each acknowledged job, right after the burst (a quorum read, from etcd).
        def readable(name: str) -> bool:
            try:
                job = read(api, kind, namespace, name)
            except RuntimeError:
                return False
            want = (job.get("spec") or {}).get("completions" if kind == "native" else "tasks")
            return (want if kind == "native" else (want or {}).get("count")) == tasks

        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            unread = [n for n, ok in zip(acked, pool.map(readable, acked), strict=True) if not ok]

        want_depth = len(acked) * tasks
        deadline, last_report = submitted + timeout, submitted
        while time.monotonic() < deadline:
            check_watches(watches, operator)
            with lock:
                all_seen = all(n in seen for n in acked)
            deep = depth is None or (depth.samples and depth.samples[-1][1] == want_depth)
            if all_seen and deep:
                break
            if time.monotonic() - last_report > 10:
                last_report = time.monotonic()
                shown = f", queue depth {depth.samples[-1][1]:,}" if depth and depth.samples else ""
                log(f"{kind}: {len(seen):,} of {len(acked):,} seen by the controller{shown}")
            time.sleep(0.2)
        settled = time.monotonic()
        if depth:
            time.sleep(2)  # a few samples after it settled: the depth stays where it is
        ended = time.monotonic()
        until = utc_stamp()
        figures = usage.stop(ended - began, controller)
        samples = depth.stop() if depth else []
        listed = json.loads(api.get(jobs_path(kind, namespace), timeout=120)).get("items") or []
        one = next((j for j in listed if j["metadata"]["name"] == "array-0"), listed[0] if listed else {})
    finally:
        if depth and depth.is_alive():
            depth.stop()
        for w in watches:
            w.stop()
        removed = cleanup(api, namespace, operator, timeout=max(300, arrays))
    log(f"{kind}: namespace deleted in {removed:.0f} s")

    codes = Counter(code for code, *_ in answers.values())
    latency = [answered - sent for code, sent, answered in answers.values() if 200 <= code < 300]
    listed_names = {j["metadata"]["name"] for j in listed}
    to_seen = [seen[n] - answers[n][2] for n in acked if n in seen]
    result: dict[str, Any] = {
        "kind": kind,
        "namespace": namespace,
        "arrays": arrays,
        "tasks_per_array": tasks,
        "threads": threads,
        "submit_seconds": submitted - began,
        "answers_by_code": {str(k): v for k, v in sorted(codes.items())},
        "acknowledged": len(acked),
        "not_acknowledged": arrays - len(acked),
        "unreadable_after_ack": len(unread),
        "lost": len(set(acked) - listed_names),
        "listed_at_end": len(listed),
        "seen_by_controller": sum(1 for n in acked if n in seen),
        "settle_seconds": settled - began,
        "cleanup_seconds": removed,
        "object_bytes": size(one),
        **figures,
    }
    for p in (50, 99):
        result[f"create_client_p{p}_seconds"] = percentile(latency, p)
        result[f"answer_to_controller_status_p{p}_seconds"] = percentile(to_seen, p)
    result["create_client_max_seconds"] = max(latency, default=math.nan)
    result["answer_to_controller_status_max_seconds"] = max(to_seen, default=math.nan)
    if cluster:
        events, complete = audit_events(cluster, namespace, since, until)
        resource = "jobs" if kind == "native" else "vigiljobs"
        creates = [
            server_seconds(e)
            for e in events
            if what(e) == f"create {resource}"
            and client_of(e) == "bench"
            and 200 <= (e.get("responseStatus") or {}).get("code", 0) < 300
        ]
        result["audit_complete"] = complete
        result["creates_in_audit_log"] = len(creates)
        for p in (50, 99):
            result[f"create_server_p{p}_seconds"] = percentile(creates, p)
        result["create_server_max_seconds"] = max(creates, default=math.nan)
        mine = [e for e in events if client_of(e) == controller]
        result["controller_writes"] = len(mine)
        result["controller_writes_per_array"] = len(mine) / arrays
        result["controller_writes_by_verb_resource"] = dict(Counter(what(e) for e in mine).most_common())
        result["writes_by_client"] = dict(Counter(client_of(e) for e in events).most_common())
    if samples:
        result["queue_depth_samples"] = [[round(t, 2), q, r] for t, q, r in samples]
        result["queue_depth_final"] = samples[-1][1]
        result["queue_depth_expected"] = want_depth
        reached = next((t for t, q, _ in samples if q == want_depth), math.nan)
        result["queue_depth_reached_seconds"] = reached
        result["queue_running_max"] = max(r for *_, r in samples)
    return result


BURST_ROWS = [
    ("arrays submitted (each its own create)", "arrays", "{:,.0f}"),
    ("submitted in, s (all at once)", "submit_seconds", "{:.1f}"),
    ("**acknowledged (2xx)**", "acknowledged", "{:,.0f}"),
    ("not acknowledged", "not_acknowledged", "{:,.0f}"),
    ("**unreadable right after their 2xx** (a GET each)", "unreadable_after_ack", "{:,.0f}"),
    ("**lost** (acknowledged, not listed at the end)", "lost", "{:,.0f}"),
    ("**API server's time per create p50**, ms (audit log)", "create_server_p50_seconds", "{:.1f}", 1000),
    ("**API server's time per create p99**, ms", "create_server_p99_seconds", "{:.1f}", 1000),
    ("API server's time per create, max, ms", "create_server_max_seconds", "{:.1f}", 1000),
    ("create as the client saw it p50, ms", "create_client_p50_seconds", "{:.1f}", 1000),
    ("create as the client saw it p99, ms", "create_client_p99_seconds", "{:.1f}", 1000),
    ("status written by the controller, of the acknowledged", "seen_by_controller", "{:,.0f}"),
    ("answer → the controller's status p50, s", "answer_to_controller_status_p50_seconds", "{:.2f}"),
    ("answer → the controller's status p99, s", "answer_to_controller_status_p99_seconds", "{:.2f}"),
    ("answer → the controller's status max, s", "answer_to_controller_status_max_seconds", "{:.2f}"),
    ("controller writes per array (audit log)", "controller_writes_per_array", "{:.2f}"),
    ("controller CPU s", "controller_cpu_seconds", "{:.1f}"),
    ("controller peak RSS MiB", "controller_peak_rss_mib", "{:.0f}"),
    ("kube-apiserver CPU s", "apiserver_cpu_seconds", "{:.1f}"),
    ("kube-apiserver peak RSS MiB", "apiserver_peak_rss_mib", "{:.0f}"),
    ("etcd CPU s", "etcd_cpu_seconds", "{:.1f}"),
    ("one object, bytes", "object_bytes", "{:,.0f}"),
]


def scaled(rows: list[tuple], sides: dict[str, dict]) -> tuple[list[tuple[str, str, str]], dict[str, dict]]:
    """Rows with a scale (seconds shown as ms) turned into plain rows over scaled copies of the sides."""
    plain, copies = [], {k: dict(v) for k, v in sides.items()}
    for label, key, pattern, *scale in rows:
        if scale:
            for side in copies.values():
                if isinstance(side.get(key), int | float):
                    side[key] = side[key] * scale[0]
        plain.append((label, key, pattern))
    return plain, copies


def depth_text(vigil: dict) -> str:
    samples = vigil.get("queue_depth_samples") or []
    if not samples:
        return ""
    step = max(1, len(samples) // 20)
    shown = samples[::step] + ([samples[-1]] if (len(samples) - 1) % step else [])
    series = ", ".join(f"{t:.1f} s: {q:,}" for t, q, _ in shown)
    return (
        f"Queue depth (VigilQueue `{QUEUE}` status.queued, tasks; paused, so nothing runs: "
        f"{vigil.get('queue_running_max', 0)} running at most), every {0.5 * step:g} s from the first create: "
        f"{series}. Expected {vigil.get('queue_depth_expected', 0):,}, reached after "
        f"{fmt(vigil.get('queue_depth_reached_seconds'), '{:.1f}')} s; "
        f"last sample {vigil.get('queue_depth_final', 0):,}."
    )


# --- --big: one array of 100,000 tasks -----------------------------------------------------------


def run_big(
    api: Api,
    cluster: testbed.Cluster | None,
    kind: str,
    tasks: int,
    parallelism: int,
    seconds: float,
    workdir: Path,
    operator_args: tuple[str, ...],
) -> dict[str, Any]:
    namespace = f"barr-big-{kind}-{uuid.uuid4().hex[:4]}"
    log(f"{kind}: one array of {tasks:,} tasks, parallelism {parallelism}, for {seconds:.0f} s, in {namespace}")
    create_namespace(api, namespace)
    operator, watches = None, []
    seen = Tasks(kind)
    controller = controller_of(kind)
    sizes: list[tuple[float, int, int]] = []  # (seconds since submit, tasks succeeded, status bytes)
    started: dict[str, float] = {}
    try:
        if kind == "vigil":
            operator = start_operator(api, namespace, workdir, f"big-{tasks}", operator_args)
        watches = watch_side(api, kind, namespace, seen.on_pod, seen.on_job)
        time.sleep(2)
        usage = Usage(bed_pids(cluster, operator)).start()
        rss_before = usage.rss_mib(controller)
        server_before = server_figures(api)
        since = utc_stamp()
        body = (native_array if kind == "native" else vigil_array)("array", tasks, parallelism)
        seen.submitted = time.monotonic()
        created = create(api, kind, namespace, body)
        if kind == "vigil":
            check_arrays_landed(created)
        end = seen.submitted + seconds
        next_size = seen.submitted
        while time.monotonic() < end and seen.outcome is None:
            check_watches(watches, operator)
            now = time.monotonic()
            if not started and len(seen.pod_created) >= parallelism:
                job = read(api, kind, namespace, "array")
                started = {
                    "seconds": now - seen.submitted,
                    "controller_rss_mib": usage.rss_mib(controller),
                    "status_bytes": size(job.get("status") or {}),
                    "status_parts": status_parts(job.get("status") or {}) if kind == "vigil" else {},
                    "tasks_succeeded": tasks_succeeded(kind, job),
                }
                log(
                    f"{kind}: {parallelism} pods after {started['seconds']:.1f} s, "
                    f"controller RSS {started['controller_rss_mib']:.0f} MiB"
                )
            if now >= next_size:
                next_size += 10
                job = read(api, kind, namespace, "array")
                sizes.append(
                    (round(now - seen.submitted, 1), tasks_succeeded(kind, job), size(job.get("status") or {}))
                )
                log(f"{kind}: {sizes[-1][1]:,} succeeded, status {sizes[-1][2]:,} bytes ({sizes[-1][0]:.0f} s)")
            time.sleep(0.2)
        ended = time.monotonic()
        until = utc_stamp()
        rss_end = usage.rss_mib(controller)
        figures = usage.stop(ended - seen.submitted, controller)
        server_after = server_figures(api)
        final = read(api, kind, namespace, "array")
    finally:
        for w in watches:
            w.stop()
        removed = cleanup(api, namespace, operator, timeout=max(600, tasks / 50))
    log(f"{kind}: namespace deleted in {removed:.0f} s")
    window = ended - seen.submitted
    succeeded = tasks_succeeded(kind, final)
    delta = growth(server_before["requests"], server_after["requests"])
    result: dict[str, Any] = {
        "kind": kind,
        "namespace": namespace,
        "tasks": tasks,
        "parallelism": parallelism,
        "window_seconds": window,
        "controller_rss_before_mib": rss_before,
        "first_tasks": started,
        "controller_rss_at_first_tasks_mib": started.get("controller_rss_mib", math.nan),
        "status_bytes_at_first_tasks": started.get("status_bytes", math.nan),
        "submit_to_parallelism_pods_seconds": started.get("seconds", math.nan),
        "controller_rss_end_mib": rss_end,
        "succeeded_tasks": succeeded,
        "throughput_tasks_per_second": succeeded / window if window > 0 else math.nan,
        "pods": len(seen.pods),
        "final_status_bytes": size(final.get("status") or {}),
        "max_status_bytes_seen": seen.status_bytes_max,
        "final_object_bytes": size(final),
        "status_sizes": sizes,
        "final_status_parts": status_parts(final.get("status") or {}) if kind == "vigil" else {},
        "largest_status_parts": status_parts(seen.largest_status) if kind == "vigil" else {},
        "cleanup_seconds": removed,
        "api_writes_per_succeeded_task": (
            sum(v for (verb, _), v in delta.items() if verb in WRITE_VERBS) / succeeded if succeeded else math.nan
        ),
        **figures,
    }
    result.update(audit_figures(cluster, namespace, since, until, kind, max(1, succeeded)))
    return result


BIG_ROWS = [
    ("window (submit → end of the run), s", "window_seconds", "{:.0f}"),
    ("controller RSS before the submission, MiB", "controller_rss_before_mib", "{:.0f}"),
    ("submit → `parallelism` pods created, s", "submit_to_parallelism_pods_seconds", "{:.2f}"),
    ("**controller RSS once the first tasks run**, MiB", "controller_rss_at_first_tasks_mib", "{:.0f}"),
    ("**status then, bytes**", "status_bytes_at_first_tasks", "{:,.0f}"),
    ("tasks succeeded in the window", "succeeded_tasks", "{:,.0f}"),
    ("throughput in the window, tasks/s", "throughput_tasks_per_second", "{:.1f}"),
    ("**status at the end, bytes**", "final_status_bytes", "{:,.0f}"),
    ("largest status on the job watch, bytes", "max_status_bytes_seen", "{:,.0f}"),
    ("whole object at the end, bytes", "final_object_bytes", "{:,.0f}"),
    ("controller RSS at the end, MiB", "controller_rss_end_mib", "{:.0f}"),
    ("**controller peak RSS**, MiB", "controller_peak_rss_mib", "{:.0f}"),
    ("controller CPU s", "controller_cpu_seconds", "{:.1f}"),
    ("controller API writes per succeeded task (audit log)", "controller_writes_per_task", "{:.2f}"),
    ("job status writes by the controller", "job_status_writes", "{:,.0f}"),
    ("kube-apiserver CPU s", "apiserver_cpu_seconds", "{:.1f}"),
    ("kube-apiserver peak RSS MiB", "apiserver_peak_rss_mib", "{:.0f}"),
    ("machine CPU busy over the window", "machine_busy_share", "{:.0%}"),
]


def parts_text(vigil: dict) -> str:
    """The Vigil array's status by part, at its largest on the watch and at the end."""
    shown = [
        (label, vigil.get(key) or {})
        for label, key in (("largest", "largest_status_parts"), ("final", "final_status_parts"))
    ]
    shown = [(label, parts) for label, parts in shown if parts]
    if not shown:
        return ""
    rows = [
        ("status, bytes", "status"),
        ("status.tasks", "tasks"),
        ("active: records", "active_records"),
        ("active, bytes", "active"),
        ("bytes per active record", "per_active_record"),
        ("failed: records", "failed_records"),
        ("failed, bytes", "failed"),
        ("index ranges (succeededIndexes, deadLetteredIndexes)", "index_ranges"),
        ("counts, progress, redrives (the rest of status.tasks)", "counts_and_the_rest"),
        ("outside status.tasks (phase, conditions, ...)", "outside_tasks"),
    ]
    lines = [
        "| the array's status by part (compact JSON) | "
        + " | ".join(f"{label} on the job watch" if label == "largest" else label for label, _ in shown)
        + " |",
        "| --- |" + " ---: |" * len(shown),
    ]
    for label, key in rows:
        lines.append(f"| {label} | " + " | ".join(fmt(parts.get(key), "{:,.0f}") for _, parts in shown) + " |")
    return "\n".join(lines)


def sizes_text(sides: dict[str, dict]) -> str:
    lines = [
        "| seconds after submit | Vigil: succeeded, status bytes | native: succeeded, status bytes |",
        "| ---: | ---: | ---: |",
    ]
    series = {k: {round(t / 10): (n, b) for t, n, b in side.get("status_sizes", [])} for k, side in sides.items()}
    for slot in sorted(set().union(*(s.keys() for s in series.values()))):
        cells = []
        for kind in ("vigil", "native"):
            n, b = series.get(kind, {}).get(slot, (None, None))
            cells.append("—" if n is None else f"{n:,}, {b:,}")
        lines.append(f"| {slot * 10} | {' | '.join(cells)} |")
    return "\n".join(lines)


# --- the command ---------------------------------------------------------------------------------


def setup_lines(meta: dict) -> list[str]:
    return [
        f"- when: {meta['started']} (UTC); commit {meta['commit']}; {meta['machine']}",
        f"- cluster: {meta['cluster']}; Kubernetes {meta['kubernetes']}; {meta['nodes']} kwok nodes",
        f"- baseline: kube-controller-manager {meta['kcm_flags']}; Vigil: `vigil operator -n <ns> "
        f"{meta.get('operator_args') or ''}`".rstrip()
        + " (started and ready before each run)",
        f"- load average at start: {meta['loadavg']}",
        "- each side alone, one after the other, each in its own namespace deleted before the next; every pod "
        "runs 0-1 s on kwok (sim run-for 1s, finish-at in whole seconds) and exits 0; VigilJobs with "
        "heartbeat.required false",
        "- times on the bench's monotonic clock: submit = just before the create; a task's pod created = its "
        "index's first pod's ADDED on one pod watch; finished = the job's Complete condition (Job) or phase "
        "Succeeded (VigilJob) on one job watch",
        "- the controller's writes: the API server's audit log (every write, with its User-Agent), in the "
        "namespace, from just before the create to the end; CPU: /proc utime+stime over the same window; RSS: "
        "VmRSS every 0.5 s",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.arrays", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=10_000, help="N: tasks of the array (default 10000)")
    parser.add_argument("--parallelism", type=int, default=100, help="tasks at once, both sides (default 100)")
    parser.add_argument("--kinds", default="native,vigil", help="which sides to run (default both, native first)")
    parser.add_argument("--throughput", action="store_true", help="run the default scenario with --burst/--big too")
    parser.add_argument("--burst", action="store_true", help="many arrays created at once, in a paused queue")
    parser.add_argument("--burst-arrays", type=int, default=600, help="arrays of the burst (default 600)")
    parser.add_argument("--burst-tasks", type=int, default=1000, help="tasks of each (default 1000)")
    parser.add_argument("--burst-threads", type=int, default=16, help="client threads that create them (default 16)")
    parser.add_argument("--big", action="store_true", help="one array of --big-tasks tasks for --big-seconds")
    parser.add_argument("--big-tasks", type=int, default=100_000, help="tasks of the big array (default 100000)")
    parser.add_argument("--big-seconds", type=float, default=240, help="how long each side runs (default 240)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="where the .md and .json go")
    parser.add_argument("--timeout", type=float, default=None, help="seconds a side may take (default 120 + N/5)")
    parser.add_argument("--kubeconfig", type=Path, help="run against this cluster instead of the bench's own")
    parser.add_argument("--name", default="barr", help="the bench's own test bed (default barr)")
    parser.add_argument("--port-base", type=int, default=28443, help="its port base (default 28443)")
    parser.add_argument(
        "--nodes", type=int, default=None, help="kwok nodes (default: 2 x parallelism / 110 + 1, at least 3)"
    )
    parser.add_argument("--operator-args", default="", help="more arguments for `vigil operator` (default none)")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if bad := [k for k in kinds if k not in KINDS]:
        parser.error(f"unknown kind: {', '.join(bad)}")
    scenarios = [s for s, on in (("burst", args.burst), ("big", args.big)) if on]
    if args.throughput or not scenarios:
        scenarios.insert(0, "throughput")
    if not 1 <= args.parallelism <= 1000:
        parser.error("--parallelism is 1..1000 (spec.tasks.parallelism)")
    if args.burst_arrays * args.burst_tasks > 10_000_000:
        parser.error("--burst-arrays x --burst-tasks is at most 10,000,000 (the queue's maxQueued)")

    if args.kubeconfig:
        kubeconfig, cluster = args.kubeconfig, testbed_of(args.kubeconfig)
    else:
        cluster = own_cluster(args.name, args.port_base, args.nodes or nodes_for(2 * args.parallelism), False)
        kubeconfig = cluster.kubeconfig
    api = Api(kubeconfig, max(8, args.burst_threads))
    install_crds(api)
    meta = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        # Run from `git archive <commit>` (no .git there), VIGIL_BENCH_COMMIT names what runs.
        "commit": os.environ.get("VIGIL_BENCH_COMMIT") or git_commit(),
        "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}",
        "cluster": f"local test bed {cluster.name!r}" if cluster else f"kubeconfig {kubeconfig}",
        "kubernetes": json.loads(api.get("/version")).get("gitVersion", "unknown"),
        "nodes": len(api.core.list_node(label_selector="type=kwok").items),
        "kcm_flags": kcm_flags(cluster),
        "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "scenarios": scenarios,
        "kinds": kinds,
        "tasks": args.tasks,
        "parallelism": args.parallelism,
        "operator_args": args.operator_args,
    }
    extra = tuple(args.operator_args.split())
    workdir = Path(tempfile.mkdtemp(prefix="vigil-bench-arrays-"))
    log(f"operator logs in {workdir}")
    results: dict[str, dict[str, dict]] = {}
    report = []
    name = "arrays-" + "-".join(
        {
            "throughput": f"{args.tasks}",
            "burst": f"burst-{args.burst_arrays}x{args.burst_tasks}",
            "big": f"big-{args.big_tasks}",
        }[s]
        for s in scenarios
    )
    for scenario in scenarios:
        results[scenario] = sides = {}
        for kind in kinds:
            if scenario == "throughput":
                timeout = args.timeout or 120 + args.tasks / 5
                sides[kind] = run_throughput(api, cluster, kind, args.tasks, args.parallelism, timeout, workdir, extra)
            elif scenario == "burst":
                timeout = args.timeout or 120 + args.burst_arrays / 5
                sides[kind] = run_burst(
                    api, cluster, kind, args.burst_arrays, args.burst_tasks, args.burst_threads, timeout, workdir, extra
                )
            else:
                sides[kind] = run_big(
                    api, cluster, kind, args.big_tasks, args.parallelism, args.big_seconds, workdir, extra
                )
            partial = args.out / f"{name}.partial.json"  # what has run so far, should a later side fail
            args.out.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps(no_nan({"meta": meta, "results": results}), indent=1) + "\n")
        if scenario == "throughput":
            report += [
                f"## One array of {args.tasks:,} tasks against an Indexed Job of {args.tasks:,} completions, "
                f"parallelism {args.parallelism}",
                "",
                side_table(f"N = {args.tasks:,}", THROUGHPUT_ROWS, sides),
                "",
                writes_table(sides, args.tasks, "task"),
                "",
                parts_text(sides.get("vigil", {})),
                "",
            ]
        elif scenario == "burst":
            rows, copies = scaled(BURST_ROWS, sides)
            report += [
                f"## A burst: {args.burst_arrays:,} arrays of {args.burst_tasks:,} tasks (VigilJobs in a paused "
                f"VigilQueue) against as many suspended Indexed Jobs of {args.burst_tasks:,} completions, created at "
                f"once by {args.burst_threads} threads",
                "",
                side_table(f"{args.burst_arrays:,} x {args.burst_tasks:,}", rows, copies),
                "",
                depth_text(sides.get("vigil", {})),
                "",
                writes_table(sides, args.burst_arrays, "array"),
                "",
            ]
        else:
            report += [
                f"## One array of {args.big_tasks:,} tasks (parallelism {args.parallelism}) against an Indexed Job "
                f"of as many completions, {args.big_seconds:.0f} s each",
                "",
                side_table(f"{args.big_tasks:,} tasks", BIG_ROWS, sides),
                "",
                "The status every 10 s (a GET of the job):",
                "",
                sizes_text(sides),
                "",
                parts_text(sides.get("vigil", {})),
                "",
            ]
    text = "\n".join(
        [f"# Task arrays against an Indexed Job ({', '.join(scenarios)})", "", *setup_lines(meta), "", *report]
    )
    print(text)
    path = results_out.write(args.out, name, text, no_nan({"meta": meta, "results": results}))
    (args.out / f"{name}.partial.json").unlink(missing_ok=True)
    log(f"wrote {path} and its .md")
    return 0 if all(ok(scenario, side) for scenario, sides in results.items() for side in sides.values()) else 1


def ok(scenario: str, side: dict) -> bool:
    """A side that ran to the end: every task succeeded, every array acknowledged and kept."""
    if scenario == "throughput":
        return side["succeeded_tasks"] == side["tasks"] and side["outcome"] == "Succeeded"
    if scenario == "burst":
        return side["acknowledged"] == side["arrays"] and not side["unreadable_after_ack"] and not side["lost"]
    return bool(side["first_tasks"])


if __name__ == "__main__":
    sys.exit(main())
