"""Table tests of decide(): one transition each, from a hand-built job and its pods."""

from __future__ import annotations

import random
from datetime import datetime
from typing import Any

import pytest

from tests.support.builders import (
    JOB_UID,
    T0,
    apply_to_job,
    at,
    condition,
    make_job,
    make_pod,
    status_of,
)
from vigil import api
from vigil.core.actions import (
    ConfirmVersion,
    CreatePod,
    Decision,
    DeleteJob,
    DeletePod,
    EmitEvent,
    PatchStatus,
    ReleasePod,
    RequeueAfter,
    SetDeadLetterLabel,
)
from vigil.core.lifecycle import POD_NAME_CONFLICT_RECHECK_SECONDS, decide, reject_pod

pytestmark = pytest.mark.unit


def run(
    job: dict[str, Any], pods: list[dict[str, Any]] = (), now: datetime = T0, *, may_start: bool = True, seed: int = 0
) -> Decision:
    return decide(job, pods, now, rng=random.Random(seed), may_start=may_start)


def step(
    job: dict[str, Any], pods: list[dict[str, Any]] = (), now: datetime = T0, **kwargs: Any
) -> tuple[dict[str, Any], Decision]:
    """decide() and apply its status and label to the job, as a successful shell would."""
    decision = run(job, pods, now, **kwargs)
    return apply_to_job(job, decision), decision


def kinds(decision: Decision) -> list[str]:
    return [type(action).__name__ for action in decision.actions]


def event_reasons(decision: Decision) -> list[str]:
    return [event.reason for event in decision.of_type(EmitEvent)]


def running_job(spec: dict[str, Any] | None = None, **job_kwargs: Any) -> dict[str, Any]:
    """A job whose attempt 1 has been started and seen running since T0."""
    job, _ = step(make_job(spec=spec, **job_kwargs))
    job, _ = step(job, [make_pod(1, phase="Running")])
    return job


def failed_attempt_1(spec: dict[str, Any] | None = None, exit_code: int = 1) -> tuple[dict[str, Any], Decision]:
    job = running_job(spec)
    return step(job, [make_pod(1, phase="Failed", exit_code=exit_code)], at(5))


# ------------------------------------------------------------------------------ first attempt


def test_a_new_job_creates_attempt_1s_pod_first_behind_a_check_of_its_version() -> None:
    decision = run(make_job())

    # No status write: the look that finds the pod records the attempt (one write per attempt fewer).
    assert kinds(decision) == ["ConfirmVersion", "CreatePod", "EmitEvent"]
    assert decision.actions[0] == ConfirmVersion("100")
    (create,) = decision.of_type(CreatePod)
    assert create.manifest["metadata"]["name"] == "ledger-1"
    assert create.manifest["metadata"]["labels"][api.LABEL_ATTEMPT] == "1"
    assert [(e.reason, e.message) for e in decision.of_type(EmitEvent)] == [
        ("AttemptStarting", "starting attempt 1 in pod ledger-1 (fencing token 1)")
    ]


def test_the_pod_of_a_new_attempt_says_when_it_started() -> None:
    (create,) = run(make_job(), now=at(1.25)).of_type(CreatePod)
    assert create.manifest["metadata"]["annotations"][api.ANNOTATION_STARTED_AT] == "2025-03-01T12:00:01.250000+00:00"


@pytest.mark.parametrize(
    ("annotations", "started"),
    [
        ({api.ANNOTATION_STARTED_AT: "2025-03-01T12:00:01.250000+00:00"}, "2025-03-01T12:00:01.250000Z"),
        ({}, "2025-03-01T12:00:01Z"),  # a pod of an older Vigil: when the API server created it
    ],
)
def test_the_look_that_finds_the_new_pod_records_its_attempt_from_the_pod(annotations: dict, started: str) -> None:
    pod = make_pod(1, phase="Pending", node=None, annotations=annotations)
    pod["metadata"]["creationTimestamp"] = "2025-03-01T12:00:01Z"

    decision = run(make_job(), [pod], at(2))

    assert kinds(decision) == ["PatchStatus"], "the start's event went with the pod"
    status = status_of(decision)
    assert (status["phase"], status["reason"]) == ("Starting", "AttemptStarting")
    assert status["message"] == "starting attempt 1 in pod ledger-1 (fencing token 1)"
    assert (status["attempts"], status["roundAttempts"]) == (1, 1)
    current = status["currentAttempt"]
    assert (current["number"], current["podName"], current["podUID"]) == (1, "ledger-1", "pod-1")
    assert current["startedAt"] == status["startedAt"] == started


def test_a_pod_found_several_attempts_ahead_of_status_is_adopted_with_a_warning() -> None:
    decision = run(make_job(), [make_pod(3, phase="Running")], at(2))

    status = status_of(decision)
    assert status["attempts"] == 3
    assert status["currentAttempt"]["podUID"] == "pod-3"
    assert ("Warning", "AttemptAdopted") in [(e.type, e.reason) for e in decision.of_type(EmitEvent)]


def test_a_new_job_gets_conditions_in_metav1_shape() -> None:
    status = status_of(run(make_job(generation=3), [make_pod(1)]))

    assert {c["type"] for c in status["conditions"]} == {
        "Succeeded",
        "DeadLettered",
        "Running",
        "HeartbeatHealthy",
        "Reconciling",
        "Stalled",
    }
    assert condition(status, "Reconciling")["status"] == "True", "kstatus: InProgress"
    assert condition(status, "Stalled")["status"] == "False"
    assert condition(status, "Succeeded")["status"] == "Unknown"
    assert condition(status, "DeadLettered")["status"] == "False"
    assert condition(status, "Running")["status"] == "False"
    assert condition(status, "HeartbeatHealthy")["status"] == "Unknown"
    for cond in status["conditions"]:
        assert set(cond) == {"type", "status", "reason", "message", "lastTransitionTime", "observedGeneration"}
        assert cond["observedGeneration"] == 3
        assert cond["lastTransitionTime"] == "2025-03-01T12:00:00Z"
    assert status["observedGeneration"] == 3


def test_a_job_the_queue_holds_back_stays_queued_and_says_so_once() -> None:
    job, decision = step(make_job(), may_start=False)

    assert kinds(decision) == ["PatchStatus", "EmitEvent"]
    assert job["status"]["phase"] == "Queued"
    assert job["status"]["reason"] == "WaitingForQueue"
    assert job["status"]["attempts"] == 0
    assert run(job, now=at(60), may_start=False).actions == ()


def test_the_queue_says_why_it_holds_a_job_back_and_a_new_count_costs_no_write() -> None:
    full = ("QueueSaturated", "queue batch is full: 10 attempts run, maxRunning is 10")
    job = apply_to_job(make_job(), decide(make_job(), [], T0, rng=random.Random(0), may_start=False, waiting=full))
    assert (job["status"]["phase"], job["status"]["reason"]) == ("Queued", "QueueSaturated")
    assert "maxRunning is 10" in job["status"]["message"]
    busier = ("QueueSaturated", "queue batch is full: 11 attempts run, maxRunning is 10")
    assert decide(job, [], at(5), rng=random.Random(0), may_start=False, waiting=busier).actions == ()
    budget = ("RetryBudgetExhausted", "queue batch spent its retry budget")
    decision = decide(job, [], at(9), rng=random.Random(0), may_start=False, waiting=budget)
    assert [e.reason for e in decision.of_type(EmitEvent)] == ["RetryBudgetExhausted"]


def test_a_queued_job_starts_when_the_queue_admits_it() -> None:
    job, _ = step(make_job(), may_start=False)
    decision = run(job, now=at(60))
    assert kinds(decision) == ["ConfirmVersion", "CreatePod", "EmitEvent"]
    assert status_of(run(job, [make_pod(1)], now=at(61)))["currentAttempt"]["number"] == 1


def test_a_job_created_suspended_starts_nothing() -> None:
    job, decision = step(make_job(spec={"suspend": True}))

    assert decision.of_type(CreatePod) == []
    assert job["status"]["phase"] == "Suspended"
    assert job["status"]["attempts"] == 0


# ------------------------------------------------------------------------------- crash safety


def test_status_written_but_pod_never_created_creates_the_same_attempt_again() -> None:
    # A start that came with other changes reserves the attempt in status before its pod; here
    # the shell died after that PatchStatus.
    job = make_job(labels={api.LABEL_DEAD_LETTER: "true"})  # left by a dead letter before a redrive
    job, first = step(job)
    assert kinds(first)[0] == "PatchStatus" and "SetDeadLetterLabel" in kinds(first)
    assert job["status"]["currentAttempt"]["number"] == 1

    decision = run(job, now=at(3))

    assert kinds(decision) == ["ConfirmVersion", "CreatePod"], "nothing to write: a read fences it"
    assert decision.of_type(CreatePod)[0].manifest["metadata"]["name"] == "ledger-1"


def test_pod_created_but_not_yet_seen_is_only_created_again_under_its_own_name() -> None:
    job, first = step(make_job())
    again = run(job, now=at(1))
    (before,), (after,) = (d.of_type(CreatePod) for d in (first, again))
    assert after.manifest["metadata"]["name"] == before.manifest["metadata"]["name"] == "ledger-1"
    assert after.manifest["metadata"]["labels"] == before.manifest["metadata"]["labels"]
    assert after.manifest["spec"] == before.manifest["spec"]  # AlreadyExists keeps the first, started-at and all


def test_a_decision_on_a_stale_job_is_fenced_by_its_resource_version() -> None:
    job = make_job(resource_version="41")
    assert run(job).actions[0] == ConfirmVersion("41")
    held = run(job, may_start=False)
    assert held.actions[0] == PatchStatus(status_of(held), "41")


@pytest.mark.parametrize(
    "pods",
    [
        [make_pod(1, phase="Running")],
        [make_pod(1, phase="Failed", exit_code=1)],
        [make_pod(1, phase="Succeeded", exit_code=0)],
        [make_pod(1, phase="Running"), make_pod(2, phase="Pending")],
        [make_pod(2, phase="Running")],
    ],
)
def test_every_mutation_is_preceded_by_a_fencing_status_write(pods: list[dict[str, Any]]) -> None:
    job = running_job(spec={"retry": {"backoff": {"initialSeconds": 0}}})
    for now in (at(1), at(1000)):
        decision = run(job, pods, now)
        mutating = [a for a in decision.actions if not isinstance(a, RequeueAfter)]
        if mutating:
            assert isinstance(mutating[0], PatchStatus)


def test_nothing_changes_when_nothing_happened() -> None:
    job = running_job()
    assert kinds(run(job, [make_pod(1, phase="Running")], at(30))) == []


def test_a_deleted_job_is_left_to_the_garbage_collector() -> None:
    job = running_job()
    job["metadata"]["deletionTimestamp"] = "2025-03-01T12:01:00Z"
    assert run(job, [make_pod(1, phase="Failed", exit_code=1)], at(60)).actions == ()


# --------------------------------------------------------------------------------- pod phases


def test_a_pending_pod_is_remembered_by_uid() -> None:
    job, _ = step(make_job())
    job, decision = step(job, [make_pod(1, phase="Pending", uid="uid-A")], at(1))

    assert job["status"]["currentAttempt"]["podUID"] == "uid-A"
    assert job["status"]["phase"] == "Starting"
    assert decision.of_type(CreatePod) == []


def test_binding_a_pending_pod_to_a_node_costs_no_write_of_its_own() -> None:
    job, _ = step(make_job())
    job, _ = step(job, [make_pod(1, phase="Pending", uid="uid-A", node=None)], at(1))
    assert job["status"]["currentAttempt"]["podUID"] == "uid-A", "the UID is written at once: it fences"

    assert run(job, [make_pod(1, phase="Pending", uid="uid-A", node="node-7")], at(2)).actions == ()
    job, _ = step(job, [make_pod(1, phase="Running", uid="uid-A", node="node-7")], at(3))
    assert job["status"]["currentAttempt"]["nodeName"] == "node-7", "it rides along with the next write"


def test_a_running_pod_makes_the_job_running() -> None:
    job, _ = step(make_job())
    job, decision = step(job, [make_pod(1, phase="Running", node="node-7")], at(2))

    status = job["status"]
    assert status["phase"] == "Running"
    assert status["currentAttempt"]["phase"] == "Running"
    assert status["currentAttempt"]["nodeName"] == "node-7"
    assert condition(status, "Running")["status"] == "True"
    assert condition(status, "Running")["lastTransitionTime"] == "2025-03-01T12:00:02Z"
    assert event_reasons(decision) == [], "seen by chance before the pod ends: said by status, not an event"


def test_a_succeeded_pod_makes_the_job_succeeded() -> None:
    job = running_job()
    job, decision = step(job, [make_pod(1, phase="Succeeded", exit_code=0)], at(30))

    status = job["status"]
    assert status["phase"] == "Succeeded"
    assert status["finishedAt"] == "2025-03-01T12:00:30Z"
    assert "currentAttempt" not in status
    assert status["history"] == [
        {
            "number": 1,
            "podName": "ledger-1",
            "outcome": "Succeeded",
            "reason": "Completed",
            "exitCode": 0,
            "nodeName": "node-a",
            "startedAt": "2025-03-01T12:00:00Z",
            "finishedAt": "2025-03-01T12:00:30Z",
        }
    ]
    assert condition(status, "Succeeded")["status"] == "True"
    assert condition(status, "Running")["status"] == "False"
    assert decision.of_type(CreatePod) == []


def test_a_failed_pod_backs_off_with_its_exit_code_in_history() -> None:
    job, decision = failed_attempt_1(exit_code=7)

    status = job["status"]
    assert status["phase"] == "BackingOff"
    assert status["reason"] == "AttemptFailed"
    assert status["history"][-1]["outcome"] == "Failed"
    assert status["history"][-1]["exitCode"] == 7
    assert status["history"][-1]["reason"] == "Error"
    next_at = datetime.fromisoformat(status["nextAttemptAt"])
    delay = (next_at - at(5)).total_seconds()
    assert 5.0 < delay <= 10.0  # initialSeconds 10, jitter 0.5
    assert decision.of_type(RequeueAfter) == [RequeueAfter(pytest.approx(delay))]
    assert decision.of_type(CreatePod) == []
    assert condition(status, "Succeeded")["status"] == "Unknown"
    # One event for the failure, saying when the next attempt starts: each event is an API write.
    (event,) = decision.of_type(EmitEvent)
    assert (event.type, event.reason, event.message) == ("Warning", "AttemptFailed", status["message"])
    assert "exit code 7" in event.message and "attempt 2 starts in" in event.message


def test_the_exit_code_is_the_first_non_zero_one_init_containers_first() -> None:
    job = running_job()
    pod = make_pod(1, phase="Failed")
    pod["status"]["initContainerStatuses"] = [
        {"name": "init", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
    ]
    pod["status"]["containerStatuses"] = [
        {"name": "sidecar", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
        {"name": "main", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}},
    ]
    job, _ = step(job, [pod], at(5))
    assert job["status"]["history"][-1]["exitCode"] == 137
    assert job["status"]["history"][-1]["reason"] == "OOMKilled"


def test_backing_off_waits_until_next_attempt_at_then_starts_the_next_attempt() -> None:
    job, _ = failed_attempt_1()
    next_at = datetime.fromisoformat(job["status"]["nextAttemptAt"])
    failed_pod = make_pod(1, phase="Failed", exit_code=1)

    early = run(job, [failed_pod], next_at - (next_at - at(5)) / 2)
    assert kinds(early) == ["RequeueAfter"]

    job, decision = step(job, [failed_pod], next_at)
    assert decision.of_type(CreatePod)[0].manifest["metadata"]["name"] == "ledger-2"
    job, decision = step(job, [failed_pod, make_pod(2)], next_at)
    assert job["status"]["currentAttempt"]["number"] == 2
    assert job["status"]["attempts"] == 2
    assert job["status"]["roundAttempts"] == 2
    assert "nextAttemptAt" not in job["status"]


def test_the_backoff_delay_grows_with_each_failure() -> None:
    spec = {"retry": {"maxAttempts": 5, "backoff": {"initialSeconds": 10, "factor": 3.0, "jitter": 0.0}}}
    job = running_job(spec)
    now = at(1)
    delays = []
    for attempt in (1, 2, 3):
        job, _ = step(job, [make_pod(attempt, phase="Failed", exit_code=1)], now)
        next_at = datetime.fromisoformat(job["status"]["nextAttemptAt"])
        delays.append((next_at - now).total_seconds())
        job, _ = step(job, [], next_at)  # starts the next attempt
        now = next_at
    assert delays == [10.0, 30.0, 90.0]


def test_kstatus_reads_in_progress_then_current_or_failed() -> None:
    """Reconciling=True while a job is not finished (InProgress), Stalled=True once dead-lettered
    (Failed), neither once it succeeded (Current), as cli-utils' kstatus and Flux read them."""
    running = running_job()["status"]
    assert (condition(running, "Reconciling")["status"], condition(running, "Stalled")["status"]) == ("True", "False")
    done, _ = step(running_job(), [make_pod(1, phase="Succeeded", exit_code=0)], at(30))
    kstatus = (condition(done["status"], "Reconciling")["status"], condition(done["status"], "Stalled")["status"])
    assert kstatus == ("False", "False")
    poison, _ = failed_attempt_1({"retry": {"nonRetryableExitCodes": [4]}}, exit_code=4)
    kstatus = (condition(poison["status"], "Reconciling")["status"], condition(poison["status"], "Stalled")["status"])
    assert kstatus == ("False", "True")
    assert poison["status"]["observedGeneration"] == poison["metadata"]["generation"]


def test_a_non_retryable_exit_code_dead_letters_at_once() -> None:
    job, decision = failed_attempt_1({"retry": {"nonRetryableExitCodes": [3, 4]}}, exit_code=4)

    status = job["status"]
    assert status["phase"] == "DeadLettered"
    assert status["reason"] == "NonRetryableExitCode"
    assert "nonRetryableExitCodes" in status["message"]
    assert "vigil.dev/redrive" in status["message"]
    assert condition(status, "DeadLettered") | {"lastTransitionTime": None} == {
        "type": "DeadLettered",
        "status": "True",
        "reason": "NonRetryableExitCode",
        "message": status["message"],
        "lastTransitionTime": None,
        "observedGeneration": 1,
    }
    assert condition(status, "Succeeded")["status"] == "False"
    assert decision.of_type(SetDeadLetterLabel) == [SetDeadLetterLabel(True)]
    assert job["metadata"]["labels"][api.LABEL_DEAD_LETTER] == "true"
    assert "DeadLettered" in event_reasons(decision)


def test_a_retryable_exit_code_is_not_poison() -> None:
    job, _ = failed_attempt_1({"retry": {"nonRetryableExitCodes": [3]}}, exit_code=2)
    assert job["status"]["phase"] == "BackingOff"


def test_exhausted_attempts_dead_letter_the_job() -> None:
    spec = {"retry": {"maxAttempts": 2, "backoff": {"initialSeconds": 0}}}
    job, _ = failed_attempt_1(spec)
    job, _ = step(job, [], at(6))  # attempt 2 starts
    job, decision = step(job, [make_pod(2, phase="Failed", exit_code=1)], at(7))

    assert job["status"]["phase"] == "DeadLettered"
    assert job["status"]["reason"] == "AttemptsExhausted"
    assert job["status"]["message"].startswith("dead-lettered: attempt 2 (pod ledger-2) failed with exit code 1")
    assert job["status"]["roundAttempts"] == 2
    assert event_reasons(decision) == ["AttemptFailed", "DeadLettered"]
    assert decision.of_type(SetDeadLetterLabel) == [SetDeadLetterLabel(True)]
    assert run(job, [make_pod(2, phase="Failed", exit_code=1)], at(10_000)).actions == ()


def test_lowering_max_attempts_while_backing_off_dead_letters() -> None:
    job, _ = failed_attempt_1({"retry": {"maxAttempts": 3}})
    job["spec"]["retry"]["maxAttempts"] = 1
    job["metadata"]["generation"] = 2

    job, _ = step(job, [], at(6))

    assert job["status"]["phase"] == "DeadLettered"
    assert job["status"]["reason"] == "AttemptsExhausted"
    assert job["status"]["observedGeneration"] == 2


# -------------------------------------------------------------------------------- disruptions

DISRUPTED_PODS = {
    "DisruptionTarget condition": make_pod(
        1,
        phase="Failed",
        exit_code=143,
        conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}],
    ),
    "Evicted": make_pod(1, phase="Failed", reason="Evicted"),
    "Preempted": make_pod(1, phase="Failed", reason="Preempted"),
    "node shutdown": make_pod(1, phase="Failed", reason="Terminated"),
    "eviction in progress": make_pod(
        1,
        phase="Running",
        deleting=True,
        conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}],
    ),
}


@pytest.mark.parametrize("pod", DISRUPTED_PODS.values(), ids=DISRUPTED_PODS.keys())
def test_a_disruption_does_not_use_an_attempt_and_retries_without_backoff(pod: dict[str, Any]) -> None:
    job = running_job({"retry": {"maxAttempts": 1}})
    job, decision = step(job, [pod], at(5))

    status = job["status"]
    assert status["history"][-1]["outcome"] == "Disrupted"
    assert status["currentAttempt"]["number"] == 2
    assert status["roundAttempts"] == 1  # attempt 2 only
    assert status["phase"] == "Starting"
    assert decision.of_type(CreatePod)[0].manifest["metadata"]["name"] == "ledger-2"
    assert event_reasons(decision) == ["AttemptDisrupted", "AttemptStarting"]


def test_a_disruption_counts_when_count_disruptions_is_set() -> None:
    job = running_job({"retry": {"maxAttempts": 2, "countDisruptions": True}})
    job, _ = step(job, [DISRUPTED_PODS["Evicted"]], at(5))

    assert job["status"]["phase"] == "BackingOff"
    assert job["status"]["reason"] == "AttemptDisrupted"
    assert job["status"]["roundAttempts"] == 1


def test_a_disrupted_attempt_waits_for_the_queue_like_any_new_attempt() -> None:
    job = running_job()
    job, decision = step(job, [DISRUPTED_PODS["Evicted"]], at(5), may_start=False)
    assert job["status"]["phase"] == "Queued"
    assert decision.of_type(CreatePod) == []


def test_a_succeeded_pod_wins_over_a_disruption_condition() -> None:
    pod = make_pod(1, phase="Succeeded", exit_code=0, conditions=[{"type": "DisruptionTarget", "status": "True"}])
    job, _ = step(running_job(), [pod], at(5))
    assert job["status"]["phase"] == "Succeeded"


# ------------------------------------------------------------------------- lost and deleted pods


def test_a_pod_seen_before_that_vanished_is_lost_and_never_recreated_under_its_number() -> None:
    job = running_job({"retry": {"backoff": {"initialSeconds": 0}}})
    job, decision = step(job, [], at(20))

    assert job["status"]["history"][-1]["outcome"] == "Lost"
    assert job["status"]["history"][-1]["reason"] == "PodVanished"
    created = [c.manifest["metadata"]["name"] for c in decision.of_type(CreatePod)]
    assert "ledger-1" not in created


def test_a_pod_deleted_by_someone_else_is_lost() -> None:
    job = running_job()
    job, _ = step(job, [make_pod(1, phase="Running", deleting=True)], at(20))
    assert job["status"]["history"][-1]["outcome"] == "Lost"
    assert job["status"]["history"][-1]["reason"] == "PodDeleted"
    assert job["status"]["phase"] == "BackingOff"


def test_an_unreachable_node_leaves_the_attempt_as_it_is() -> None:
    job = running_job()
    assert run(job, [make_pod(1, phase="Unknown")], at(30)).actions == ()


# ------------------------------------------------------------------------------ stale views


def test_stale_and_duplicated_snapshots_are_read_as_the_freshest() -> None:
    job = running_job()
    pods = [
        make_pod(1, phase="Running", resource_version="5"),
        make_pod(1, phase="Failed", exit_code=1, resource_version="9"),
        make_pod(1, phase="Pending", resource_version="2"),
        make_pod(1, phase="Running", resource_version="5"),
    ]
    for order in (pods, pods[::-1]):
        job_after, _ = step(job, order, at(5))
        assert job_after["status"]["history"][-1]["outcome"] == "Failed"


def test_a_running_pod_of_an_older_attempt_is_deleted_by_uid() -> None:
    job, _ = failed_attempt_1({"retry": {"backoff": {"initialSeconds": 0}}})
    job, _ = step(job, [], at(6))  # attempt 2 reserved
    stale = make_pod(1, phase="Running", uid="old-1")  # e.g. a stale view, or a crash before DeletePod

    decision = run(job, [stale, make_pod(2, phase="Running")], at(7))

    assert decision.of_type(DeletePod) == [DeletePod("ledger-1", "old-1")]
    assert isinstance(decision.actions[0], PatchStatus)


def test_finished_pods_of_older_attempts_are_kept() -> None:
    job, _ = failed_attempt_1({"retry": {"backoff": {"initialSeconds": 0}}})
    job, _ = step(job, [], at(6))
    pods = [make_pod(1, phase="Failed", exit_code=1), make_pod(2, phase="Running")]
    assert run(job, pods, at(7)).of_type(DeletePod) == []


def test_a_pod_with_a_number_status_does_not_know_is_adopted_not_duplicated() -> None:
    # The status write of attempt 3 is not in this view (stale) or was lost: pod ledger-3 proves it.
    job, _ = step(make_job())
    decision = run(job, [make_pod(1, phase="Failed", exit_code=1), make_pod(3, phase="Running", uid="u3")], at(9))

    status = status_of(decision)
    assert status["attempts"] == 3
    assert status["currentAttempt"]["number"] == 3
    assert status["currentAttempt"]["podUID"] == "u3"
    assert status["phase"] == "Running"
    assert decision.of_type(CreatePod) == []


def test_a_pod_of_another_uid_for_the_current_attempt_is_not_taken_for_it() -> None:
    job = running_job()  # saw pod-1
    impostor = make_pod(1, phase="Running", uid="other-uid")
    job_after, decision = step(job, [impostor], at(9))
    assert job_after["status"]["history"][-1]["outcome"] == "Lost"
    assert DeletePod("ledger-1", "other-uid") in decision.of_type(DeletePod)


# ------------------------------------------------------------------------- pod name conflicts


def test_a_pod_with_the_attempts_name_but_another_owner_is_never_adopted() -> None:
    job, _ = step(make_job())
    stranger = make_pod(1, phase="Running", owner_uid="someone-else", uid="s1")

    job, decision = step(job, [stranger], at(1))

    assert decision.of_type(CreatePod) == []
    assert decision.of_type(DeletePod) == []
    status = job["status"]
    assert status["reason"] == "PodNameConflict"
    assert "not owned by this job" in status["message"]
    assert "podUID" not in status["currentAttempt"]
    assert condition(status, "Running")["reason"] == "PodNameConflict"
    assert [(e.type, e.reason) for e in decision.of_type(EmitEvent)] == [
        ("Normal", "AttemptStarting"),
        ("Warning", "PodNameConflict"),
    ]
    assert decision.of_type(RequeueAfter) == [RequeueAfter(POD_NAME_CONFLICT_RECHECK_SECONDS)]

    again = run(job, [stranger], at(31))
    assert kinds(again) == ["RequeueAfter"]

    job, cleared = step(job, [], at(62))
    assert cleared.of_type(CreatePod)[0].manifest["metadata"]["name"] == "ledger-1"
    job, _ = step(job, [make_pod(1, phase="Pending")], at(63))
    assert job["status"]["reason"] == "AttemptStarting"


def test_an_orphan_pod_without_owner_is_not_adopted_either() -> None:
    job, _ = step(make_job())
    decision = run(job, [make_pod(1, phase="Running", owner_uid=None)], at(1))
    assert decision.of_type(CreatePod) == []
    assert status_of(decision)["reason"] == "PodNameConflict"


# ---------------------------------------------------------------------------------- deadlines


def test_an_attempt_past_its_deadline_is_deleted_and_retried() -> None:
    job = running_job({"attemptDeadlineSeconds": 60})
    pod = make_pod(1, phase="Running")

    before = run(job, [pod], at(45))
    assert kinds(before) == ["RequeueAfter"]
    assert before.actions[0] == RequeueAfter(15.0)

    job, decision = step(job, [pod], at(60))
    assert job["status"]["history"][-1]["outcome"] == "DeadlineExceeded"
    assert job["status"]["history"][-1]["reason"] == "AttemptDeadlineExceeded"
    assert job["status"]["phase"] == "BackingOff"
    assert job["status"]["reason"] == "AttemptDeadlineExceeded"
    assert decision.of_type(DeletePod) == [DeletePod("ledger-1", "pod-1")]
    assert kinds(decision)[:2] == ["PatchStatus", "DeletePod"]


def test_the_job_past_its_active_deadline_is_dead_lettered() -> None:
    job = running_job({"activeDeadlineSeconds": 300})
    pod = make_pod(1, phase="Running")

    assert run(job, [pod], at(100)).actions == (RequeueAfter(200.0),)

    job, decision = step(job, [pod], at(300))
    status = job["status"]
    assert status["phase"] == "DeadLettered"
    assert status["reason"] == "DeadlineExceeded"
    assert status["history"][-1]["outcome"] == "DeadlineExceeded"
    assert decision.of_type(DeletePod) == [DeletePod("ledger-1", "pod-1")]
    assert decision.of_type(SetDeadLetterLabel) == [SetDeadLetterLabel(True)]


def test_the_decision_that_starts_an_attempt_sets_the_timers_of_its_deadlines() -> None:
    # No look at its own write follows the start (Controller._execute): the timers come with it.
    first = run(make_job(spec={"attemptDeadlineSeconds": 60, "activeDeadlineSeconds": 300}))
    assert kinds(first)[:2] == ["ConfirmVersion", "CreatePod"]
    assert first.of_type(RequeueAfter) == [RequeueAfter(60.0)]

    job, _ = failed_attempt_1({"attemptDeadlineSeconds": 60, "retry": {"backoff": {"initialSeconds": 10}}})
    retry = run(job, [make_pod(1, phase="Failed", exit_code=1)], at(30))  # backoff over: attempt 2
    assert kinds(retry)[:2] == ["ConfirmVersion", "CreatePod"]
    assert retry.of_type(RequeueAfter) == [RequeueAfter(60.0)]


def test_the_active_deadline_also_ends_a_job_that_is_backing_off() -> None:
    job, _ = failed_attempt_1({"activeDeadlineSeconds": 30, "retry": {"backoff": {"initialSeconds": 600}}})
    job, decision = step(job, [make_pod(1, phase="Failed", exit_code=1)], at(30))
    assert job["status"]["reason"] == "DeadlineExceeded"
    assert decision.of_type(CreatePod) == []


# ------------------------------------------------------------------------------------ suspend


def test_suspending_cancels_the_running_attempt_without_using_it() -> None:
    job = running_job({"retry": {"maxAttempts": 1}})
    job["spec"]["suspend"] = True
    job, decision = step(job, [make_pod(1, phase="Running")], at(10))

    status = job["status"]
    assert status["phase"] == "Suspended"
    assert status["history"][-1]["outcome"] == "Cancelled"
    assert status["roundAttempts"] == 0
    assert "currentAttempt" not in status
    assert decision.of_type(DeletePod) == [DeletePod("ledger-1", "pod-1")]
    assert decision.of_type(CreatePod) == []

    job["spec"]["suspend"] = False
    job, resumed = step(job, [make_pod(1, phase="Running", deleting=True)], at(20))
    assert job["status"]["currentAttempt"]["number"] == 2
    assert job["status"]["startedAt"] == "2025-03-01T12:00:20Z"  # the active deadline restarts
    assert event_reasons(resumed) == ["Resumed", "AttemptStarting"]


def test_a_pod_that_succeeded_before_the_suspend_was_seen_still_counts_as_success() -> None:
    job = running_job()
    job["spec"]["suspend"] = True
    job, decision = step(job, [make_pod(1, phase="Succeeded", exit_code=0)], at(10))
    assert job["status"]["phase"] == "Succeeded"
    assert decision.of_type(DeletePod) == []


def test_resume_honours_the_remaining_backoff() -> None:
    job, _ = failed_attempt_1({"retry": {"backoff": {"initialSeconds": 100, "jitter": 0.0}}})
    job["spec"]["suspend"] = True
    job, _ = step(job, [], at(10))
    assert job["status"]["phase"] == "Suspended"
    assert job["status"]["nextAttemptAt"] == "2025-03-01T12:01:45Z"

    job["spec"]["suspend"] = False
    resumed = run(job, [], at(20))
    assert resumed.of_type(CreatePod) == []
    assert resumed.of_type(RequeueAfter) == [RequeueAfter(85.0)]


def test_suspend_does_not_touch_a_finished_job() -> None:
    job, _ = step(running_job(), [make_pod(1, phase="Succeeded", exit_code=0)], at(5))
    job["spec"]["suspend"] = True
    assert run(job, [], at(6)).actions == ()


# -------------------------------------------------------------------------------------- TTL


def test_a_finished_job_is_deleted_once_its_ttl_has_passed() -> None:
    job, decision = step(
        running_job({"ttlSecondsAfterFinished": 100}), [make_pod(1, phase="Succeeded", exit_code=0)], at(5)
    )
    assert decision.of_type(RequeueAfter) == [RequeueAfter(100.0)]

    assert run(job, [], at(55)).actions == (RequeueAfter(50.0),)
    due = run(job, [], at(105))
    assert due.of_type(DeleteJob) == [DeleteJob(JOB_UID)]
    assert due.of_type(RequeueAfter) == []


def test_a_dead_lettered_job_expires_too() -> None:
    job, _ = failed_attempt_1({"ttlSecondsAfterFinished": 0, "retry": {"maxAttempts": 1}})
    assert run(job, [], at(5)).of_type(DeleteJob) == [DeleteJob(JOB_UID)]


# ------------------------------------------------------------------------------------ redrive


def dead_lettered_job() -> dict[str, Any]:
    job, _ = failed_attempt_1({"retry": {"maxAttempts": 1}})
    assert job["status"]["phase"] == "DeadLettered"
    return job


def test_redrive_starts_a_new_round_and_keeps_history() -> None:
    job = dead_lettered_job()
    job["metadata"]["annotations"][api.ANNOTATION_REDRIVE] = "2025-03-01"

    job, decision = step(job, [make_pod(1, phase="Failed", exit_code=1)], at(100))

    status = job["status"]
    assert status["redrives"] == 1
    assert status["lastRedrive"] == "2025-03-01"
    assert status["currentAttempt"]["number"] == 2  # numbers go on: pod names and tokens stay unique
    assert status["roundAttempts"] == 1
    assert status["attempts"] == 2
    assert [h["number"] for h in status["history"]] == [1]
    assert "finishedAt" not in status
    assert condition(status, "DeadLettered")["status"] == "False"
    assert decision.of_type(SetDeadLetterLabel) == [SetDeadLetterLabel(False)]
    assert api.LABEL_DEAD_LETTER not in job["metadata"]["labels"]
    assert decision.of_type(CreatePod)[0].manifest["metadata"]["name"] == "ledger-2"
    assert event_reasons(decision) == ["Redriven", "AttemptStarting"]

    # The same value again is not a new redrive.
    job, _ = step(job, [make_pod(2, phase="Failed", exit_code=1)], at(110))
    assert job["status"]["phase"] == "DeadLettered"
    assert run(job, [], at(120)).of_type(CreatePod) == []


def test_a_second_redrive_needs_a_new_value() -> None:
    job = dead_lettered_job()
    job["metadata"]["annotations"][api.ANNOTATION_REDRIVE] = "a"
    job, _ = step(job, [], at(100))
    job, _ = step(job, [make_pod(2, phase="Failed", exit_code=1)], at(110))
    job["metadata"]["annotations"][api.ANNOTATION_REDRIVE] = "b"
    job, _ = step(job, [], at(120))
    assert job["status"]["redrives"] == 2
    assert job["status"]["currentAttempt"]["number"] == 3


def test_a_redrive_of_a_job_that_is_not_dead_lettered_is_recorded_and_ignored() -> None:
    job = running_job(annotations={api.ANNOTATION_REDRIVE: "early"})
    assert job["status"]["lastRedrive"] == "early"
    assert job["status"]["redrives"] == 0

    job, _ = step(job, [make_pod(1, phase="Failed", exit_code=1)], at(5))
    job["spec"]["retry"] = {"maxAttempts": 1}
    job, _ = step(job, [], at(1000))
    assert job["status"]["phase"] == "DeadLettered"  # the old value does not redrive it


def test_redrive_reports_an_ignored_value_as_a_warning() -> None:
    job = running_job()
    job["metadata"]["annotations"][api.ANNOTATION_REDRIVE] = "x"
    decision = run(job, [make_pod(1, phase="Running")], at(5))
    assert [(e.type, e.reason) for e in decision.of_type(EmitEvent)] == [("Warning", "RedriveIgnored")]


def test_a_missing_dead_letter_label_is_put_back() -> None:
    job = dead_lettered_job()
    del job["metadata"]["labels"][api.LABEL_DEAD_LETTER]  # the shell crashed before labelling
    decision = run(job, [], at(100))
    assert kinds(decision) == ["ConfirmVersion", "SetDeadLetterLabel"]


# ------------------------------------------------------------------------- status bookkeeping


def test_history_keeps_the_last_attempts_only() -> None:
    spec = {"retry": {"maxAttempts": 100, "backoff": {"initialSeconds": 0}}}
    job = running_job(spec)
    now = at(1)
    for attempt in range(1, api.HISTORY_LIMIT + 6):
        job, _ = step(job, [make_pod(attempt, phase="Failed", exit_code=1)], now)
        job, _ = step(job, [], now)
    history = job["status"]["history"]
    assert len(history) == api.HISTORY_LIMIT
    assert history[-1]["number"] == api.HISTORY_LIMIT + 5
    assert history[0]["number"] == 6


def test_last_transition_time_moves_only_when_the_condition_status_does() -> None:
    job = running_job()
    running_since = condition(job["status"], "Running")["lastTransitionTime"]
    dead_since = condition(job["status"], "DeadLettered")["lastTransitionTime"]

    job, _ = step(job, [make_pod(1, phase="Failed", exit_code=1)], at(50))

    assert condition(job["status"], "Running")["status"] == "False"
    assert condition(job["status"], "Running")["lastTransitionTime"] == "2025-03-01T12:00:50Z"
    assert condition(job["status"], "Running")["lastTransitionTime"] != running_since
    assert condition(job["status"], "DeadLettered")["lastTransitionTime"] == dead_since
    assert condition(job["status"], "DeadLettered")["reason"] == "AttemptFailed"


def test_a_spec_change_is_acknowledged_in_observed_generation() -> None:
    job = running_job()
    job["metadata"]["generation"] = 2
    job["spec"]["priority"] = 5
    job, decision = step(job, [make_pod(1, phase="Running")], at(5))
    assert kinds(decision) == ["PatchStatus"]
    assert job["status"]["observedGeneration"] == 2
    assert {c["observedGeneration"] for c in job["status"]["conditions"]} == {2}


def test_a_checkpoint_left_by_an_attempt_is_handed_to_the_next() -> None:
    job = running_job({"retry": {"backoff": {"initialSeconds": 0}}})
    pod = make_pod(1, phase="Failed", exit_code=1, checkpoint='{"offset": 42}')
    job, _ = step(job, [pod], at(5))
    assert job["status"]["lastCheckpoint"] == '{"offset": 42}'

    job, decision = step(job, [pod], at(6))
    env = decision.of_type(CreatePod)[0].manifest["spec"]["containers"][0]["env"]
    assert {"name": "VIGIL_CHECKPOINT", "value": '{"offset": 42}'} in env


def test_an_oversized_checkpoint_is_ignored() -> None:
    job = running_job()
    pod = make_pod(1, phase="Running", checkpoint="x" * (api.MAX_CHECKPOINT_BYTES + 1))
    job, _ = step(job, [pod], at(5))
    assert "lastCheckpoint" not in job["status"]


def test_status_round_trips_through_the_models() -> None:
    job, _ = failed_attempt_1()
    parsed = api.VigilJobStatus.model_validate(job["status"])
    assert {k: v for k, v in parsed.model_dump(mode="json", by_alias=True).items() if v is not None} == job["status"]


# ----------------------------------------------------------------------------- pod rejection


def test_a_pod_refused_before_status_holds_its_attempt_dead_letters_the_job() -> None:
    job = make_job()  # the pod comes first: status does not hold attempt 1 yet
    decision = reject_pod(job, 1, 'Pod "ledger-1" is invalid: spec.containers[0].image: Required value', at(1))

    status = status_of(decision)
    assert (status["phase"], status["reason"]) == ("DeadLettered", "InvalidPodTemplate")
    assert (status["attempts"], status["history"][-1]["number"]) == (1, 1)
    assert status["history"][-1]["reason"] == "PodRejected"
    assert reject_pod(job, 2, "stale", at(1)).actions == (), "only the attempt whose pod was to come next"


def test_a_pod_the_api_server_refuses_dead_letters_the_job_with_its_message() -> None:
    job, _ = step(make_job(labels={api.LABEL_DEAD_LETTER: "true"}))  # reserves attempt 1 in status
    decision = reject_pod(job, 1, 'Pod "ledger-1" is invalid: spec.containers[0].image: Required value', at(1))

    status = status_of(decision)
    assert status["phase"] == "DeadLettered"
    assert status["reason"] == "InvalidPodTemplate"
    assert "spec.containers[0].image: Required value" in status["message"]
    assert status["history"][-1]["reason"] == "PodRejected"
    assert decision.of_type(SetDeadLetterLabel) == [SetDeadLetterLabel(True)]
    assert decision.actions[0] == PatchStatus(status, job["metadata"]["resourceVersion"])


def test_a_refusal_for_an_attempt_that_is_no_longer_current_is_ignored() -> None:
    job, _ = step(make_job())
    assert reject_pod(job, 2, "invalid", at(1)).actions == ()


# ------------------------------------------------------------------ the attempt-tracking finalizer

# initialSeconds 0, as a job stored before the floor may have it: its retries still wait api.MIN_RETRY_SECONDS.
NO_BACKOFF = {"retry": {"backoff": {"initialSeconds": 0}}}
RELEASE_1 = ReleasePod("ledger-1", "pod-1")


def test_the_pod_that_ends_an_attempt_is_released_after_the_status_write_that_records_it() -> None:
    job, decision = step(running_job(), [make_pod(1, phase="Succeeded", exit_code=0, tracked=True)], at(30))

    assert kinds(decision)[:2] == ["PatchStatus", "ReleasePod"]
    assert decision.of_type(ReleasePod) == [RELEASE_1]
    assert job["status"]["history"][-1]["exitCode"] == 0


def test_a_failed_pod_is_released_before_the_next_attempts_pod_is_created() -> None:
    job, decision = step(running_job(NO_BACKOFF), [make_pod(1, phase="Failed", exit_code=1, tracked=True)], at(5))
    assert kinds(decision)[:2] == ["PatchStatus", "ReleasePod"]
    assert decision.of_type(CreatePod) == []  # the floor of every backoff: 1 s
    decision = run(job, [make_pod(1, phase="Failed", exit_code=1)], at(6))
    assert decision.of_type(ReleasePod) == [] and len(decision.of_type(CreatePod)) == 1


def test_a_running_or_pending_pod_is_never_released() -> None:
    job = running_job()
    assert run(job, [make_pod(1, phase="Running", tracked=True)], at(5)).actions == ()
    job, _ = step(make_job())
    assert run(job, [make_pod(1, phase="Pending", tracked=True)], at(1)).of_type(ReleasePod) == []


def test_a_released_pod_costs_nothing_more() -> None:
    job, _ = step(running_job(), [make_pod(1, phase="Failed", exit_code=1, tracked=True)], at(5))
    assert kinds(run(job, [make_pod(1, phase="Failed", exit_code=1)], at(6))) == ["RequeueAfter"]  # backing off


def test_a_release_lost_in_a_crash_is_redone_behind_a_fence_that_writes_nothing() -> None:
    job, _ = step(running_job(), [make_pod(1, phase="Succeeded", exit_code=0, tracked=True)], at(30))
    # The shell died after the status write: the pod still carries the finalizer.
    decision = run(job, [make_pod(1, phase="Succeeded", exit_code=0, tracked=True)], at(31))

    assert decision.actions == (ConfirmVersion(job["metadata"]["resourceVersion"]), ReleasePod("ledger-1", "pod-1"))


def test_a_pod_of_another_owner_is_never_released() -> None:
    job, _ = step(make_job())
    stranger = make_pod(1, phase="Failed", exit_code=1, owner_uid="someone-else", uid="s1", tracked=True)
    assert run(job, [stranger], at(1)).of_type(ReleasePod) == []


def test_the_pods_of_a_job_being_deleted_are_released_at_once() -> None:
    job = running_job()
    job["metadata"]["deletionTimestamp"] = "2025-03-01T12:01:00Z"
    pods = [make_pod(1, phase="Running", tracked=True), make_pod(2, phase="Pending", uid="pod-2")]

    decision = run(job, pods, at(60))

    assert kinds(decision) == ["ConfirmVersion", "ReleasePod"]  # pod-2 carries no finalizer
    assert decision.of_type(ReleasePod) == [RELEASE_1]


# ---------------------------------------------------------------- pods deleted by someone else


def test_a_pod_deleted_while_running_is_held_until_its_exit_code_is_recorded() -> None:
    job = running_job()
    deleting = make_pod(1, phase="Running", deleted_at=at(20), tracked=True)
    job, decision = step(job, [deleting], at(20))
    assert (job["status"]["history"][-1]["outcome"], job["status"]["history"][-1]["reason"]) == ("Lost", "PodDeleted")
    assert job["status"]["history"][-1]["exitCode"] is None
    assert decision.of_type(ReleasePod) == []

    stopped = make_pod(1, phase="Failed", exit_code=143, deleted_at=at(20), finished_at=at(21), tracked=True)
    job, decision = step(job, [stopped], at(22))

    record = job["status"]["history"][-1]
    assert (record["outcome"], record["reason"], record["exitCode"]) == ("Lost", "PodDeleted", 143)
    assert kinds(decision)[:2] == ["PatchStatus", "ReleasePod"]
    assert job["status"]["attempts"] == 1  # only the record changed
    assert event_reasons(decision) == []


def test_a_pod_deleted_by_someone_else_that_exits_0_on_sigterm_is_a_counted_failure() -> None:
    job = running_job({"retry": {"maxAttempts": 3}})
    stopped = make_pod(1, phase="Succeeded", exit_code=0, deleted_at=at(20), finished_at=at(21), tracked=True)

    job, decision = step(job, [stopped], at(22))

    status = job["status"]
    record = status["history"][-1]
    assert (record["outcome"], record["reason"], record["exitCode"]) == ("Lost", "PodDeleted", 0)
    assert (status["phase"], status["reason"]) == ("BackingOff", "AttemptLost")
    assert status["roundAttempts"] == 1
    assert "was stopped by the deletion of its pod (exit code 0)" in status["message"]
    assert decision.of_type(ReleasePod) == [RELEASE_1]


def test_exit_0_after_the_deletion_was_seen_is_no_late_success() -> None:
    job = running_job(NO_BACKOFF)
    job, _ = step(job, [make_pod(1, phase="Running", deleted_at=at(20), tracked=True)], at(20))
    stopped = make_pod(1, phase="Succeeded", exit_code=0, deleted_at=at(20), finished_at=at(21), tracked=True)

    job, decision = step(job, [stopped, make_pod(2, phase="Running", uid="pod-2")], at(22))

    assert job["status"]["phase"] == "Running"
    assert job["status"]["history"][-1]["outcome"] == "Lost"
    assert job["status"]["history"][-1]["exitCode"] == 0
    assert decision.of_type(ReleasePod) == [RELEASE_1]


def test_a_pod_that_had_finished_before_someone_deleted_it_succeeded() -> None:
    job = running_job()
    done = make_pod(1, phase="Succeeded", exit_code=0, deleted_at=at(20), finished_at=at(10), tracked=True)
    job, decision = step(job, [done], at(22))
    assert (job["status"]["phase"], job["status"]["reason"]) == ("Succeeded", "AttemptSucceeded")
    assert decision.of_type(ReleasePod) == [RELEASE_1]


def test_a_success_reported_after_the_deletion_was_seen_wins_if_it_came_first() -> None:
    job = running_job()
    job, _ = step(job, [make_pod(1, phase="Running", deleted_at=at(20), tracked=True)], at(20))
    done = make_pod(1, phase="Succeeded", exit_code=0, deleted_at=at(20), finished_at=at(10), tracked=True)
    job, decision = step(job, [done], at(22))
    assert (job["status"]["phase"], job["status"]["reason"]) == ("Succeeded", "LateSuccess")
    assert decision.of_type(ReleasePod) == [RELEASE_1]


def test_a_force_deleted_pod_of_a_dead_node_is_released_with_its_attempt_closed() -> None:
    job = running_job()
    gone = make_pod(1, phase="Running", deleted_at=at(20), grace=0, tracked=True)
    job, decision = step(job, [gone], at(21))
    assert job["status"]["history"][-1]["reason"] == "PodDeleted"
    assert kinds(decision)[:2] == ["PatchStatus", "ReleasePod"]


def test_a_pod_the_garbage_collector_took_from_a_vanished_node_is_a_disruption_and_released() -> None:
    job = running_job()
    collected = make_pod(
        1,
        phase="Failed",
        deleted_at=at(20),
        grace=0,
        conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC"}],
        tracked=True,
    )
    job, decision = step(job, [collected], at(21))
    assert job["status"]["history"][-1]["outcome"] == "Disrupted"
    assert decision.of_type(ReleasePod) == [RELEASE_1]


# -------------------------------------------------------------- pods Vigil stopped on purpose


@pytest.mark.parametrize(
    ("change", "outcome"),
    [({"suspend": True}, "Cancelled"), ({"attemptDeadlineSeconds": 10}, "DeadlineExceeded")],
)
def test_a_pod_vigil_stopped_keeps_its_outcome_and_is_released_once_it_ends(
    change: dict[str, Any], outcome: str
) -> None:
    job = running_job()
    job["spec"].update(change)
    job, decision = step(job, [make_pod(1, phase="Running", tracked=True)], at(20))
    assert decision.of_type(DeletePod) == [DeletePod("ledger-1", "pod-1")]
    assert decision.of_type(ReleasePod) == []

    terminating = make_pod(1, phase="Running", deleted_at=at(20), tracked=True)
    assert run(job, [terminating], at(21)).of_type(ReleasePod) == []

    exited = make_pod(1, phase="Succeeded", exit_code=0, deleted_at=at(20), finished_at=at(21), tracked=True)
    job, decision = step(job, [exited], at(22))
    record = job["status"]["history"][-1]
    assert (record["outcome"], record["exitCode"]) == (outcome, 0)  # the outcome stays as recorded
    assert job["status"]["phase"] != "Succeeded"
    assert decision.of_type(ReleasePod) == [RELEASE_1]


def test_an_unscheduled_pod_vigil_deleted_is_released_at_once() -> None:
    job, _ = step(make_job())
    job["spec"]["suspend"] = True
    job, _ = step(job, [make_pod(1, phase="Pending", node=None, tracked=True)], at(5))
    # The API server deletes a pod on no node with grace 0: no kubelet will report on it.
    gone = make_pod(1, phase="Pending", node=None, deleted_at=at(5), grace=0, tracked=True)
    assert run(job, [gone], at(6)).of_type(ReleasePod) == [RELEASE_1]


def test_a_dead_lettered_jobs_stray_pod_is_released_once_it_ends() -> None:
    job, _ = failed_attempt_1({"retry": {"maxAttempts": 1}})
    stray = make_pod(1, phase="Failed", exit_code=1, tracked=True)  # the release was lost
    assert kinds(run(job, [stray], at(100))) == ["ConfirmVersion", "ReleasePod"]


def test_a_pod_whose_record_left_the_history_is_released_without_a_write() -> None:
    spec = {"retry": {"maxAttempts": 100, "backoff": {"initialSeconds": 0}}}
    job = running_job(spec)
    for attempt in range(1, api.HISTORY_LIMIT + 3):
        job, _ = step(job, [make_pod(attempt, phase="Failed", exit_code=1, uid=f"p{attempt}")], at(attempt))
        job, _ = step(job, [], at(attempt))
    assert job["status"]["history"][0]["number"] == 3
    old = make_pod(1, phase="Failed", exit_code=1, uid="p1", tracked=True)
    live = make_pod(api.HISTORY_LIMIT + 3, phase="Running", uid="live")

    job_after, decision = step(job, [old, live], at(100))

    assert decision.of_type(ReleasePod) == [ReleasePod("ledger-1", "p1")]
    assert job_after["status"]["history"] == job["status"]["history"]
