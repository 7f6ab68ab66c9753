"""Task arrays (VigilJob spec.tasks) on the cluster under test: array bodies, and `TaskPods`, a
watch of the tasks' pods that records every pod ever seen per task and attempt and, as the
tasks' own workload would, tells kwok how each one ends.

kwok's stages finish a pod as its `sim.vigil.dev/*` annotations say, and every task of an array
has the same template: the template cannot make one task fail and another succeed. So the
array's template carries no exit code (its pods run until deleted), and `TaskPods` plays the
workload: when it first sees a task's pod it asks `decide(index, attempt)` and writes the answer,
an exit code and a run time, on the pod (what a program reading VIGIL_TASK_INDEX and VIGIL_ATTEMPT
would do); kwok then runs it that long and ends it with that code. `decide` returning None leaves
the pod running until deleted (`finish` ends it later).
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from tests.support.cluster import Kube
from tests.support.jobs import FAST_BACKOFF, GROUP, PLURAL, VERSION, vigil_job
from tests.support.operators import OperatorProcess
from tests.support.waits import wait_until
from tests.support.watchers import TERMINAL_POD_PHASES, Watch

LABEL_TASK_INDEX = "vigil.dev/task-index"
LABEL_ATTEMPT = "vigil.dev/attempt"
EXIT_CODE = "sim.vigil.dev/exit-code"
RUN_FOR = "sim.vigil.dev/run-for"

# How a task's attempt ends: (exit code, run time as a Go duration), or None: it runs until deleted.
Ending = tuple[int, str] | None
Decide = Callable[[int, int], Ending]


def array_job(
    name: str,
    count: int,
    parallelism: int | None = None,
    exit_code: str | None = None,
    run_for: str | None = None,
    **spec: Any,
) -> dict:
    """A VigilJob of `count` tasks (indexes 0..count-1) whose pods run on kwok nodes: with no
    `exit_code` they run until deleted (or until `TaskPods` says how they end); retries back
    off 1 s without jitter unless `retry` says otherwise."""
    spec.setdefault("retry", {"maxAttempts": 3, "backoff": FAST_BACKOFF})
    job = vigil_job(name, exit_code=exit_code, run_for=run_for, **spec)
    tasks: dict[str, Any] = {"count": count}
    if parallelism is not None:
        tasks["parallelism"] = parallelism
    job["spec"]["tasks"] = tasks
    return job


def tasks_of(kube: Kube, namespace: str, name: str) -> dict:
    """status.tasks of the job ({} until written)."""
    job = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return (job.get("status") or {}).get("tasks") or {}


def active_task(tasks: dict, index: int) -> dict | None:
    """The entry of status.tasks.active for the task, if it is active."""
    return next((t for t in tasks.get("active") or [] if t["index"] == index), None)


def annotate_job(kube: Kube, namespace: str, name: str, annotations: dict[str, str]) -> dict:
    return kube.custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, {"metadata": {"annotations": annotations}}
    )


def patch_spec(kube: Kube, namespace: str, name: str, spec: dict) -> dict:
    return kube.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, {"spec": spec})


def env_of(pod: client.V1Pod) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env or [] if e.value is not None}


@dataclass
class TaskPod:
    name: str
    job: str  # the owner's name
    index: int
    attempt: int
    uid: str
    added: int  # the watch's event number when it was first shown
    stopped: int | None = None  # event number when it was first shown finished (Succeeded/Failed) or gone
    ended: int | None = None  # the same, or being deleted: it no longer counts as running
    asked: bool = False  # the workload was asked how it ends (or the template said)


class TaskPods(Watch):
    """Every task pod of a namespace, as the API server showed them in order (each event has a
    number, so "created after the other stopped" is a comparison of numbers, not of clocks);
    and the workload of those pods (see the module's docstring): `decide(index, attempt)`."""

    def __init__(self, kube: Kube, namespace: str, decide: Decide | None = None) -> None:
        super().__init__(kube, client.CoreV1Api(kube.api).list_namespaced_pod, namespace, watch_seconds=10)
        self.namespace = namespace
        self.decide = decide
        self.pods: dict[str, TaskPod] = {}  # uid -> pod
        self.active: set[str] = set()
        self.max_active = 0
        self.event = 0
        self.patch_errors: list[str] = []
        self._to_decide: list[TaskPod] = []
        self._patching = threading.Lock()

    def on_object(self, obj: dict, now: float, deleted: bool) -> None:
        meta = obj["metadata"]
        labels = meta.get("labels") or {}
        if LABEL_TASK_INDEX not in labels:
            return
        self.event += 1
        uid = meta["uid"]
        pod = self.pods.get(uid)
        if pod is None:
            owner = (meta.get("ownerReferences") or [{"name": "?"}])[0]
            pod = TaskPod(
                name=meta["name"],
                job=owner["name"],
                index=int(labels[LABEL_TASK_INDEX]),
                attempt=int(labels.get(LABEL_ATTEMPT, "0")),
                uid=uid,
                added=self.event,
            )
            self.pods[uid] = pod
            self.active.add(uid)
            self.max_active = max(self.max_active, len(self.active))
        phase = (obj.get("status") or {}).get("phase")
        if pod.stopped is None and (deleted or phase in TERMINAL_POD_PHASES):
            pod.stopped = self.event
        if pod.ended is None and (pod.stopped is not None or meta.get("deletionTimestamp")):
            pod.ended = self.event
            self.active.discard(uid)
        annotations = meta.get("annotations") or {}
        if EXIT_CODE in annotations:
            pod.asked = True
        if not pod.asked and pod.ended is None and self.decide is not None:
            pod.asked = True
            self._to_decide.append(pod)

    def _deliver(self, obj: dict, deleted: bool = False) -> str:
        version = super()._deliver(obj, deleted)
        with self.lock:
            todo, self._to_decide = self._to_decide, []
        for pod in todo:  # outside the lock: an API call
            assert self.decide is not None
            ending = self.decide(pod.index, pod.attempt)
            if ending is not None:
                self.finish(pod.name, *ending)
        return version

    def finish(self, pod_name: str, exit_code: int, run_for: str = "0s") -> None:
        """Ends the pod's run: kwok stops it with `exit_code` after `run_for` from now."""
        patch = {"metadata": {"annotations": {EXIT_CODE: str(exit_code), RUN_FOR: run_for}}}
        with self._patching:
            try:
                client.CoreV1Api(self.kube.api).patch_namespaced_pod(pod_name, self.namespace, patch)
            except client.ApiException as err:
                if err.status != 404:  # gone meanwhile: nothing to end
                    self.patch_errors.append(f"{pod_name}: {err.status} {err.reason}")

    # --- what was seen --------------------------------------------------------------------------

    def of(self, job: str) -> list[TaskPod]:
        """The job's pods, in the order they were first shown."""
        with self.lock:
            return sorted((p for p in self.pods.values() if p.job == job), key=lambda p: p.added)

    def per_index(self, job: str) -> dict[int, list[TaskPod]]:
        """The job's pods ever seen, per task index, oldest first."""
        found: dict[int, list[TaskPod]] = defaultdict(list)
        for pod in self.of(job):
            found[pod.index].append(pod)
        return dict(found)

    def started(self, job: str) -> int:
        return len(self.of(job))

    def active_count(self) -> int:
        with self.lock:
            return len(self.active)

    def duplicates(self, job: str) -> list[str]:
        """(task, attempt) pairs that had more than one pod: an attempt started twice."""
        counts = Counter((p.index, p.attempt) for p in self.of(job))
        return [f"task {i} attempt {a}: {n} pods" for (i, a), n in counts.items() if n > 1]

    def caught_up(self) -> None:
        """Waits until the watch has shown every pod that exists, in its latest phase."""
        listed = self.kube.core.list_namespaced_pod(self.namespace).items

        def shown() -> bool:
            with self.lock:
                return all(
                    p.metadata.uid in self.pods
                    and (p.status.phase not in TERMINAL_POD_PHASES or self.pods[p.metadata.uid].stopped is not None)
                    for p in listed
                    if LABEL_TASK_INDEX in (p.metadata.labels or {})
                )

        wait_until(shown, 30, "the test's pod watch to catch up with the API server")

    def assert_healthy(self) -> None:
        assert not self.relists, f"the pod watch had to list again {self.relists} times: the order is unknown"
        assert len(self.errors) <= 3, f"the pod watch failed {len(self.errors)} times: {self.errors[:5]}"
        assert not self.patch_errors, f"the workload could not end pods: {self.patch_errors[:5]}"


@dataclass(frozen=True)
class TaskSeen:
    at: float  # monotonic, when the watch showed it
    phase: str  # the task's phase in status.tasks.active
    attempts: int
    last_outcome: str | None  # its last finished attempt's outcome


class TaskPhases(Watch):
    """Every phase each active task of each array was shown in, in the order of the job's
    writes (a watch shows every write, where polling may miss a state that lasts one write)."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        custom = client.CustomObjectsApi(kube.api)
        super().__init__(kube, custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL)
        self.seen: dict[tuple[str, int], list[TaskSeen]] = defaultdict(list)

    def on_object(self, obj: dict, now: float, deleted: bool) -> None:
        tasks = (obj.get("status") or {}).get("tasks") or {}
        for task in tasks.get("active") or []:
            entry = TaskSeen(now, task["phase"], task.get("attempts", 0), (task.get("last") or {}).get("outcome"))
            history = self.seen[obj["metadata"]["name"], task["index"]]
            if not history or (history[-1].phase, history[-1].attempts) != (entry.phase, entry.attempts):
                history.append(entry)

    def of(self, job: str, index: int) -> list[TaskSeen]:
        with self.lock:
            return list(self.seen.get((job, index), []))

    def first(self, job: str, index: int, phase: str, attempts: int) -> TaskSeen | None:
        """When the task was first shown in `phase` during its attempt number `attempts`."""
        return next((s for s in self.of(job, index) if (s.phase, s.attempts) == (phase, attempts)), None)


# --- an operator of a test's own, killed and restarted ------------------------------------------


def reconciling_count(operator: OperatorProcess) -> int:
    """How many times the operator's log said it listed everything and reconciles."""
    return sum(" vigil.manager: " in line and line.endswith("reconciling") for line in operator.log().splitlines())


def wait_reconciling(operator: OperatorProcess, before: int) -> None:
    """Waits until the operator's log says it reconciles for the time number `before` + 1."""
    wait_until(
        lambda: (
            reconciling_count(operator) > before or (operator.proc is not None and operator.proc.poll() is not None)
        ),
        60,
        "the operator to list and begin reconciling",
    )
    assert operator.proc is not None and operator.proc.poll() is None, f"the operator exited: see {operator.log_path}"
