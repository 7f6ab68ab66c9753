"""`kubectl vigil`'s output, as `kubectl get -o` prints: `table` (the default; columns as kubectl
prints them, and a described job), `wide` (more columns), `name` (`vigiljob.vigil.dev/NAME`),
`json` and `yaml` (the same rows, whole, for scripts), `jsonpath=TEMPLATE` and
`custom-columns=HEADER:PATH,...` (kubectl's JSONPath, over the document `-o json` prints).
Pure: strings from `report`'s rows.

Each item of a document carries `metadata: {name, namespace}` beside its flat `name` and
`namespace`, so that what kubectl users type (`{.items[*].metadata.name}`,
`NAME:.metadata.name`) reads the rows as it reads objects.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import yaml

from vigil.api.names import GROUP
from vigil.core.tasks.ranges import IndexSet
from vigil.plugin import jsonpath, report

# What -o takes, as kubectl's error lists them.
FORMATS = ("table", "wide", "name", "json", "yaml", "jsonpath=TEMPLATE", "custom-columns=SPEC")
JOB_RESOURCE = f"vigiljob.{GROUP}"  # as `kubectl get -o name` prints a VigilJob
QUEUE_RESOURCE = f"vigilqueue.{GROUP}"
POOL_RESOURCE = f"vigilworkerpool.{GROUP}"
Column = tuple[str, str]  # (header, key of the row)


class BadOutput(ValueError):
    """An -o value kubectl vigil cannot print; the message says what it can."""


@dataclass(frozen=True)
class Output:
    """How to print: `kind` one of table, wide, name, json, yaml, jsonpath, custom-columns;
    `template` the parsed JSONPath template, or the custom columns as (header, parsed path)."""

    kind: str = "table"
    template: Any = None
    no_headers: bool = False

    @property
    def tabular(self) -> bool:
        return self.kind in ("table", "wide")


def parse_output(value: str, no_headers: bool = False) -> Output:
    """`-o VALUE` checked before anything is asked, with kubectl's words when it is not one."""
    kind, sep, template = value.partition("=")
    if kind in ("table", "wide", "name", "json", "yaml") and not sep:
        return Output(kind, None, no_headers)
    if kind == "jsonpath":
        if not template:
            raise BadOutput("template format specified but no template given: -o jsonpath='{.items[*].name}'")
        try:
            return Output(kind, jsonpath.parse(template), no_headers)
        except jsonpath.JsonPathError as err:
            raise BadOutput(str(err)) from None
    if kind == "custom-columns":
        return Output(kind, custom_columns(template), no_headers)
    raise BadOutput(
        f'unable to match a printer suitable for the output format "{value}", allowed formats are: '
        + ", ".join(FORMATS)
    )


def custom_columns(spec: str) -> list[tuple[str, tuple[jsonpath.Node, ...]]]:
    """kubectl's `HEADER:PATH,...`, each path as `.a.b`, `a.b` or `{.a.b}`."""
    if not spec:
        raise BadOutput("custom-columns format specified but no custom columns given: -o custom-columns=NAME:.name")
    columns = []
    for part in spec.split(","):
        header, sep, path = part.partition(":")
        if not sep or not header or not path:
            raise BadOutput(f"unexpected custom-columns spec: {part}, expected <header>:<json-path-expr>")
        relaxed = path if path.startswith("{") else "{" + (path if path[0] in ".[$@" else "." + path) + "}"
        try:
            columns.append((header, jsonpath.parse(relaxed)))
        except jsonpath.JsonPathError as err:
            raise BadOutput(str(err)) from None
    return columns


def as_output(fmt: Output | str) -> Output:
    return fmt if isinstance(fmt, Output) else parse_output(fmt)


# An array's row: how many of its tasks are dead-lettered and which (a plain job's are empty);
# -o wide adds its progress (succeeded/total) and its phase (it may be running still).
DLQ_COLUMNS: list[Column] = [
    ("NAME", "name"),
    ("QUEUE", "queue"),
    ("ATTEMPTS", "attempts"),
    ("REDRIVES", "redrives"),
    ("REASON", "reason"),
    ("DEAD-LETTERED", "since"),
    ("DEAD-TASKS", "deadLetteredTasks"),
    ("DEAD-INDEXES", "deadLetteredIndexes"),
]
DLQ_WIDE: list[Column] = [
    *DLQ_COLUMNS,
    ("TASKS", "tasks"),
    ("PHASE", "phase"),
    ("DEAD-LETTERED-AT", "deadLetteredAt"),
    ("MESSAGE", "message"),
]
RANGES_SHOWN = 40  # characters of index ranges in a table (-o wide and the documents: all of them)
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
TOP_WIDE: list[Column] = [*TOP_COLUMNS, ("HEAD-OF-LINE", "headOfLine")]
# `top`'s second table, the worker pools: WORKERS ready/desired, MAX maxReplicas, SLOTS used/total,
# BACKLOG tasks waiting for a worker, CONDITIONS those in trouble (not Ready, AtMaximum).
POOL_COLUMNS: list[Column] = [
    ("POOL", "name"),
    ("WORKERS", "workers"),
    ("MAX", "maxReplicas"),
    ("SLOTS", "slotsShown"),
    ("BACKLOG", "backlog"),
    ("CONDITIONS", "trouble"),
]
POOL_WIDE: list[Column] = [
    *POOL_COLUMNS,
    ("REPLICAS", "replicas"),
    ("MIN", "minReplicas"),
    ("SLOTS-PER-WORKER", "slotsPerWorker"),
    ("SCALED-BY", "scaledBy"),
    ("MESSAGE", "messages"),
]
REDRIVE_COLUMNS: list[Column] = [("NAME", "name"), ("RESULT", "result"), ("DETAIL", "detail")]
NAMESPACE_COLUMN: Column = ("NAMESPACE", "namespace")


def cell(value: Any) -> str:
    if value is None or value == "" or value == []:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(cell(item) for item in value)
    return str(value)


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column], headers: bool = True) -> str:
    """Left-aligned columns three spaces apart, as `kubectl get` prints them; the headers alone
    when there are no rows (nothing at all without headers)."""
    cells = [[header for header, _ in columns]] + [[cell(row.get(key)) for _, key in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["   ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in cells]
    return "\n".join(lines if headers else lines[1:])


def dump(data: Any, fmt: Output | str) -> str:
    """JSON or YAML of the rows, keys in the order `report` gives them; or what the JSONPath
    template or custom columns make of that same document."""
    out = as_output(fmt)
    if out.kind == "json":
        return json.dumps(data, indent=2)
    if out.kind == "jsonpath":
        return jsonpath.execute(out.template, data)
    if out.kind == "custom-columns":
        items = data["items"] if isinstance(data, dict) and isinstance(data.get("items"), list) else [data]
        rows = [{header: jsonpath.execute(path, item) or "<none>" for header, path in out.template} for item in items]
        return table(rows, [(header, header) for header, _ in out.template], headers=not out.no_headers)
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip("\n")


def with_metadata(row: Mapping[str, Any]) -> dict[str, Any]:
    """The row as a document's item: its name and namespace also as metadata, as an object's."""
    return {**row, "metadata": {"name": row.get("name"), "namespace": row.get("namespace")}}


def names(rows: Sequence[Mapping[str, Any]], resource: str) -> str:
    """`-o name`: one `RESOURCE/NAME` a line, as `kubectl get -o name` prints (no namespace)."""
    return "\n".join(f"{resource}/{row['name']}" for row in rows)


def listing(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[Column],
    fmt: Output | str,
    namespaces: bool = False,
    *,
    wide: Sequence[Column] | None = None,
    resource: str = JOB_RESOURCE,
) -> str:
    """A command's rows in `fmt`; in a table, with a NAMESPACE column for -A; `wide`: the
    columns of -o wide (default: the table's)."""
    out = as_output(fmt)
    if out.kind == "name":
        return names(rows, resource)
    if not out.tabular:
        return dump({"items": [with_metadata(row) for row in rows]}, out)
    shown = list(wide if out.kind == "wide" and wide is not None else columns)
    return table(rows, [NAMESPACE_COLUMN, *shown] if namespaces else shown, headers=not out.no_headers)


def clip_ranges(ranges: str | None, width: int = RANGES_SHOWN) -> str | None:
    """Index ranges cut to about `width` characters at a comma, saying how many indexes there
    are in all ("0,2,4,...(500 in all)"): a table's line stays readable however scattered."""
    if not ranges or len(ranges) <= width:
        return ranges
    head = ranges[:width].rpartition(",")[0] or ranges[:width]
    return f"{head},...({len(IndexSet.parse(ranges))} in all)"


def dead_letters(rows: Sequence[Mapping[str, Any]], fmt: Output | str, namespaces: bool = False) -> str:
    """`kubectl vigil dlq`: in a table an array's index ranges clipped (-o wide: whole)."""
    out = as_output(fmt)
    if out.kind == "table":
        rows = [{**row, "deadLetteredIndexes": clip_ranges(row.get("deadLetteredIndexes"))} for row in rows]
    return listing(rows, DLQ_COLUMNS, out, namespaces, wide=DLQ_WIDE)


def top(
    rows: Sequence[Mapping[str, Any]],
    fmt: Output | str,
    namespaces: bool = False,
    pools: Sequence[Mapping[str, Any]] | None = None,
    pools_unread: str | None = None,
) -> str:
    """`kubectl vigil top`: the queues, then the worker pools (`report.pool_rows`; None: not
    read, `pools_unread` says why). A table of each, a blank line between (the queues' alone,
    headers included, when there are no pools; the pools' alone when there are no queues); the
    documents hold the queues as `items` and the pools as `pools`; -o name lists both."""
    out = as_output(fmt)
    shown_pools = list(pools or [])
    if out.kind == "name":
        return "\n".join(filter(None, [names(rows, QUEUE_RESOURCE), names(shown_pools, POOL_RESOURCE)]))
    if not out.tabular:
        document: dict[str, Any] = {"items": [with_metadata(row) for row in rows]}
        if pools is not None:
            document["pools"] = [with_metadata(row) for row in pools]
        return dump(document, out)
    parts = []
    if rows or not shown_pools:
        queues = [{**row, "oldestWait": report.duration(row["oldestWaitSeconds"])} for row in rows]
        parts.append(listing(queues, TOP_COLUMNS, out, namespaces, wide=TOP_WIDE))
    if shown_pools:
        parts.append(listing([pool_cells(row) for row in shown_pools], POOL_COLUMNS, out, namespaces, wide=POOL_WIDE))
    if pools_unread and not out.no_headers:
        parts.append(f"(worker pools not shown: {pools_unread})")
    return "\n\n".join(part for part in parts if part)


def _fraction(part: Any, whole: Any) -> str | None:
    """`part/whole`, as kubectl's READY column; None when neither is known (status not written)."""
    return None if part is None and whole is None else f"{cell(part)}/{cell(whole)}"


def pool_cells(row: Mapping[str, Any]) -> dict[str, Any]:
    """A pool's row as its table shows it: workers ready/desired, slots used/total, its conditions
    in trouble in a word each ("Ready=False (WorkersNotReady)", "AtMaximum") and their messages."""
    trouble = [
        c["type"] if c["type"] == c["reason"] or not c["reason"] else f"{c['type']}={c['status']} ({c['reason']})"
        for c in row["conditions"]
    ]
    return {
        **row,
        "workers": _fraction(row["readyReplicas"], row["desiredReplicas"]),
        "slotsShown": _fraction(row["slotsUsed"], row["slots"]),
        "trouble": ", ".join(trouble),
        "messages": "; ".join(c["message"] for c in row["conditions"] if c["message"]),
    }


def job_status(summary: Mapping[str, Any], now: datetime, fmt: Output | str) -> str:
    """`kubectl vigil status JOB`: in a table, described as `kubectl describe` would; -o wide
    adds when each recent attempt started and how long it ran."""
    out = as_output(fmt)
    if out.kind == "name":
        return names([summary], JOB_RESOURCE)
    if not out.tabular:
        return dump(with_metadata(summary), out)
    lines = [
        f"VigilJob {summary['namespace']}/{summary['name']} (queue {summary['queue']}, age {summary['age']})",
        f"Phase:        {summary['phase']}" + (f" ({summary['reason']})" if summary["reason"] else ""),
    ]
    if summary["message"]:
        lines.append(f"Message:      {summary['message']}")
    tasks = summary.get("tasks")
    if tasks is not None:
        return "\n".join(lines + _array_status(summary, tasks, now, out.kind == "wide"))
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
            {
                **item,
                "exit": item["exitCode"],
                "ended": report.ago(item["finishedAt"], now),
                "started": item["startedAt"],
                "ran": _ran(item["startedAt"], item["finishedAt"]),
            }
            for item in summary["recentAttempts"]
        ]
        columns = [("#", "number"), ("POD", "pod"), ("OUTCOME", "outcome"), ("REASON", "reason")]
        columns += [("EXIT", "exit"), ("NODE", "node"), ("ENDED", "ended")]
        if out.kind == "wide":
            columns += [("STARTED", "started"), ("RAN", "ran")]
        lines += ["  " + line for line in table(rows, columns).splitlines()]
    return "\n".join(lines)


def _array_status(summary: Mapping[str, Any], tasks: Mapping[str, Any], now: datetime, wide: bool) -> list[str]:
    """The rest of an array's description: its attempts (each task's own), its tasks counted,
    the index ranges, the active tasks (the first ACTIVE_SHOWN by index; -o json has them all)
    and the dead-lettered ones status describes, newest first. -o wide: the ranges whole, each
    task's reason, node, next attempt and checkpoint, each dead task's message."""

    def clip(ranges: str) -> str | None:
        return ranges if wide else clip_ranges(ranges)

    each = f"each task at most {cell(summary['maxAttempts'])} a round"
    lines = [f"Attempts:     {summary['attempts']} across the tasks ({each}), redrives {summary['redrives']}"]
    counts = [
        f"{tasks['succeeded']} succeeded",
        f"{tasks['running']} running",
        f"{tasks['backingOff']} backing off",
        f"{tasks['pending']} pending",
        f"{tasks['deadLettered']} dead-lettered",
    ]
    limits = f"parallelism {tasks['parallelism']}"
    if tasks["maxDeadLetteredTasks"] is not None:
        limits += f", at most {tasks['maxDeadLetteredTasks']} dead-lettered"
    lines.append(f"Tasks:        {tasks['total']}: " + ", ".join(counts) + f" ({limits})")
    if tasks["succeededIndexes"]:
        lines.append(f"  Succeeded:      {clip(tasks['succeededIndexes'])}")
    if tasks["deadLetteredIndexes"]:
        lines.append(f"  Dead-lettered:  {clip(tasks['deadLetteredIndexes'])}")
    if wide and tasks["priorAttempts"]:  # a redriven task's attempts go on from these
        used = [f"{group.get('indexes')}: {group.get('attempts')}" for group in tasks["priorAttempts"]]
        lines.append("  Attempts used:  " + "; ".join(used))
    if tasks["redrives"]:
        lines.append(f"  Redrives:       {tasks['redrives']}, the last {tasks['lastRedrive'] or '-'}")
    if summary["waiting"]:
        lines.append("Waiting:")
        lines += [f"  {w['reason']} ({w['source']}): {w['message']}" for w in summary["waiting"]]
    beat = summary["heartbeat"]
    if not beat["required"]:
        lines.append("Heartbeat:    not required (liveness is each task's pod's phase)")
    else:
        health = f", healthy {beat['healthy']} ({beat['reason']})" if beat["healthy"] else ""
        lines.append(f"Heartbeat:    required of each task's attempts{health}")
    active = tasks["active"]
    if active:
        lines.append(f"Active tasks ({len(active)}):")
        rows = [
            {
                **item,
                "started": report.ago(item["startedAt"], now) if item["startedAt"] else None,
                "last": None if item["lastOutcome"] is None else _last(item["lastOutcome"], item["lastExitCode"]),
            }
            for item in active[: report.ACTIVE_SHOWN]
        ]
        columns = [("INDEX", "index"), ("PHASE", "phase"), ("ATTEMPT", "attempt"), ("POD", "pod")]
        columns += [("STARTED", "started")]
        if wide:
            columns += [("REASON", "reason"), ("NODE", "node"), ("LAST", "last"), ("NEXT-ATTEMPT", "nextAttemptAt")]
            columns += [("CHECKPOINT", "lastCheckpoint")]
        lines += ["  " + line for line in table(rows, columns).splitlines()]
        if len(active) > report.ACTIVE_SHOWN:
            lines.append(f"  ... and {len(active) - report.ACTIVE_SHOWN} more (-o json lists them all)")
    failed = tasks["failed"]
    if failed:
        shown = failed if wide else failed[: report.ACTIVE_SHOWN]
        lines.append("Dead-lettered tasks (newest first):")
        rows = [{**item, "exit": item["exitCode"], "ended": report.ago(item["finishedAt"], now)} for item in shown]
        columns = [("INDEX", "index"), ("ATTEMPTS", "attempts"), ("OUTCOME", "outcome"), ("REASON", "reason")]
        columns += [("EXIT", "exit"), ("ENDED", "ended")]
        if wide:
            columns += [("FINISHED-AT", "finishedAt"), ("MESSAGE", "message")]
        lines += ["  " + line for line in table(rows, columns).splitlines()]
        more = max(tasks["deadLettered"], len(failed)) - len(shown)
        if more > 0:  # status describes the newest 20; the ranges hold them all
            described = f" (-o wide describes the newest {len(failed)})" if len(failed) > len(shown) else ""
            lines.append(f"  ... and {more} more, in the ranges above{described}")
    return lines


def _last(outcome: str, exit_code: int | None) -> str:
    return outcome if exit_code is None else f"{outcome} ({exit_code})"


def _ran(started: str | None, finished: str | None) -> str | None:
    begin, end = report.parse_time(started), report.parse_time(finished)
    return None if begin is None or end is None else report.duration((end - begin).total_seconds())


def redrive(steps: Sequence[report.RedriveStep], done: Mapping[str, str], fmt: Output | str, dry_run: bool) -> str:
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
    out = as_output(fmt)
    if out.kind == "name":  # as `kubectl annotate -o name`: the objects written (or that would be)
        return names([row for row in rows if row["result"] != "refused"], JOB_RESOURCE)
    # -o wide: the namespace too (the jobs' own, which a script may want beside the name)
    return listing(rows, REDRIVE_COLUMNS, out, wide=[NAMESPACE_COLUMN, *REDRIVE_COLUMNS])
