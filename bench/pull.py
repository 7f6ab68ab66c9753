"""Pull (issue 45): pulled task arrays on a VigilWorkerPool, side by side with a baseline of the same run.

    .venv/bin/python -m bench.pull                       # throughput: --tasks 100000 of 1 s
    .venv/bin/python -m bench.pull --in-flight           # --in-flight-tasks 50000 of 5 s at once
    .venv/bin/python -m bench.pull --burst               # --burst-arrays 600 x --burst-tasks 1000 over 30 s
    .venv/bin/python -m bench.pull --faults              # the leader, then a worker, SIGKILLed mid-run
    .venv/bin/python -m bench.pull --profile             # the throughput run under py-spy

On the bench's own test bed (name `bpull`, port base 28643, brought up or reused as bench.arrays does
`barr`), or on `--kubeconfig`'s cluster. The operator runs with its beat server (so its pull
endpoint, docs/pull.md) on a self-signed certificate; the pool's pods are kwok pods, and each pod's
worker runs here as a process (`--workers`, one pod each) with the pod's identity: a projected
token of the pod's ServiceAccount bound to that pod (TokenRequest, audience vigil.dev), as
bench.heartbeat_load does for beats and tests/support/pools.py for the e2e tests.

The workers are the project's own worker, `vigil.worker.runner.Worker` (its two request loops, its
bookkeeping `vigil.worker.state.WorkerState`, its client `vigil.worker.client.PullClient`, counting
every answer by status), with a task runner (`--worker-mode`):

- `timers` (the default): a task is a timer of the task's seconds on one scheduler thread of the
  process (the `TaskRunner` protocol of vigil.worker.runner, as HandlerRunner implements it);
- `handler`: `vigil.worker.handlers.HandlerRunner` with a handler that sleeps the task's seconds,
  what `vigil.worker.serve(handler)` runs (a thread per slot).

A child process per task (vigil-worker -- CMD) cannot run thousands of tasks a second on 2 cores.
Each finished task appends `<idempotency key> <attempt> <start> <end> <pod>` to its process's
ledger (one write(2), O_APPEND) before its result is reported: the side effect the faults count.

Scenarios (each side by side with its baseline, measured in the same run):

- the default, throughput: N tasks of 1 s in `--arrays` arrays (parallelism `--parallelism`, at most
  1,000 each, so several arrays make the in-flight count) on a pool of `--workers` x `--slots`,
  against the native Job controller running an Indexed Job of `--native-tasks` completions of 1 s
  pods at `--native-parallelism` (bench.arrays' native side). Reported: tasks/s, makespan, claim
  latency (vigil_pull_claim_latency_seconds), submit -> task start p50/p99 (the worker's start, on
  the machine's monotonic clock, against the array's create; the Indexed Job's pod created),
  controller API writes per task (audit log, by User-Agent), operator CPU and peak RSS against
  kube-controller-manager's, kube-apiserver's CPU, the workers' CPU. `--profile`: py-spy on the
  operator over the Vigil side, its top frames in the results.
- `--in-flight`: `--in-flight-tasks` tasks of `--in-flight-seconds` (5 s) at once, in arrays of
  parallelism 1,000 (each of `--in-flight-rounds` x 1,000 tasks, so the pool stays full for a
  while): in flight at once (the workers' own count, every 0.5 s), every worker request answered
  (non-200s and requests with no answer, from the workers), no false Uncertain (tasks whose active
  record went Uncertain on the job watch, the operator's vigil_attempts_uncertain_total and
  vigil_attempts_lost_total, attempts over tasks), operator CPU and RSS, API writes per task;
  against the throughput run's Indexed Job (pods in flight, its writes, its controller's CPU).
- `--burst`: `--burst-arrays` arrays of `--burst-tasks` tasks of 1 s created over
  `--burst-over` seconds in a VigilQueue whose maxRunning is the pool's slots: every create's
  answer, none lost, all done, the queue's depth (status.queued) over time; against as many
  suspended Indexed Jobs created alike (bench.arrays' burst, which can only be acknowledged: the
  Job controller would take hours to run 600,000 pods here).
- `--faults`: `--fault-tasks` tasks of `--fault-seconds` in flight on a pool with a short heartbeat
  (`--fault-heartbeat`), the leader SIGKILLed (and started again on the same port) once the
  workers hold them, then one worker SIGKILLed: no task lost (every array Succeeded, every key in
  the ledger), the tasks run twice (the ledger), against what docs/design.md promises (nothing
  reported is lost; a task runs twice only if its worker was lost with it, or it was claimed just
  before the crash).

Written to <out>/pull-<scenarios>-<UTC>.md (the tables) and .json (every figure). See bench/README.md,
"Pull: worker pools against an Indexed Job".
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import logging
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# --- the worker processes (`python -m bench.pull --worker CONFIG`): the standard library and vigil.worker only


class CountingClient:
    """Made in the worker process around vigil.worker.client.PullClient: counts every answer by
    status, and the requests that got none."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.lock = threading.Lock()
        self.statuses: Counter[str] = Counter()

    def post(self, body: bytes, timeout: float) -> Any:
        from vigil.worker.client import PullFailed

        try:
            reply = self.inner.post(body, timeout)
        except PullFailed:
            with self.lock:
                self.statuses["no answer"] += 1
            raise
        with self.lock:
            self.statuses[str(reply.status)] += 1
        return reply

    def close(self) -> None:
        self.inner.close()


class Ledger:
    """The side effect of a task: a line appended (one write, O_APPEND) when it succeeds."""

    def __init__(self, path: str, pod: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.pod = pod

    def write(self, key: str, attempt: int, started: float, ended: float) -> None:
        os.write(self.fd, f"{key} {attempt} {started:.4f} {ended:.4f} {self.pod}\n".encode())


class TimerRunner:
    """vigil.worker.runner's TaskRunner with tasks as timers: a task ends `seconds` after its
    start (exit code 0, its ledger line first); a stop ends it at once (143)."""

    def __init__(self, seconds: float, ledger: Ledger) -> None:
        self.seconds, self.ledger = seconds, ledger
        self.heap: list[tuple[float, Any]] = []
        self.live: dict[Any, tuple[Any, float]] = {}
        self.cond = threading.Condition()
        self.on_exit: Any = lambda lease, code, message: None
        self.started = 0
        threading.Thread(target=self._run, name="bench-timers", daemon=True).start()

    def bind(self, on_exit: Any, on_checkpoint: Any) -> None:
        self.on_exit = on_exit

    def start(self, grant: Any) -> None:
        now = time.monotonic()
        with self.cond:
            self.live[grant.lease] = (grant, now)
            heapq.heappush(self.heap, (now + self.seconds, grant.lease))
            self.started += 1
            self.cond.notify()

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.heap or self.heap[0][0] > time.monotonic():
                    self.cond.wait(self.heap[0][0] - time.monotonic() if self.heap else 1.0)
                now, due = time.monotonic(), []
                while self.heap and self.heap[0][0] <= now:
                    _, lease = heapq.heappop(self.heap)
                    entry = self.live.pop(lease, None)
                    if entry is not None:
                        due.append((lease, *entry))
            for lease, grant, began in due:
                self.ledger.write(grant.env.get("VIGIL_IDEMPOTENCY_KEY", ""), grant.attempt, began, now)
                self.on_exit(lease, 0, "")

    def running(self) -> int:
        with self.cond:
            return len(self.live)

    def stop(self, lease: Any) -> None:
        with self.cond:
            entry = self.live.pop(lease, None)
        if entry is not None:
            self.on_exit(lease, 143, "stopped")

    def kill(self, lease: Any) -> bool:
        return True

    def checkpoints(self) -> list:
        return []

    def ended(self, lease: Any) -> None:
        with self.cond:
            self.live.pop(lease, None)

    def close(self) -> None:
        pass


def worker_main(config_path: str) -> int:
    """One pool pod's worker: vigil.worker.runner.Worker with the bench's runner, until SIGTERM."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from vigil.worker.client import PullClient, Settings
    from vigil.worker.handlers import HandlerRunner, TaskFailed
    from vigil.worker.runner import Worker, on_signals

    config = json.loads(Path(config_path).read_text())
    settings = Settings(
        url=config["url"],
        ca_pem=config["ca_pem"],
        token_file=config["token_file"],
        pod_name=config["pod"],
        namespace=config["namespace"],
        pod_uid=config["uid"],
        slots=config["slots"],
        pool=config["pool"],
    )
    ledger = Ledger(config["ledger"], config["pod"])
    seconds = float(config["task_seconds"])
    counting = CountingClient(PullClient(settings))
    if config["mode"] == "handler":
        started = [0]

        def handle(task: Any) -> None:
            began = time.monotonic()
            started[0] += 1
            if task.cancelled.wait(seconds):
                raise TaskFailed(143, "cancelled")
            ledger.write(task.idempotency_key, task.attempt, began, time.monotonic())

        runner: Any = HandlerRunner(handle, settings.slots)
    else:
        runner = TimerRunner(seconds, ledger)
    worker = Worker(settings, runner, grace=5.0, client=counting)  # type: ignore[arg-type]
    on_signals(worker)
    stats_path = Path(config["stats"])

    def stats() -> None:
        peak = 0
        while True:
            with worker.lock:
                running = len(worker.state.tasks)
            peak = max(peak, running)
            with counting.lock:
                statuses = dict(counting.statuses)
            figures = {
                "t": time.monotonic(),
                "running": running,
                "peak_running": peak,
                "started": runner.started if isinstance(runner, TimerRunner) else started[0],
                "statuses": statuses,
            }
            tmp = stats_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(figures))
            tmp.replace(stats_path)
            time.sleep(0.5)

    threading.Thread(target=stats, name="bench-stats", daemon=True).start()
    return worker.run()


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--worker":
    sys.exit(worker_main(sys.argv[2]))

# --- the bench ---------------------------------------------------------------------------------------

from kubernetes import client  # noqa: E402

from bench import results_out  # noqa: E402
from bench.arrays import (  # noqa: E402
    GROUP,
    VERSION,
    Usage,
    audit_figures,
    bed_pids,
    run_burst,
    run_throughput,
    utc_stamp,
)
from bench.bed import Api, create_namespace, delete_namespace, install_crds, log, own_cluster, testbed_of  # noqa: E402
from bench.compare import git_commit, kcm_flags  # noqa: E402
from bench.heartbeat_load import allow_open_files, bucket_quantile  # noqa: E402
from bench.measure import LABEL, WRITE_VERBS, Operator, Watch, free_port, growth, percentile, server_figures  # noqa: E402
from bench.procfs import cpu_seconds  # noqa: E402
from bench.profiles import Profiler, py_spy  # noqa: E402
from bench.report import fmt, no_nan, ratio  # noqa: E402
from bench.workloads import pod_spec  # noqa: E402
from testbed import cluster as testbed  # noqa: E402
from vigil.servers.webhook import make_self_signed  # noqa: E402

POOL = "bench"
QUEUE = "burst"
AUDIENCE = "vigil.dev"
CLAIM = "vigil_pull_claim_latency_seconds"
BENCH_PER_SOURCE = 65_536  # every worker posts from 127.0.0.1, where pods would have an address each
MAX_PARALLELISM = 1000  # spec.tasks.parallelism


# --- the objects ---------------------------------------------------------------------------------


def worker_pool(workers: int, slots: int, heartbeat: tuple[int, int]) -> dict:
    """A pool of `workers` kwok pods (Running until deleted: their worker runs here), no autoscaling."""
    spec = {**pod_spec()}
    spec["containers"] = [{"name": "worker", "image": "registry.invalid/vigil/sim:none", "command": ["vigil-worker"]}]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "VigilWorkerPool",
        "metadata": {"name": POOL},
        "spec": {
            "template": {"metadata": {"labels": {"app": POOL}}, "spec": spec},
            "minReplicas": workers,
            "maxReplicas": workers,
            "slotsPerWorker": slots,
            "heartbeat": {"intervalSeconds": heartbeat[0], "timeoutSeconds": heartbeat[1]},
        },
    }


def pulled_array(name: str, count: int, parallelism: int, queue: str | None = None) -> dict:
    spec: dict[str, Any] = {
        "pool": POOL,
        "tasks": {"count": count, "parallelism": parallelism},
        "retry": {"maxAttempts": 5, "backoff": {"initialSeconds": 1, "jitter": 0}},
    }
    if queue:
        spec["queue"] = queue
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VigilJob", "metadata": {"name": name}, "spec": spec}


def split(tasks: int, arrays: int) -> list[int]:
    """`tasks` over `arrays` arrays, as evenly as can be."""
    arrays = max(1, min(arrays, tasks))
    return [tasks // arrays + (1 if i < tasks % arrays else 0) for i in range(arrays)]


# --- the workers -----------------------------------------------------------------------------------


def pod_token(api: Api, namespace: str, pod: Any) -> str:
    """A token of the pod's ServiceAccount bound to the pod, audience vigil.dev (as the kubelet mounts it)."""
    bound = client.V1BoundObjectReference(kind="Pod", api_version="v1", name=pod.metadata.name, uid=pod.metadata.uid)
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[AUDIENCE], expiration_seconds=7200, bound_object_ref=bound)
    )
    account = pod.spec.service_account_name or "default"
    return api.core.create_namespaced_service_account_token(account, namespace, request).status.token


def pool_pods(api: Api, namespace: str) -> list:
    pods = api.core.list_namespaced_pod(namespace, label_selector=f"vigil.dev/pool={POOL}").items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


class Workers:
    """One `python -m bench.pull --worker` process per pool pod, with the pod's identity."""

    def __init__(self, api: Api, namespace: str, workdir: Path, mode: str, task_seconds: float):
        self.api, self.namespace, self.workdir = api, namespace, workdir
        self.mode, self.task_seconds = mode, task_seconds
        self.procs: dict[str, subprocess.Popen] = {}
        self.stats: dict[str, Path] = {}
        self.ledgers: list[Path] = []
        self.cpu_before: dict[str, float] = {}

    def start_all(self, count: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while len(pods := pool_pods(self.api, self.namespace)) < count or not all(
            p.spec.node_name and (p.spec.containers[0].env or []) for p in pods
        ):
            if time.monotonic() > deadline:
                raise SystemExit(f"only {len(pods)} of {count} pool pods after {timeout:.0f} s")
            time.sleep(0.5)
        for pod in pods[:count]:
            self.start(pod)

    def start(self, pod: Any) -> None:
        name = pod.metadata.name
        env = {e.name: e.value for e in pod.spec.containers[0].env or [] if e.value is not None}
        token = self.workdir / f"{name}.token"
        token.write_text(pod_token(self.api, self.namespace, pod))
        token.chmod(0o600)
        ledger = self.workdir / f"{name}-{len(self.ledgers)}.ledger"
        self.ledgers.append(ledger)
        self.stats[name] = self.workdir / f"{name}.stats.json"
        config = {
            "url": env["VIGIL_PULL_URL"],
            "ca_pem": env["VIGIL_PULL_CA"],
            "token_file": str(token),
            "pod": name,
            "namespace": self.namespace,
            "uid": pod.metadata.uid,
            "slots": int(env["VIGIL_POOL_SLOTS"]),
            "pool": POOL,
            "ledger": str(ledger),
            "stats": str(self.stats[name]),
            "task_seconds": self.task_seconds,
            "mode": self.mode,
        }
        path = self.workdir / f"{name}.config.json"
        path.write_text(json.dumps(config))
        with open(self.workdir / f"{name}.log", "ab") as out:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "bench.pull", "--worker", str(path)],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.procs.items() if p.poll() is None}

    def mark_cpu(self) -> None:
        self.cpu_before = {n: self._cpu(pid) for n, pid in self.pids().items()}

    def cpu(self) -> float:
        return sum(self._cpu(pid) - self.cpu_before.get(n, 0.0) for n, pid in self.pids().items())

    @staticmethod
    def _cpu(pid: int) -> float:
        try:
            return cpu_seconds(pid)
        except OSError:
            return 0.0

    def read_stats(self) -> dict[str, dict]:
        out = {}
        for name, path in self.stats.items():
            with contextlib.suppress(OSError, ValueError):
                out[name] = json.loads(path.read_text())
        return out

    def running(self) -> int:
        return sum(s.get("running", 0) for n, s in self.read_stats().items() if self.procs[n].poll() is None)

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def runs(self) -> list[tuple[str, int, float, float, str]]:
        """Every ledger line: (idempotency key, attempt, start, end, pod)."""
        out = []
        for path in self.ledgers:
            with contextlib.suppress(FileNotFoundError):
                for line in path.read_text().splitlines():
                    parts = line.split()
                    if len(parts) == 5:
                        out.append((parts[0], int(parts[1]), float(parts[2]), float(parts[3]), parts[4]))
        return out

    def statuses(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for s in self.read_stats().values():
            total.update(s.get("statuses") or {})
        return total

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


# --- the operator's /metrics -----------------------------------------------------------------------


def scrape(operator: Operator) -> str:
    import urllib3

    return urllib3.PoolManager().request("GET", f"http://127.0.0.1:{operator.metrics_port}/metrics").data.decode()


def op_histogram(text: str, name: str) -> dict[float, float]:
    buckets: dict[float, float] = {}
    prefix = name + "_bucket{"
    for line in text.splitlines():
        if line.startswith(prefix):
            labels_part, _, value = line.rpartition(" ")
            le = dict(LABEL.findall(labels_part))["le"]
            bound = math.inf if le == "+Inf" else float(le)
            buckets[bound] = buckets.get(bound, 0.0) + float(value)
    return buckets


def op_sum(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
            head, _, value = line.rpartition(" ")
            found = dict(LABEL.findall(head))
            if all(found.get(k) == v for k, v in labels.items()):
                total += float(value)
    return total


class Metrics:
    """The operator's pull figures between two scrapes (several operators: each one's, summed)."""

    NAMES = ("vigil_attempts_uncertain_total", "vigil_attempts_lost_total")

    def __init__(self) -> None:
        self.claims: list[tuple[dict[float, float], dict[float, float]]] = []
        self.sums: Counter[str] = Counter()
        self.before: str | None = None

    def begin(self, operator: Operator) -> None:
        self.before = scrape(operator)

    def end(self, operator: Operator, text: str | None = None) -> None:
        after = text if text is not None else scrape(operator)
        before = self.before or ""
        self.claims.append((op_histogram(before, CLAIM), op_histogram(after, CLAIM)))
        for name in self.NAMES:
            self.sums[name] += op_sum(after, name) - op_sum(before, name)
        for outcome in ("answered", "bad-request", "refused", "not-leader", "unavailable"):
            key = f"pull_requests_{outcome}"
            self.sums[key] += op_sum(after, "vigil_pull_requests_total", outcome=outcome) - op_sum(
                before, "vigil_pull_requests_total", outcome=outcome
            )
        self.sums["claim_count"] += op_sum(after, CLAIM + "_count") - op_sum(before, CLAIM + "_count")
        self.sums["claim_sum"] += op_sum(after, CLAIM + "_sum") - op_sum(before, CLAIM + "_sum")
        self.before = None

    def figures(self) -> dict[str, Any]:
        before: dict[float, float] = {}
        after: dict[float, float] = {}
        for b, a in self.claims:
            for k, v in a.items():
                after[k] = after.get(k, 0.0) + v
                before[k] = before.get(k, 0.0) + b.get(k, 0.0)
        out: dict[str, Any] = {
            "claim_latency_p50_seconds": bucket_quantile(before, after, 0.5),
            "claim_latency_p99_seconds": bucket_quantile(before, after, 0.99),
            "claim_latency_mean_seconds": (
                self.sums["claim_sum"] / self.sums["claim_count"] if self.sums["claim_count"] else math.nan
            ),
            "claims": self.sums["claim_count"],
            "vigil_attempts_uncertain_total": self.sums["vigil_attempts_uncertain_total"],
            "vigil_attempts_lost_total": self.sums["vigil_attempts_lost_total"],
        }
        for key, value in self.sums.items():
            if key.startswith("pull_requests_"):
                out[key] = value
        return out


# --- what the job watch sees -------------------------------------------------------------------------


class Arrays:
    """The arrays on one job watch: which finished, and every task that went Uncertain or Lost."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.submitted: dict[str, float] = {}  # uid -> monotonic, just before its create
        self.names: dict[str, str] = {}
        self.done: dict[str, tuple[str, float]] = {}  # name -> (phase, arrival)
        self.uncertain: set[tuple[str, int, int]] = set()
        self.lost: set[tuple[str, int, int]] = set()
        self.lost_reasons: Counter[str] = Counter()  # events showing a Lost last attempt, by its reason
        self.events = 0

    def on_job(self, _type: str, job: dict, now: float) -> None:
        status = job.get("status") or {}
        meta = job.get("metadata") or {}
        uid, name = meta.get("uid", ""), meta.get("name", "")
        with self.lock:
            self.events += 1
            for record in (status.get("tasks") or {}).get("active") or []:
                attempt = int(record.get("attempts") or 0)
                if record.get("phase") == "Uncertain":
                    self.uncertain.add((uid, int(record.get("index", -1)), attempt))
                last = record.get("last") or {}
                if last.get("outcome") == "Lost":
                    self.lost.add((uid, int(record.get("index", -1)), int(last.get("number") or 0)))
                    self.lost_reasons[str(last.get("reason"))] += 1
            phase = status.get("phase")
            if phase in ("Succeeded", "DeadLettered") and name not in self.done:
                self.done[name] = (phase, now)


# --- one Vigil side ----------------------------------------------------------------------------------


class Depth(threading.Thread):
    """The pool's load every 0.5 s: tasks in flight on the workers, and the queue's depth if any."""

    def __init__(self, api: Api, namespace: str, workers: Workers, began: float, queue: str | None):
        super().__init__(daemon=True)
        self.api, self.namespace, self.workers, self.began, self.queue = api, namespace, workers, began, queue
        self.samples: list[tuple[float, int, int, int]] = []  # (s, in flight, queued, queue running)
        self.halt = threading.Event()

    def run(self) -> None:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/vigilqueues/{self.queue}"
        while not self.halt.is_set():
            queued = running = -1
            if self.queue:
                with contextlib.suppress(Exception):
                    status = json.loads(self.api.get(path, timeout=5)).get("status") or {}
                    queued, running = int(status.get("queued") or 0), int(status.get("running") or 0)
            self.samples.append((time.monotonic() - self.began, self.workers.running(), queued, running))
            self.halt.wait(0.5)

    def stop(self) -> list[tuple[float, int, int, int]]:
        self.halt.set()
        self.join()
        return self.samples


class Side:
    """A namespace with a pool, its operator (beat server on a fixed port, so a new one after a
    SIGKILL takes the same URL), and its workers."""

    def __init__(self, api: Api, args: argparse.Namespace, workdir: Path, label: str, heartbeat, seconds: float):
        self.api, self.args, self.label = api, args, label
        self.namespace = f"bpull-{label}-{uuid.uuid4().hex[:4]}"
        self.workdir = workdir / self.namespace
        self.workdir.mkdir(parents=True)
        self.certs = self.workdir / "certs"
        make_self_signed(self.certs)
        self.port = free_port()
        self.heartbeat = heartbeat
        self.operators: list[Operator] = []
        self.workers = Workers(api, self.namespace, self.workdir, args.worker_mode, seconds)

    def operator_args(self) -> tuple[str, ...]:
        url = f"https://127.0.0.1:{self.port}/v1/heartbeat"
        return (
            "--beat-address", f"127.0.0.1:{self.port}",
            "--beat-cert-file", str(self.certs / "tls.crt"),
            "--beat-key-file", str(self.certs / "tls.key"),
            "--beat-connections-per-source", str(BENCH_PER_SOURCE),
            "--heartbeat-url", url,
            "--heartbeat-ca-file", str(self.certs / "ca.crt"),
            *self.args.operator_args.split(),
        )  # fmt: skip

    def start_operator(self) -> Operator:
        n = len(self.operators)
        operator = Operator(
            self.api.kubeconfig, self.namespace, self.workdir / f"operator-{n}.log", self.operator_args()
        )
        operator.wait_ready()
        self.operators.append(operator)
        return operator

    @property
    def operator(self) -> Operator:
        return self.operators[-1]

    def up(self, queue: dict | None = None) -> None:
        create_namespace(self.api, self.namespace)
        if queue:
            self.api.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, "vigilqueues", queue)
        body = worker_pool(self.args.workers, self.args.slots, self.heartbeat)
        self.api.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, "vigilworkerpools", body)
        self.start_operator()
        self.workers.start_all(self.args.workers)
        log(f"{self.label}: {self.args.workers} workers x {self.args.slots} slots on pool {POOL} in {self.namespace}")

    def down(self) -> float:
        self.workers.stop()
        try:
            return delete_namespace(self.api, self.namespace, timeout=600)
        finally:
            for operator in self.operators:
                operator.stop()


def submit_arrays(
    api: Api, namespace: str, seen: Arrays, counts: list[int], parallelism: int, queue: str | None, over: float
) -> dict[str, int]:
    """Creates the arrays, evenly over `over` seconds (at once for 0); their answers by code."""
    import concurrent.futures

    codes: Counter[str] = Counter()
    began = time.monotonic()

    def one(i: int) -> None:
        if over:
            time.sleep(max(0.0, began + over * i / len(counts) - time.monotonic()))  # the pace of the burst
        body = pulled_array(f"array-{i}", counts[i], min(parallelism, counts[i]), queue)
        sent = time.monotonic()
        try:
            created = api.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "vigiljobs", body)
        except client.ApiException as err:
            codes[str(err.status)] += 1
            return
        except Exception as err:  # noqa: BLE001 - a broken connection: no answer, counted
            log(f"array-{i}: {err!r}")
            codes["no answer"] += 1
            return
        codes["201"] += 1
        with seen.lock:
            seen.submitted[created["metadata"]["uid"]] = sent
            seen.names[created["metadata"]["uid"]] = body["metadata"]["name"]

    with concurrent.futures.ThreadPoolExecutor(min(16, len(counts))) as pool:
        list(pool.map(one, range(len(counts))))
    return dict(codes)


def run_pool(
    api: Api,
    cluster: testbed.Cluster | None,
    args: argparse.Namespace,
    workdir: Path,
    *,
    label: str,
    tasks: int,
    arrays: int,
    parallelism: int,
    seconds: float,
    heartbeat: tuple[int, int] = (5, 30),
    queue_running: int | None = None,
    over: float = 0.0,
    timeout: float,
    profile: bool = False,
    faults: bool = False,
) -> dict[str, Any]:
    """One Vigil side: `tasks` tasks of `seconds` in `arrays` pulled arrays on the pool, until every
    array has finished (or `timeout`); with `faults`, the leader and then a worker SIGKILLed."""
    side = Side(api, args, workdir, label, heartbeat, seconds)
    counts = split(tasks, arrays)
    queue = None
    if queue_running:
        queue = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "VigilQueue",
            "metadata": {"name": QUEUE},
            "spec": {"maxRunning": queue_running, "maxQueued": 10_000_000},
        }
    log(f"{label}: {tasks:,} tasks of {seconds:g} s in {len(counts)} arrays (parallelism {parallelism})")
    seen = Arrays()
    watch = depth = profiler = None
    metrics = Metrics()
    result: dict[str, Any] = {}
    try:
        side.up(queue)
        watch = Watch(api, f"/apis/{GROUP}/{VERSION}/namespaces/{side.namespace}/vigiljobs", seen.on_job)
        watch.start()
        watch.ready.wait(30)
        time.sleep(2)  # the pool's and the operator's start-up writes settle
        pids = bed_pids(cluster, side.operator)
        usage = Usage(pids).start()
        side.workers.mark_cpu()
        server_before = server_figures(api)
        metrics.begin(side.operator)
        since = utc_stamp()
        if profile:
            profiler = Profiler(side.operator.pid, workdir / f"profile-{label}.txt")
        began = time.monotonic()
        depth = Depth(api, side.namespace, side.workers, began, QUEUE if queue else None)
        depth.start()
        codes = submit_arrays(api, side.namespace, seen, counts, parallelism, QUEUE if queue else None, over)
        submitted = time.monotonic()
        log(f"{label}: {sum(codes.values())} arrays submitted in {submitted - began:.1f} s: {codes}")
        acked = codes.get("201", 0)
        deadline, last = began + timeout, began
        fault: dict[str, Any] = {}
        cpu_first = 0.0
        while time.monotonic() < deadline:
            if watch.error:
                raise watch.error
            with seen.lock:
                finished = len(seen.done)
            if finished >= acked:
                break
            if side.operator.proc.poll() is not None:
                raise SystemExit(
                    f"vigil operator exited ({side.operator.proc.returncode}); see {side.operator.log_path}"
                )
            if faults:
                cpu_first += fault_step(side, args, fault, metrics, usage)
            if time.monotonic() - last > 10:
                last = time.monotonic()
                done = sum(1 for _ in side.workers.runs()) if tasks <= 20_000 else None
                log(
                    f"{label}: {finished} of {acked} arrays finished, {side.workers.running():,} tasks in flight"
                    + (f", {done:,} run" if done is not None else "")
                    + f" ({last - began:.0f} s)"
                )
            time.sleep(0.2)
        ended = time.monotonic()
        until = utc_stamp()
        if profiler:
            profiler.stop()
        samples = depth.stop()
        figures = usage.stop(ended - began, "operator")
        if cpu_first:  # the first operator's CPU until its SIGKILL (Usage follows the pid it was given)
            figures["operator_cpu_seconds"] += cpu_first
            figures["controller_cpu_seconds"] += cpu_first
        workers_cpu = side.workers.cpu()
        metrics.end(side.operator)
        server_after = server_figures(api)
        statuses = side.workers.statuses()
        listed = api.custom.list_namespaced_custom_object(GROUP, VERSION, side.namespace, "vigiljobs")["items"]
        runs = side.workers.runs()
    finally:
        if depth and depth.is_alive():
            depth.stop()
        if watch:
            watch.stop()
        removed = side.down()
    log(f"{label}: namespace deleted in {removed:.0f} s")

    total = sum(int(((j.get("status") or {}).get("tasks") or {}).get("total") or 0) for j in listed)
    succeeded = sum(int(((j.get("status") or {}).get("tasks") or {}).get("succeeded") or 0) for j in listed)
    attempts = sum(int((j.get("status") or {}).get("attempts") or 0) for j in listed)
    phases = Counter(str((j.get("status") or {}).get("phase")) for j in listed)
    finished_at = [t for _, t in seen.done.values()]
    makespan = (max(finished_at) - began) if len(seen.done) >= acked and finished_at else math.nan
    ok_runs = Counter(key for key, *_ in runs)
    starts = []
    for key, _attempt, start, _end, _pod in runs:
        uid = key.rsplit("-", 1)[0]
        if uid in seen.submitted:
            starts.append(start - seen.submitted[uid])
    first_start = min((r[2] for r in runs), default=math.nan)
    # Every task's key: <job uid>-<index>, for every array acknowledged.
    expected = {
        f"{j['metadata']['uid']}-{i}"
        for j in listed
        for i in range(int((j.get("spec") or {}).get("tasks", {})["count"]))
    }
    in_flight = [s[1] for s in samples]
    delta = growth(server_before["requests"], server_after["requests"])
    result = {
        "label": label,
        "namespace": side.namespace,
        "tasks": tasks,
        "arrays": len(counts),
        "parallelism": parallelism,
        "task_seconds": seconds,
        "workers": args.workers,
        "slots_per_worker": args.slots,
        "slots": args.workers * args.slots,
        "worker_mode": args.worker_mode,
        "heartbeat": list(heartbeat),
        "create_answers": codes,
        "arrays_acknowledged": acked,
        "arrays_finished": len(seen.done),
        "arrays_by_phase": dict(phases),
        "arrays_listed": len(listed),
        "succeeded_tasks": succeeded,
        "tasks_in_status": total,
        "attempts": attempts,
        "attempts_over_tasks": attempts - total,
        "tasks_lost": len(expected - set(ok_runs)) if expected else math.nan,
        "tasks_not_succeeded": total - succeeded,
        "tasks_run_twice": sum(1 for n in ok_runs.values() if n > 1),
        "ledger_runs": len(runs),
        "submit_seconds": submitted - began,
        "window_seconds": ended - began,
        "makespan_seconds": makespan,
        "throughput_tasks_per_second": succeeded / makespan if makespan and makespan > 0 else math.nan,
        "throughput_in_window_tasks_per_second": len(runs) / (ended - began),
        "submit_to_first_start_seconds": first_start - began,
        "in_flight_max": max(in_flight, default=0),
        "in_flight_mean": sum(in_flight) / len(in_flight) if in_flight else math.nan,
        "in_flight_samples": [[round(t, 1), f, q, r] for t, f, q, r in samples],
        "worker_requests_by_status": dict(statuses),
        "worker_requests": sum(statuses.values()),
        "worker_requests_not_200": sum(v for k, v in statuses.items() if k != "200"),
        "tasks_seen_uncertain": len(seen.uncertain),
        "tasks_seen_lost": len(seen.lost),
        "lost_reasons_seen": dict(seen.lost_reasons),
        "job_watch_events": seen.events,
        "workers_cpu_seconds": workers_cpu,
        "workers_cpu_ms_per_task": workers_cpu * 1000 / max(1, len(runs)),
        **figures,
        **metrics.figures(),
    }
    for p in (50, 99):
        result[f"submit_to_start_p{p}_seconds"] = percentile(starts, p)
    if queue:
        queued = [(t, q) for t, _, q, _ in samples if q >= 0]
        result["queue_depth_max"] = max((q for _, q in queued), default=math.nan)
        result["queue_depth_final"] = queued[-1][1] if queued else math.nan
        result["queue_running_max"] = max((r for *_, r in samples), default=math.nan)
    n = max(1, succeeded)
    result["controller_cpu_ms_per_task"] = result.get("controller_cpu_seconds", math.nan) * 1000 / n
    result["api_writes_per_task"] = sum(v for (verb, _), v in delta.items() if verb in WRITE_VERBS) / n
    result["api_requests_per_task"] = sum(delta.values()) / n
    result["api_requests_by_verb_resource"] = {f"{verb} {res}": v for (verb, res), v in sorted(delta.items())}
    result.update(audit_figures(cluster, side.namespace, since, until, "vigil", n))
    if fault:
        result["fault"] = fault
        result.update(twice_figures(runs, fault))
    if profiler:
        result["profile"] = {"file": str(profiler.path), **profiler.top(20)}
    return result


def fault_step(side: Side, args: argparse.Namespace, fault: dict, metrics: Metrics, usage: Usage) -> float:
    """The faults, in turn: once the workers hold `--fault-tasks` (or their count stops growing for
    10 s), SIGKILL the leader and start another on the same port; `--fault-worker-after` seconds after
    it is ready, SIGKILL the busiest worker. Returns the first operator's CPU seconds when it is killed (else 0)."""
    now = time.monotonic()
    running = side.workers.running()
    if "leader_killed_at" not in fault:
        best = fault.setdefault("best", [0, now])
        if running > best[0]:
            best[:] = [running, now]
        if running >= args.fault_tasks or (running > 0 and now - best[1] > 10):
            operator = side.operator
            text = scrape(operator)
            cpu = cpu_seconds(operator.pid) - usage.cpu.get("operator", 0.0)
            os.kill(operator.pid, signal.SIGKILL)
            operator.proc.wait(10)
            fault["leader_killed_at"] = now
            fault["in_flight_at_leader_kill"] = running
            metrics.end(operator, text)
            log(f"faults: leader SIGKILLed with {running:,} tasks in flight")
            time.sleep(1.0)
            began = time.monotonic()
            new = side.start_operator()
            fault["new_leader_ready_seconds"] = time.monotonic() - began
            usage.pids["operator"] = new.pid
            usage.cpu["operator"] = cpu_seconds(new.pid)
            if usage.sampler:
                usage.sampler.pids["operator"] = new.pid
            metrics.begin(new)
            fault["new_leader_ready_at"] = time.monotonic()
            return cpu
        return 0.0
    if "worker_killed_at" not in fault and now - fault["new_leader_ready_at"] > args.fault_worker_after:
        stats = side.workers.read_stats()
        name = max(stats, key=lambda n: stats[n].get("running", 0))
        held = stats[name].get("running", 0)
        side.workers.kill(name)
        fault["worker_killed"] = name
        fault["worker_killed_at"] = time.monotonic()
        fault["in_flight_on_killed_worker"] = held
        fault["in_flight_at_worker_kill"] = running
        log(f"faults: worker {name} SIGKILLed holding {held} tasks ({running:,} in flight)")
    return 0.0


def twice_figures(runs: list[tuple[str, int, float, float, str]], fault: dict) -> dict[str, Any]:
    """The tasks run twice (two ledger lines of one key), each put down to a cause the design allows:
    claimed just before the leader's crash (a run that started in the 5 s before it, and another
    after it), or lost with the killed worker (a run of it that ended before its SIGKILL, and
    another that started after); the rest are unexplained."""
    by_key: dict[str, list[tuple[int, float, float, str]]] = {}
    for key, attempt, start, end, pod in runs:
        by_key.setdefault(key, []).append((attempt, start, end, pod))
    killed = fault.get("worker_killed")
    crash = fault.get("leader_killed_at", math.inf)
    worker_kill = fault.get("worker_killed_at", math.inf)
    window = 5.0
    worker, leader, other, on_killed = 0, 0, 0, 0
    for entries in by_key.values():
        if len(entries) < 2:
            continue
        on_killed += any(pod == killed for *_, pod in entries)
        if any(crash - window <= s <= crash for _, s, _, _ in entries) and any(s > crash for _, s, _, _ in entries):
            leader += 1
        elif any(pod == killed and e <= worker_kill for _, _, e, pod in entries) and any(
            s > worker_kill for _, s, _, _ in entries
        ):
            worker += 1
        else:
            other += 1
    return {
        "twice_claimed_just_before_leader_crash": leader,
        "twice_lost_with_killed_worker": worker,
        "twice_unexplained": other,
        "twice_with_a_run_on_killed_worker": on_killed,
        "attempt_numbers_of_reruns": dict(
            Counter(str(a) for entries in by_key.values() if len(entries) > 1 for a, *_ in entries)
        ),
    }


# --- the tables --------------------------------------------------------------------------------------


def side_table(title: str, rows: list[tuple[str, str, str]], vigil: dict, base: dict, base_name: str) -> str:
    lines = [
        f"| {title} | Vigil pool | {base_name} | Vigil / {base_name.split(' ')[0]} |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, key, pattern in rows:
        a, b = vigil.get(key), base.get(key)
        lines.append(f"| {label} | {fmt(a, pattern)} | {fmt(b, pattern)} | {fmt(ratio(a, b), '{:.2f}')} |")
    return "\n".join(lines)


THROUGHPUT_ROWS = [
    ("tasks succeeded", "succeeded_tasks", "{:,.0f}"),
    ("makespan (submit → last array finished), s", "makespan_seconds", "{:.1f}"),
    ("**throughput, tasks/s**", "throughput_tasks_per_second", "{:,.1f}"),
    ("**claim latency p50** (offer → claim), s", "claim_latency_p50_seconds", "{:.3f}"),
    ("claim latency p99, s", "claim_latency_p99_seconds", "{:.3f}"),
    ("claim latency mean, s", "claim_latency_mean_seconds", "{:.3f}"),
    ("**submit → task start p50**, s (pod created, native)", "submit_to_start_p50_seconds", "{:.1f}"),
    ("**submit → task start p99**, s", "submit_to_start_p99_seconds", "{:.1f}"),
    ("tasks in flight, max (worker slots used; pods, native)", "in_flight_max", "{:,.0f}"),
    ("tasks in flight, mean", "in_flight_mean", "{:,.0f}"),
    ("**controller API writes per task** (audit log)", "controller_writes_per_task", "{:.3f}"),
    ("job status writes by the controller", "job_status_writes", "{:,.0f}"),
    ("API writes per task, every client", "api_writes_per_task", "{:.3f}"),
    ("**controller CPU s** (operator / kube-controller-manager)", "controller_cpu_seconds", "{:.1f}"),
    ("controller CPU ms per task", "controller_cpu_ms_per_task", "{:.2f}"),
    ("**controller peak RSS MiB**", "controller_peak_rss_mib", "{:.0f}"),
    ("**kube-apiserver CPU s**", "apiserver_cpu_seconds", "{:.1f}"),
    ("etcd CPU s", "etcd_cpu_seconds", "{:.1f}"),
    ("kwok CPU s", "kwok_cpu_seconds", "{:.1f}"),
    ("the workers' CPU s (every worker process)", "workers_cpu_seconds", "{:.1f}"),
    ("the bench's own CPU s", "bench_cpu_seconds", "{:.1f}"),
    ("machine CPU busy over the run", "machine_busy_share", "{:.0%}"),
    ("worker requests not answered 200", "worker_requests_not_200", "{:,.0f}"),
    ("tasks lost (a key never in the ledger)", "tasks_lost", "{:,.0f}"),
]
REQUIRED = [
    "succeeded_tasks",
    "makespan_seconds",
    "throughput_tasks_per_second",
    "claim_latency_p50_seconds",
    "claim_latency_p99_seconds",
    "submit_to_start_p50_seconds",
    "submit_to_start_p99_seconds",
    "controller_writes_per_task",
    "controller_cpu_seconds",
    "controller_peak_rss_mib",
    "apiserver_cpu_seconds",
]

IN_FLIGHT_ROWS = [
    ("tasks submitted", "tasks", "{:,.0f}"),
    ("**tasks in flight at once, max** (Indexed Job: its parallelism's pods)", "in_flight_max", "{:,.0f}"),
    ("tasks in flight, mean over the run", "in_flight_mean", "{:,.0f}"),
    ("tasks succeeded", "succeeded_tasks", "{:,.0f}"),
    ("makespan, s", "makespan_seconds", "{:.1f}"),
    ("throughput, tasks/s", "throughput_tasks_per_second", "{:,.1f}"),
    ("worker requests", "worker_requests", "{:,.0f}"),
    ("**worker requests not answered 200** (any status, or none)", "worker_requests_not_200", "{:,.0f}"),
    ("**tasks seen Uncertain** (active records on the job watch)", "tasks_seen_uncertain", "{:,.0f}"),
    ("**vigil_attempts_uncertain_total**", "vigil_attempts_uncertain_total", "{:,.0f}"),
    ("vigil_attempts_lost_total", "vigil_attempts_lost_total", "{:,.0f}"),
    ("attempts over tasks (retries)", "attempts_over_tasks", "{:,.0f}"),
    ("claim latency p50 / p99, s", "claim_latency_p50_seconds", "{:.3f}"),
    ("claim latency p99, s", "claim_latency_p99_seconds", "{:.3f}"),
    ("**controller CPU s**", "controller_cpu_seconds", "{:.1f}"),
    ("**controller peak RSS MiB**", "controller_peak_rss_mib", "{:.0f}"),
    ("**controller API writes per task**", "controller_writes_per_task", "{:.3f}"),
    ("API writes per task, every client", "api_writes_per_task", "{:.3f}"),
    ("kube-apiserver CPU s", "apiserver_cpu_seconds", "{:.1f}"),
    ("the workers' CPU s", "workers_cpu_seconds", "{:.1f}"),
    ("machine CPU busy over the run", "machine_busy_share", "{:.0%}"),
]

BURST_ROWS = [
    ("arrays created", "arrays", "{:,.0f}"),
    ("created over, s", "submit_seconds", "{:.1f}"),
    ("**acknowledged (2xx)**", "acknowledged", "{:,.0f}"),
    ("**lost** (acknowledged, not listed at the end)", "lost", "{:,.0f}"),
    ("**arrays finished** (Succeeded)", "arrays_finished", "{:,.0f}"),
    ("**tasks succeeded**", "succeeded_tasks", "{:,.0f}"),
    ("tasks lost (a key never in the ledger)", "tasks_lost", "{:,.0f}"),
    ("makespan (first create → last array finished), s", "makespan_seconds", "{:.1f}"),
    ("throughput, tasks/s", "throughput_tasks_per_second", "{:,.1f}"),
    ("queue depth max (status.queued, tasks)", "queue_depth_max", "{:,.0f}"),
    ("tasks in flight, max", "in_flight_max", "{:,.0f}"),
    ("worker requests not answered 200", "worker_requests_not_200", "{:,.0f}"),
    ("controller writes per array (audit log)", "controller_writes_per_array", "{:.1f}"),
    ("controller CPU s", "controller_cpu_seconds", "{:.1f}"),
    ("controller peak RSS MiB", "controller_peak_rss_mib", "{:.0f}"),
    ("kube-apiserver CPU s", "apiserver_cpu_seconds", "{:.1f}"),
]


def in_flight_baseline(native: dict) -> dict:
    """The throughput run's Indexed Job as the in-flight scenario's baseline: its pods in flight."""
    if not native:
        return {}
    base = dict(native)
    base["in_flight_max"] = native.get("parallelism")
    base["in_flight_mean"] = native.get("in_flight_share", math.nan) * native.get("parallelism", 0)
    base["tasks"] = native.get("tasks")
    return base


def native_figures(native: dict) -> dict:
    """bench.arrays' Indexed Job side under this bench's names."""
    out = dict(native)
    out["submit_to_start_p50_seconds"] = native.get("submit_to_pod_p50_seconds")
    out["submit_to_start_p99_seconds"] = native.get("submit_to_pod_p99_seconds")
    out["in_flight_max"] = native.get("parallelism")
    out["in_flight_mean"] = native.get("in_flight_share", math.nan) * native.get("parallelism", 0)
    return out


def depth_text(vigil: dict) -> str:
    samples = vigil.get("in_flight_samples") or []
    if not samples:
        return ""
    step = max(1, len(samples) // 24)
    shown = samples[::step] + ([samples[-1]] if (len(samples) - 1) % step else [])
    lines = [
        "| s after the first create | tasks in flight | queue depth (queued) | queue running |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for t, f, q, r in shown:
        lines.append(f"| {t:.0f} | {f:,} | {'—' if q < 0 else f'{q:,}'} | {'—' if r < 0 else f'{r:,}'} |")
    return "\n".join(lines)


def fault_text(vigil: dict) -> str:
    fault = vigil.get("fault") or {}
    promised_twice = fault.get("in_flight_on_killed_worker", 0)
    rows = [
        ("tasks in flight when the leader was SIGKILLed", fault.get("in_flight_at_leader_kill"), "—"),
        ("new leader ready after, s", fault.get("new_leader_ready_seconds"), "—"),
        ("tasks held by the worker SIGKILLed", fault.get("in_flight_on_killed_worker"), "—"),
        ("**tasks lost** (a key never in the ledger)", vigil.get("tasks_lost"), "0"),
        ("tasks not succeeded in the arrays' status", vigil.get("tasks_not_succeeded"), "0"),
        ("arrays by phase", json.dumps(vigil.get("arrays_by_phase")), "all Succeeded"),
        (
            "**tasks run twice** (the ledger)",
            vigil.get("tasks_run_twice"),
            f"≤ {promised_twice:,} + those claimed just before the crash",
        ),
        (
            "… claimed in the 5 s before the leader's crash, run again after it",
            vigil.get("twice_claimed_just_before_leader_crash"),
            "allowed (design.md), unless its first worker named it before another claimed it",
        ),
        (
            "… lost with the killed worker (ended before its SIGKILL, run again after)",
            vigil.get("twice_lost_with_killed_worker"),
            f"≤ {promised_twice:,}",
        ),
        ("… with a run on the worker later killed (any cause)", vigil.get("twice_with_a_run_on_killed_worker"), "—"),
        ("… **unexplained**", vigil.get("twice_unexplained"), "0"),
        ("attempts over tasks (retries)", vigil.get("attempts_over_tasks"), "≥ the killed worker's tasks"),
        ("vigil_attempts_lost_total (both leaders)", vigil.get("vigil_attempts_lost_total"), "—"),
        ("worker requests not answered 200 (the leader's gap)", vigil.get("worker_requests_not_200"), "—"),
    ]
    lines = ["| faults | measured | docs/design.md promises |", "| --- | ---: | ---: |"]
    for label, value, promise in rows:
        shown = fmt(value, "{:,.1f}" if isinstance(value, float) else "{:,}") if not isinstance(value, str) else value
        lines.append(f"| {label} | {shown} | {promise} |")
    return "\n".join(lines)


def profile_text(vigil: dict) -> str:
    prof = vigil.get("profile") or {}
    if not prof.get("self"):
        return ""
    lines = [
        f"The operator under py-spy over the Vigil side ({prof.get('samples', 0):,} samples of a working thread, "
        f"100 Hz; {prof.get('file')}):",
        "",
        "| on top of the stack (self) | share | in Vigil's code, anywhere in the stack (total) | share |",
        "| --- | ---: | --- | ---: |",
    ]
    for (a, sa), (b, sb) in zip(prof["self"], prof["total"] + [("", 0.0)] * len(prof["self"]), strict=False):
        lines.append(f"| `{a}` | {sa:.1%} | {'`' + b + '`' if b else ''} | {sb:.1%} |")
    return "\n".join(lines)


# --- the command ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.pull", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=100_000, help="throughput: N tasks of 1 s (default 100000)")
    parser.add_argument("--arrays", type=int, default=None, help="throughput: arrays (default N / 10000, at least 1)")
    parser.add_argument("--parallelism", type=int, default=1000, help="each array's (default 1000, the most)")
    parser.add_argument("--native-tasks", type=int, default=5000, help="the Indexed Job's completions (default 5000)")
    parser.add_argument("--native-parallelism", type=int, default=1000, help="its parallelism (default 1000)")
    parser.add_argument("--workers", type=int, default=20, help="worker processes, one pool pod each (default 20)")
    parser.add_argument("--slots", type=int, default=500, help="slots per worker (default 500)")
    parser.add_argument("--worker-mode", choices=("timers", "handler"), default="timers")
    parser.add_argument("--throughput", action="store_true", help="run the default scenario with the others too")
    parser.add_argument("--profile", action="store_true", help="py-spy on the operator over the throughput run")
    parser.add_argument("--in-flight", action="store_true")
    parser.add_argument("--in-flight-tasks", type=int, default=50_000, help="tasks at once (default 50000)")
    parser.add_argument("--in-flight-seconds", type=float, default=5.0)
    parser.add_argument("--in-flight-rounds", type=int, default=2, help="each array's tasks over its parallelism")
    parser.add_argument("--burst", action="store_true")
    parser.add_argument("--burst-arrays", type=int, default=600)
    parser.add_argument("--burst-tasks", type=int, default=1000)
    parser.add_argument("--burst-over", type=float, default=30.0, help="seconds the creates are spread over")
    parser.add_argument("--burst-seconds", type=float, default=1.0, help="each task's seconds (default 1)")
    parser.add_argument("--faults", action="store_true")
    parser.add_argument("--fault-tasks", type=int, default=50_000, help="in flight when the leader is killed")
    parser.add_argument("--fault-seconds", type=float, default=10.0)
    parser.add_argument("--fault-rounds", type=int, default=2, help="each array's tasks over its parallelism")
    parser.add_argument(
        "--fault-worker-after", type=float, default=20.0, help="seconds after the new leader is ready (default 20)"
    )
    parser.add_argument("--fault-heartbeat", default="2,10", help="the pool's interval,timeout (default 2,10)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds a Vigil side may take")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--kubeconfig", type=Path, help="run against this cluster instead of the bench's own")
    parser.add_argument("--name", default="bpull", help="the bench's own test bed (default bpull)")
    parser.add_argument("--port-base", type=int, default=28643, help="its port base (default 28643)")
    parser.add_argument("--operator-args", default="", help="more arguments for `vigil operator`")
    args = parser.parse_args(argv)
    scenarios = [s for s, on in (("in-flight", args.in_flight), ("burst", args.burst), ("faults", args.faults)) if on]
    if args.throughput or args.profile or not scenarios:
        scenarios.insert(0, "throughput")
    if not 1 <= args.parallelism <= MAX_PARALLELISM or not 1 <= args.slots <= 1000:
        parser.error("--parallelism and --slots are 1..1000")
    if args.profile:
        py_spy()
    heartbeat = tuple(int(x) for x in args.fault_heartbeat.split(","))
    allow_open_files(20_000)

    native_nodes = math.ceil(args.native_parallelism / 110) + 1
    if args.kubeconfig:
        kubeconfig, cluster = args.kubeconfig, testbed_of(args.kubeconfig)
    else:
        cluster = own_cluster(args.name, args.port_base, native_nodes + math.ceil(args.workers / 110) + 1, False)
        kubeconfig = cluster.kubeconfig
    api = Api(kubeconfig, 16)
    install_crds(api)
    meta = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": os.environ.get("VIGIL_BENCH_COMMIT") or git_commit(),
        "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}",
        "cluster": f"local test bed {cluster.name!r}" if cluster else f"kubeconfig {kubeconfig}",
        "kubernetes": json.loads(api.get("/version")).get("gitVersion", "unknown"),
        "nodes": len(api.core.list_node(label_selector="type=kwok").items),
        "kcm_flags": kcm_flags(cluster),
        "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "scenarios": scenarios,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    workdir = Path(tempfile.mkdtemp(prefix="vigil-bench-pull-"))
    log(f"operator and worker logs in {workdir}")
    results: dict[str, dict] = {}
    report: list[str] = []
    name = "pull-" + "-".join(
        {
            "throughput": f"{args.tasks}",
            "in-flight": f"inflight-{args.in_flight_tasks}",
            "burst": f"burst-{args.burst_arrays}x{args.burst_tasks}",
            "faults": f"faults-{args.fault_tasks}",
        }[s]
        for s in scenarios
    )
    args.out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        (args.out / f"{name}.partial.json").write_text(json.dumps(no_nan({"meta": meta, "results": results}), indent=1))

    native: dict = {}
    for scenario in scenarios:
        if scenario == "throughput":
            arrays = args.arrays or max(1, args.tasks // 10_000)
            native_raw = run_throughput(
                api, cluster, "native", args.native_tasks, args.native_parallelism,
                args.timeout or 120 + args.native_tasks / 5, workdir, (),
            )  # fmt: skip
            native = native_figures(native_raw)
            vigil = run_pool(
                api, cluster, args, workdir, label="throughput", tasks=args.tasks, arrays=arrays,
                parallelism=args.parallelism, seconds=1.0, timeout=args.timeout or 300 + args.tasks / 20,
                profile=args.profile,
            )  # fmt: skip
            results["throughput"] = {"vigil": vigil, "native": native}
            report += [
                f"## Throughput: {args.tasks:,} tasks of 1 s in {arrays} arrays (parallelism {args.parallelism}) on "
                f"{args.workers} workers x {args.slots} slots ({args.worker_mode}), against an Indexed Job of "
                f"{args.native_tasks:,} completions of 1 s pods at parallelism {args.native_parallelism}",
                "",
                side_table(f"N = {args.tasks:,}", THROUGHPUT_ROWS, vigil, native, "Indexed Job"),
                "",
                "The controller's writes by verb and resource: Vigil "
                + json.dumps(vigil.get("controller_writes_by_verb_resource"))
                + "; Indexed Job "
                + json.dumps(native.get("controller_writes_by_verb_resource")),
                "",
                profile_text(vigil),
                "",
            ]
        elif scenario == "in-flight":
            arrays = max(1, math.ceil(args.in_flight_tasks / args.parallelism))
            tasks = args.in_flight_tasks * args.in_flight_rounds
            vigil = run_pool(
                api, cluster, args, workdir, label="inflight", tasks=tasks, arrays=arrays,
                parallelism=args.parallelism, seconds=args.in_flight_seconds,
                timeout=args.timeout or 300 + tasks / 20,
            )  # fmt: skip
            results["in-flight"] = {"vigil": vigil, "native": in_flight_baseline(native)}
            report += [
                f"## In flight: {args.in_flight_tasks:,} tasks of {args.in_flight_seconds:g} s at once "
                f"({arrays} arrays of {args.in_flight_rounds} x {args.parallelism} tasks, parallelism "
                f"{args.parallelism}) on {args.workers} x {args.slots} slots",
                "",
                side_table(
                    f"{args.in_flight_tasks:,} in flight",
                    IN_FLIGHT_ROWS,
                    vigil,
                    in_flight_baseline(native),
                    "Indexed Job (throughput run)",
                ),  # fmt: skip
                "",
                depth_text(vigil),
                "",
            ]
        elif scenario == "burst":
            slots = args.workers * args.slots
            total = args.burst_arrays * args.burst_tasks
            vigil = run_pool(
                api, cluster, args, workdir, label="burst", tasks=total, arrays=args.burst_arrays,
                parallelism=min(args.parallelism, args.burst_tasks), seconds=args.burst_seconds,
                queue_running=slots, over=args.burst_over, timeout=args.timeout or 600 + total / 100,
            )  # fmt: skip
            vigil["arrays"] = args.burst_arrays
            vigil["acknowledged"] = vigil["arrays_acknowledged"]
            vigil["lost"] = vigil["arrays_acknowledged"] - vigil["arrays_listed"]
            vigil["controller_writes_per_array"] = vigil.get("controller_writes", math.nan) / args.burst_arrays
            base = run_burst(
                api,
                cluster,
                "native",
                args.burst_arrays,
                args.burst_tasks,
                16,
                120 + args.burst_arrays / 5,
                workdir,
                (),
            )
            results["burst"] = {"vigil": vigil, "native": base}
            report += [
                f"## Burst: {args.burst_arrays:,} arrays of {args.burst_tasks:,} tasks of {args.burst_seconds:g} s "
                f"created over {args.burst_over:g} s in a VigilQueue (maxRunning {slots:,}, the pool's slots), "
                f"against as many suspended Indexed Jobs of {args.burst_tasks:,} completions created at once "
                "(acknowledged only: they do not run)",
                "",
                side_table(f"{total:,} tasks", BURST_ROWS, vigil, base, "Indexed Jobs"),
                "",
                "Tasks in flight and the queue's depth over time:",
                "",
                depth_text(vigil),
                "",
            ]
        else:
            arrays = max(1, math.ceil(args.fault_tasks / args.parallelism))
            tasks = arrays * args.parallelism * args.fault_rounds
            vigil = run_pool(
                api, cluster, args, workdir, label="faults", tasks=tasks, arrays=arrays,
                parallelism=args.parallelism, seconds=args.fault_seconds, heartbeat=heartbeat,  # type: ignore[arg-type]
                timeout=args.timeout or 600 + tasks / 20, faults=True,
            )  # fmt: skip
            results["faults"] = {"vigil": vigil}
            report += [
                f"## Faults: {tasks:,} tasks of {args.fault_seconds:g} s ({arrays} arrays, parallelism "
                f"{args.parallelism}) on {args.workers} x {args.slots} slots, pool heartbeat {args.fault_heartbeat}; "
                "the leader SIGKILLed (target "
                f"{args.fault_tasks:,} in flight) and started again, then the busiest worker SIGKILLed",
                "",
                fault_text(vigil),
                "",
                depth_text(vigil),
                "",
            ]
        save()
    text = "\n".join(
        [
            f"# Pull: worker pools against an Indexed Job ({', '.join(scenarios)})",
            "",
            f"- when: {meta['started']} (UTC); commit {meta['commit']}; {meta['machine']}",
            f"- cluster: {meta['cluster']}; Kubernetes {meta['kubernetes']}; {meta['nodes']} kwok nodes; "
            f"kube-controller-manager {meta['kcm_flags']}",
            f"- load average at start: {meta['loadavg']}",
            f"- `python -m bench.pull {' '.join(argv if argv is not None else sys.argv[1:])}`",
            "- workers: processes on this machine, one per pool pod, each the project's Worker "
            "(vigil.worker.runner) with tasks as "
            + ("timers" if args.worker_mode == "timers" else "sleeping handler calls"),
            "",
            *report,
        ]
    )
    print(text)
    path = results_out.write(args.out, name, text, no_nan({"meta": meta, "results": results}))
    (args.out / f"{name}.partial.json").unlink(missing_ok=True)
    log(f"wrote {path} and its .md")
    return 0 if all(ok(s, r["vigil"]) for s, r in results.items()) else 1


def ok(scenario: str, vigil: dict) -> bool:
    """Every array acknowledged finished Succeeded, and no task lost."""
    return (
        vigil["arrays_finished"] == vigil["arrays_acknowledged"] > 0
        and vigil["arrays_by_phase"] == {"Succeeded": vigil["arrays_acknowledged"]}
        and vigil["tasks_lost"] == 0
    )


if __name__ == "__main__":
    sys.exit(main())
