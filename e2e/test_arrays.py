"""Task arrays (VigilJob spec.tasks) end to end: `vigil operator` as a process, kwok pods.

Every task of an array has the same template, so the tasks' pods run until the test's
`TaskPods` (tests/support/arrays.py), playing the workload that reads VIGIL_TASK_INDEX and
VIGIL_ATTEMPT, writes on each new pod how it ends (an exit code after a run time), or the
template says so for all of them. `TaskPods` also records every task pod the API server ever
showed, in order, so "one pod per task", "never more than N at once" and "created after the old
one stopped" are read from the cluster, not from Vigil's status.

Attempts last 1-2 s and retries back off 1 s without jitter, so the file takes about two minutes.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

from tests.support.agents import HEARTBEAT, HEARTBEAT_ANNOTATION, JOB_ACCOUNT, grant_heartbeat_rbac
from tests.support.arrays import (
    TaskPhases,
    TaskPods,
    active_task,
    annotate_job,
    array_job,
    env_of,
    patch_spec,
    reconciling_count,
    tasks_of,
    wait_reconciling,
)
from tests.support.cluster import Kube, event_reasons, read_pod
from tests.support.jobs import (
    FAST_BACKOFF,
    GROUP,
    QUEUE_PLURAL,
    VERSION,
    condition,
    create,
    get,
    status,
    vigil_queue,
    wait_dead_letter_label,
    wait_phase,
)
from tests.support.operators import OperatorProcess
from tests.support.waits import deadline, holds, wait_until

pytestmark = pytest.mark.e2e  # the operator end to end, as a process, on a real cluster

POISON = 42  # a non-retryable exit code of these tests' retry policies
RETRY = {"maxAttempts": 3, "nonRetryableExitCodes": [POISON], "backoff": FAST_BACKOFF}


def pods_by_index(kube: Kube, namespace: str, job: dict) -> dict[int, list[str]]:
    """The job's pods that exist, per vigil.dev/task-index, as a user counts them."""
    selector = f"vigil.dev/job-uid={job['metadata']['uid']}"
    found: dict[int, list[str]] = {}
    for pod in kube.core.list_namespaced_pod(namespace, label_selector=selector).items:
        found.setdefault(int(pod.metadata.labels["vigil.dev/task-index"]), []).append(pod.metadata.name)
    return {index: sorted(names) for index, names in sorted(found.items())}


def printed_column(kube: Kube, namespace: str, name: str, column: str) -> str:
    """A cell of `kubectl get vj <name>`, as a user reads it."""
    header, row = kube.kubectl("get", "vj", name, "-n", namespace).stdout.splitlines()
    assert column in header.split(), header
    return row[header.index(column) :].split()[0]


# --------------------------------------------------------------------------------- the tests


def test_a_poison_task_is_dead_lettered_alone_and_the_other_nineteen_succeed_once_each(
    kube: Kube, vigil: OperatorProcess, namespace: str
):
    def workload(index: int, attempt: int) -> tuple[int, str]:
        return (POISON, "1s") if index == 7 else (0, "1s")

    with TaskPods(kube, namespace, workload) as pods:
        create(kube, namespace, array_job("batch", 20, retry=RETRY))
        job = wait_phase(kube, namespace, "batch", "DeadLettered", 60)
        pods.caught_up()
        pods.assert_healthy()

    st, tasks = job["status"], job["status"]["tasks"]
    assert (st["phase"], st["reason"]) == ("DeadLettered", "TasksDeadLettered"), st
    assert condition(job, "DeadLettered")["status"] == "True"
    assert st["attempts"] == 20, "one attempt per task: the poison one is not retried"
    assert not st.get("currentAttempt") and not st.get("history"), "per-task attempts are in status.tasks"
    counts = {k: tasks.get(k, 0) for k in ("total", "pending", "running", "backingOff", "succeeded", "deadLettered")}
    assert counts == {"total": 20, "pending": 0, "running": 0, "backingOff": 0, "succeeded": 19, "deadLettered": 1}
    assert tasks["progress"] == "19/20"
    assert tasks["succeededIndexes"] == "0-6,8-19"
    assert tasks["deadLetteredIndexes"] == "7"
    assert tasks["priorAttempts"] == [{"attempts": 1, "indexes": "7"}]
    [failed] = tasks["failed"]
    assert (failed["index"], failed["attempts"], failed["outcome"], failed["exitCode"]) == (7, 1, "Failed", POISON)
    assert not tasks.get("active")

    # Exactly one pod per task, in the cluster (counted by vigil.dev/task-index) and in what the
    # watch saw over the whole run; never more tasks at once than the default parallelism, 10.
    assert pods_by_index(kube, namespace, job) == {i: [f"batch-{i}-1"] for i in range(20)}
    assert {i: [p.attempt for p in ps] for i, ps in pods.per_index("batch").items()} == {i: [1] for i in range(20)}
    assert 0 < pods.max_active <= 10, pods.max_active

    poisoned = kube.core.read_namespaced_pod("batch-7-1", namespace)
    env = env_of(poisoned)
    assert (env["VIGIL_TASK_INDEX"], env["VIGIL_TASK_COUNT"], env["VIGIL_ATTEMPT"]) == ("7", "20", "1")
    assert env["VIGIL_IDEMPOTENCY_KEY"] == f"{job['metadata']['uid']}-7"
    assert poisoned.metadata.labels["vigil.dev/attempt"] == "1"

    wait_dead_letter_label(kube, namespace, "batch")
    assert printed_column(kube, namespace, "batch", "TASKS") == "19/20"


def test_redriving_the_dead_lettered_task_runs_it_again_with_a_newer_attempt_and_the_job_succeeds(
    kube: Kube, vigil: OperatorProcess, namespace: str
):
    # Task 7 fails on its first attempt only: the input was fixed before the redrive.
    def workload(index: int, attempt: int) -> tuple[int, str]:
        return (POISON, "1s") if (index, attempt) == (7, 1) else (0, "1s")

    with TaskPods(kube, namespace, workload) as pods:
        create(kube, namespace, array_job("again", 10, retry=RETRY))
        job = wait_phase(kube, namespace, "again", "DeadLettered", 60)
        assert job["status"]["tasks"]["deadLetteredIndexes"] == "7"
        first = kube.core.read_namespaced_pod("again-7-1", namespace)

        # Task 8 succeeded: it is not redriven, and a Warning says so; task 7 is.
        value = f"7-8@{int(time.time())}"
        annotate_job(kube, namespace, "again", {"vigil.dev/redrive-tasks": value})
        job = wait_phase(kube, namespace, "again", "Succeeded", 60)
        pods.caught_up()
        pods.assert_healthy()

    tasks = job["status"]["tasks"]
    assert (tasks["progress"], tasks["succeededIndexes"], tasks.get("deadLettered", 0)) == ("10/10", "0-9", 0), tasks
    assert not tasks.get("deadLetteredIndexes") and not tasks.get("failed"), tasks
    assert (tasks["redrives"], tasks["lastRedrive"]) == (1, value)
    assert job["status"]["attempts"] == 11
    assert condition(job, "Succeeded")["status"] == "True"
    assert "vigil.dev/dead-letter" not in (job["metadata"].get("labels") or {})

    # Task 7 ran once more, under a newer attempt number (its fencing token), with the same
    # idempotency key; no other task ran again.
    seen = {i: [p.attempt for p in ps] for i, ps in pods.per_index("again").items()}
    assert seen == {**{i: [1] for i in range(10)}, 7: [1, 2]}, seen
    again = kube.core.read_namespaced_pod("again-7-2", namespace)
    assert int(again.metadata.labels["vigil.dev/attempt"]) > int(first.metadata.labels["vigil.dev/attempt"])
    env, env_first = env_of(again), env_of(first)
    assert int(env["VIGIL_ATTEMPT"]) > int(env_first["VIGIL_ATTEMPT"])
    assert int(env["VIGIL_FENCING_TOKEN"]) > int(env_first["VIGIL_FENCING_TOKEN"])
    assert env["VIGIL_IDEMPOTENCY_KEY"] == env_first["VIGIL_IDEMPOTENCY_KEY"] == f"{job['metadata']['uid']}-7"
    wait_until(lambda: "RedriveIgnored" in event_reasons(kube, namespace, "again"), 10, "a RedriveIgnored event")


@pytest.fixture
def job_account(kube: Kube, namespace: str) -> str:
    grant_heartbeat_rbac(kube, namespace)
    return JOB_ACCOUNT


def test_a_task_whose_beats_stop_is_lost_and_retried_only_once_its_pod_has_stopped(
    kube: Kube, vigil: OperatorProcess, namespace: str, job_account: str, agents
):
    """Three tasks beat through `vigil-agent` processes (interval 1 s, timeout 6 s); task 1's
    agent is SIGKILLed: its attempt goes Uncertain, then Lost, and under NoOverlap its next
    attempt's pod is created only once the old pod has stopped (it takes 3 s to terminate);
    tasks 0 and 2 run on in their first attempt."""
    job = array_job("beating", 3, parallelism=3, heartbeat=HEARTBEAT, guarantee="NoOverlap")
    job["spec"]["template"]["spec"]["serviceAccountName"] = job_account
    job["spec"]["template"]["metadata"]["annotations"]["sim.vigil.dev/delete-delay"] = "3s"
    with TaskPods(kube, namespace) as pods, TaskPhases(kube, namespace) as phases:  # pods run until ended here
        create(kube, namespace, job)
        agent = {i: agents.start(namespace, f"beating-{i}-1") for i in range(3)}
        wait_until(
            lambda: HEARTBEAT_ANNOTATION in (read_pod(kube, namespace, "beating-1-1").metadata.annotations or {}),
            20,
            "a beat of task 1",
        )
        wait_until(
            lambda: all(
                (t := active_task(tasks_of(kube, namespace, "beating"), i)) and t["phase"] == "Running"
                for i in range(3)
            ),
            20,
            "the three tasks to be Running",
        )
        agent[1].signal(signal.SIGKILL)
        killed = time.monotonic()
        wait_until(lambda: read_pod(kube, namespace, "beating-1-2") is not None, 40, "task 1's attempt 2")
        agents.start(namespace, "beating-1-2")

        # Uncertain after 3 s of silence, Lost after 6 (docs/heartbeats.md), as for a job: the
        # beat before the kill was at most 1 s before it. Every write of the job was watched.
        seen = phases.of("beating", 1)
        doubt = phases.first("beating", 1, "Uncertain", 1)
        verdict = next((s for s in seen if s.attempts == 1 and s.last_outcome == "Lost"), None)
        described = [(round(s.at - killed, 1), s.phase, s.attempts, s.last_outcome) for s in seen]
        print(f"\ntask 1 after its agent's SIGKILL (s, phase, attempts, last outcome): {described}")
        assert doubt is not None, f"task 1 was never shown Uncertain before it was Lost: {described}"
        assert verdict is not None and doubt.at < verdict.at, described
        assert 2 <= doubt.at - killed <= deadline(6), described
        assert 5 <= verdict.at - killed <= deadline(9), described
        for i in (0, 2):  # untouched throughout
            shown = {(s.phase, s.attempts) for s in phases.of("beating", i)}
            assert shown <= {("Starting", 1), ("Running", 1)}, (i, phases.of("beating", i))

        tasks = tasks_of(kube, namespace, "beating")
        lost = active_task(tasks, 1)
        assert lost is not None and lost["attempts"] == 2, tasks
        assert (lost["last"]["number"], lost["last"]["outcome"]) == (1, "Lost"), lost
        for i in (0, 2):
            other = active_task(tasks, i)
            assert other is not None and other["attempts"] == 1, tasks
            assert other["phase"] == "Running" and other["currentAttempt"]["number"] == 1, other
            assert read_pod(kube, namespace, f"beating-{i}-1").status.phase == "Running"

        # NoOverlap, as the cluster showed it: the old pod had stopped before the new one existed.
        pods.caught_up()
        old, new = pods.per_index("beating")[1]
        assert (old.attempt, new.attempt) == (1, 2)
        assert old.stopped is not None and old.stopped < new.added, (
            f"task 1's attempt 2 was created (event {new.added}) while attempt 1's pod could still run "
            f"(stopped at event {old.stopped})"
        )

        for name in ("beating-0-1", "beating-2-1", "beating-1-2"):
            pods.finish(name, 0)
        job = wait_phase(kube, namespace, "beating", "Succeeded", 30)
        pods.caught_up()
        pods.assert_healthy()

    assert job["status"]["tasks"]["progress"] == "3/3"
    assert job["status"]["attempts"] == 4
    assert {i: [p.attempt for p in ps] for i, ps in pods.per_index("beating").items()} == {0: [1], 1: [1, 2], 2: [1]}


def test_an_array_survives_operator_sigkills_with_no_task_lost_or_run_twice(
    kube: Kube, own_namespace: str, own_operator
):
    """30 tasks of 2 s, 5 at a time; the operator is SIGKILLed twice mid-array and restarted at
    once. Without heartbeats nothing can be Lost while the pods stay, so the claim is strict:
    every task succeeds in exactly one pod, its attempt 1 (a task running at a kill is adopted by
    the next process, never started again), and never more than 5 tasks run at once."""
    operator, _ = own_operator()
    with TaskPods(kube, own_namespace) as pods:
        wait_reconciling(operator, 0)
        create(kube, own_namespace, array_job("sturdy", 30, parallelism=5, exit_code="0", run_for="2s"))
        kills = []
        for after in (8, 20):  # tasks started before each kill
            wait_until(lambda after=after: pods.started("sturdy") >= after, 90, f"{after} tasks to have started")
            kills.append((pods.started("sturdy"), pods.active_count()))
            before = reconciling_count(operator)
            operator.kill()
            operator.start()
            wait_reconciling(operator, before)
        job = wait_phase(kube, own_namespace, "sturdy", "Succeeded", 120)
        pods.caught_up()
        pods.assert_healthy()

    print(f"\n30 tasks, parallelism 5, SIGKILL at (started, running) {kills}: at most {pods.max_active} at once")
    assert all(running > 0 and started < 30 for started, running in kills), f"a kill struck no running task: {kills}"
    per = pods.per_index("sturdy")
    assert sorted(per) == list(range(30))
    twice = {i: [(p.name, p.attempt) for p in ps] for i, ps in per.items() if len(ps) != 1 or ps[0].attempt != 1}
    assert not twice, f"tasks with another pod than their attempt 1's: {twice}"
    assert pods_by_index(kube, own_namespace, job) == {i: [f"sturdy-{i}-1"] for i in range(30)}
    tasks = job["status"]["tasks"]
    assert (tasks["progress"], tasks["succeededIndexes"], tasks.get("deadLettered", 0)) == ("30/30", "0-29", 0), tasks
    assert job["status"]["attempts"] == 30
    assert 0 < pods.max_active <= 5, pods.max_active


def test_suspend_stops_the_running_tasks_and_starts_none_and_resume_finishes_the_array(
    kube: Kube, vigil: OperatorProcess, namespace: str
):
    """Six tasks, three at a time, with maxAttempts 1: the first three run until suspended (their
    pods deleted, nothing started while suspended); after the resume every task runs for 1 s
    and succeeds: a task stopped by the suspension did not use up its one attempt."""
    resumed = threading.Event()

    def workload(index: int, attempt: int) -> tuple[int, str] | None:
        return (0, "1s") if resumed.is_set() else None  # before the resume: runs until deleted

    with TaskPods(kube, namespace, workload) as pods:
        create(kube, namespace, array_job("pausable", 6, parallelism=3, retry={"maxAttempts": 1}))
        wait_until(lambda: tasks_of(kube, namespace, "pausable").get("running") == 3, 30, "three tasks running")
        first = [p.name for p in pods.of("pausable")]
        assert len(first) == 3, first

        patch_spec(kube, namespace, "pausable", {"suspend": True})
        wait_phase(kube, namespace, "pausable", "Suspended", 30)
        wait_until(
            lambda: all(read_pod(kube, namespace, name) is None for name in first), 30, "the tasks' pods to be deleted"
        )
        wait_until(lambda: tasks_of(kube, namespace, "pausable").get("running") == 0, 10, "no task running")

        def nothing_starts() -> None:
            assert pods.started("pausable") == 3, [p.name for p in pods.of("pausable")]
            assert status(kube, namespace, "pausable")["phase"] == "Suspended"

        holds(nothing_starts, 3)

        resumed.set()
        patch_spec(kube, namespace, "pausable", {"suspend": False})
        job = wait_phase(kube, namespace, "pausable", "Succeeded", 60)
        pods.caught_up()
        pods.assert_healthy()

    tasks = job["status"]["tasks"]
    assert (tasks["progress"], tasks["succeededIndexes"], tasks.get("deadLettered", 0)) == ("6/6", "0-5", 0), tasks
    per = pods.per_index("pausable")
    stopped = {p.index for p in pods.of("pausable") if p.name in first}
    assert sorted(per) == list(range(6))
    for index, seen in per.items():
        if index in stopped:  # attempt 1 cancelled, then one more that succeeded
            assert len(seen) == 2 and seen[1].attempt > seen[0].attempt, (index, [p.name for p in seen])
        else:
            assert [p.attempt for p in seen] == [1], (index, [p.name for p in seen])
    assert 0 < pods.max_active <= 3


def test_the_queues_max_running_bounds_the_tasks_of_an_array(kube: Kube, vigil: OperatorProcess, namespace: str):
    """maxRunning 3 on the queue, parallelism 10 on the array of 12 tasks of 2 s: the pod watch
    never sees more than 3 tasks running, the queue's status counts the tasks (3 running, the
    rest queued), and every task succeeds once."""
    kube.custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, QUEUE_PLURAL, vigil_queue("narrow", maxRunning=3)
    )
    queue_seen: list[tuple[int, int]] = []

    def sample_queue() -> bool:
        queue = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, QUEUE_PLURAL, "narrow")
        st = queue.get("status") or {}
        queue_seen.append((st.get("running") or 0, st.get("queued") or 0))
        return (get(kube, namespace, "crowd") or {}).get("status", {}).get("phase") == "Succeeded"

    with TaskPods(kube, namespace) as pods:
        create(kube, namespace, array_job("crowd", 12, parallelism=10, exit_code="0", run_for="2s", queue="narrow"))
        wait_until(sample_queue, 90, "the array to succeed", interval=0.3)
        pods.caught_up()
        pods.assert_healthy()

    job = get(kube, namespace, "crowd")
    print(f"\n12 tasks on maxRunning 3: at most {pods.max_active} pods running; queue (running, queued) {queue_seen}")
    assert 0 < pods.max_active <= 3, pods.max_active
    assert max(running for running, _ in queue_seen) == 3, f"the queue never counted 3 tasks running: {queue_seen}"
    assert max(queued for _, queued in queue_seen) > 0, f"the queue never counted a task waiting: {queue_seen}"
    assert job["status"]["tasks"]["progress"] == "12/12"
    assert {i: [p.attempt for p in ps] for i, ps in pods.per_index("crowd").items()} == {i: [1] for i in range(12)}
