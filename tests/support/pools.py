"""VigilWorkerPools on the cluster under test, and their workers as processes on this machine.

kwok's pods run nothing, so a pool's worker pods are given a real worker here: `vigil-worker`
started as a process with the pod's identity, a token of the pod's ServiceAccount bound to that
pod (the TokenRequest API, audience vigil.dev, as the kubelet mounts the projected token), and the
pull environment the pool put in the pod (docs/pull.md, "The pool's pods"). Every request then
travels the path a worker's does in a cluster: TLS to the leader's beat port, the token verified
against the cluster's keys, the pod looked up among the pool's.

Each task of the tests' workers appends a line to a ledger file (`LEDGER_LINE`), the side effect
the tests count: a task that ran twice shows twice.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.support.agents import pod_token
from tests.support.cluster import Kube, simulated_pod_spec
from tests.support.jobs import GROUP, VERSION

POOLS = "vigilworkerpools"
WORKER = Path(sys.executable).with_name("vigil-worker")

# A task: sleeps `VIGIL_TEST_TASK_SECONDS`, appends "<index> <attempt> <idempotency key> <code>
# <began> <ended>" (epoch seconds) to the ledger, and exits with the code `VIGIL_TEST_POISON` gives
# its index (3), else 0.
TASK = r"""
import os, sys, time
index = int(os.environ["VIGIL_TASK_INDEX"])
began = time.time()
time.sleep(float(os.environ.get("VIGIL_TEST_TASK_SECONDS", "0.2")))
poison = {int(i) for i in os.environ.get("VIGIL_TEST_POISON", "").split(",") if i}
code = 3 if index in poison else 0
line = f"{index} {os.environ['VIGIL_ATTEMPT']} {os.environ['VIGIL_IDEMPOTENCY_KEY']} {code} {began} {time.time()}\n"
with open(os.environ["VIGIL_TEST_LEDGER"], "a") as ledger:
    ledger.write(line)
sys.exit(code)
"""


def worker_pool(name: str, **spec: Any) -> dict[str, Any]:
    """A VigilWorkerPool whose pods run on kwok nodes until deleted (their worker runs here)."""
    _, pod_spec = simulated_pod_spec(exit_code=None)  # Running and Ready until deleted
    pod_spec["containers"][0]["command"] = ["vigil-worker", "--", "python", "task.py"]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "VigilWorkerPool",
        "metadata": {"name": name},
        "spec": {"template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec}, **spec},
    }


def pool_pods(kube: Kube, namespace: str, name: str) -> list[client.V1Pod]:
    """The pool's pods that are not being deleted."""
    pods = kube.core.list_namespaced_pod(namespace, label_selector=f"vigil.dev/pool={name}").items
    return [pod for pod in pods if pod.metadata.deletion_timestamp is None]


def read_pool(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, POOLS, name)


def pulled_array(name: str, pool: str, count: int, parallelism: int = 10, **spec: Any) -> dict[str, Any]:
    """A VigilJob of `count` tasks run by `pool`'s workers."""
    spec.setdefault("retry", {"maxAttempts": 3, "backoff": {"initialSeconds": 1, "jitter": 0}})
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "VigilJob",
        "metadata": {"name": name},
        "spec": {"pool": pool, "tasks": {"count": count, "parallelism": parallelism}, **spec},
    }


def env_of(pod: client.V1Pod) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env or [] if e.value is not None}


class Workers:
    """`vigil-worker` processes for pool pods, each with its pod's identity; stopped at the end."""

    def __init__(self, kube: Kube, workdir: Path) -> None:
        self.kube, self.workdir = kube, workdir
        self.procs: dict[str, subprocess.Popen] = {}
        self.ledger = workdir / "ledger.txt"
        self.ledger.touch()

    def start(
        self,
        pod: client.V1Pod,
        *,
        url: str | None = None,
        task_seconds: float = 0.2,
        poison: tuple[int, ...] = (),
        token: str | None = None,
    ) -> subprocess.Popen:
        namespace, name = pod.metadata.namespace, pod.metadata.name
        env = env_of(pod)
        if token is None:
            account = pod.spec.service_account_name or "default"
            bound = {"name": name, "uid": pod.metadata.uid}
            token = pod_token(self.kube, namespace, bound, account=account, audiences=("vigil.dev",))
        token_file = self.workdir / f"{name}.token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        run_env = {
            **os.environ,
            "VIGIL_PULL_URL": url or env["VIGIL_PULL_URL"],
            "VIGIL_PULL_CA": env["VIGIL_PULL_CA"],
            "VIGIL_PULL_TOKEN_FILE": str(token_file),
            "VIGIL_POD_NAME": name,
            "VIGIL_POD_NAMESPACE": namespace,
            "VIGIL_POD_UID": pod.metadata.uid,
            "VIGIL_POOL_SLOTS": env["VIGIL_POOL_SLOTS"],
            "VIGIL_TEST_LEDGER": str(self.ledger),
            "VIGIL_TEST_TASK_SECONDS": str(task_seconds),
            "VIGIL_TEST_POISON": ",".join(map(str, poison)),
        }
        log = (self.workdir / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            [str(WORKER), "--grace", "5", "--", sys.executable, "-c", TASK],
            env=run_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def kill(self, name: str) -> None:
        """SIGKILL the worker and every task it runs (its tasks' process groups are its children's)."""
        proc = self.procs[name]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def log(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text(errors="replace")

    def runs(self) -> list[tuple[int, int, str, int]]:
        """Every task run the ledger records: (index, attempt, idempotency key, exit code)."""
        lines = [line.split() for line in self.ledger.read_text().splitlines() if line.strip()]
        return [(int(i), int(a), key, int(code)) for i, a, key, code, *_ in lines]

    def most_at_once(self) -> int:
        """The most tasks that ran at the same instant, by the ledger's times."""
        lines = [line.split() for line in self.ledger.read_text().splitlines() if line.strip()]
        edges = sorted((float(t), step) for *_, began, ended in lines for t, step in ((began, 1), (ended, -1)))
        most = now = 0
        for _, step in edges:
            now += step
            most = max(most, now)
        return most

    def successes(self) -> Counter[int]:
        return Counter(index for index, _, _, code in self.runs() if code == 0)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
