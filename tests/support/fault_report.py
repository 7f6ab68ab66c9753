"""The fault matrix's report: one row per fault test, printed as a markdown table.

Tests call `record(...)`; rows are kept in this process (the session fixture of
`test_fault_matrix` prints them at the end) and, when $VIGIL_FAULT_REPORT names a file, appended
to it as JSON lines, one row a line, so that several sessions can add to one file. To print it:

    python -m tests.support.fault_report /tmp/faults.json          # the newest session's rows
    python -m tests.support.fault_report /tmp/faults.json --all    # every session's rows

Columns: the fault; rounds (how many times it struck); jobs; jobs lost (missing, or not in their
expected terminal phase with the expected number of attempts); duplicate attempts (attempt
numbers that got more than one pod, or attempts beyond the expected ones); false Lost verdicts
(attempts recorded Lost although their pod was never taken away and, for heartbeat jobs, their
agent kept beating); time to recover (from the end of the fault, a heal or a restart that
returned, to the operator's next write to a job); and how long the test took.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

RUN = f"{time.strftime('%Y-%m-%dT%H:%M:%S')}-{uuid.uuid4().hex[:6]}"  # this session
ROWS: list[dict] = []

COLUMNS = (
    "fault",
    "rounds",
    "jobs",
    "jobs lost",
    "duplicate attempts",
    "false Lost verdicts",
    "time to recover",
    "test took",
)


def record(
    fault: str,
    *,
    rounds: int,
    jobs: int,
    lost: int,
    duplicates: int,
    false_lost: int,
    recover_seconds: list[float],
    seconds: float,
    test: str = "",
) -> dict:
    row = {
        "run": RUN,
        "test": test,
        "fault": fault,
        "rounds": rounds,
        "jobs": jobs,
        "lost": lost,
        "duplicates": duplicates,
        "false_lost": false_lost,
        "recover_seconds": [round(s, 2) for s in recover_seconds],
        "seconds": round(seconds, 1),
    }
    ROWS.append(row)
    target = os.environ.get("VIGIL_FAULT_REPORT")
    if target:
        with open(target, "a") as out:
            out.write(json.dumps(row) + "\n")
    return row


def _recovery(values: list[float]) -> str:
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.1f} s"
    return f"max {max(values):.1f} s, median {statistics.median(values):.1f} s (n={len(values)})"


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    for row in rows:
        cells = (
            row["fault"],
            row["rounds"],
            row["jobs"],
            row["lost"],
            row["duplicates"],
            row["false_lost"],
            _recovery(row["recover_seconds"]),
            f"{row['seconds']:.0f} s",
        )
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def load(path: Path, every_run: bool = False) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not every_run and rows:
        newest = rows[-1]["run"]
        rows = [row for row in rows if row["run"] == newest]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.fault_report", description=__doc__)
    parser.add_argument("file", type=Path, help="the file $VIGIL_FAULT_REPORT named")
    parser.add_argument("--all", action="store_true", help="every session's rows, not only the newest's")
    args = parser.parse_args(argv)
    rows = load(args.file, args.all)
    if not rows:
        print(f"{args.file}: no rows", file=sys.stderr)
        return 1
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
