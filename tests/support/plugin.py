"""`kubectl vigil` for the tests: VigilJobs, VigilQueues and VigilWorkerPools as the API server sends them (unit
tests), and the plugin as kubectl finds it on PATH (end-to-end tests)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from testbed import cluster as testbed
from vigil.plugin import cli


def plugin_command() -> list[str]:
    """The installed console script next to the interpreter, as kubectl finds it on PATH; in an
    environment installed before the script existed, the same `main` through `python -m`."""
    script = Path(sys.executable).with_name("kubectl-vigil")
    return [str(script)] if script.exists() else [sys.executable, "-m", "vigil.plugin"]


def kubectl_binary() -> str:
    """kubectl as the suites run it: the test bed's own build, else the one on PATH."""
    built = testbed.BIN / "kubectl"
    return str(built) if built.exists() else shutil.which("kubectl") or "kubectl"


def plugin_environment(kubeconfig: Path) -> dict[str, str]:
    """A user's environment for kubectl and its plugins: the console scripts (kubectl-vigil,
    kubectl_complete-vigil) first on PATH, the kubeconfig in KUBECONFIG (kubectl hands a plugin
    its environment, not its own flags)."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, "KUBECONFIG": str(kubeconfig)}


def sample_job(
    name: str = "j",
    namespace: str = "ns",
    *,
    queue: str | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    **status: Any,
) -> dict:
    """A job with `status` as given (phase, reason, conditions... in the CRD's names)."""
    spec: dict[str, Any] = {"retry": {"maxAttempts": 6}, "heartbeat": {"required": True}}
    if queue:
        spec["queue"] = queue
    return {
        "apiVersion": "vigil.dev/v1beta1",
        "kind": "VigilJob",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "resourceVersion": "7",
            "creationTimestamp": "2026-03-01T11:00:00Z",
            "annotations": annotations or {},
            "labels": labels or {},
        },
        "spec": spec,
        "status": status,
    }


def dead_job(name: str, finished: str = "2026-03-01T11:30:00Z", **fields: Any) -> dict:
    """A job dead-lettered by a non-retryable exit code after one attempt, labelled as Vigil does."""
    status = {
        "phase": "DeadLettered",
        "reason": "NonRetryableExitCode",
        "message": "dead-lettered: attempt 1 exited 7",
        "attempts": 1,
        "finishedAt": finished,
        **fields,
    }
    return sample_job(name, labels={"vigil.dev/dead-letter": "true"}, **status)


def array_job(
    name: str = "batch",
    *,
    count: int = 1000,
    parallelism: int = 10,
    tasks: dict | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    **status: Any,
) -> dict:
    """A task array of `count` tasks (spec.tasks) with `status` as given and `tasks` as its
    status.tasks (None: the operator has not written it yet)."""
    job = sample_job(name, annotations=annotations, labels=labels, **status)
    job["spec"]["tasks"] = {"count": count, "parallelism": parallelism}
    job["spec"]["retry"] = {"maxAttempts": 3}
    if tasks is not None:
        job["status"]["tasks"] = tasks
    return job


def active_task(index: int, phase: str = "Running", attempts: int = 1, **fields: Any) -> dict:
    """An entry of status.tasks.active: a task started and not finished."""
    entry: dict[str, Any] = {"index": index, "phase": phase, "reason": "AttemptRunning", "attempts": attempts}
    entry["roundAttempts"] = attempts
    if phase == "Running":
        entry["currentAttempt"] = {
            "number": attempts,
            "podName": f"batch-{index}-{attempts}",
            "phase": "Running",
            "startedAt": "2026-03-01T11:59:00Z",
            "nodeName": "kwok-node-0",
        }
    entry["startedAt"] = "2026-03-01T11:58:00Z"
    return {**entry, **fields}


def failed_task(index: int, attempts: int = 3, finished: str = "2026-03-01T11:50:00Z", **fields: Any) -> dict:
    """An entry of status.tasks.failed: a dead-lettered task."""
    return {
        "index": index,
        "attempts": attempts,
        "outcome": "Failed",
        "reason": "AttemptsExhausted",
        "exitCode": 3,
        "finishedAt": finished,
        "message": f"task {index}: attempt {attempts} exited 3",
        **fields,
    }


def array_tasks(**fields: Any) -> dict:
    """status.tasks of a running array of 1000 tasks, as the brief's example: 979 succeeded,
    task 5 dead-lettered, tasks 980-989 active (986 backing off), 990-999 pending."""
    active = [active_task(i) for i in range(980, 990) if i != 986]
    active.insert(6, active_task(986, "BackingOff", 2, reason="AttemptFailed", nextAttemptAt="2026-03-01T12:00:05Z"))
    active[6]["last"] = {
        "number": 1,
        "podName": "batch-986-1",
        "outcome": "Failed",
        "exitCode": 1,
        "startedAt": "2026-03-01T11:58:00Z",
        "finishedAt": "2026-03-01T11:59:55Z",
    }
    return {
        "total": 1000,
        "pending": 10,
        "running": 9,
        "backingOff": 1,
        "succeeded": 979,
        "deadLettered": 1,
        "progress": "979/1000",
        "succeededIndexes": "0-4,6-979",
        "deadLetteredIndexes": "5",
        "priorAttempts": [{"attempts": 3, "indexes": "5"}],
        "failed": [failed_task(5)],
        "active": active,
        "redrives": 0,
        "lastRedrive": None,
        **fields,
    }


def queue(name: str, namespace: str = "ns", spec: dict | None = None, status: dict | None = None) -> dict:
    return {
        "apiVersion": "vigil.dev/v1beta1",
        "kind": "VigilQueue",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": "3"},
        "spec": spec or {},
        "status": status or {},
    }


def worker_pool(name: str, namespace: str = "ns", spec: dict | None = None, status: dict | None = None) -> dict:
    """A VigilWorkerPool as the API server sends it."""
    return {
        "apiVersion": "vigil.dev/v1beta1",
        "kind": "VigilWorkerPool",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": "4"},
        "spec": {"template": {"spec": {"containers": [{"name": "w", "image": "etl:1"}]}}, **(spec or {})},
        "status": status or {},
    }


class KeptOut(cli.Out):
    """What `kubectl vigil logs` writes, kept: the log's bytes and the notes (unit tests)."""

    def __init__(self) -> None:
        self.written = b""
        self.notes: list[str] = []

    def data(self, chunk: bytes) -> None:
        self.written += chunk

    def note(self, text: str) -> None:
        self.notes.append(text)
