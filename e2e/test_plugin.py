"""`kubectl vigil` end to end: the plugin as a process, as a user runs it, against the real
operator (its own, for a namespace of its own) on the bed: a job's status and why it waits, the
dead-letter queue, a redrive that gives the job a new attempt, pause and resume, top (the queues
and a worker pool), an attempt's log (kwok runs no containers: the plugin must say there is none,
and why; a real pod's log, followed across a retry, is e2e/test_real_node.py's), the output
formats kubectl users type (-o name, wide, jsonpath, custom-columns, --no-headers) and
`kubectl vigil <TAB>` completed by kubectl itself through kubectl_complete-vigil, with names from
the cluster; and a task array's day two: its tasks in `status`, its dead-lettered tasks in `dlq`
while it runs, and redrives of some of its tasks by index and of all of them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.arrays import TaskPods, array_job, tasks_of
from tests.support.cluster import Kube, free_port
from tests.support.jobs import (
    FAST_BACKOFF,
    GROUP,
    QUEUE_PLURAL,
    VERSION,
    create,
    get,
    vigil_job,
    vigil_queue,
    wait_dead_letter_label,
    wait_phase,
)
from tests.support.plugin import kubectl_binary, plugin_command, plugin_environment
from tests.support.pools import POOLS, worker_pool
from tests.support.waits import deadline, wait_until

pytestmark = pytest.mark.e2e  # the operator end to end, as a process, on a real cluster


def plugin(kube: Kube, namespace: str, *args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*plugin_command(), "--kubeconfig", str(kubeconfig or kube.kubeconfig), "-n", namespace, *args],
        capture_output=True,
        text=True,
        timeout=deadline(30),
        env=os.environ.copy(),
    )


def as_json(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_kubectl_vigil_day_two(kube: Kube, own_namespace: str, own_operator, tmp_path: Path):
    ns = own_namespace
    own_operator()
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, ns, QUEUE_PLURAL, vigil_queue("nightly", maxRunning=1))
    create(kube, ns, vigil_job("poison", "7", "1s", retry={"maxAttempts": 3, "nonRetryableExitCodes": [7]}))
    create(kube, ns, vigil_job("long", None, None, queue="nightly"))  # runs until deleted
    create(kube, ns, vigil_job("waiter", "0", "1s", queue="nightly"))
    wait_phase(kube, ns, "poison", "DeadLettered", timeout=30)
    wait_dead_letter_label(kube, ns, "poison")

    # status: the phase, the attempts, the recent attempts
    done = plugin(kube, ns, "status", "poison")
    assert done.returncode == 0, done.stderr
    assert "Phase:        DeadLettered (NonRetryableExitCode)" in done.stdout
    assert "Attempts:     1 (1 of 3 this round), redrives 0" in done.stdout
    assert "poison-1" in done.stdout and "Failed" in done.stdout
    # why it waits: the queue's limit, as the job's status says it
    wait_until(
        lambda: (
            [w["reason"] for w in as_json(plugin(kube, ns, "status", "waiter", "-o", "json"))["waiting"]]
            == ["QueueSaturated"]
        ),
        20,
        "waiter to say it waits for its saturated queue",
    )
    missing = plugin(kube, ns, "status", "nope")
    assert (missing.returncode, missing.stderr.strip()) == (1, f"error: vigiljob nope not found in namespace {ns}")

    # dlq
    rows = as_json(plugin(kube, ns, "dlq", "-o", "json"))["items"]
    assert [(r["name"], r["reason"], r["attempts"]) for r in rows] == [("poison", "NonRetryableExitCode", 1)]
    assert plugin(kube, ns, "dlq").stdout.splitlines()[1].split()[:2] == ["poison", "default"]

    # the output formats kubectl users type
    assert plugin(kube, ns, "dlq", "-o", "name").stdout == "vigiljob.vigil.dev/poison\n"
    template = r'{range .items[*]}{.metadata.name}{"\t"}{.reason}{"\n"}{end}'  # as typed in a shell
    assert plugin(kube, ns, "dlq", "-o", f"jsonpath={template}").stdout == "poison\tNonRetryableExitCode\n"
    assert plugin(kube, ns, "status", "poison", "-o", "jsonpath={.phase}").stdout == "DeadLettered"  # no newline
    columns = plugin(kube, ns, "dlq", "-o", "custom-columns=JOB:.metadata.name,ATTEMPTS:.attempts", "--no-headers")
    assert columns.stdout.split() == ["poison", "1"]
    wide = plugin(kube, ns, "dlq", "-o", "wide").stdout.splitlines()
    assert wide[0].split()[-1] == "MESSAGE" and "nonRetryableExitCodes" in wide[1], wide
    bad = plugin(kube, ns, "dlq", "-o", "xml")
    assert bad.returncode == 1 and "allowed formats are: table, wide, name, json, yaml" in bad.stderr

    # kubectl completes `kubectl vigil ...` itself (1.26+) by running kubectl_complete-vigil from PATH
    def completed(*words: str) -> list[str]:
        done = subprocess.run(
            [kubectl_binary(), "__complete", "vigil", *words],
            capture_output=True,
            text=True,
            timeout=deadline(30),
            env=plugin_environment(kube.kubeconfig),
        )
        assert done.returncode == 0, done.stderr
        return [line.split("\t")[0] for line in done.stdout.splitlines()]

    assert completed("re")[:2] == ["redrive", "resume"]
    assert completed("-n", ns, "status", "po")[0] == "poison"  # the namespace's jobs, from the cluster
    assert completed("-n", ns, "pause", "")[0] == "nightly"
    assert completed("-n", ns, "redrive", "")[0] == "poison"  # the dead-lettered ones

    # top: the queue's status as Vigil writes it (at most every 2 s)
    def nightly() -> dict:
        return as_json(plugin(kube, ns, "top", "-o", "json"))["items"][0]

    wait_until(lambda: (nightly()["running"], nightly()["queued"]) == (1, 1), 20, "nightly to run 1 and queue 1")
    row = nightly()
    assert (row["name"], row["maxRunning"], row["paused"], row["retryBudget"]) == ("nightly", 1, False, "0.2 ok")
    assert row["oldestWaitSeconds"] is not None and row["headOfLine"] == ["waiter"]
    assert plugin(kube, ns, "top").stdout.splitlines()[0].split()[:3] == ["QUEUE", "PAUSED", "QUEUED"]

    # top: the namespace's worker pools after its queues, from their status as Vigil writes it
    # (minReplicas 0 and nothing pulled: no worker is made, whether or not this operator pulls)
    kube.custom.create_namespaced_custom_object(
        GROUP, VERSION, ns, POOLS, worker_pool("etl", minReplicas=0, maxReplicas=3)
    )

    def etl() -> dict:
        return next(iter(as_json(plugin(kube, ns, "top", "-o", "json"))["pools"]), {})

    wait_until(lambda: etl().get("ready") is not None, 20, "Vigil to write the pool etl's status")
    assert (etl()["name"], etl()["desiredReplicas"], etl()["maxReplicas"], etl()["backlog"]) == ("etl", 0, 3, 0)
    pools = plugin(kube, ns, "top").stdout.split("\n\n")[1].splitlines()
    assert pools[0].split() == ["POOL", "WORKERS", "MAX", "SLOTS", "BACKLOG", "CONDITIONS"]
    assert pools[1].split()[:5] == ["etl", "0/0", "3", "0/0", "0"]

    # pause and resume: spec.paused
    def paused() -> bool:
        return kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, QUEUE_PLURAL, "nightly")["spec"]["paused"]

    done = plugin(kube, ns, "pause", "nightly")
    assert done.returncode == 0 and f"vigilqueue {ns}/nightly paused" in done.stdout and paused()
    done = plugin(kube, ns, "resume", "nightly")
    assert done.returncode == 0 and "resumed" in done.stdout and not paused()
    assert plugin(kube, ns, "pause", "gone").returncode == 1

    # logs: kwok's nodes run no containers; the plugin says so, with what the API server answered
    done = plugin(kube, ns, "logs", "poison")
    print("logs of a kwok pod:", done.returncode, done.stdout, done.stderr)
    assert done.returncode == 1, done.stdout
    assert "error: no log for pod poison-1 (attempt 1) on kwok-node-" in done.stderr
    gone = plugin(kube, ns, "logs", "poison", "--attempt", "9")
    assert gone.returncode == 1 and "the pod of attempt 9 of vigiljob poison is gone" in gone.stderr
    followed = plugin(kube, ns, "logs", "poison", "-f")  # the job has ended: no wait for another attempt
    assert followed.returncode == 1 and "no log for pod poison-1 (attempt 1)" in followed.stderr, followed

    # redrive: a dry run writes nothing; the redrive gives the job a new round, attempt 2
    dry = plugin(kube, ns, "redrive", "--all-dead-letters", "--dry-run")
    assert dry.returncode == 0 and "would redrive" in dry.stdout
    assert "vigil.dev/redrive" not in (get(kube, ns, "poison")["metadata"].get("annotations") or {})
    refused = plugin(kube, ns, "redrive", "long")
    assert refused.returncode == 1 and "not dead-lettered (phase Running)" in refused.stdout
    done = plugin(kube, ns, "redrive", "--all-dead-letters", "--rate", "5")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[1].split()[:2] == ["poison", "redriven"]
    value = get(kube, ns, "poison")["metadata"]["annotations"]["vigil.dev/redrive"]
    wait_until(lambda: (get(kube, ns, "poison")["status"].get("attempts") or 0) >= 2, 20, "poison's attempt 2")
    job = wait_phase(kube, ns, "poison", "DeadLettered", timeout=20)  # exit 7 again
    assert (job["status"]["redrives"], job["status"]["lastRedrive"], job["status"]["attempts"]) == (1, value, 2)

    # an API server that does not answer: exit 2, saying where it looked
    dead = tmp_path / "dead.kubeconfig"
    dead.write_text(kube.kubeconfig.read_text().replace(kube.host_port.split(":")[1], str(free_port())))
    unreachable = plugin(kube, ns, "top", kubeconfig=dead)
    assert unreachable.returncode == 2 and "cannot reach the API server" in unreachable.stderr


def test_kubectl_vigil_on_a_task_array(kube: Kube, own_namespace: str, own_operator):
    ns = own_namespace
    own_operator()

    # Tasks 0 and 1 are poison on their first attempt (exit 7: dead-lettered at once) and succeed
    # once redriven (the input fixed); task 2 runs until the test ends it.
    def workload(index: int, attempt: int) -> tuple[int, str] | None:
        if index == 2:
            return None
        return (7, "1s") if attempt == 1 else (0, "1s")

    retry = {"maxAttempts": 3, "nonRetryableExitCodes": [7], "backoff": FAST_BACKOFF}
    with TaskPods(kube, ns, workload) as pods:
        create(kube, ns, array_job("shards", 3, parallelism=3, retry=retry))
        wait_until(
            lambda: (
                tasks_of(kube, ns, "shards").get("deadLetteredIndexes") == "0-1"
                and [(t["index"], t["phase"]) for t in tasks_of(kube, ns, "shards").get("active") or []]
                == [(2, "Running")]
            ),
            30,
            "tasks 0 and 1 dead-lettered and task 2 running",
        )

        # status: the tasks counted, their ranges, the active one and the dead ones
        done = plugin(kube, ns, "status", "shards")
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[1].startswith("Phase:        Running"), done.stdout
        assert (
            "Tasks:        3: 0 succeeded, 1 running, 0 backing off, 0 pending, 2 dead-lettered (parallelism 3)"
            in lines
        ), done.stdout
        assert "  Dead-lettered:  0-1" in lines
        active = lines[lines.index("Active tasks (1):") + 2].split()
        assert active[:4] == ["2", "Running", "1", "shards-2-1"], done.stdout
        dead = lines[lines.index("Dead-lettered tasks (newest first):") + 1 :]
        assert sorted(row.split()[0] for row in dead[1:]) == ["0", "1"], done.stdout
        assert all(row.split()[1:5] == ["1", "Failed", "NonRetryableExitCode", "7"] for row in dead[1:]), done.stdout
        summary = as_json(plugin(kube, ns, "status", "shards", "-o", "json"))
        assert summary["tasks"]["active"][0]["pod"] == "shards-2-1" and summary["currentAttempt"] is None

        # dlq: the array runs on, unlabelled, and is in the dead-letter queue for its two tasks
        assert "vigil.dev/dead-letter" not in (get(kube, ns, "shards")["metadata"].get("labels") or {})
        rows = as_json(plugin(kube, ns, "dlq", "-o", "json"))["items"]
        assert [
            (r["name"], r["phase"], r["deadLetteredTasks"], r["deadLetteredIndexes"], r["tasks"]) for r in rows
        ] == [("shards", "Running", 2, "0-1", "0/3")]
        assert sorted(f["index"] for f in rows[0]["failedTasks"]) == [0, 1]
        assert plugin(kube, ns, "dlq").stdout.splitlines()[1].split()[-2:] == ["2", "0-1"]
        assert plugin(kube, ns, "dlq", "-o", "name").stdout == "vigiljob.vigil.dev/shards\n"

        # redrives refused: saying which indexes, and why; a malformed range is bad usage
        refused = plugin(kube, ns, "redrive", "shards", "--tasks", "1,5")
        assert refused.returncode == 1 and "1 index 5 out of range: the array has 3 tasks (0-2)" in refused.stdout
        refused = plugin(kube, ns, "redrive", "shards", "--tasks", "1-2")
        assert refused.returncode == 1
        assert "1 task 2 not dead-lettered (of those asked, these are: 1)" in refused.stdout
        bad = plugin(kube, ns, "redrive", "shards", "--tasks", "1-x")
        assert bad.returncode == 2 and "error: --tasks '1-x': " in bad.stderr, bad.stderr
        refused = plugin(kube, ns, "redrive", "shards")  # a whole redrive: the array is not dead-lettered
        assert refused.returncode == 1 and "its dead-lettered tasks can, by index: --tasks 0-1" in refused.stdout
        assert "vigil.dev/redrive-tasks" not in (get(kube, ns, "shards")["metadata"].get("annotations") or {})

        # redrive --tasks 1: that task's new round, while the array runs; it succeeds this time
        done = plugin(kube, ns, "redrive", "shards", "--tasks", "1")
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.splitlines()[1].split()[:2] == ["shards", "redriven"], done.stdout
        value = get(kube, ns, "shards")["metadata"]["annotations"]["vigil.dev/redrive-tasks"]
        assert value.startswith("1@") and value in done.stdout
        seen: dict = {}

        def task_1_redriven() -> bool:
            seen.update(tasks_of(kube, ns, "shards"))
            return (seen.get("succeededIndexes"), seen.get("lastRedrive")) == ("1", value)

        try:
            wait_until(task_1_redriven, 30, "task 1 redriven and succeeded")
        except BaseException:
            print("status.tasks as last read:", json.dumps(seen, indent=1))
            raise
        assert tasks_of(kube, ns, "shards")["deadLetteredIndexes"] == "0"
        assert [p.attempt for p in pods.per_index("shards")[1]] == [1, 2]

        # task 2 ends well: the array ends dead-lettered for task 0; a whole redrive is task 0's round
        pods.finish("shards-2-1", 0)
        job = wait_phase(kube, ns, "shards", "DeadLettered", timeout=30)
        assert (job["status"]["tasks"]["succeededIndexes"], job["status"]["tasks"]["deadLetteredIndexes"]) == (
            "1-2",
            "0",
        )
        done = plugin(kube, ns, "redrive", "shards")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "every dead-lettered task (0)" in done.stdout, done.stdout
        job = wait_phase(kube, ns, "shards", "Succeeded", timeout=30)
        pods.caught_up()
        pods.assert_healthy()

    assert job["status"]["tasks"]["progress"] == "3/3"
    assert {i: [p.attempt for p in ps] for i, ps in pods.per_index("shards").items()} == {0: [1, 2], 1: [1, 2], 2: [1]}
    assert as_json(plugin(kube, ns, "dlq", "-o", "json"))["items"] == []
