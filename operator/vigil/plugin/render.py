"""`kubectl vigil`'s output: `-o table` (columns as kubectl prints them, and a described job),
`-o json` and `-o yaml` (the same rows, whole, for scripts). Pure: strings from `report`'s rows."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import yaml

from vigil.plugin import report

FORMATS = ("table", "json", "yaml")
Column = tuple[str, str]  # (header, key of the row)

DLQ_COLUMNS: list[Column] = [
    ("NAME", "name"),
    ("QUEUE", "queue"),
    ("ATTEMPTS", "attempts"),
    ("REDRIVES", "redrives"),
    ("REASON", "reason"),
    ("DEAD-LETTERED", "since"),
]
TOP_COLUMNS: list[Column] = [
    ("QUEUE", "name"),
    ("PAUSED", "paused"),
    ("QUEUED", "queued"),
    ("RUNNING", "running"),
    ("MAX-RUNNING", "maxRunning"),
    ("BACKING-OFF", "backingOff"),
    ("DEAD-LETTERED", "deadLettered"),
    ("OLDEST-WAIT", "oldestWait"),
    ("RETRY-BUDGET", "retryBudget"),
    ("SATURATED", "saturated"),
]
REDRIVE_COLUMNS: list[Column] = [("NAME", "name"), ("RESULT", "result"), ("DETAIL", "detail")]
NAMESPACE_COLUMN: Column = ("NAMESPACE", "namespace")


def cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column]) -> str:
    """Left-aligned columns three spaces apart, as `kubectl get` prints them; the headers alone
    when there are no rows."""
    cells = [[header for header, _ in columns]] + [[cell(row.get(key)) for _, key in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("   ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in cells)


def dump(data: Any, fmt: str) -> str:
    """JSON or YAML of the rows, keys in the order `report` gives them."""
    if fmt == "json":
        return json.dumps(data, indent=2)
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip("\n")


def listing(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column], fmt: str, namespaces: bool = False) -> str:
    """A command's rows in `fmt`; in a table, with a NAMESPACE column for -A."""
    if fmt != "table":
        return dump({"items": list(rows)}, fmt)
    return table(rows, [NAMESPACE_COLUMN, *columns] if namespaces else columns)


def top(rows: Sequence[Mapping[str, Any]], fmt: str, namespaces: bool = False) -> str:
    if fmt == "table":
        rows = [{**row, "oldestWait": report.duration(row["oldestWaitSeconds"])} for row in rows]
    return listing(rows, TOP_COLUMNS, fmt, namespaces)


def job_status(summary: Mapping[str, Any], now: datetime, fmt: str) -> str:
    """`kubectl vigil status JOB`: in a table, described as `kubectl describe` would."""
    if fmt != "table":
        return dump(summary, fmt)
    lines = [
        f"VigilJob {summary['namespace']}/{summary['name']} (queue {summary['queue']}, age {summary['age']})",
        f"Phase:        {summary['phase']}" + (f" ({summary['reason']})" if summary["reason"] else ""),
    ]
    if summary["message"]:
        lines.append(f"Message:      {summary['message']}")
    rounds = f"{summary['roundAttempts']} of {cell(summary['maxAttempts'])} this round"
    lines.append(f"Attempts:     {summary['attempts']} ({rounds}), redrives {summary['redrives']}")
    if summary["nextAttemptAt"]:
        lines.append(f"Next attempt: {summary['nextAttemptAt']}")
    if summary["waiting"]:
        lines.append("Waiting:")
        lines += [f"  {w['reason']} ({w['source']}): {w['message']}" for w in summary["waiting"]]
    beat = summary["heartbeat"]
    current = summary["currentAttempt"]
    if current:
        lines.append(
            f"Attempt {current['number']}:    pod {current['pod']}, {current['phase']}, "
            f"node {cell(current['node'])}, started {report.ago(current['startedAt'], now)} ago"
        )
    if not beat["required"]:
        lines.append("Heartbeat:    not required (liveness is the pod's phase)")
    else:
        health = f"{beat['healthy']} ({beat['reason']})" if beat["healthy"] else "no beat seen yet"
        parts = [f"healthy {health}"]
        if current and current["beatsSent"] is not None:
            parts.append(f"{current['beatsSent']} beats sent by the agent")
        if current and current["lastHeartbeatAt"]:
            parts.append(f"last recorded in status {report.ago(current['lastHeartbeatAt'], now)} ago")
        lines.append("Heartbeat:    " + ", ".join(parts))
    lines.append(f"Checkpoint:   {summary['lastCheckpoint'] or '-'}")
    if summary["recentAttempts"]:
        lines.append("Recent attempts:")
        rows = [
            {**item, "exit": item["exitCode"], "ended": report.ago(item["finishedAt"], now)}
            for item in summary["recentAttempts"]
        ]
        columns = [("#", "number"), ("POD", "pod"), ("OUTCOME", "outcome"), ("REASON", "reason")]
        columns += [("EXIT", "exit"), ("NODE", "node"), ("ENDED", "ended")]
        lines += ["  " + line for line in table(rows, columns).splitlines()]
    return "\n".join(lines)


def redrive(steps: Sequence[report.RedriveStep], done: Mapping[str, str], fmt: str, dry_run: bool) -> str:
    """What was redriven and what was refused. `done`: per job name, "" once its annotation was
    written, else why the write failed (a job not in it was not reached)."""
    rows = []
    for step in steps:
        if step.value is None:
            rows.append({"name": step.name, "result": "refused", "detail": step.why})
        elif dry_run:
            rows.append({"name": step.name, "result": "would redrive", "detail": f"{step.why}, value {step.value}"})
        elif done.get(step.name) == "":
            rows.append({"name": step.name, "result": "redriven", "detail": f"{step.why}, value {step.value}"})
        else:
            rows.append({"name": step.name, "result": "refused", "detail": done.get(step.name, "not reached")})
    for row, step in zip(rows, steps, strict=True):
        row["namespace"] = step.namespace
    return listing(rows, REDRIVE_COLUMNS, fmt)
