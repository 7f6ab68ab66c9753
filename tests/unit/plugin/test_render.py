"""`kubectl vigil`'s output (vigil.plugin.render): tables as kubectl prints them, and the same
rows whole in JSON and YAML."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
import yaml

from tests.support.plugin import dead_job, queue, sample_job
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
        "NAME     QUEUE     ATTEMPTS   REDRIVES   REASON                 DEAD-LETTERED",
        "poison   default   1          0          NonRetryableExitCode   60s",
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
