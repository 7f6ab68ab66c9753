"""What one write costs kube-apiserver: a VigilJob status write beside a built-in kind's write,
and a heartbeat on a pod beside one on a Lease.

    .venv/bin/python -m bench.write_cost            # --writes 800 --rounds 2 [--kubeconfig PATH] [--out DIR]

On the bench's own test bed (brought up or reused, as bench.compare does; no operator runs), each
kind of write below is made `--writes` times from 4 threads, each thread to its own 10 objects (no
conflicts), and kube-apiserver's CPU (utime + stime from /proc) over those writes is divided by
their number. The kinds take turns, `--rounds` times, so that a drift of the machine shows as a
spread rather than as a difference:

- `vigiljob-status-patch`: the merge patch Vigil writes when an attempt succeeds (the status of a
  finished job: five conditions, one attempt of history), with its resourceVersion precondition;
- `vigiljob-status-put`: the same status as a PUT of the whole object (what the Job controller's
  UpdateStatus does);
- `vigiljob-status-small`: a status of one condition, as a merge patch;
- `vigiljob-get`: not a write but a read, a GET of a VigilJob: the fence of a decision that writes
  no status (`ConfirmVersion`: an attempt's pod created first), where a status write was before;
- `vigiljob-create` and `job-create`: a submission, one new object each time, as bench.compare
  submits them (the same pod template); the Jobs carry `spec.managedBy` of no controller, so that
  the Job controller leaves them (and this measure) alone;
- `job-status-put`: what the Job controller's UpdateStatus sends, a PUT of a Job's status (one
  with `spec.managedBy`, which the Job controller leaves to us) whose `ready` count changes;
- `configmap-patch`: a merge patch of a ConfigMap's data, a built-in kind, for scale;
- `pod-heartbeat-patch`: what vigil-agent writes on every beat, a merge patch of the
  `vigil.dev/heartbeat` annotation of a Running pod (kwok's); the pod's watchers (kwok, the
  scheduler, kube-controller-manager) are sent every such change;
- `lease-renew`: the same beat as the kubelet makes it since KEP-589, a merge patch of a
  coordination.k8s.io Lease's `spec.renewTime`: what a beat would cost on a Lease per attempt.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import itertools
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import results_out
from bench.compare import (
    Api,
    cpu_seconds,
    create_namespace,
    delete_namespace,
    install_crds,
    log,
    native_job,
    own_cluster,
    pod_spec,
    testbed_of,
    vigil_job,
)
from testbed import cluster as testbed

THREADS = 4
OBJECTS_PER_THREAD = 10
GROUP_PATH = "/apis/vigil.dev/v1beta1"
MERGE_PATCH = "application/merge-patch+json"
LEASES_PATH = "/apis/coordination.k8s.io/v1"
HEARTBEAT = "vigil.dev/heartbeat"
JOBS_PATH = "/apis/batch/v1"
# A Job the Job controller leaves alone (JobManagedBy), so that its status is ours to write.
NO_CONTROLLER = "vigil.dev/bench-write-cost"


def condition(kind: str, status: str, message: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": "AttemptSucceeded",
        "message": message,
        "observedGeneration": 1,
        "lastTransitionTime": "2026-11-30T15:55:46Z",
    }


def finished_status(message: str) -> dict[str, Any]:
    """A VigilJob's status once its first attempt succeeded, as the operator writes it."""
    conditions = [("Succeeded", "True"), ("DeadLettered", "False"), ("Running", "False")]
    conditions += [("Reconciling", "False"), ("Stalled", "False")]
    return {
        "phase": "Succeeded",
        "reason": "AttemptSucceeded",
        "message": message,
        "attempts": 1,
        "roundAttempts": 1,
        "redrives": 0,
        "observedGeneration": 1,
        "startedAt": "2026-11-30T15:55:43Z",
        "finishedAt": "2026-11-30T15:55:46Z",
        "conditions": [condition(kind, status, message) for kind, status in conditions],
        "history": [
            {
                "number": 1,
                "podName": "job-1-1",
                "outcome": "Succeeded",
                "reason": "Completed",
                "exitCode": 0,
                "nodeName": "kwok-node-1",
                "startedAt": "2026-11-30T15:55:43Z",
                "finishedAt": "2026-11-30T15:55:46Z",
            }
        ],
    }


def small_status(message: str) -> dict[str, Any]:
    return {"message": message, "conditions": [condition("Succeeded", "True", message)]}


class Writer:
    """The objects of one run and one write of each kind to them."""

    def __init__(self, api: Api, namespace: str) -> None:
        self.api, self.namespace = api, namespace
        self.jobs: dict[int, dict[str, Any]] = {}
        self.native: dict[int, dict[str, Any]] = {}  # the batch/v1 Jobs, as last written
        self.fresh = itertools.count()  # names of created objects, unique over every round

    def setup(self) -> None:
        for i in range(THREADS * OBJECTS_PER_THREAD):
            job = {
                "apiVersion": "vigil.dev/v1beta1",
                "kind": "VigilJob",
                "metadata": {"name": f"job-{i}"},
                "spec": {
                    "template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}},
                    "heartbeat": {"required": False},
                },
            }
            self.jobs[i] = json.loads(self._send("POST", self._jobs(), job, "application/json"))
            config_map = {"metadata": {"name": f"cm-{i}"}, "data": {"a": "0"}}
            self._send("POST", f"/api/v1/namespaces/{self.namespace}/configmaps", config_map, "application/json")
            pod = {
                "metadata": {"name": f"pod-{i}", "annotations": {HEARTBEAT: "0"}},
                "spec": {**pod_spec(), "restartPolicy": "Never"},  # on kwok's nodes
            }
            self._send("POST", f"/api/v1/namespaces/{self.namespace}/pods", pod, "application/json")
            lease = {"metadata": {"name": f"pod-{i}"}, "spec": {"holderIdentity": f"pod-{i}", "renewTime": _now()}}
            self._send("POST", f"{LEASES_PATH}/namespaces/{self.namespace}/leases", lease, "application/json")
            self._send("POST", self._native_jobs(), self._native_job(f"njob-{i}"), "application/json")
            answer = self._send(
                "PUT",
                f"{self._native_jobs()}/njob-{i}/status",
                {
                    **self._get_native(i),
                    "status": {
                        "startTime": _now()[:19] + "Z",
                        "active": 1,
                        "ready": 0,
                        "terminating": 0,
                        "uncountedTerminatedPods": {},
                    },
                },
                "application/json",
            )
            self.native[i] = json.loads(answer)  # so that no measured write reads the Job first

    def wait_running(self, timeout: float = 120) -> None:
        """The pods are Running on kwok's nodes, their status filled, as a beating attempt's is."""
        deadline = time.monotonic() + timeout
        while True:
            pods = json.loads(self._send("GET", f"/api/v1/namespaces/{self.namespace}/pods", None, ""))["items"]
            if sum((p.get("status") or {}).get("phase") == "Running" for p in pods) == len(self.jobs):
                return
            if time.monotonic() > deadline:
                raise SystemExit(f"the pods of {self.namespace} were not all Running after {timeout:.0f}s")
            time.sleep(0.5)

    def _jobs(self) -> str:
        return f"{GROUP_PATH}/namespaces/{self.namespace}/vigiljobs"

    def _native_jobs(self) -> str:
        return f"{JOBS_PATH}/namespaces/{self.namespace}/jobs"

    @staticmethod
    def _native_job(name: str) -> dict[str, Any]:
        job = native_job("all-succeed", 0)
        job["metadata"]["name"] = name
        job["spec"]["managedBy"] = NO_CONTROLLER
        return job

    def _get_native(self, i: int) -> dict[str, Any]:
        return json.loads(self._send("GET", f"{self._native_jobs()}/njob-{i}", None, ""))

    def _create_vigiljob(self, i: int, n: int) -> None:
        job = vigil_job("all-succeed", 0)
        job["metadata"]["name"] = f"new-{next(self.fresh)}"
        self._send("POST", self._jobs(), job, "application/json")

    def _job_status(self, i: int, n: int) -> None:
        """The Job controller's UpdateStatus: a PUT of the whole Job as last read, its status changed."""
        job = self.native[i]
        job["status"]["ready"] = 1 - (job["status"].get("ready") or 0)  # a change, or the write is a no-op
        self.native[i] = json.loads(
            self._send("PUT", f"{self._native_jobs()}/njob-{i}/status", job, "application/json")
        )

    def _send(self, verb: str, path: str, body: dict[str, Any] | None, content_type: str) -> bytes:
        resp = self.api.http.request(
            verb,
            self.api.host + path,
            body=json.dumps(body).encode() if body is not None else None,
            headers={**self.api.headers, "Content-Type": content_type} if content_type else self.api.headers,
            timeout=30,
            retries=False,
        )
        if resp.status not in (200, 201):
            raise SystemExit(f"{verb} {path}: {resp.status} {resp.data[:300]!r}")
        return resp.data

    def _status(self, i: int, status: dict[str, Any], put: bool) -> None:
        job = self.jobs[i]
        path = f"{self._jobs()}/{job['metadata']['name']}/status"
        if put:
            answer = self._send("PUT", path, {**job, "status": status}, "application/json")
        else:
            patch = {"metadata": {"resourceVersion": job["metadata"]["resourceVersion"]}, "status": status}
            answer = self._send("PATCH", path, patch, MERGE_PATCH)
        self.jobs[i] = json.loads(answer)

    def kinds(self) -> dict[str, Callable[[int, int], None]]:
        return {
            "vigiljob-status-patch": lambda i, n: self._status(i, finished_status(f"write {n}"), put=False),
            "vigiljob-status-put": lambda i, n: self._status(i, finished_status(f"write {n}"), put=True),
            "vigiljob-status-small": lambda i, n: self._status(i, small_status(f"write {n}"), put=False),
            "vigiljob-get": lambda i, n: self._send(
                "GET", f"{self._jobs()}/{self.jobs[i]['metadata']['name']}", None, ""
            ),
            "vigiljob-create": self._create_vigiljob,
            "job-create": lambda i, n: self._send(
                "POST", self._native_jobs(), self._native_job(f"new-{next(self.fresh)}"), "application/json"
            ),
            "job-status-put": self._job_status,
            "configmap-patch": lambda i, n: self._send(
                "PATCH", f"/api/v1/namespaces/{self.namespace}/configmaps/cm-{i}", {"data": {"a": str(n)}}, MERGE_PATCH
            ),
            "pod-heartbeat-patch": lambda i, n: self._send(
                "PATCH",
                f"/api/v1/namespaces/{self.namespace}/pods/pod-{i}",
                {"metadata": {"annotations": {HEARTBEAT: str(n)}}},
                MERGE_PATCH,
            ),
            "lease-renew": lambda i, n: self._send(
                "PATCH",
                f"{LEASES_PATH}/namespaces/{self.namespace}/leases/pod-{i}",
                {"spec": {"renewTime": _now()}},
                MERGE_PATCH,
            ),
        }


def _now() -> str:
    """A Lease's MicroTime."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def measure(write: Callable[[int, int], None], writes: int, apiserver: int | None) -> dict[str, float]:
    """Over `writes` writes: kube-apiserver's CPU ms per write (when its process is local), and the
    writes per second."""

    def lane(thread: int) -> None:
        for n in range(writes // THREADS):
            write(thread * OBJECTS_PER_THREAD + n % OBJECTS_PER_THREAD, n)

    before, began = cpu_seconds(apiserver) if apiserver else 0.0, time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(lane, range(THREADS)))
    done = writes // THREADS * THREADS
    figures = {"writes_per_second": done / (time.monotonic() - began)}
    if apiserver:
        figures["cpu_ms_per_write"] = (cpu_seconds(apiserver) - before) * 1000 / done
    return figures


def report(results: dict[str, list[dict[str, float]]], writes: int, rounds: int, where: str) -> str:
    cpu = all("cpu_ms_per_write" in r for runs in results.values() for r in runs)
    base = min(r["cpu_ms_per_write"] for r in results["configmap-patch"]) if cpu else math.nan
    lines = [
        f"kube-apiserver CPU per write, {writes} writes of each kind per round from {THREADS} threads, "
        f"{rounds} rounds ({where})",
        "",
        "| write | CPU ms per write (each round) | writes/s | / configmap-patch |",
        "| --- | ---: | ---: | ---: |",
    ]
    for kind, runs in results.items():
        rate = sum(r["writes_per_second"] for r in runs) / len(runs)
        if cpu:
            each = " / ".join(f"{r['cpu_ms_per_write']:.2f}" for r in runs)
            against = f"{min(r['cpu_ms_per_write'] for r in runs) / base:.1f}×"
        else:  # not a local test bed: its API server's CPU cannot be read
            each, against = "—", "—"
        lines.append(f"| {kind} | {each} | {rate:.0f} | {against} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=800, help="writes of each kind per round (default 800)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, the kinds taking turns (default 2)")
    parser.add_argument("--name", default="bench", help="the bench's test bed (default bench)")
    parser.add_argument("--port-base", type=int, default=27443, help="its port base (default 27443)")
    parser.add_argument(
        "--kubeconfig", type=Path, help="run on this cluster instead (CPU figures only on a local test bed)"
    )
    parser.add_argument("--out", type=Path, help="also write <out>/write-cost-<UTC>.md and .json")
    args = parser.parse_args(argv)

    if args.kubeconfig:
        kubeconfig, cluster = args.kubeconfig, testbed_of(args.kubeconfig)
    else:
        cluster = own_cluster(args.name, args.port_base, nodes=3, needs_bench_stages=False)
        kubeconfig = cluster.kubeconfig
    apiserver = testbed.running_pid(cluster, "kube-apiserver") if cluster else None
    where = f"local test bed {cluster.name!r}" if cluster else f"kubeconfig {kubeconfig}, no CPU figures"
    api = Api(kubeconfig, THREADS)
    install_crds(api)
    namespace = f"bench-write-cost-{int(time.time())}"
    create_namespace(api, namespace)
    try:
        writer = Writer(api, namespace)
        writer.setup()
        writer.wait_running()
        time.sleep(2)  # let the creations' watch events and the garbage collector's look settle
        results: dict[str, list[dict[str, float]]] = {}
        for round_ in range(1, args.rounds + 1):
            for kind, write in writer.kinds().items():
                results.setdefault(kind, []).append(measure(write, args.writes, apiserver))
                log(f"round {round_}: {kind}: {results[kind][-1]}")
    finally:
        delete_namespace(api, namespace, timeout=120)

    text = report(results, args.writes, args.rounds, where)
    print(text)
    if args.out:
        figures = {"where": where, "writes": args.writes, "rounds": args.rounds, "results": results}
        figures = figures
        results_out.write(args.out, "write-cost", text, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
