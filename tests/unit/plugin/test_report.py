"""`kubectl vigil`'s decisions (vigil.plugin.report), from sample objects as the API server sends
them: why a job waits, its beats, the dead-letter queue, the queues, and the redrive's plan."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.support.plugin import array_job, array_tasks, dead_job, failed_task, queue, sample_job
from vigil.core.ratelimit import TokenBucket
from vigil.core.tasks.ranges import IndexSet
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


# --- task arrays ------------------------------------------------------------------------------

PLAIN_STATUS_KEYS = [
    "name", "namespace", "queue", "phase", "reason", "message", "attempts", "roundAttempts", "maxAttempts",
    "redrives", "age", "waiting", "nextAttemptAt", "heartbeat", "currentAttempt", "lastCheckpoint", "recentAttempts",
]  # fmt: skip


def _written(value):
    """A value as the operator writes it: no nulls."""
    if isinstance(value, dict):
        return {k: _written(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_written(v) for v in value]
    return value


def test_the_array_fixtures_are_status_tasks_as_the_operator_writes_it():
    # Read by the API's own model and written back, field for field: a name the plugin reads
    # that the operator does not write would show as nothing, silently.
    from vigil.api import TaskStatus

    for tasks in (array_tasks(), array_tasks(failed=[failed_task(5), failed_task(7, exitCode=None)])):
        wire = TaskStatus.model_validate(tasks).model_dump(mode="json", by_alias=True, exclude_none=True)
        assert wire == _written(tasks)


def test_a_job_without_tasks_has_the_status_it_always_had():
    assert list(report.job_status(dead_job("poison"), NOW)) == PLAIN_STATUS_KEYS
    assert report.task_summary(dead_job("poison")) is None
    assert report.task_total(sample_job()) is None


def test_an_arrays_status_has_its_tasks_counted_their_ranges_the_dead_newest_first_and_the_active_in_brief():
    tasks = array_tasks(
        deadLettered=2,
        deadLetteredIndexes="5,7",
        failed=[failed_task(5, finished="2026-03-01T11:40:00Z"), failed_task(7, attempts=4, exitCode=None)],
    )
    summary = report.job_status(array_job(phase="Running", reason="TasksRunning", attempts=1034, tasks=tasks), NOW)
    assert list(summary) == [*PLAIN_STATUS_KEYS, "tasks"]
    got = summary["tasks"]
    assert {k: got[k] for k in ("total", "parallelism", "pending", "running", "backingOff", "succeeded")} == {
        "total": 1000, "parallelism": 10, "pending": 10, "running": 9, "backingOff": 1, "succeeded": 979,
    }  # fmt: skip
    assert (got["deadLettered"], got["progress"], got["succeededIndexes"], got["deadLetteredIndexes"]) == (
        2,
        "979/1000",
        "0-4,6-979",
        "5,7",
    )
    assert [(f["index"], f["attempts"], f["exitCode"]) for f in got["failed"]] == [(7, 4, None), (5, 3, 3)]
    assert len(got["active"]) == 10 and [a["index"] for a in got["active"]][:3] == [980, 981, 982]
    assert got["active"][0] == {
        "index": 980, "phase": "Running", "reason": "AttemptRunning", "attempt": 1, "pod": "batch-980-1",
        "node": "kwok-node-0", "startedAt": "2026-03-01T11:59:00Z", "nextAttemptAt": None, "lastCheckpoint": None,
        "lastOutcome": None, "lastExitCode": None,
    }  # fmt: skip
    backing_off = got["active"][6]
    assert (backing_off["index"], backing_off["phase"], backing_off["attempt"], backing_off["pod"]) == (
        986,
        "BackingOff",
        2,
        None,
    )
    assert (backing_off["nextAttemptAt"], backing_off["lastOutcome"], backing_off["lastExitCode"]) == (
        "2026-03-01T12:00:05Z",
        "Failed",
        1,
    )
    assert backing_off["startedAt"] == "2026-03-01T11:58:00Z"  # the round's start, no attempt in flight
    assert summary["currentAttempt"] is None and summary["recentAttempts"] == []  # unset for arrays


def test_an_array_the_operator_has_not_written_yet_has_every_task_pending():
    summary = report.task_summary(array_job(count=7, phase="Queued"))
    assert summary is not None
    assert (summary["total"], summary["pending"], summary["running"], summary["progress"]) == (7, 7, 0, "0/7")
    items = array_job(phase="Queued")
    items["spec"]["tasks"] = {"items": ["a.csv", {"k": 1}, 3]}
    assert report.task_total(items) == 3 and report.task_summary(items)["parallelism"] == 10  # type: ignore[index]


def test_the_dead_letter_queue_holds_dead_jobs_and_arrays_with_a_dead_task_whatever_their_phase():
    running = array_job("running", phase="Running", attempts=12, tasks=array_tasks())
    clean = array_job("clean", phase="Running", tasks=array_tasks(deadLettered=0, deadLetteredIndexes="", failed=[]))
    dead = array_job(
        "dead",
        phase="DeadLettered",
        reason="TasksDeadLettered",
        finishedAt="2026-03-01T11:30:00Z",
        labels={"vigil.dev/dead-letter": "true"},
        tasks=array_tasks(deadLettered=3, deadLetteredIndexes="5,8-9", failed=[failed_task(i) for i in (5, 8, 9)]),
    )
    assert [report.in_dead_letter_queue(j) for j in (running, clean, dead, dead_job("p"), sample_job())] == [
        True,
        False,
        True,
        True,
        False,
    ]
    rows = report.dead_letters([running, dead, dead_job("poison", finished="2026-03-01T11:59:00Z")], NOW)
    assert [(r["name"], r["since"], r["tasks"], r["deadLetteredTasks"], r["deadLetteredIndexes"]) for r in rows] == [
        ("dead", "30m", "979/1000", 3, "5,8-9"),
        ("running", "10m", "979/1000", 1, "5"),  # since its first dead task status describes
        ("poison", "60s", None, None, None),
    ]
    assert rows[1]["phase"] == "Running" and rows[1]["failedTasks"][0]["reason"] == "AttemptsExhausted"
    assert [f["index"] for f in rows[0]["failedTasks"]] == [9, 8, 5]  # newest first


def test_tasks_are_index_ranges_and_a_bad_one_says_what_was_typed():
    assert str(report.parse_tasks(" 7-9,5 ")) == "5,7-9"
    assert len(report.parse_tasks("0-99999")) == 100000
    for typed, says in [
        ("5,x", "--tasks '5,x': \"x\" is not an index or a range of indexes"),
        ("9-3", "--tasks '9-3': \"9-3\" is a range that ends before it starts"),
        ("", "--tasks '': no index given (index ranges, e.g. --tasks 5,7-9)"),
        ("-1", "--tasks '-1': \"-1\" is not an index"),
    ]:
        with pytest.raises(ValueError) as bad:
            report.parse_tasks(typed)
        assert str(bad.value).startswith(says), str(bad.value)


def dead_array(**tasks) -> dict:
    """An array of 10 tasks, DeadLettered with tasks 5 and 7-9 dead."""
    fields = {
        "total": 10, "succeeded": 6, "deadLettered": 4, "progress": "6/10", "succeededIndexes": "0-4,6",
        "deadLetteredIndexes": "5,7-9", "failed": [failed_task(i) for i in (5, 7, 8, 9)], "active": [],
        "pending": 0, "running": 0, "backingOff": 0, **tasks,
    }  # fmt: skip
    return array_job(
        "batch",
        count=10,
        phase="DeadLettered",
        reason="TasksDeadLettered",
        labels={"vigil.dev/dead-letter": "true"},
        tasks=fields,
    )


def test_a_task_redrive_writes_its_ranges_at_a_fresh_token_on_the_array_as_read():
    token = int(NOW.timestamp())
    step = report.plan_task_redrive("batch", dead_array(), "ns", IndexSet.parse("7-9,5"), NOW)
    assert (step.value, step.why, step.annotation) == (
        f"5,7-9@{token}",
        "4 dead-lettered tasks 5,7-9",
        "vigil.dev/redrive-tasks",
    )
    assert report.redrive_patch(step) == {
        "metadata": {"annotations": {"vigil.dev/redrive-tasks": f"5,7-9@{token}"}, "resourceVersion": "7"}
    }
    # a token the array used last (a redrive within the same second) is not used again
    honoured = dead_array(lastRedrive=f"5@{token}")
    honoured["metadata"]["annotations"]["vigil.dev/redrive-tasks"] = f"5@{token}"
    assert report.plan_task_redrive("batch", honoured, "ns", IndexSet.parse("8"), NOW).value == f"8@{token + 1}"
    # any phase: an array running on past a dead task redrives it
    running = array_job("batch", phase="Running", tasks=array_tasks())
    assert report.plan_task_redrive("batch", running, "ns", IndexSet.parse("5"), NOW).value == f"5@{token}"


@pytest.mark.parametrize(
    ("job", "tasks", "why"),
    [
        (None, "5", "vigiljob batch not found in namespace ns"),
        (dead_job("batch"), "5", "not a task array (no spec.tasks): redrive it without --tasks"),
        ("dead", "5,9-12,40", "4 indexes 10-12,40 out of range: the array has 10 tasks (0-9)"),
        ("dead", "5-7", "1 task 6 not dead-lettered (of those asked, these are: 5,7)"),
        ("dead", "0-4", "5 tasks 0-4 not dead-lettered (the array's dead-lettered tasks: 5,7-9)"),
        ("clean", "0", "1 task 0 not dead-lettered (the array's dead-lettered tasks: none)"),
        ("pending", "5", "a task redrive is already pending (vigil.dev/redrive-tasks=8@100, not yet honoured"),
    ],
)
def test_a_task_redrive_is_refused_saying_which_indexes_and_why(job, tasks, why):
    arrays = {
        "dead": dead_array(),
        "clean": dead_array(deadLettered=0, deadLetteredIndexes="", failed=[], succeeded=10),
        "pending": dead_array(lastRedrive="5@90"),
    }
    arrays["pending"]["metadata"]["annotations"]["vigil.dev/redrive-tasks"] = "8@100"
    job = arrays[job] if isinstance(job, str) else job
    step = report.plan_task_redrive("batch", job, "ns", IndexSet.parse(tasks), NOW)
    assert step.value is None
    assert step.why.startswith(why), step.why


def test_a_whole_redrive_of_an_array_is_every_dead_task_and_a_running_one_is_pointed_to_tasks():
    running = array_job("running", phase="Running", tasks=array_tasks(deadLetteredIndexes="5,7"))
    steps = report.plan_redrive([("batch", dead_array()), ("running", running)], "ns", NOW)
    assert steps[0].why == "redrive 1, every dead-lettered task (5,7-9)" and steps[0].annotation == "vigil.dev/redrive"
    assert steps[1].value is None
    assert steps[1].why == (
        "not dead-lettered (phase Running): only a dead-lettered job can be redriven; "
        "its dead-lettered tasks can, by index: --tasks 5,7"
    )
    assert report.plan_redrive([("j", sample_job(phase="Running"))], "ns", NOW)[0].why.endswith("can be redriven")
