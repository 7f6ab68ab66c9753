"""Task arrays (spec.tasks), decided without a cluster: each task keeps a job's whole contract,
the array's status stays small, and its starts follow parallelism and the queue's permits."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.builders import T0, apply_to_job, make_job, merge_patch, stamp
from vigil import api
from vigil.core import doubt
from vigil.core.actions import CreatePod, Decision, DeletePod, EmitEvent, PatchStatus, ReleasePod
from vigil.core.tasks.array import decide_array, reject_array_pod, wants_now
from vigil.core.tasks.ranges import IndexSet

pytestmark = pytest.mark.unit

FAST_RETRY = {"maxAttempts": 3, "backoff": {"initialSeconds": 1, "jitter": 0.0, "factor": 1.0, "maxSeconds": 1}}


def array(count: int = 5, parallelism: int = 2, **spec: Any) -> dict[str, Any]:
    tasks = {"count": count, "parallelism": parallelism}
    tasks.update(spec.pop("tasks", {}))
    return make_job(
        name="arr",
        spec={"tasks": tasks, "heartbeat": {"required": False}, "retry": FAST_RETRY, **spec},
    )


class Sim:
    """The API server and the kubelets, as far as an array's decisions need them: a status patch is
    applied, a created pod appears, and `outcome(index, attempt)` says how each pod ends (an exit
    code, or None to keep it running)."""

    def __init__(self, job: dict[str, Any], outcome: Callable[[int, int], int | None], starts: int = 1000) -> None:
        self.job, self.outcome, self.starts = job, outcome, starts
        self.pods: dict[str, dict[str, Any]] = {}
        self.now = T0
        self.created: list[tuple[int, int]] = []
        self.writes = 0
        self.events: list[EmitEvent] = []
        self.max_running = 0
        self.rng = random.Random(7)

    def look(self) -> Any:
        decided = decide_array(self.job, list(self.pods.values()), self.now, rng=self.rng, starts=self.starts)
        decision = decided.decision
        self.writes += len(decision.of_type(PatchStatus))
        self.job = apply_to_job(self.job, decision) if decision.of_type(PatchStatus) else self.job
        for create in decision.of_type(CreatePod):
            pod = copy.deepcopy(create.manifest)
            labels = pod["metadata"]["labels"]
            key = (int(labels[api.LABEL_TASK_INDEX]), int(labels[api.LABEL_ATTEMPT]))
            assert pod["metadata"]["name"] not in self.pods, f"pod {pod['metadata']['name']} created twice"
            self.created.append(key)
            pod["metadata"]["uid"] = f"uid-{key[0]}-{key[1]}"
            pod["metadata"]["resourceVersion"] = "1"
            pod["status"] = {"phase": "Pending"}
            self.pods[pod["metadata"]["name"]] = pod
        for delete in decision.of_type(DeletePod):
            self.pods.pop(delete.name, None)
        releases = decision.of_type(ReleasePod)
        # Each release is an API write: one per finished pod, never a second (the bench counts them).
        assert len({r.uid for r in releases}) == len(releases), f"a pod released twice in one look: {releases}"
        for release in releases:
            pod = self.pods.get(release.name)
            assert pod is None or api.FINALIZER_ATTEMPT_TRACKING in pod["metadata"].get("finalizers", []), (
                f"{release.name} released again"
            )
            if pod is not None:
                pod["metadata"]["finalizers"] = [
                    f for f in pod["metadata"].get("finalizers", []) if f != api.FINALIZER_ATTEMPT_TRACKING
                ]
        self.events += decision.of_type(EmitEvent)
        return decided

    def run_pods(self) -> None:
        """Every pending pod runs; a running one ends as `outcome` says."""
        running = 0
        for pod in self.pods.values():
            labels = pod["metadata"]["labels"]
            index, attempt = int(labels[api.LABEL_TASK_INDEX]), int(labels[api.LABEL_ATTEMPT])
            phase = pod["status"]["phase"]
            if phase == "Pending":
                pod["status"] = {
                    "phase": "Running",
                    "containerStatuses": [{"name": "c", "state": {"running": {"startedAt": stamp(self.now)}}}],
                }
                running += 1
            elif phase == "Running":
                code = self.outcome(index, attempt)
                if code is None:
                    running += 1
                    continue
                terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
                pod["status"] = {
                    "phase": "Succeeded" if code == 0 else "Failed",
                    "containerStatuses": [{"name": "c", "state": {"terminated": terminated}}],
                }
            pod["metadata"]["resourceVersion"] = str(int(pod["metadata"]["resourceVersion"]) + 1)
        self.max_running = max(self.max_running, running)

    def run(self, steps: int = 200) -> dict[str, Any]:
        for _ in range(steps):
            self.look()
            if self.status().get("phase") in api.TERMINAL_PHASES:
                self.look()  # the releases of the last pods
                return self.status()
            self.run_pods()
            self.now += timedelta(seconds=1)
        raise AssertionError(f"the array did not finish: {json.dumps(self.status())[:2000]}")

    def status(self) -> dict[str, Any]:
        return self.job.get("status") or {}

    def tasks(self) -> dict[str, Any]:
        return self.status().get("tasks") or {}

    def pods_per_task(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for index, _ in self.created:
            counts[index] = counts.get(index, 0) + 1
        return counts


def succeed(index: int, attempt: int) -> int | None:
    return 0


def test_every_task_runs_once_and_the_array_succeeds() -> None:
    sim = Sim(array(count=7, parallelism=3), succeed)
    status = sim.run()
    assert status["phase"] == "Succeeded" and status["reason"] == "AllTasksSucceeded"
    assert sim.tasks()["succeededIndexes"] == "0-6" and sim.tasks()["progress"] == "7/7"
    assert sim.pods_per_task() == dict.fromkeys(range(7), 1)
    assert sim.tasks()["active"] == [] and status["attempts"] == 7
    assert sim.max_running <= 3
    # every pod released once its task's end is in status
    assert all(api.FINALIZER_ATTEMPT_TRACKING not in p["metadata"].get("finalizers", []) for p in sim.pods.values())
    assert {c["type"]: c["status"] for c in status["conditions"]}["Succeeded"] == "True"


def test_task_pods_carry_the_index_the_item_and_a_stable_idempotency_key() -> None:
    job = array(count=1, tasks={"count": None, "items": ["a.csv", {"k": 1}]})
    job["spec"]["tasks"].pop("count")
    sim = Sim(job, lambda index, attempt: 0 if attempt == 2 else 1)
    sim.run()
    envs = {}
    for name, pod in sim.pods.items():
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        envs[name] = env
        assert pod["metadata"]["ownerReferences"][0]["name"] == "arr"
    assert envs["arr-0-1"]["VIGIL_TASK_ITEM"] == "a.csv" and envs["arr-1-1"]["VIGIL_TASK_ITEM"] == '{"k":1}'
    assert envs["arr-0-1"]["VIGIL_TASK_INDEX"] == "0" and envs["arr-1-2"]["VIGIL_TASK_COUNT"] == "2"
    # the key is the task's, the same over its attempts; the fencing token is the attempt's
    assert envs["arr-1-1"]["VIGIL_IDEMPOTENCY_KEY"] == envs["arr-1-2"]["VIGIL_IDEMPOTENCY_KEY"]
    assert envs["arr-0-1"]["VIGIL_IDEMPOTENCY_KEY"] != envs["arr-1-1"]["VIGIL_IDEMPOTENCY_KEY"]
    assert envs["arr-1-2"]["VIGIL_FENCING_TOKEN"] == "2" and envs["arr-1-2"]["VIGIL_JOB"] == "arr"


def test_a_poison_task_is_dead_lettered_alone_and_the_others_go_on() -> None:
    spec_retry = {**FAST_RETRY, "nonRetryableExitCodes": [3]}
    sim = Sim(array(count=20, parallelism=5, retry=spec_retry), lambda i, a: 3 if i == 7 else 0)
    status = sim.run()
    tasks = sim.tasks()
    assert status["phase"] == "DeadLettered" and status["reason"] == "TasksDeadLettered"
    assert tasks["deadLetteredIndexes"] == "7" and tasks["succeededIndexes"] == "0-6,8-19"
    assert tasks["progress"] == "19/20" and tasks["deadLettered"] == 1
    assert sim.pods_per_task() == dict.fromkeys(range(20), 1)
    (failure,) = tasks["failed"]
    assert failure["index"] == 7 and failure["exitCode"] == 3 and failure["reason"] == "NonRetryableExitCode"
    assert tasks["priorAttempts"] == [{"attempts": 1, "indexes": "7"}]
    assert any(e.reason == "TaskDeadLettered" and "--tasks 7" in e.message for e in sim.events)
    assert sim.job["metadata"]["labels"].get(api.LABEL_DEAD_LETTER) == "true"
    assert sim.job["metadata"]["labels"].get(api.LABEL_DEAD_TASKS) == "true"


def test_a_failing_task_is_retried_with_backoff_then_dead_lettered_when_its_attempts_are_used() -> None:
    sim = Sim(array(count=3, parallelism=3), lambda i, a: 1 if i == 1 else 0)
    status = sim.run()
    assert status["reason"] == "TasksDeadLettered"
    assert sim.pods_per_task() == {0: 1, 1: 3, 2: 1}
    assert sim.tasks()["failed"][0]["reason"] == "AttemptsExhausted"


def test_redrive_of_a_task_goes_on_with_its_attempt_numbers() -> None:
    sim = Sim(array(count=4, parallelism=4), lambda i, a: 3 if (i == 2 and a == 1) else 0)
    sim.job["spec"]["retry"] = {**FAST_RETRY, "nonRetryableExitCodes": [3]}
    status = sim.run()
    assert status["phase"] == "DeadLettered" and sim.tasks()["deadLetteredIndexes"] == "2"
    sim.job["metadata"]["annotations"][api.ANNOTATION_REDRIVE_TASKS] = "2@tok1"
    status = sim.run()
    assert status["phase"] == "Succeeded" and sim.tasks()["succeededIndexes"] == "0-3"
    assert api.LABEL_DEAD_TASKS not in sim.job["metadata"]["labels"]
    assert api.LABEL_DEAD_LETTER not in sim.job["metadata"]["labels"]
    assert sorted(a for i, a in sim.created if i == 2) == [1, 2]  # a new attempt number, never reused
    assert sim.tasks()["lastRedrive"] == "2@tok1" and sim.tasks()["priorAttempts"] == []
    # honoured once: the same value again changes nothing
    before = copy.deepcopy(sim.job)
    decided = sim.look()
    assert decided.decision.of_type(PatchStatus) == [] and sim.job == before


def test_redrive_of_tasks_that_are_not_dead_lettered_is_refused_with_a_warning() -> None:
    sim = Sim(array(count=2, parallelism=2), succeed)
    sim.run()
    sim.job["metadata"]["annotations"][api.ANNOTATION_REDRIVE_TASKS] = "0-1,9@t"
    sim.look()
    assert any(e.reason == "RedriveIgnored" and "0-1,9" in e.message for e in sim.events)
    assert sim.status()["phase"] == "Succeeded"


def test_parallelism_and_the_queues_starts_bound_what_runs() -> None:
    sim = Sim(array(count=30, parallelism=10), lambda i, a: None if a == 1 else 0, starts=4)
    for _ in range(5):
        sim.look()
        sim.run_pods()
        sim.starts = 0 if len(sim.created) >= 4 else 4 - len(sim.created)
    assert len(sim.created) == 4  # the queue gave four starts, whatever parallelism allows
    sim.starts = 100
    sim.look()
    assert len(sim.created) == 10  # parallelism now
    assert sim.tasks()["running"] == 10 and sim.tasks()["pending"] == 20


def test_max_dead_lettered_tasks_stops_the_whole_array() -> None:
    job = array(count=10, parallelism=4, tasks={"maxDeadLetteredTasks": 1})
    job["spec"]["retry"] = {**FAST_RETRY, "nonRetryableExitCodes": [3]}
    sim = Sim(job, lambda i, a: 3 if i in (0, 1) else None)
    status = sim.run()
    assert status["phase"] == "DeadLettered" and status["reason"] == "TooManyDeadLetteredTasks"
    sim.look()
    sim.look()
    running = [p for p in sim.pods.values() if p["status"]["phase"] in ("Pending", "Running")]
    assert running == []  # the others' pods are deleted
    assert len(sim.created) == 4  # nothing started after the stop


def test_suspend_cancels_running_tasks_and_resume_goes_on() -> None:
    sim = Sim(array(count=6, parallelism=3), lambda i, a: None if (i < 3 and a == 1) else 0)
    sim.look()
    sim.run_pods()
    sim.job["spec"]["suspend"] = True
    sim.look()
    assert sim.status()["phase"] == "Suspended"
    assert all(p["status"]["phase"] not in ("Pending", "Running") for p in sim.pods.values())
    created = len(sim.created)
    sim.look()
    assert len(sim.created) == created
    sim.job["spec"]["suspend"] = False
    status = sim.run()
    assert status["phase"] == "Succeeded"
    assert sorted(a for i, a in sim.created if i == 0) == [1, 2]  # the cancelled attempt ran again


def test_a_lost_write_is_repaired_from_the_pods() -> None:
    """A look whose status write never landed still created its pods: the next look adopts them
    instead of starting the same tasks again."""
    sim = Sim(array(count=4, parallelism=2), lambda i, a: None)
    job_before = copy.deepcopy(sim.job)
    sim.look()
    assert len(sim.created) == 2
    sim.job = job_before  # the write is lost
    sim.look()
    assert len(sim.created) == 2, "the tasks whose pods exist were started again"
    assert {t["index"] for t in sim.tasks()["active"]} == {0, 1}


def test_deciding_again_on_its_own_write_changes_nothing() -> None:
    sim = Sim(array(count=12, parallelism=4), lambda i, a: 1 if (i % 5 == 0 and a == 1) else 0)
    for _ in range(8):
        sim.look()
        sim.look()  # the pods the first look created are seen (their UIDs recorded)
        before = copy.deepcopy(sim.job)
        again = sim.look()
        assert again.decision.of_type(PatchStatus) == [], "a second look on the same pods wrote again"
        assert again.decision.of_type(CreatePod) == [] and sim.job == before
        sim.run_pods()
        sim.now += timedelta(seconds=1)


def test_status_stays_small_for_a_large_array() -> None:
    """100,000 tasks, 1,000 of them active: status is ranges and the active records."""
    sim = Sim(array(count=100_000, parallelism=1000), lambda i, a: None)
    sim.look()
    size = len(json.dumps(sim.status()))
    assert sim.tasks()["running"] == 1000
    assert size < 600_000, size
    per_active = size / 1000
    assert per_active < 600  # bytes per active task; the rest are ranges


@settings(max_examples=40, deadline=None)
@given(
    count=st.integers(1, 25),
    parallelism=st.integers(1, 6),
    poison=st.sets(st.integers(0, 24), max_size=4),
    flaky=st.sets(st.integers(0, 24), max_size=6),
    starts=st.integers(1, 8),
)
def test_every_task_ends_once_and_no_attempt_number_is_reused(
    count: int, parallelism: int, poison: set[int], flaky: set[int], starts: int
) -> None:
    job = array(count=count, parallelism=parallelism)
    job["spec"]["retry"] = {**FAST_RETRY, "nonRetryableExitCodes": [3]}

    def outcome(index: int, attempt: int) -> int:
        if index in poison:
            return 3
        return 1 if index in flaky and attempt == 1 else 0

    sim = Sim(job, outcome, starts=starts)
    sim.run(steps=400)
    tasks = sim.tasks()
    dead = IndexSet.parse(tasks["deadLetteredIndexes"])
    done = IndexSet.parse(tasks["succeededIndexes"])
    assert set(dead) == {i for i in poison if i < count}
    assert set(done) | set(dead) == set(range(count)) and not (set(done) & set(dead))
    assert len(set(sim.created)) == len(sim.created)  # no (task, attempt) twice
    assert sim.max_running <= parallelism
    for index in range(count):
        attempts = sorted(a for i, a in sim.created if i == index)
        assert attempts == list(range(1, len(attempts) + 1))
        assert len(attempts) == (2 if index in flaky and index not in poison else 1)


def test_invalid_tasks_are_dead_lettered_with_what_to_fix() -> None:
    job = array(count=3)
    job["spec"]["tasks"]["items"] = ["a"]
    decided = decide_array(job, [], T0, rng=random.Random(1), starts=5)
    patch = decided.decision.of_type(PatchStatus)[0].status
    assert patch["phase"] == "DeadLettered" and patch["reason"] == "InvalidTasks"
    assert "exactly one of count" in patch["message"]
    again = decide_array({**job, "status": merge_patch({}, patch)}, [], T0, rng=random.Random(1), starts=5).decision
    assert again.actions == ()


def test_the_starts_wanted_count_tasks_whose_pods_ended_as_room() -> None:
    sim = Sim(array(count=10, parallelism=3), lambda i, a: 0)
    sim.look()
    assert wants_now(sim.job, list(sim.pods.values()), sim.now) == 0  # three running, no room
    sim.run_pods()
    sim.run_pods()  # they end; status does not show it yet
    assert wants_now(sim.job, list(sim.pods.values()), sim.now) == 3
    sim.job["spec"]["suspend"] = True
    assert wants_now(sim.job, list(sim.pods.values()), sim.now) == 0


def test_a_task_newly_lost_is_read_from_the_api_server_first() -> None:
    active = {"index": 4, "phase": "Running", "attempts": 1, "currentAttempt": None}
    job = array(count=5)
    job["status"] = {"tasks": {"total": 5, "active": [active]}}
    lost = {**active, "phase": "BackingOff", "last": {"number": 1, "outcome": "Lost"}}
    decision = Decision((PatchStatus({"tasks": {"total": 5, "active": [lost]}}, "1"),))
    assert doubt.doubt(job, decision) is not None
    failed = {"tasks": {"total": 5, "failed": [{"index": 4, "attempts": 1, "outcome": "Failed"}]}}
    assert doubt.doubt(job, Decision((PatchStatus(failed, "1"),))) is None


def test_a_template_the_api_server_refuses_dead_letters_the_whole_array() -> None:
    sim = Sim(array(count=4, parallelism=2), lambda i, a: None)
    sim.look()
    decision = reject_array_pod(sim.job, "arr-0-1", "spec.containers[0].image: Required value", T0)
    sim.job = apply_to_job(sim.job, decision)
    assert sim.status()["phase"] == "DeadLettered" and sim.status()["reason"] == "InvalidPodTemplate"
    assert "Required value" in sim.status()["message"]
    sim.look()
    created = len(sim.created)
    sim.look()
    assert len(sim.created) == created  # nothing starts again
    assert all(p["status"]["phase"] not in ("Pending", "Running") for p in sim.pods.values())
    assert reject_array_pod(sim.job, "arr-1-1", "again", T0).actions == ()
