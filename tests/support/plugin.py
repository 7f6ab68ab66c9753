"""`kubectl vigil` for the tests: VigilJobs and VigilQueues as the API server sends them (unit
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


def queue(name: str, namespace: str = "ns", spec: dict | None = None, status: dict | None = None) -> dict:
    return {
        "apiVersion": "vigil.dev/v1beta1",
        "kind": "VigilQueue",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": "3"},
        "spec": spec or {},
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
