"""`kubectl vigil`'s decisions (vigil.plugin.report), from sample objects as the API server sends
them: why a job waits, its beats, the dead-letter queue, the queues, and the redrive's plan."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.support.plugin import dead_job, queue, sample_job
from vigil.core.ratelimit import TokenBucket
from vigil.plugin import report

pytestmark = pytest.mark.unit

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def test_a_queued_job_says_its_queue_holds_it_back_and_a_troubled_condition_too():
    job = sample_job(
        phase="Queued",
        reason="QueueSaturated",
        message="queue nightly runs 1 of at most 1 attempts",
        conditions=[
            {"type": "Running", "status": "False", "reason": "QueueSaturated", "message": "queue nightly runs 1"},
            {"type": "ReconcileError", "status": "True", "reason": "PatchFailed", "message": "503 from the API"},
            {"type": "HeartbeatHealthy", "status": "True", "reason": "Beating", "message": "beats arrive"},
        ],
    )
    assert report.why_it_waits(job) == [
        {"source": "phase", "reason": "QueueSaturated", "message": "queue nightly runs 1 of at most 1 attempts"},
        {"source": "ReconcileError", "reason": "PatchFailed", "message": "503 from the API"},
    ]


def test_a_running_job_waits_for_nothing_unless_its_beats_stop():
    assert report.why_it_waits(sample_job(phase="Running", reason="AttemptRunning")) == []
    silent = sample_job(
        phase="Uncertain",
        reason="HeartbeatMissed",
        message="no beat for 31s",
        conditions=[{"type": "HeartbeatHealthy", "status": "Unknown", "reason": "HeartbeatMissed", "message": "x"}],
    )
    assert [w["source"] for w in report.why_it_waits(silent)] == ["phase", "HeartbeatHealthy"]


def test_status_has_the_attempts_the_beats_the_checkpoint_and_the_newest_attempts_first():
    history = [
        {
            "number": n,
            "podName": f"j-{n}",
            "outcome": "Failed",
            "exitCode": 1,
            "startedAt": "2026-03-01T11:00:00Z",
            "finishedAt": "2026-03-01T11:01:00Z",
        }
        for n in range(1, 8)
    ]
    job = sample_job(
        phase="Running",
        attempts=8,
        roundAttempts=2,
        redrives=1,
        history=history,
        lastCheckpoint='{"offset": 42}',
        currentAttempt={
            "number": 8,
            "podName": "j-8",
            "phase": "Running",
            "startedAt": "2026-03-01T11:58:00Z",
            "lastHeartbeatAt": "2026-03-01T11:59:30Z",
            "nodeName": "kwok-node-0",
        },
    )
    pod = {"metadata": {"annotations": {"vigil.dev/heartbeat": "17:0a1b2c3d"}}}
    summary = report.job_status(job, NOW, pod)
    assert summary["phase"] == "Running"
    assert (summary["attempts"], summary["roundAttempts"], summary["maxAttempts"], summary["redrives"]) == (8, 2, 6, 1)
    assert summary["currentAttempt"]["beatsSent"] == 17
    assert summary["currentAttempt"]["lastHeartbeatAt"] == "2026-03-01T11:59:30Z"
    assert summary["lastCheckpoint"] == '{"offset": 42}'
    assert [a["number"] for a in summary["recentAttempts"]] == [7, 6, 5, 4, 3]
    assert summary["queue"] == "default"  # a job that names none


def test_a_new_job_and_a_pod_without_beats():
    job = {"metadata": {"name": "fresh", "namespace": "ns"}, "spec": {}}
    summary = report.job_status(job, NOW)
    assert (summary["phase"], summary["attempts"], summary["currentAttempt"], summary["waiting"]) == (
        "New",
        0,
        None,
        [],
    )
    assert report.beat_sequence({"metadata": {}}) is None
    assert report.beat_sequence({"metadata": {"annotations": {"vigil.dev/heartbeat": "junk"}}}) is None


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(None, "-"), (-3, "0s"), (59, "59s"), (119, "119s"), (120, "2m"), (7199, "119m"), (7200, "2h"), (200000, "2d")],
)
def test_durations_read_as_kubectl_ages(seconds, shown):
    assert report.duration(seconds) == shown


def test_ages_of_times_as_the_api_server_writes_them():
    assert report.ago("2026-03-01T11:59:15Z", NOW) == "45s"
    assert report.ago(None, NOW) == "-"
    assert report.ago("not a time", NOW) == "-"


def test_the_dead_letter_queue_lists_the_longest_dead_first():
    rows = report.dead_letters(
        [
            dead_job("young", finished="2026-03-01T11:59:00Z"),
            dead_job("old", finished="2026-03-01T10:00:00Z", queue="nightly"),
        ],
        NOW,
    )
    assert [(r["name"], r["queue"], r["since"], r["reason"]) for r in rows] == [
        ("old", "nightly", "2h", "NonRetryableExitCode"),
        ("young", "default", "60s", "NonRetryableExitCode"),
    ]


def test_queues_at_a_glance():
    rows = report.queue_rows(
        [
            queue(
                "nightly",
                spec={"maxRunning": 1, "paused": True, "retryBudget": 0.2},
                status={
                    "queued": 2,
                    "running": 1,
                    "backingOff": 1,
                    "deadLettered": 3,
                    "oldestQueuedSeconds": 42,
                    "headOfLine": ["report-a", "report-b"],
                    "conditions": [
                        {"type": "Saturated", "status": "True"},
                        {"type": "RetryBudgetExhausted", "status": "True"},
                    ],
                },
            ),
            queue("batch", spec={"maxRunning": 100, "retryBudget": 1.0}),  # Vigil has written no status yet
        ]
    )
    nightly, batch = rows[1], rows[0]
    assert nightly == {
        "name": "nightly", "namespace": "ns", "paused": True, "queued": 2, "running": 1, "maxRunning": 1,
        "backingOff": 1, "deadLettered": 3, "oldestWaitSeconds": 42, "retryBudget": "0.2 exhausted",
        "saturated": "True", "headOfLine": ["report-a", "report-b"],
    }  # fmt: skip
    assert (batch["paused"], batch["queued"], batch["retryBudget"], batch["saturated"]) == (False, None, "off", None)
    assert report.budget_state(queue("q", spec={"retryBudget": 0.5})) == "0.5 ok"


# --- redrive ----------------------------------------------------------------------------------


def test_the_redrive_value_is_the_unix_time_as_date_plus_s_writes_it_and_never_one_already_used():
    seconds = str(int(NOW.timestamp()))
    assert report.redrive_value(NOW, [None, "old"]) == seconds
    # Redriven again within the same second: the operator honours only a value new to lastRedrive.
    assert report.redrive_value(NOW, [seconds, None]) == str(int(seconds) + 1)
    assert report.redrive_value(NOW, [seconds, str(int(seconds) + 1)]) == str(int(seconds) + 2)


def test_only_dead_lettered_jobs_are_redriven_each_once_and_a_pending_redrive_is_left_alone():
    pending = dead_job("pending", annotations={"vigil.dev/redrive": "123"}, lastRedrive="100")
    honoured = dead_job("honoured", annotations={"vigil.dev/redrive": "100"}, lastRedrive="100", redrives=1)
    steps = report.plan_redrive(
        [
            ("poison", dead_job("poison")),
            ("running", sample_job(phase="Running")),
            ("missing", None),
            ("pending", pending),
            ("honoured", honoured),
            ("poison", dead_job("poison")),  # named twice: redriven once
        ],
        "ns",
        NOW,
    )
    assert [(s.name, s.value is not None) for s in steps] == [
        ("poison", True),
        ("running", False),
        ("missing", False),
        ("pending", False),
        ("honoured", True),
    ]
    by_name = {s.name: s for s in steps}
    assert by_name["running"].why == "not dead-lettered (phase Running): only a dead-lettered job can be redriven"
    assert by_name["missing"].why == "vigiljob missing not found in namespace ns"
    assert "already pending (vigil.dev/redrive=123" in by_name["pending"].why
    assert by_name["honoured"].why == "redrive 2"
    assert report.redrive_patch(by_name["poison"]) == {
        "metadata": {"annotations": {"vigil.dev/redrive": str(int(NOW.timestamp()))}, "resourceVersion": "7"}
    }


def test_past_max_the_rest_are_refused_for_a_later_run():
    steps = report.plan_redrive([(f"j{i}", dead_job(f"j{i}")) for i in range(5)], "ns", NOW, most=3)
    assert [s.value is not None for s in steps] == [True, True, True, False, False]
    assert steps[3].why == "over --max 3: not redriven this time"


def test_the_token_bucket_says_when_the_next_token_comes():
    bucket = TokenBucket(rate=5.0, burst=1)
    assert bucket.delay(10.0) == 0.0  # unused: full
    assert bucket.take(10.0)
    assert bucket.delay(10.0) == pytest.approx(0.2)
    assert bucket.delay(10.1) == pytest.approx(0.1)
    assert not bucket.take(10.1)
    assert bucket.delay(10.3) == 0.0 and bucket.take(10.3)


def test_times_handed_in_are_the_walls_of_the_objects():
    assert report.parse_time("2026-03-01T12:00:00Z") == NOW
    assert report.parse_time("2026-03-01T12:00:00.5Z") == NOW + timedelta(seconds=0.5)
