"""`kubectl vigil`'s command line: its commands, flags and help, apart from what runs them
(`cli`), so that shell completion, which reads them on every TAB, loads nothing but argparse."""

from __future__ import annotations

import argparse

DEFAULT_RATE = 5.0  # redrives a second: each is a new round of attempts, queued at once
MAX_RATE = 50.0  # a bulk redrive is paced whatever is asked: it must not become a retry storm
DEFAULT_MAX = 100  # jobs redriven in one run; the rest wait for the next run
SHELLS = ("bash", "zsh", "fish")  # what `kubectl vigil completion` prints a script for


def parser() -> argparse.ArgumentParser:
    # The common flags go on the top level and on every command, with no defaults of their
    # own (SUPPRESS), so that `kubectl vigil -n X top` and `kubectl vigil top -n X` both work.
    common = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    common.add_argument("-n", "--namespace", help="default: the kubeconfig context's namespace, else default")
    common.add_argument("--kubeconfig", help="default: $KUBECONFIG, else ~/.kube/config")
    common.add_argument("--context", help="the kubeconfig context to use (default: its current one)")
    common.add_argument(
        "-o",
        "--output",
        metavar="FORMAT",
        help="the output format: table, wide, name, json, yaml, jsonpath=TEMPLATE or "
        "custom-columns=HEADER:PATH[,HEADER:PATH] (default table; kubectl's JSONPath, over what -o json "
        "prints, each item with its metadata.name: -o jsonpath='{.items[*].metadata.name}')",
    )
    top_level = argparse.ArgumentParser(
        prog="kubectl vigil",
        parents=[common],
        description="Day two with Vigil: why a job waits, the dead-letter queue, redrives, queues, an attempt's log. "
        "Exit codes: 0 done; 1 not found or refused, or an -o it cannot print; 2 bad usage, no kubeconfig, or the "
        "API server unreachable. Shell completion: kubectl vigil completion --help.",
    )
    commands = top_level.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, parents=[common], help=help, description=help)

    command("status", "a job's phase, attempts, why it waits, its beats, checkpoint and recent attempts").add_argument(
        "job"
    )
    for name, help in (
        (
            "dlq",
            "the dead-letter queue: jobs labelled vigil.dev/dead-letter=true, and task arrays with dead-lettered "
            "tasks (their index ranges)",
        ),
        ("top", "the queues and worker pools at a glance: depth, running, oldest wait; workers, slots, backlog"),
    ):
        sub = command(name, help)
        sub.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
        sub.add_argument("--no-headers", action="store_true", help="tables without their header line")
        if name == "dlq":
            sub.add_argument("-l", "--selector", help="only the jobs this label selector picks too")
    sub = command(
        "redrive",
        "start a new round of attempts of dead-lettered jobs (the vigil.dev/redrive annotation; an array's: "
        "every dead-lettered task), or of some dead-lettered tasks of an array (--tasks), paced",
    )
    sub.add_argument("jobs", nargs="*", metavar="JOB")
    sub.add_argument(
        "--tasks",
        metavar="RANGES",
        help="only these dead-lettered tasks of the array JOB, by index ranges as 5,7-9 (the "
        "vigil.dev/redrive-tasks annotation); refused, saying which, if one is out of range or not dead-lettered",
    )
    sub.add_argument("--all-dead-letters", action="store_true", help="every dead-lettered job of the namespace")
    sub.add_argument("-l", "--selector", help="with --all-dead-letters: only those this label selector picks")
    sub.add_argument(
        "--rate",
        type=float,
        default=DEFAULT_RATE,
        help=f"redrives a second (default {DEFAULT_RATE:g}, at most {MAX_RATE:g})",
    )
    sub.add_argument("--max", type=int, default=DEFAULT_MAX, help=f"redrive at most N jobs (default {DEFAULT_MAX})")
    sub.add_argument("--dry-run", action="store_true", help="say what would be redriven, write nothing")
    sub.add_argument("--no-headers", action="store_true", help="the table without its header line")
    for name, help in (
        ("pause", "stop a queue starting attempts (spec.paused: true); running ones finish"),
        ("resume", "let a paused queue start attempts again (spec.paused: false)"),
    ):
        command(name, help).add_argument("queue")
    sub = command(
        "logs",
        "the log of an attempt's pod (default: the latest attempt); -f follows it, and each next attempt's "
        "after a line '--- attempt N: pod P on NODE ---', until the job is Succeeded or DeadLettered",
    )
    sub.add_argument("job")
    sub.add_argument("--attempt", type=int, metavar="N", help="the attempt (default: the latest)")
    sub.add_argument(
        "--all-attempts",
        action="store_true",
        help="every attempt whose pod is still there, oldest first, each after its '--- attempt N' line",
    )
    sub.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="stream the log as it is written; when the attempt ends and a retry starts, go on with the "
        "retry's pod (with --attempt N: that attempt's alone); ends when the job is Succeeded or DeadLettered",
    )
    sub.add_argument("-c", "--container", help="default: the pod's default container, else its first")
    sub.add_argument("--tail", type=int, metavar="LINES", help="only the last LINES lines (of the first attempt shown)")
    sub = command(
        "completion",
        "print a shell completion script for kubectl-vigil (source <(kubectl vigil completion bash), "
        "source <(kubectl vigil completion zsh), kubectl vigil completion fish | source); "
        "`kubectl vigil <TAB>` needs none: kubectl (1.26+) runs kubectl_complete-vigil, installed beside "
        "kubectl-vigil",
    )
    sub.add_argument("shell", choices=SHELLS)
    return top_level
