"""Table tests of decide() for liveness: heartbeat verdicts (Uncertain, resumed, Lost), NoOverlap,
a late success, checkpoints, lastHeartbeatAt."""

from __future__ import annotations

import random
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import pytest

from tests.support.builders import T0, apply_to_job, at, condition, make_job, make_pod, stamp
from vigil import api
from vigil.core.actions import AnnotatePod, CreatePod, Decision, DeletePod, EmitEvent, ReleasePod
from vigil.core.lifecycle import decide
from vigil.core.liveness import Liveness

pytestmark = pytest.mark.unit

HEALTHY = Liveness("Healthy", 1.0, "heartbeats arriving")
UNCERTAIN = Liveness("Uncertain", 35.0, "no heartbeat for 30s or more; Lost after 60s of silence")
LOST = Liveness("Lost", 61.0, "no heartbeat for 60s or more (heartbeat.timeoutSeconds)")
# The shortest backoff there is (api.MIN_RETRY_SECONDS, without jitter): the next attempt may start 1 s after a failure.
SHORTEST_BACKOFF = {"retry": {"backoff": {"initialSeconds": 1, "jitter": 0.0}}}
SUPERSEDED = {api.ANNOTATION_SUPERSEDED: "HeartbeatLost"}


def run(
    job: dict[str, Any],
    pods: list[dict[str, Any]] = (),
    now: datetime = T0,
    *,
    liveness: Mapping[str, Liveness] | None = None,
    may_start: bool = True,
    stamp_floor: float = 0.0,
) -> Decision:
    return decide(job, pods, now, rng=random.Random(0), may_start=may_start, liveness=liveness, stamp_floor=stamp_floor)


def step(job: dict[str, Any], pods: list[dict[str, Any]] = (), now: datetime = T0, **kwargs: Any):
    decision = run(job, pods, now, **kwargs)
    return apply_to_job(job, decision), decision


def kinds(decision: Decision) -> list[str]:
    return [type(action).__name__ for action in decision.actions]


def events(decision: Decision) -> list[tuple[str, str]]:
    return [(e.type, e.reason) for e in decision.of_type(EmitEvent)]


def running_job(spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """Attempt 1 started at T0 and seen running."""
    job, _ = step(make_job(spec=spec))
    job, _ = step(job, [make_pod(1, phase="Running")])
    return job


def uncertain_job(spec: dict[str, Any] | None = None) -> dict[str, Any]:
    job, _ = step(running_job(spec), [make_pod(1, phase="Running")], at(40), liveness={"pod-1": UNCERTAIN})
    return job


def lost_attempt_1(spec: dict[str, Any] | None = None) -> tuple[dict[str, Any], Decision]:
    return step(running_job(spec), [make_pod(1, phase="Running")], at(70), liveness={"pod-1": LOST})


# ------------------------------------------------------------------------------- Uncertain


def test_a_silent_running_attempt_becomes_uncertain_with_a_warning_and_nothing_replaced() -> None:
    job, decision = step(running_job(), [make_pod(1, phase="Running")], at(40), liveness={"pod-1": UNCERTAIN})

    status = job["status"]
    assert (status["phase"], status["reason"]) == ("Uncertain", "HeartbeatUncertain")
    assert status["currentAttempt"]["phase"] == "Uncertain"
    assert "no heartbeat for 30s" in status["message"]
    assert condition(status, "HeartbeatHealthy")["status"] == "Unknown"
    assert condition(status, "Running")["status"] == "False"
    assert events(decision) == [("Warning", "HeartbeatUncertain")]
    assert kinds(decision) == ["PatchStatus", "EmitEvent"]


def test_an_uncertain_attempt_that_stays_silent_costs_no_write() -> None:
    job = uncertain_job()
    assert run(job, [make_pod(1, phase="Running")], at(50), liveness={"pod-1": UNCERTAIN}).actions == ()


def test_resumed_heartbeats_bring_an_uncertain_attempt_back_to_running() -> None:
    job, decision = step(uncertain_job(), [make_pod(1, phase="Running")], at(45), liveness={"pod-1": HEALTHY})

    status = job["status"]
    assert (status["phase"], status["reason"]) == ("Running", "HeartbeatResumed")
    assert status["currentAttempt"]["phase"] == "Running"
    assert condition(status, "HeartbeatHealthy")["status"] == "True"
    assert condition(status, "Running")["status"] == "True"
    assert events(decision) == [("Normal", "HeartbeatResumed")]
    assert status["attempts"] == 1


def test_no_verdict_counts_as_healthy_never_as_lost() -> None:
    job, decision = step(uncertain_job(), [make_pod(1, phase="Running")], at(10_000), liveness={})
    assert job["status"]["phase"] == "Running"
    assert events(decision) == [("Normal", "HeartbeatResumed")]
    assert run(job, [make_pod(1, phase="Running")], at(20_000)).actions == ()  # liveness=None


def test_a_flapping_verdict_never_starts_another_attempt() -> None:
    job = running_job()
    for i, verdict in enumerate([UNCERTAIN, HEALTHY, UNCERTAIN, UNCERTAIN, HEALTHY, UNCERTAIN]):
        job, decision = step(job, [make_pod(1, phase="Running")], at(40 + i), liveness={"pod-1": verdict})
        assert decision.of_type(CreatePod) == [] and decision.of_type(DeletePod) == []
    assert job["status"]["phase"] == "Uncertain"
    assert job["status"]["attempts"] == 1


def test_a_verdict_about_another_pod_is_not_about_the_current_attempt() -> None:
    decision = run(running_job(), [make_pod(1, phase="Running")], at(70), liveness={"pod-0": LOST})
    assert decision.actions == ()


def test_an_unreachable_node_and_a_silent_agent_make_the_attempt_uncertain() -> None:
    job, _ = step(running_job(), [make_pod(1, phase="Unknown")], at(40), liveness={"pod-1": UNCERTAIN})
    assert job["status"]["phase"] == "Uncertain"


# ------------------------------------------------------------------------------------ Lost


def test_a_lost_attempt_is_marked_superseded_deleted_and_retried_after_backoff() -> None:
    job, decision = lost_attempt_1({"retry": {"backoff": {"initialSeconds": 10, "jitter": 0.0}}})

    assert kinds(decision) == ["PatchStatus", "AnnotatePod", "DeletePod", "EmitEvent", "RequeueAfter"]
    assert decision.of_type(AnnotatePod) == [AnnotatePod("ledger-1", "pod-1", SUPERSEDED)]
    assert decision.of_type(DeletePod) == [DeletePod("ledger-1", "pod-1")]
    status = job["status"]
    record = status["history"][-1]
    assert (record["outcome"], record["reason"]) == ("Lost", "HeartbeatLost")
    assert (status["phase"], status["reason"]) == ("BackingOff", "AttemptLost")
    assert status["roundAttempts"] == 1  # Lost counts against maxAttempts
    assert "currentAttempt" not in status
    assert condition(status, "HeartbeatHealthy")["status"] == "False"
    assert events(decision) == [("Warning", "AttemptLost")]  # one event, saying when attempt 2 starts
    assert decision.of_type(EmitEvent)[0].message == status["message"]
    assert status["message"].endswith(f"attempt 2 starts in 10.0s, at {stamp(at(70 + 10))}")

    # AtLeastOnce: attempt 2 starts while attempt 1's pod still terminates, with a greater token
    job, decision = step(job, [make_pod(1, phase="Running", deleting=True)], at(80))
    (create,) = decision.of_type(CreatePod)
    env = {e["name"]: e.get("value") for e in create.manifest["spec"]["containers"][0]["env"]}
    assert env["VIGIL_FENCING_TOKEN"] == "2"
    assert condition(job["status"], "HeartbeatHealthy")["status"] == "False"  # until attempt 2 runs


def test_a_lost_last_attempt_dead_letters_the_job() -> None:
    job, decision = lost_attempt_1({"retry": {"maxAttempts": 1}})
    assert (job["status"]["phase"], job["status"]["reason"]) == ("DeadLettered", "AttemptsExhausted")
    assert decision.of_type(AnnotatePod) == [AnnotatePod("ledger-1", "pod-1", SUPERSEDED)]
    assert decision.of_type(DeletePod) == [DeletePod("ledger-1", "pod-1")]


def test_the_old_pod_is_stopped_before_the_new_one_is_created() -> None:
    job, decision = lost_attempt_1(SHORTEST_BACKOFF)
    assert kinds(decision)[:3] == ["PatchStatus", "AnnotatePod", "DeletePod"]
    assert decision.of_type(CreatePod) == []  # not even the shortest backoff is none
    marked = make_pod(1, phase="Running", deleting=True, annotations=SUPERSEDED)
    assert len(run(job, [marked], at(71)).of_type(CreatePod)) == 1


def test_a_crash_before_the_marking_is_repaired_by_the_next_look() -> None:
    job, _ = lost_attempt_1()  # only its PatchStatus landed
    decision = run(job, [make_pod(1, phase="Running")], at(71))
    assert kinds(decision)[:3] == ["ConfirmVersion", "AnnotatePod", "DeletePod"]

    marked = make_pod(1, phase="Running", annotations=SUPERSEDED)  # marked, deletion not done
    assert run(job, [marked], at(72)).of_type(AnnotatePod) == []
    assert run(job, [marked], at(72)).of_type(DeletePod) == [DeletePod("ledger-1", "pod-1")]


def test_a_success_reported_with_a_lost_verdict_is_a_success() -> None:
    job, decision = step(running_job(), [make_pod(1, phase="Succeeded", exit_code=0)], at(70), liveness={"pod-1": LOST})
    assert job["status"]["phase"] == "Succeeded"
    assert decision.of_type(AnnotatePod) == []


def test_an_unreachable_node_with_a_lost_agent_is_replaced() -> None:
    job, _ = step(running_job(), [make_pod(1, phase="Unknown")], at(70), liveness={"pod-1": LOST})
    assert job["status"]["history"][-1]["outcome"] == "Lost"


def test_without_required_heartbeats_verdicts_are_ignored_and_no_condition_is_kept() -> None:
    spec = {"heartbeat": {"required": False}}
    job = running_job(spec)
    assert "HeartbeatHealthy" not in {c["type"] for c in job["status"]["conditions"]}
    assert run(job, [make_pod(1, phase="Running")], at(70), liveness={"pod-1": LOST}).actions == ()


def test_turning_required_off_while_uncertain_brings_the_attempt_back() -> None:
    job = uncertain_job()
    job["spec"]["heartbeat"] = {"required": False}
    job, _ = step(job, [make_pod(1, phase="Running")], at(45), liveness={"pod-1": UNCERTAIN})
    assert job["status"]["phase"] == "Running"
    assert "HeartbeatHealthy" not in {c["type"] for c in job["status"]["conditions"]}


# ------------------------------------------------------------------------- lastHeartbeatAt


def beat_at(seconds: float) -> dict[str, Liveness]:
    return {"pod-1": Liveness("Healthy", 0.0, "heartbeats arriving", last_beat_at=at(seconds))}


def test_last_heartbeat_at_is_written_first_then_only_when_stale_by_the_period() -> None:
    job = running_job()  # heartbeat timeout 60s: period max(300, 30) = 300s
    pods = [make_pod(1, phase="Running")]

    job, decision = step(job, pods, at(10), liveness=beat_at(10))
    assert job["status"]["currentAttempt"]["lastHeartbeatAt"] == "2025-03-01T12:00:10Z"

    assert run(job, pods, at(300), liveness=beat_at(300)).actions == ()  # 290s newer: not worth a write
    job, decision = step(job, pods, at(310), liveness=beat_at(310.5))
    assert kinds(decision) == ["PatchStatus"]
    assert job["status"]["currentAttempt"]["lastHeartbeatAt"] == "2025-03-01T12:05:10Z"  # seconds


def test_with_many_attempts_tracked_last_heartbeat_at_is_written_alone_more_rarely() -> None:
    # 10,000 attempts under the 10 stamps a second: each job's stamp every 1,000 s, not 300 s.
    job, _ = step(running_job(), [make_pod(1, phase="Running")], at(10), liveness=beat_at(10))
    pods = [make_pod(1, phase="Running")]
    assert run(job, pods, at(310), liveness=beat_at(310), stamp_floor=1000.0).actions == ()
    assert run(job, pods, at(1009), liveness=beat_at(1009), stamp_floor=1000.0).actions == ()
    job, decision = step(job, pods, at(1010), liveness=beat_at(1010), stamp_floor=1000.0)
    assert kinds(decision) == ["PatchStatus"]
    assert job["status"]["currentAttempt"]["lastHeartbeatAt"] == "2025-03-01T12:16:50Z"


def test_last_heartbeat_at_rides_along_with_any_other_write() -> None:
    job, _ = step(running_job(), [make_pod(1, phase="Running")], at(10), liveness=beat_at(10))
    job, _ = step(job, [make_pod(1, phase="Running")], at(45), liveness={"pod-1": UNCERTAIN})
    verdict = Liveness("Healthy", 0.0, "heartbeats arriving", last_beat_at=at(46))
    job, _ = step(job, [make_pod(1, phase="Running")], at(46), liveness={"pod-1": verdict})
    assert job["status"]["currentAttempt"]["lastHeartbeatAt"] == "2025-03-01T12:00:46Z"


# ------------------------------------------------------------------------------- NoOverlap


def test_under_no_overlap_the_next_attempt_waits_for_the_lost_pod_to_be_gone() -> None:
    job, decision = lost_attempt_1({"guarantee": "NoOverlap", **SHORTEST_BACKOFF})
    assert decision.of_type(DeletePod) == [DeletePod("ledger-1", "pod-1")]
    marked = make_pod(1, phase="Running", annotations=SUPERSEDED)  # its deletion not seen yet

    job, decision = step(job, [marked], at(71))  # the backoff is over
    assert decision.of_type(CreatePod) == []
    status = job["status"]
    assert (status["phase"], status["reason"]) == ("BackingOff", "WaitingForPreviousPod")
    assert "pod ledger-1 of attempt 1" in status["message"]
    assert ("Normal", "WaitingForPreviousPod") in events(decision)

    terminating = make_pod(1, phase="Running", deleting=True, annotations=SUPERSEDED)
    job, decision = step(job, [terminating], at(72))
    assert kinds(decision) == ["PatchStatus"]  # the message now says it is terminating; no event
    assert "terminating" in job["status"]["message"]
    assert run(job, [terminating], at(500)).actions == ()  # it may never go: the job waits

    job, decision = step(job, [], at(600))
    assert len(decision.of_type(CreatePod)) == 1
    job, _ = step(job, [make_pod(2)], at(601))
    assert job["status"]["currentAttempt"]["number"] == 2


def test_under_no_overlap_a_finished_pod_never_blocks_the_next_attempt_and_keeps_its_logs() -> None:
    spec = {"guarantee": "NoOverlap", "retry": {"backoff": {"initialSeconds": 10, "jitter": 0.0}}}
    job, _ = step(running_job(spec), [make_pod(1, phase="Failed", exit_code=1)], at(5))
    failed = make_pod(1, phase="Failed", exit_code=1)

    assert run(job, [failed], at(10)).of_type(DeletePod) == []  # backing off
    job, decision = step(job, [failed], at(15))
    # A finished pod can run nothing any more: no overlap is possible, so no wait and no deletion.
    assert decision.of_type(DeletePod) == []
    assert len(decision.of_type(CreatePod)) == 1
    assert job["status"]["reason"] != "WaitingForPreviousPod"


def test_under_no_overlap_a_lost_pod_that_has_stopped_frees_the_next_attempt_before_it_is_gone() -> None:
    # The node stopped the pod (exit 143 on SIGTERM, phase Failed): it runs nothing any more, even
    # while Vigil's own finalizer still holds its object for the exit code.
    job, _ = lost_attempt_1({"guarantee": "NoOverlap", **SHORTEST_BACKOFF})
    stopped = make_pod(1, phase="Failed", exit_code=143, deleting=True, annotations=SUPERSEDED)
    job, decision = step(job, [stopped], at(75))
    assert len(decision.of_type(CreatePod)) == 1
    assert job["status"]["currentAttempt"]["number"] == 2


def test_under_no_overlap_a_resumed_job_waits_for_its_cancelled_pod() -> None:
    job = running_job({"guarantee": "NoOverlap"})
    job["spec"]["suspend"] = True
    job, _ = step(job, [make_pod(1, phase="Running")], at(10))
    job["spec"]["suspend"] = False
    job, decision = step(job, [make_pod(1, phase="Running", deleting=True)], at(20))

    assert decision.of_type(CreatePod) == []
    assert (job["status"]["phase"], job["status"]["reason"]) == ("Queued", "WaitingForPreviousPod")


def test_under_no_overlap_the_previous_pod_is_reported_before_the_queue() -> None:
    job, _ = lost_attempt_1({"guarantee": "NoOverlap", **SHORTEST_BACKOFF})
    job, _ = step(job, [make_pod(1, phase="Running", deleting=True)], at(71), may_start=False)
    assert job["status"]["reason"] == "WaitingForPreviousPod"
    job, _ = step(job, [], at(72), may_start=False)
    assert job["status"]["reason"] == "WaitingForQueue"


def test_at_least_once_does_not_wait_for_the_previous_pod() -> None:
    job, _ = lost_attempt_1(SHORTEST_BACKOFF)
    job, decision = step(job, [make_pod(1, phase="Running", annotations=SUPERSEDED)], at(71))
    assert len(decision.of_type(CreatePod)) == 1
    assert job["status"]["currentAttempt"]["number"] == 2


# ---------------------------------------------------------------------------- late success


def attempt_2_running(spec: dict[str, Any] | None = None) -> dict[str, Any]:
    job, _ = lost_attempt_1({**SHORTEST_BACKOFF, **(spec or {})})
    job, _ = step(job, [make_pod(1, phase="Running", deleting=True), make_pod(2, phase="Running")], at(71))
    assert job["status"]["currentAttempt"]["number"] == 2
    return job


def test_a_late_success_of_a_lost_attempt_wins_and_cancels_the_replacement() -> None:
    job = attempt_2_running()
    # It had finished before Vigil deleted it at 70s; the report of that came late.
    late = make_pod(1, phase="Succeeded", exit_code=0, deleted_at=at(70), finished_at=at(60))
    job, decision = step(job, [late, make_pod(2, phase="Running")], at(90))

    status = job["status"]
    assert (status["phase"], status["reason"]) == ("Succeeded", "LateSuccess")
    assert condition(status, "Succeeded")["status"] == "True"
    history = {r["number"]: r for r in status["history"]}
    assert (history[1]["outcome"], history[1]["reason"], history[1]["exitCode"]) == ("Succeeded", "LateSuccess", 0)
    assert (history[2]["outcome"], history[2]["reason"]) == ("Cancelled", "LateSuccess")
    assert [r["number"] for r in status["history"]] == [1, 2]
    assert "currentAttempt" not in status
    assert status["attempts"] == 2  # tokens never go back
    assert decision.of_type(DeletePod) == [DeletePod("ledger-2", "pod-2")]
    assert decision.of_type(CreatePod) == []
    assert ("Normal", "LateSuccess") in events(decision)

    assert run(job, [late, make_pod(2, phase="Running", deleting=True)], at(999)).actions == ()


def test_a_late_success_while_backing_off_ends_the_job() -> None:
    job, _ = lost_attempt_1({"retry": {"backoff": {"initialSeconds": 100}}})
    job, decision = step(job, [make_pod(1, phase="Succeeded", exit_code=0)], at(80))
    assert (job["status"]["phase"], job["status"]["reason"]) == ("Succeeded", "LateSuccess")
    assert "nextAttemptAt" not in job["status"]
    assert job["status"]["history"][-1]["outcome"] == "Succeeded"
    assert decision.of_type(CreatePod) == []


def test_the_replacements_own_success_in_the_same_look_is_an_ordinary_success() -> None:
    job = attempt_2_running()
    pods = [make_pod(1, phase="Succeeded", exit_code=0), make_pod(2, phase="Succeeded", exit_code=0)]
    job, _ = step(job, pods, at(90))
    assert (job["status"]["phase"], job["status"]["reason"]) == ("Succeeded", "AttemptSucceeded")
    assert job["status"]["history"][-1]["outcome"] == "Succeeded"


@pytest.mark.parametrize("spec", [{"attemptDeadlineSeconds": 30}, {"suspend": True}])
def test_a_pod_that_exits_0_after_vigil_stopped_it_on_purpose_is_no_late_success(spec: dict[str, Any]) -> None:
    job = running_job(SHORTEST_BACKOFF)
    job["spec"].update(spec)
    job, _ = step(job, [make_pod(1, phase="Running")], at(40))
    job["spec"]["suspend"] = False
    job, _ = step(job, [make_pod(1, phase="Running", deleting=True)], at(41))
    job, _ = step(job, [make_pod(1, phase="Succeeded", exit_code=0), make_pod(2, phase="Running")], at(42))
    assert job["status"]["phase"] == "Running"
    assert job["status"]["currentAttempt"]["number"] == 2


def test_a_dead_lettered_job_is_not_revived_by_a_late_success_but_records_it() -> None:
    job, _ = lost_attempt_1({"retry": {"maxAttempts": 1}})
    late = make_pod(1, phase="Succeeded", exit_code=0, finished_at=at(65), deleted_at=at(70), tracked=True)

    job, decision = step(job, [late], at(80))

    assert (job["status"]["phase"], job["status"]["reason"]) == ("DeadLettered", "AttemptsExhausted")
    record = job["status"]["history"][-1]
    assert (record["outcome"], record["reason"], record["exitCode"]) == ("Lost", "HeartbeatLost", 0)
    assert kinds(decision) == ["PatchStatus", "ReleasePod"]
    assert events(decision) == []


# ----------------------------------------------------------------------------- checkpoints


def with_checkpoint(value: str, **kwargs: Any) -> dict[str, Any]:
    return make_pod(1, phase=kwargs.pop("phase", "Running"), checkpoint=value, **kwargs)


@pytest.mark.parametrize(
    "bad",
    [
        "not json",
        '{"offset": ',
        "x" * (api.MAX_CHECKPOINT_BYTES + 1),
        "[" * 2000 + "]" * 2000,  # deep nesting: the parser's RecursionError, caught
        '"' + "é" * 1100 + '"',  # short in characters, over the limit in bytes
    ],
)
def test_a_bad_checkpoint_is_ignored_with_one_warning(bad: str) -> None:
    job, decision = step(running_job(), [with_checkpoint(bad)], at(5))

    assert "lastCheckpoint" not in job["status"]
    assert events(decision) == [("Warning", "CheckpointRejected")]
    assert condition(job["status"], "CheckpointAccepted")["status"] == "False"
    assert run(job, [with_checkpoint(bad)], at(6)).actions == ()  # not on every look


def test_each_distinct_bad_checkpoint_is_reported_once() -> None:
    job, _ = step(running_job(), [with_checkpoint("bad one")], at(5))
    job, decision = step(job, [with_checkpoint("bad two")], at(6))
    assert events(decision) == [("Warning", "CheckpointRejected")]
    assert run(job, [with_checkpoint("bad two")], at(7)).actions == ()


def test_a_good_checkpoint_after_a_bad_one_is_taken_and_the_condition_says_so() -> None:
    job, _ = step(running_job(), [with_checkpoint("bad")], at(5))
    job, decision = step(job, [with_checkpoint('{"offset": 7}')], at(6))
    assert job["status"]["lastCheckpoint"] == '{"offset": 7}'
    assert condition(job["status"], "CheckpointAccepted")["status"] == "True"
    assert events(decision) == []


def test_an_unchanged_checkpoint_costs_no_write() -> None:
    job, _ = step(running_job(), [with_checkpoint('{"offset": 7}')], at(5))
    assert "CheckpointAccepted" not in {c["type"] for c in job["status"]["conditions"]}
    assert run(job, [with_checkpoint('{"offset": 7}')], at(6)).actions == ()


def test_the_next_attempt_gets_the_last_good_checkpoint_not_a_later_bad_one() -> None:
    job, _ = step(running_job(SHORTEST_BACKOFF), [with_checkpoint('{"offset": 7}')], at(5))
    failed = with_checkpoint("{broken", phase="Failed", exit_code=1)
    job, _ = step(job, [failed], at(6))
    job, decision = step(job, [failed], at(7))
    (create,) = decision.of_type(CreatePod)
    env = {e["name"]: e.get("value") for e in create.manifest["spec"]["containers"][0]["env"]}
    assert env["VIGIL_CHECKPOINT"] == '{"offset": 7}'


# ------------------------------------------------- the finalizer on a lost attempt's pod


LOST_AT = at(70)  # lost_attempt_1 deletes the pod then


def lost_pod(**kwargs: Any) -> dict[str, Any]:
    return make_pod(1, deleted_at=LOST_AT, annotations=SUPERSEDED, tracked=True, **kwargs)


def test_a_lost_attempts_pod_is_held_until_its_final_phase_is_recorded() -> None:
    job, decision = lost_attempt_1({"retry": {"backoff": {"initialSeconds": 100}}})
    assert decision.of_type(ReleasePod) == []

    assert run(job, [lost_pod(phase="Running")], at(75)).of_type(ReleasePod) == []  # it may still succeed

    fenced = lost_pod(phase="Failed", exit_code=75, finished_at=at(71))  # its agent stopped it
    job, decision = step(job, [fenced], at(76))
    record = job["status"]["history"][-1]
    assert (record["outcome"], record["reason"], record["exitCode"]) == ("Lost", "HeartbeatLost", 75)
    assert kinds(decision) == ["PatchStatus", "ReleasePod", "RequeueAfter"]


def test_a_lost_pod_that_exits_0_on_the_sigterm_of_its_deletion_is_no_late_success() -> None:
    job = attempt_2_running()
    stopped = lost_pod(phase="Succeeded", exit_code=0, finished_at=at(72))

    job, decision = step(job, [stopped, make_pod(2, phase="Running")], at(90))

    assert job["status"]["phase"] == "Running"
    assert job["status"]["currentAttempt"]["number"] == 2
    assert job["status"]["history"][-1]["outcome"] == "Lost"
    assert decision.of_type(ReleasePod) == [ReleasePod("ledger-1", "pod-1")]


def test_a_late_success_is_recorded_before_its_pod_is_released() -> None:
    job = attempt_2_running()
    late = lost_pod(phase="Succeeded", exit_code=0, finished_at=at(60))

    job, decision = step(job, [late, make_pod(2, phase="Running", tracked=True)], at(90))

    assert (job["status"]["phase"], job["status"]["reason"]) == ("Succeeded", "LateSuccess")
    assert kinds(decision)[:3] == ["PatchStatus", "DeletePod", "ReleasePod"]
    assert decision.of_type(ReleasePod) == [ReleasePod("ledger-1", "pod-1")]  # attempt 2's pod still runs

    cancelled = make_pod(2, phase="Failed", exit_code=143, deleted_at=at(90), finished_at=at(91), tracked=True)
    released = make_pod(1, phase="Succeeded", exit_code=0, finished_at=at(60), deleted_at=LOST_AT)
    job, decision = step(job, [released, cancelled], at(92))
    assert job["status"]["history"][-1]["outcome"] == "Cancelled"
    assert job["status"]["history"][-1]["exitCode"] == 143
    assert decision.of_type(ReleasePod) == [ReleasePod("ledger-2", "pod-2")]


def test_a_late_success_seen_only_after_the_kubelets_final_deletion_is_not_proven() -> None:
    # The kubelet deletes a finished pod with grace 0, and the API server then moves
    # deletionTimestamp to that moment: whether the pod ended before Vigil deleted it is lost, so
    # the success is not counted (at least once: attempt 2 does the work).
    job = attempt_2_running()
    late = make_pod(1, phase="Succeeded", exit_code=0, finished_at=at(60), annotations=SUPERSEDED, tracked=True)
    late["metadata"].update(deletionTimestamp=stamp(at(88)), deletionGracePeriodSeconds=0)

    job, decision = step(job, [late, make_pod(2, phase="Running")], at(90))

    assert job["status"]["phase"] == "Running"
    assert job["status"]["history"][-1]["exitCode"] == 0
    assert decision.of_type(ReleasePod) == [ReleasePod("ledger-1", "pod-1")]


def test_under_no_overlap_a_stopped_but_held_pod_does_not_block_the_next_attempt() -> None:
    job, _ = lost_attempt_1({"guarantee": "NoOverlap", **SHORTEST_BACKOFF})
    held = lost_pod(phase="Failed", exit_code=143, finished_at=at(71))

    job, decision = step(job, [held], at(72))

    assert job["status"]["currentAttempt"]["number"] == 2
    assert kinds(decision)[:3] == ["PatchStatus", "ReleasePod", "CreatePod"]
