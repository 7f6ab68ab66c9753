"""`kubectl vigil`'s output (vigil.plugin.render): tables as kubectl prints them, and the same
rows whole in JSON and YAML."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
import yaml

from tests.support.plugin import active_task, array_job, array_tasks, dead_job, failed_task, queue, sample_job
from vigil.plugin import render, report

pytestmark = pytest.mark.unit

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def test_a_table_is_aligned_columns_with_a_dash_for_nothing():
    rows = [{"a": "x", "b": None}, {"a": "longer", "b": True}]
    assert render.table(rows, [("A", "a"), ("B", "b")]).splitlines() == [
        "A        B",
        "x        -",
        "longer   true",
    ]
    assert render.table([], [("NAME", "name")]) == "NAME"


def test_the_dead_letter_queue_as_a_table_json_and_yaml():
    rows = report.dead_letters([dead_job("poison", finished="2026-03-01T11:59:00Z")], NOW)
    assert render.listing(rows, render.DLQ_COLUMNS, "table").splitlines() == [
        "NAME     QUEUE     ATTEMPTS   REDRIVES   REASON                 DEAD-LETTERED   DEAD-TASKS   DEAD-INDEXES",
        "poison   default   1          0          NonRetryableExitCode   60s             -            -",
    ]
    assert render.listing(rows, render.DLQ_COLUMNS, "table", namespaces=True).startswith("NAMESPACE   NAME")
    as_json = json.loads(render.listing(rows, render.DLQ_COLUMNS, "json"))
    assert as_json["items"][0]["deadLetteredAt"] == "2026-03-01T11:59:00Z"
    assert yaml.safe_load(render.listing(rows, render.DLQ_COLUMNS, "yaml")) == as_json


def test_top_shows_the_oldest_wait_as_an_age_in_a_table_and_in_seconds_for_scripts():
    rows = report.queue_rows(
        [queue("nightly", spec={"maxRunning": 1, "paused": True}, status={"queued": 2, "oldestQueuedSeconds": 150})]
    )
    lines = render.top(rows, "table").splitlines()
    assert lines[0].split() == [
        "QUEUE", "PAUSED", "QUEUED", "RUNNING", "MAX-RUNNING", "BACKING-OFF", "DEAD-LETTERED", "OLDEST-WAIT",
        "RETRY-BUDGET", "SATURATED",
    ]  # fmt: skip
    assert lines[1].split() == ["nightly", "true", "2", "-", "1", "-", "-", "2m", "0.2", "ok", "-"]
    assert json.loads(render.top(rows, "json"))["items"][0]["oldestWaitSeconds"] == 150


def test_a_job_described_says_why_it_waits_its_beats_and_its_attempts():
    job = sample_job(
        "flaky",
        phase="BackingOff",
        reason="AttemptFailed",
        message="attempt 1 exited 1; attempt 2 starts in 9.5s",
        attempts=1,
        roundAttempts=1,
        nextAttemptAt="2026-03-01T12:00:10Z",
        lastCheckpoint='{"offset": 42}',
        history=[
            {
                "number": 1,
                "podName": "flaky-1",
                "outcome": "Failed",
                "reason": "ExitCode",
                "exitCode": 1,
                "nodeName": "kwok-node-0",
                "startedAt": "2026-03-01T11:59:00Z",
                "finishedAt": "2026-03-01T11:59:50Z",
            }
        ],
        conditions=[{"type": "HeartbeatHealthy", "status": "True", "reason": "Beating", "message": "ok"}],
    )
    text = render.job_status(report.job_status(job, NOW), NOW, "table")
    assert text.splitlines()[:6] == [
        "VigilJob ns/flaky (queue default, age 60m)",
        "Phase:        BackingOff (AttemptFailed)",
        "Message:      attempt 1 exited 1; attempt 2 starts in 9.5s",
        "Attempts:     1 (1 of 6 this round), redrives 0",
        "Next attempt: 2026-03-01T12:00:10Z",
        "Waiting:",
    ]
    assert "  AttemptFailed (phase): attempt 1 exited 1; attempt 2 starts in 9.5s" in text
    assert "Heartbeat:    healthy True (Beating)" in text
    assert 'Checkpoint:   {"offset": 42}' in text
    assert "  1   flaky-1   Failed    ExitCode   1      kwok-node-0   10s" in text
    assert json.loads(render.job_status(report.job_status(job, NOW), NOW, "json"))["nextAttemptAt"]


def test_a_running_attempt_with_its_beats():
    job = sample_job(
        "long",
        phase="Running",
        attempts=2,
        currentAttempt={
            "number": 2,
            "podName": "long-2",
            "phase": "Running",
            "startedAt": "2026-03-01T11:50:00Z",
            "lastHeartbeatAt": "2026-03-01T11:58:00Z",
            "nodeName": "kwok-node-1",
        },
        conditions=[{"type": "HeartbeatHealthy", "status": "True", "reason": "Beating", "message": "ok"}],
    )
    pod = {"metadata": {"annotations": {"vigil.dev/heartbeat": "40:00ff00ff"}}}
    text = render.job_status(report.job_status(job, NOW, pod), NOW, "table")
    assert "Attempt 2:    pod long-2, Running, node kwok-node-1, started 10m ago" in text
    assert "Heartbeat:    healthy True (Beating), 40 beats sent by the agent, last recorded in status 2m ago" in text
    unbeating = sample_job("quiet", phase="Queued")
    unbeating["spec"]["heartbeat"]["required"] = False
    assert "Heartbeat:    not required" in render.job_status(report.job_status(unbeating, NOW), NOW, "table")


def test_a_redrive_reports_what_was_redriven_and_what_was_refused():
    steps = report.plan_redrive(
        [("a", dead_job("a")), ("b", dead_job("b")), ("c", sample_job("c", phase="Running"))], "ns", NOW
    )
    value = str(int(NOW.timestamp()))
    done = {"a": "", "b": "the job was deleted since it was read"}
    assert render.redrive(steps, done, "table", dry_run=False).splitlines() == [
        "NAME   RESULT     DETAIL",
        f"a      redriven   redrive 1, value {value}",
        "b      refused    the job was deleted since it was read",
        "c      refused    not dead-lettered (phase Running): only a dead-lettered job can be redriven",
    ]
    assert render.redrive(steps, done, "name", dry_run=False) == "vigiljob.vigil.dev/a"  # the one written
    dry = json.loads(render.redrive(steps, {}, "json", dry_run=True))["items"]
    assert [row["result"] for row in dry] == ["would redrive", "would redrive", "refused"]
    assert dry[0]["namespace"] == "ns"


def dlq_rows() -> list[dict]:
    return report.dead_letters(
        [dead_job("poison", finished="2026-03-01T11:59:00Z"), dead_job("gone", finished="2026-03-01T11:00:00Z")], NOW
    )


def test_wide_adds_columns_name_prints_kubectls_resource_names_and_no_headers_drops_the_header():
    rows = dlq_rows()
    wide = render.listing(rows, render.DLQ_COLUMNS, "wide", wide=render.DLQ_WIDE).splitlines()
    assert wide[0].split()[-2:] == ["DEAD-LETTERED-AT", "MESSAGE"]
    assert wide[1].split()[:2] == ["gone", "default"] and wide[1].endswith("dead-lettered: attempt 1 exited 7")
    assert render.listing(rows, render.DLQ_COLUMNS, "name") == "vigiljob.vigil.dev/gone\nvigiljob.vigil.dev/poison"
    quiet = render.listing(rows, render.DLQ_COLUMNS, render.parse_output("table", no_headers=True))
    assert [line.split()[0] for line in quiet.splitlines()] == ["gone", "poison"]
    queues = report.queue_rows([queue("nightly", status={"headOfLine": ["a", "b"]})])
    assert render.top(queues, "name") == "vigilqueue.vigil.dev/nightly"
    assert render.top(queues, "wide").splitlines()[1].split()[-1] == "a,b"


def test_jsonpath_and_custom_columns_read_what_json_prints_with_kubectls_metadata_name():
    rows = dlq_rows()
    assert json.loads(render.listing(rows, render.DLQ_COLUMNS, "json"))["items"][0]["metadata"] == {
        "name": "gone",
        "namespace": "ns",
    }
    template = render.parse_output('jsonpath={range .items[*]}{.metadata.name}{"\\t"}{.reason}{"\\n"}{end}')
    assert (
        render.listing(rows, render.DLQ_COLUMNS, template)
        == "gone\tNonRetryableExitCode\npoison\tNonRetryableExitCode\n"
    )
    assert render.listing(rows, render.DLQ_COLUMNS, "jsonpath={.items[*].name}") == "gone poison"
    columns = render.parse_output("custom-columns=NAME:.metadata.name,SINCE:{.deadLetteredAt},NOPE:nothing.here")
    assert render.listing(rows, render.DLQ_COLUMNS, columns).splitlines() == [
        "NAME     SINCE                  NOPE",
        "gone     2026-03-01T11:00:00Z   <none>",
        "poison   2026-03-01T11:59:00Z   <none>",
    ]
    summary = report.job_status(dead_job("poison"), NOW)
    assert render.job_status(summary, NOW, "jsonpath={.metadata.name} {.phase}") == "poison DeadLettered"
    assert render.job_status(summary, NOW, "name") == "vigiljob.vigil.dev/poison"


def test_status_wide_adds_when_each_attempt_started_and_how_long_it_ran():
    history = [{"number": 1, "podName": "j-1", "outcome": "Failed", "startedAt": "2026-03-01T11:58:00Z"}]
    history[0]["finishedAt"] = "2026-03-01T11:59:30Z"
    summary = report.job_status(sample_job("j", phase="BackingOff", history=history), NOW)
    assert "STARTED" not in render.job_status(summary, NOW, "table")
    wide = render.job_status(summary, NOW, "wide").splitlines()
    assert wide[-2].split()[-2:] == ["STARTED", "RAN"]
    assert wide[-1].split()[-2:] == ["2026-03-01T11:58:00Z", "90s"]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("xml", 'unable to match a printer suitable for the output format "xml", allowed formats are: table, wide'),
        ("jsonpath", "template format specified but no template given"),
        ("jsonpath=", "template format specified but no template given"),
        ("jsonpath={.items[", "error parsing jsonpath {.items[: unclosed action"),
        ("custom-columns=NAME", "expected <header>:<json-path-expr>"),
        ("custom-columns=", "no custom columns given"),
        ("wide=x", "unable to match a printer"),
    ],
)
def test_an_output_it_cannot_print_is_refused_saying_what_it_can(value, says):
    with pytest.raises(render.BadOutput) as refused:
        render.parse_output(value)
    assert says in str(refused.value)


# --- task arrays ------------------------------------------------------------------------------


def test_a_job_without_tasks_is_described_as_it_always_was():
    summary = report.job_status(dead_job("poison", finished="2026-03-01T11:59:00Z"), NOW)
    assert render.job_status(summary, NOW, "table").splitlines() == [
        "VigilJob ns/poison (queue default, age 60m)",
        "Phase:        DeadLettered (NonRetryableExitCode)",
        "Message:      dead-lettered: attempt 1 exited 7",
        "Attempts:     1 (0 of 6 this round), redrives 0",
        "Heartbeat:    healthy no beat seen yet",
        "Checkpoint:   -",
    ]
    assert "tasks" not in json.loads(render.job_status(summary, NOW, "json"))


def running_array(**tasks) -> dict:
    return array_job(
        phase="Running",
        reason="TasksRunning",
        message="979 of 1000 tasks succeeded",
        attempts=1034,
        tasks=array_tasks(**tasks),
        conditions=[{"type": "HeartbeatHealthy", "status": "True", "reason": "Beating", "message": "ok"}],
    )


def test_an_array_is_described_with_its_tasks_ranges_active_tasks_and_dead_ones():
    text = render.job_status(report.job_status(running_array(), NOW), NOW, "table")
    assert text.splitlines() == [
        "VigilJob ns/batch (queue default, age 60m)",
        "Phase:        Running (TasksRunning)",
        "Message:      979 of 1000 tasks succeeded",
        "Attempts:     1034 across the tasks (each task at most 3 a round), redrives 0",
        "Tasks:        1000: 979 succeeded, 9 running, 1 backing off, 10 pending, 1 dead-lettered (parallelism 10)",
        "  Succeeded:      0-4,6-979",
        "  Dead-lettered:  5",
        "Heartbeat:    required of each task's attempts, healthy True (Beating)",
        "Active tasks (10):",
        "  INDEX   PHASE        ATTEMPT   POD           STARTED",
        "  980     Running      1         batch-980-1   60s",
        "  981     Running      1         batch-981-1   60s",
        "  982     Running      1         batch-982-1   60s",
        "  983     Running      1         batch-983-1   60s",
        "  984     Running      1         batch-984-1   60s",
        "  985     Running      1         batch-985-1   60s",
        "  986     BackingOff   2         -             2m",
        "  987     Running      1         batch-987-1   60s",
        "  988     Running      1         batch-988-1   60s",
        "  989     Running      1         batch-989-1   60s",
        "Dead-lettered tasks (newest first):",
        "  INDEX   ATTEMPTS   OUTCOME   REASON              EXIT   ENDED",
        "  5       3          Failed    AttemptsExhausted   3      10m",
    ]


def test_many_active_and_dead_tasks_are_bounded_in_a_table_and_clipped_ranges_say_how_many():
    scattered = ",".join(str(i) for i in range(100, 150, 2))  # 25 dead tasks, 20 described
    summary = report.job_status(
        running_array(
            active=[active_task(i) for i in range(980, 1003)],
            deadLettered=25,
            deadLetteredIndexes=scattered,
            priorAttempts=[{"attempts": 3, "indexes": "100-138"}, {"attempts": 6, "indexes": "140-148"}],
            failed=[failed_task(i) for i in range(110, 150, 2)],
            maxDeadLetteredTasks=None,
        ),
        NOW,
    )
    lines = render.job_status(summary, NOW, "table").splitlines()
    assert "  Dead-lettered:  100,102,104,106,108,110,112,114,116,118,...(25 in all)" in lines
    assert lines.count("  ... and 13 more (-o json lists them all)") == 1  # 23 active, 10 shown
    assert lines[-1] == "  ... and 15 more, in the ranges above (-o wide describes the newest 20)"
    assert lines[-2].split()[0] == "130"  # the 10 newest dead, newest first
    wide = render.job_status(summary, NOW, "wide").splitlines()
    assert f"  Dead-lettered:  {scattered}" in wide
    assert "  Attempts used:  100-138: 3; 140-148: 6" in wide
    assert wide[-1] == "  ... and 5 more, in the ranges above"
    assert wide[-22].split()[-2:] == ["FINISHED-AT", "MESSAGE"] and wide[-21].endswith("task 148: attempt 3 exited 3")
    assert "  ... and 13 more (-o json lists them all)" in wide
    assert len(json.loads(render.job_status(summary, NOW, "json"))["tasks"]["active"]) == 23


def test_wide_adds_each_active_tasks_reason_node_last_attempt_and_next_attempt():
    wide = render.job_status(report.job_status(running_array(), NOW), NOW, "wide").splitlines()
    header = wide.index("Active tasks (10):") + 1
    assert wide[header].split() == [
        "INDEX", "PHASE", "ATTEMPT", "POD", "STARTED", "REASON", "NODE", "LAST", "NEXT-ATTEMPT", "CHECKPOINT"
    ]  # fmt: skip
    assert wide[header + 7].split() == [
        "986", "BackingOff", "2", "-", "2m", "AttemptFailed", "-", "Failed", "(1)", "2026-03-01T12:00:05Z", "-"
    ]  # fmt: skip


def test_an_array_not_yet_written_and_one_with_a_dead_task_limit():
    fresh = array_job(count=7, phase="Queued", reason="QueueSaturated", message="queue default is full")
    fresh["spec"]["tasks"]["maxDeadLetteredTasks"] = 2
    fresh["spec"]["heartbeat"]["required"] = False
    lines = render.job_status(report.job_status(fresh, NOW), NOW, "table").splitlines()
    assert lines[3:] == [
        "Attempts:     0 across the tasks (each task at most 3 a round), redrives 0",
        "Tasks:        7: 0 succeeded, 0 running, 0 backing off, 7 pending, 0 dead-lettered "
        "(parallelism 10, at most 2 dead-lettered)",
        "Waiting:",
        "  QueueSaturated (phase): queue default is full",
        "Heartbeat:    not required (liveness is each task's pod's phase)",
    ]


def test_clipped_ranges_end_at_a_comma():
    assert render.clip_ranges("0-4,6-979") == "0-4,6-979"
    assert render.clip_ranges(None) is None
    assert render.clip_ranges("1-5,10-12,20-25,30,40,50,60,70,80,90,100,110", 20) == "1-5,10-12,20-25,30,...(23 in all)"


def test_the_dead_letter_queue_lists_an_array_with_its_dead_tasks_in_every_output():
    dead = array_job(
        "nightly",
        phase="DeadLettered",
        reason="TasksDeadLettered",
        message="2 of 1000 tasks dead-lettered",
        finishedAt="2026-03-01T11:00:00Z",
        attempts=1010,
        tasks=array_tasks(
            succeeded=998,
            progress="998/1000",
            deadLettered=2,
            deadLetteredIndexes="5,7",
            failed=[failed_task(5), failed_task(7)],
        ),
    )
    rows = report.dead_letters([running_array(), dead, dead_job("poison", finished="2026-03-01T11:59:00Z")], NOW)
    assert render.dead_letters(rows, "table").splitlines() == [
        "NAME      QUEUE     ATTEMPTS   REDRIVES   REASON                 DEAD-LETTERED   DEAD-TASKS   DEAD-INDEXES",
        "nightly   default   1010       0          TasksDeadLettered      60m             2            5,7",
        "batch     default   1034       0          TasksRunning           10m             1            5",
        "poison    default   1          0          NonRetryableExitCode   60s             -            -",
    ]
    wide = render.dead_letters(rows, "wide").splitlines()
    assert wide[0].split()[-4:] == ["TASKS", "PHASE", "DEAD-LETTERED-AT", "MESSAGE"]
    assert wide[2].split()[8:11] == ["979/1000", "Running", "2026-03-01T11:50:00Z"]
    assert wide[3].split()[6:10] == ["-", "-", "-", "DeadLettered"]
    assert render.dead_letters(rows, "name").splitlines() == [
        "vigiljob.vigil.dev/nightly",
        "vigiljob.vigil.dev/batch",
        "vigiljob.vigil.dev/poison",
    ]
    items = json.loads(render.dead_letters(rows, "json"))["items"]
    assert [(i["deadLetteredTasks"], i["deadLetteredIndexes"], i["tasks"]) for i in items] == [
        (2, "5,7", "998/1000"),
        (1, "5", "979/1000"),
        (None, None, None),
    ]
    assert [f["index"] for f in items[0]["failedTasks"]] == [7, 5] and items[2]["failedTasks"] is None
    assert yaml.safe_load(render.dead_letters(rows, "yaml"))["items"] == items
    template = render.parse_output("jsonpath={range .items[*]}{.metadata.name}={.deadLetteredIndexes};{end}")
    assert render.dead_letters(rows, template) == "nightly=5,7;batch=5;poison=;"


def test_a_task_redrive_reports_its_ranges_and_value():
    job = running_array()
    step = report.plan_task_redrive("batch", job, "ns", report.parse_tasks("5"), NOW)
    value = f"5@{int(NOW.timestamp())}"
    assert render.redrive([step], {"batch": ""}, "table", dry_run=False).splitlines() == [
        "NAME    RESULT     DETAIL",
        f"batch   redriven   1 dead-lettered task 5, value {value}",
    ]
    refused = report.plan_task_redrive("batch", job, "ns", report.parse_tasks("4-5"), NOW)
    assert render.redrive([refused], {}, "table", dry_run=False).splitlines()[1].split(None, 2) == [
        "batch",
        "refused",
        "1 task 4 not dead-lettered (of those asked, these are: 5)",
    ]
