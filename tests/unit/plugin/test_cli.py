"""`kubectl vigil`'s thin part (vigil.plugin.cli) against an API in memory and a fake clock: the
redrive's pace (no test waits for real time), the writes it makes, and the errors with their exit
codes, down to an API server that does not answer."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.clock import WALL_START, FakeClock
from tests.support.plugin import KeptOut as Out
from tests.support.plugin import array_job, array_tasks, dead_job, queue, sample_job, worker_pool
from vigil.kube.errors import Conflict, NotFound, Refused, Unauthorized, Unreachable, from_status
from vigil.plugin import cli, render

pytestmark = pytest.mark.unit


class Api:
    """The plugin's calls, answered from objects in memory; each write recorded with its time."""

    def __init__(self, clock: FakeClock, jobs=(), queues=(), pods=(), log: bytes | Exception = b"", pools=()) -> None:
        self.clock = clock
        self.jobs_ = {j["metadata"]["name"]: j for j in jobs}
        self.queues_ = {q["metadata"]["name"]: q for q in queues}
        self.pools_: list[dict] | Exception = list(pools)
        self.pods_ = list(pods)
        self.log_ = log
        self.writes: list[tuple[float, str, dict]] = []
        self.refuse: dict[str, Exception] = {}
        self.selectors: list[str] = []

    async def job(self, namespace, name):
        return self.jobs_.get(name)

    async def jobs(self, namespace, selector, keep=None):
        self.selectors.append(selector)
        wanted = dict(part.split("=") for part in selector.split(",") if part)
        picked = [j for j in self.jobs_.values() if all(j["metadata"]["labels"].get(k) == v for k, v in wanted.items())]
        return [j for j in picked if keep is None or keep(j)]

    async def queue(self, namespace, name):
        return self.queues_.get(name)

    async def queues(self, namespace):
        return list(self.queues_.values())

    async def pools(self, namespace):
        if isinstance(self.pools_, Exception):
            raise self.pools_
        return self.pools_

    async def patch_job(self, namespace, name, patch):
        if name in self.refuse:
            raise self.refuse[name]
        self.writes.append((self.clock.monotonic(), name, patch))
        return {}

    async def patch_queue(self, namespace, name, patch):
        self.writes.append((self.clock.monotonic(), name, patch))
        return {}

    async def pods(self, namespace, selector):
        self.selectors.append(selector)
        return self.pods_

    async def pod(self, namespace, name):
        if "pod" in self.refuse:
            raise self.refuse["pod"]
        return next((p for p in self.pods_ if p["metadata"]["name"] == name), None)

    async def log(self, namespace, pod, container, tail):
        if isinstance(self.log_, Exception):
            raise self.log_
        return self.log_


def args(*argv: str):
    parsed = cli.parser().parse_args(list(argv))
    parsed.output = render.parse_output(getattr(parsed, "output", "table"), getattr(parsed, "no_headers", False))
    assert cli.usage_error(parsed) is None
    return parsed


def run(api: Api, clock: FakeClock, *argv: str, out: Out | None = None) -> tuple[int, str]:
    return asyncio.run(cli.run(api, args(*argv), "ns", clock, out or Out()))  # type: ignore[arg-type]


def many_dead(count: int) -> list[dict]:
    return [dead_job(f"d{i:02}", finished=f"2026-03-01T11:{i:02}:00Z") for i in range(count)]


def test_a_bulk_redrive_goes_at_the_rate_asked_on_the_clock_and_stops_at_max():
    clock = FakeClock()
    api = Api(clock, jobs=many_dead(12))

    async def scenario() -> tuple[int, str]:
        task = asyncio.create_task(cli.run(api, args("redrive", "--all-dead-letters", "--max", "10"), "ns", clock))
        await clock.advance(0.9)
        assert len(api.writes) == 5  # one at once, then one every 0.2 s
        await clock.until(task.done, 10)
        return task.result()

    code, out = asyncio.run(scenario())
    times = [round(t - 1000.0, 6) for t, _, _ in api.writes]
    assert times == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6, 1.8])
    assert [name for _, name, _ in api.writes] == [f"d{i:02}" for i in range(10)]  # the longest dead first
    assert api.selectors == ["vigil.dev/dead-letter=true"]
    value = str(int(WALL_START.timestamp()))  # planned before the first write
    assert api.writes[0][2] == {"metadata": {"annotations": {"vigil.dev/redrive": value}, "resourceVersion": "7"}}
    assert code == cli.EXIT_FAILED  # two refused: over --max
    assert out.count("   redriven   ") == 10 and out.count("over --max 10: not redriven this time") == 2


def test_a_slower_rate_and_a_selector():
    clock = FakeClock()
    jobs = many_dead(3)
    api = Api(clock, jobs=jobs)

    async def scenario() -> None:
        command = cli.run(api, args("redrive", "--all-dead-letters", "-l", "team=a", "--rate", "0.5"), "ns", clock)
        task = asyncio.create_task(command)
        await clock.until(task.done, 10)

    for job in jobs:
        job["metadata"]["labels"]["team"] = "a"
    asyncio.run(scenario())
    assert api.selectors == ["vigil.dev/dead-letter=true,team=a"]
    assert [t - 1000.0 for t, _, _ in api.writes] == pytest.approx([0.0, 2.0, 4.0])


def test_a_dry_run_writes_nothing_and_says_what_it_would_do():
    clock = FakeClock()
    api = Api(clock, jobs=[dead_job("poison"), sample_job("ok", phase="Succeeded")])
    code, out = run(api, clock, "redrive", "poison", "ok", "gone", "--dry-run")
    assert api.writes == []
    assert code == cli.EXIT_FAILED
    lines = out.splitlines()
    assert lines[1].split()[:3] == ["poison", "would", "redrive"]
    assert "not dead-lettered (phase Succeeded)" in lines[2]
    assert "vigiljob gone not found in namespace ns" in lines[3]


def test_named_jobs_all_redriven_exit_0_and_a_write_refused_is_reported():
    clock = FakeClock()
    api = Api(clock, jobs=[dead_job("a"), dead_job("b"), dead_job("c")])
    api.refuse = {"b": Conflict("changed"), "c": from_status(403, {"reason": "Forbidden", "message": "no"})}

    async def scenario(*argv: str) -> tuple[int, str]:
        task = asyncio.create_task(cli.run(api, args(*argv), "ns", clock))
        await clock.until(task.done, 10)
        return task.result()

    code, out = asyncio.run(scenario("redrive", "a", "-o", "json"))
    assert (code, [name for _, name, _ in api.writes]) == (cli.EXIT_OK, ["a"])
    assert '"result": "redriven"' in out
    code, out = asyncio.run(scenario("redrive", "b", "c"))
    assert code == cli.EXIT_FAILED
    assert "the job changed since it was read (redriven by someone else?): run again" in out
    assert "refused by the API server: 403 Forbidden: no" in out


def test_a_redrive_stops_at_the_first_write_that_cannot_reach_the_api_server():
    clock = FakeClock()
    api = Api(clock, jobs=many_dead(3))
    api.refuse = {"d01": Unreachable("connection refused")}

    async def scenario() -> tuple[int, str]:
        task = asyncio.create_task(cli.run(api, args("redrive", "--all-dead-letters"), "ns", clock))
        await clock.until(task.done, 10)
        return task.result()

    code, out = asyncio.run(scenario())
    assert code == cli.EXIT_CANNOT_ASK
    assert [name for _, name, _ in api.writes] == ["d00"]
    assert "not written: connection refused" in out and "not reached" in out


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["redrive"], "redrive takes job names or --all-dead-letters, not both nor neither"),
        (["redrive", "a", "--all-dead-letters"], "not both nor neither"),
        (["redrive", "a", "-l", "x=y"], "-l/--selector goes with --all-dead-letters"),
        (["redrive", "a", "--rate", "0"], "--rate must be above 0 and at most 50 redrives a second"),
        (["redrive", "a", "--rate", "500"], "at most 50"),
        (["redrive", "a", "--max", "0"], "--max must be at least 1"),
        (["redrive", "a", "b", "--tasks", "5"], "--tasks goes with one job, an array: redrive JOB --tasks 5,7-9"),
        (["redrive", "--all-dead-letters", "--tasks", "5"], "--tasks goes with one job"),
        (["redrive", "a", "--tasks", "5,x"], "--tasks '5,x': \"x\" is not an index or a range of indexes"),
        (["redrive", "a", "--tasks", "9-3"], "is a range that ends before it starts"),
        (["redrive", "a", "--tasks", ","], "is not an index"),
        (["redrive", "a", "--tasks", ""], "--tasks '': no index given"),
    ],
)
def test_bad_usage_exits_2_before_anything_is_asked(argv, problem, capsys: pytest.CaptureFixture[str]):
    assert cli.main([*argv, "--kubeconfig", "/nonexistent"]) == cli.EXIT_CANNOT_ASK
    assert problem in capsys.readouterr().err


def test_status_of_a_job_not_there_exits_1_naming_it_and_its_namespace():
    clock = FakeClock()
    with pytest.raises(cli.Failed) as failed:
        run(Api(clock), clock, "status", "nope")
    assert (failed.value.code, failed.value.message) == (1, "vigiljob nope not found in namespace ns")


def test_status_json_and_yaml():
    clock = FakeClock()
    api = Api(clock, jobs=[dead_job("poison")])
    code, out = run(api, clock, "status", "poison", "-o", "json")
    assert code == 0 and '"phase": "DeadLettered"' in out
    code, out = run(api, clock, "-o", "yaml", "status", "poison")  # the common flags go before the command too
    assert code == 0 and "phase: DeadLettered" in out


def test_status_reads_the_beats_from_the_attempts_pod_and_does_without_it_if_forbidden():
    clock = FakeClock()
    current = {"number": 1, "podName": "long-1", "phase": "Running", "startedAt": "2026-03-01T11:59:00Z"}
    api = Api(
        clock,
        jobs=[sample_job("long", phase="Running", attempts=1, currentAttempt=current)],
        pods=[{"metadata": {"name": "long-1", "annotations": {"vigil.dev/heartbeat": "12:abcdef01"}}}],
    )
    assert "12 beats sent by the agent" in run(api, clock, "status", "long")[1]
    api.refuse = {"pod": from_status(403, {"reason": "Forbidden", "message": "cannot get pods"})}
    code, out = run(api, clock, "status", "long")
    assert code == 0 and "beats sent" not in out and "Attempt 1:    pod long-1, Running" in out


def test_dlq_and_top_across_namespaces():
    clock = FakeClock()
    api = Api(clock, jobs=[dead_job("poison"), sample_job("fine", phase="Running")], queues=[queue("nightly")])
    code, out = run(api, clock, "dlq", "-A")
    assert code == 0 and out.splitlines()[1].split()[:2] == ["ns", "poison"] and "fine" not in out
    code, out = run(api, clock, "top")
    assert code == 0 and out.splitlines()[1].startswith("nightly")


def test_top_shows_the_worker_pools_after_the_queues_and_the_queues_when_pools_cannot_be_read():
    clock = FakeClock()
    status = {"replicas": 2, "readyReplicas": 2, "desiredReplicas": 2, "slots": 8, "slotsUsed": 3, "backlog": 0}
    etl = worker_pool("etl", spec={"slotsPerWorker": 4}, status=status)
    api = Api(clock, queues=[queue("nightly")], pools=[etl])
    code, out = run(api, clock, "top")
    queues, pools = out.split("\n\n")
    assert code == 0 and queues.splitlines()[1].startswith("nightly")
    assert pools.splitlines()[0].split() == ["POOL", "WORKERS", "MAX", "SLOTS", "BACKLOG", "CONDITIONS"]
    assert pools.splitlines()[1].split() == ["etl", "2/2", "10", "3/8", "0", "-"]
    code, out = run(api, clock, "top", "-A", "-o", "json")
    assert [p["name"] for p in json.loads(out)["pools"]] == ["etl"]
    # A Vigil without worker pools (the CRD not served): nothing to show, nothing to say.
    api.pools_ = NotFound("the server could not find the requested resource", status=404)
    code, out = run(api, clock, "top")
    assert code == 0 and "\n\n" not in out and "pool" not in out.lower()
    assert json.loads(run(api, clock, "top", "-o", "json")[1])["pools"] == []
    # A user who may list queues but not pools sees the queues, and why the pools are missing.
    api.pools_ = from_status(403, {"reason": "Forbidden", "message": "cannot list vigilworkerpools"})
    code, out = run(api, clock, "top")
    assert code == 0 and out.splitlines()[1].startswith("nightly")
    assert out.splitlines()[-1] == "(worker pools not shown: forbidden: cannot list vigilworkerpools)"
    assert "pools" not in json.loads(run(api, clock, "top", "-o", "json")[1]), "not read: not said to be none"
    assert run(api, clock, "top", "--no-headers")[1].split() == ["nightly", "false", *"------", "0.2", "ok", "-"]


def test_pause_and_resume_patch_spec_paused_once():
    clock = FakeClock()
    api = Api(clock, queues=[queue("nightly", spec={"paused": False})])
    code, out = run(api, clock, "pause", "nightly")
    assert (code, out) == (0, "vigilqueue ns/nightly paused: no new attempt starts, running ones finish")
    assert api.writes == [(1000.0, "nightly", {"spec": {"paused": True}})]
    api.queues_["nightly"]["spec"]["paused"] = True
    code, out = run(api, clock, "pause", "nightly")
    assert out.endswith("(it already was)") and len(api.writes) == 1
    code, out = run(api, clock, "resume", "nightly", "-o", "json")
    assert '"paused": false' in out and api.writes[-1][2] == {"spec": {"paused": False}}
    with pytest.raises(cli.Failed, match="vigilqueue batch not found in namespace ns"):
        run(api, clock, "pause", "batch")


def attempt_pod(name: str, containers: tuple[str, ...] = ("main",), annotations: dict | None = None) -> dict:
    return {
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"nodeName": "kwok-node-0", "containers": [{"name": c} for c in containers]},
    }


def test_logs_of_an_attempt_by_the_jobs_uid_and_the_attempt_number():
    clock = FakeClock()
    job = dead_job("poison", attempts=3)
    api = Api(clock, jobs=[job], pods=[attempt_pod("poison-2", ("side", "main"), {cli.DEFAULT_CONTAINER: "main"})])
    api.log_ = b"line 1\nline 2\n"
    out = Out()
    assert run(api, clock, "logs", "poison", "--attempt", "2", out=out) == (0, "")
    assert out.written == b"line 1\nline 2\n"  # as the kubelet sent it
    assert api.selectors == ["vigil.dev/job-uid=uid-poison,vigil.dev/attempt=2"]
    run(api, clock, "logs", "poison")
    assert api.selectors[-1].endswith("vigil.dev/attempt=3")  # the latest


def test_logs_of_a_pod_gone_or_a_log_the_node_cannot_give_say_so():
    clock = FakeClock()
    api = Api(clock, jobs=[dead_job("poison")])
    with pytest.raises(cli.Failed, match="the pod of attempt 1 of vigiljob poison is gone") as failed:
        run(api, clock, "logs", "poison")
    assert failed.value.code == cli.EXIT_FAILED
    api.pods_ = [attempt_pod("poison-1")]
    api.log_ = from_status(500, {"message": "dial tcp 10.0.0.1:10250: connect: connection refused"})
    with pytest.raises(cli.Failed, match="no log for pod poison-1 \\(attempt 1\\) on kwok-node-0: the API server"):
        run(api, clock, "logs", "poison")
    with pytest.raises(cli.Failed, match="has started no attempt yet"):
        run(Api(clock, jobs=[sample_job("new")]), clock, "logs", "new")


@pytest.mark.parametrize(
    ("error", "code", "says"),
    [
        (Unreachable("connect: connection refused"), 2, "cannot reach the API server at https://h:6443"),
        (Unauthorized("token expired"), 2, "refused the credentials"),
        (from_status(403, {"reason": "Forbidden", "message": "cannot list vigiljobs"}), 1, "forbidden: cannot list"),
        (NotFound("the server could not find the requested resource"), 1, "are Vigil's CRDs installed"),
        (Refused("invalid", status=422), 1, "invalid"),
    ],
)
def test_api_errors_become_exit_codes_and_what_to_fix(error, code, says):
    assert cli.explain(error, "https://h:6443")[0] == code
    assert says in cli.explain(error, "https://h:6443")[1]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_api_server_that_does_not_answer_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{closed_port()}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u, namespace: from-context}}}}]
current-context: x
"""
    )
    assert cli.main(["--kubeconfig", str(kubeconfig), "status", "poison"]) == cli.EXIT_CANNOT_ASK
    err = capsys.readouterr().err
    assert "error: cannot reach the API server at http://127.0.0.1:" in err and "--context" in err
    assert cli.main(["--kubeconfig", str(kubeconfig), "--context", "nope", "top"]) == cli.EXIT_CANNOT_ASK
    assert "no usable kubeconfig" in capsys.readouterr().err


def test_the_namespace_comes_from_the_kubeconfig_context(tmp_path: Path):
    from vigil.kube import config

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: team-a}}, {name: y, context: {cluster: c, user: u}}]
current-context: x
"""
    )
    assert config.context_namespace(str(kubeconfig)) == "team-a"
    assert config.context_namespace(str(kubeconfig), "y") is None
    assert config.context_namespace(str(tmp_path / "missing")) is None


def test_the_console_script_is_declared_for_kubectl_to_find():
    pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"
    assert 'kubectl-vigil = "vigil.plugin.cli:main"' in pyproject.read_text()
    assert callable(cli.main)


# --- task arrays ------------------------------------------------------------------------------


def array(name: str = "batch", **tasks) -> dict:
    """A running array of 1000 tasks, task 5 dead-lettered (tasks as the brief's example)."""
    return array_job(name, phase="Running", reason="TasksRunning", attempts=1034, tasks=array_tasks(**tasks))


class Racing(Api):
    """An API whose job changes under each of the first `conflicts` writes (its status is
    written twice a second): each is refused with a conflict, and the job read again is newer."""

    def __init__(self, clock: FakeClock, conflicts: int, **kwargs) -> None:
        super().__init__(clock, **kwargs)
        self.conflicts = conflicts
        self.reads = 0

    async def job(self, namespace, name):
        self.reads += 1
        job = self.jobs_.get(name)
        if job is not None:
            job["metadata"]["resourceVersion"] = str(100 + self.reads)
        return job

    async def pools(self, namespace):
        if isinstance(self.pools_, Exception):
            raise self.pools_
        return self.pools_

    async def patch_job(self, namespace, name, patch):
        self.writes.append((self.clock.monotonic(), name, patch))
        if len(self.writes) <= self.conflicts:
            raise Conflict("the object has been modified; please apply your changes to the latest version")
        return {}


def run_paced(api: Api, clock: FakeClock, *argv: str) -> tuple[int, str]:
    async def scenario() -> tuple[int, str]:
        task = asyncio.create_task(cli.run(api, args(*argv), "ns", clock))
        await clock.until(task.done, 10)
        return task.result()

    return asyncio.run(scenario())


def test_a_task_redrive_writes_the_ranges_at_a_fresh_token_on_the_array_as_read():
    clock = FakeClock()
    api = Api(clock, jobs=[array()])
    code, out = run_paced(api, clock, "redrive", "batch", "--tasks", "5")
    value = f"5@{int(WALL_START.timestamp())}"
    assert code == cli.EXIT_OK, out
    assert api.writes == [
        (1000.0, "batch", {"metadata": {"annotations": {"vigil.dev/redrive-tasks": value}, "resourceVersion": "7"}})
    ]
    assert out.splitlines()[1].split(None, 2) == ["batch", "redriven", f"1 dead-lettered task 5, value {value}"]


def test_a_task_redrive_that_meets_a_conflict_reads_the_array_again_and_writes_again_paced():
    clock = FakeClock()
    api = Racing(clock, conflicts=2, jobs=[array()])
    code, out = run_paced(api, clock, "redrive", "batch", "--tasks", "5", "-o", "json")
    assert code == cli.EXIT_OK and '"result": "redriven"' in out
    # each write on the version just read, at the bulk redrive's pace (5 a second by default)
    assert [(round(t - 1000.0, 6), p["metadata"]["resourceVersion"]) for t, _, p in api.writes] == [
        (0.0, "101"),
        (0.2, "102"),
        (0.4, "103"),
    ]
    assert api.reads == 3


def test_a_task_redrive_gives_up_after_its_tries_and_exits_1():
    clock = FakeClock()
    api = Racing(clock, conflicts=99, jobs=[array()])
    code, out = run_paced(api, clock, "redrive", "batch", "--tasks", "5", "--rate", "1")
    assert code == cli.EXIT_FAILED
    assert len(api.writes) == cli.REDRIVE_TASKS_TRIES == 5
    assert [t - 1000.0 for t, _, _ in api.writes] == pytest.approx([0.0, 1.0, 2.0, 3.0, 4.0])
    assert "refused   the job changed each time it was read (5 tries): run again" in out


def test_a_task_redrive_read_again_after_a_conflict_is_checked_again():
    clock = FakeClock()
    api = Racing(clock, conflicts=1, jobs=[array()])
    real_job = api.job

    async def redriven_meanwhile(namespace, name):  # someone else's redrive of task 5 was honoured
        job = await real_job(namespace, name)
        if api.reads == 2:
            job["status"]["tasks"].update(deadLettered=0, deadLetteredIndexes="", pending=11)
        return job

    api.job = redriven_meanwhile  # type: ignore[method-assign]
    code, out = run_paced(api, clock, "redrive", "batch", "--tasks", "5")
    assert code == cli.EXIT_FAILED and len(api.writes) == 1
    assert "1 task 5 not dead-lettered (the array's dead-lettered tasks: none)" in out


def test_a_task_redrive_refused_writes_nothing_and_a_dry_run_neither():
    clock = FakeClock()
    api = Api(clock, jobs=[array(), dead_job("poison")])
    code, out = run(api, clock, "redrive", "batch", "--tasks", "4-6,1200")
    assert (code, api.writes) == (cli.EXIT_FAILED, [])
    assert "1 index 1200 out of range: the array has 1000 tasks (0-999)" in out
    code, out = run(api, clock, "redrive", "poison", "--tasks", "0")
    assert code == cli.EXIT_FAILED and "not a task array (no spec.tasks): redrive it without --tasks" in out
    code, out = run(api, clock, "redrive", "gone", "--tasks", "0")
    assert code == cli.EXIT_FAILED and "vigiljob gone not found in namespace ns" in out
    code, out = run(api, clock, "redrive", "batch", "--tasks", "5", "--dry-run", "-o", "name")
    assert (code, out, api.writes) == (cli.EXIT_OK, "vigiljob.vigil.dev/batch", [])


def test_dlq_lists_an_array_with_a_dead_task_though_it_runs():
    """An array with a dead-lettered task carries vigil.dev/dead-tasks whatever its phase (the
    operator sets it): dlq selects it beside the dead-lettered jobs, listing nothing else."""
    clock = FakeClock()
    clean = array("clean", deadLettered=0, deadLetteredIndexes="", failed=[])
    running = array()
    running["metadata"]["labels"]["vigil.dev/dead-tasks"] = "true"
    api = Api(clock, jobs=[running, clean, dead_job("poison"), sample_job("fine", phase="Running")])
    code, out = run(api, clock, "dlq", "-o", "name")
    assert (code, out) == (cli.EXIT_OK, "vigiljob.vigil.dev/poison\nvigiljob.vigil.dev/batch")
    assert api.selectors == ["vigil.dev/dead-letter=true", "vigil.dev/dead-tasks=true"]
    api.jobs_["batch"]["metadata"]["labels"]["team"] = "a"
    code, out = run(api, clock, "dlq", "-l", "team=a")
    assert api.selectors[-1] == "vigil.dev/dead-tasks=true,team=a"
    assert [line.split()[0] for line in out.splitlines()] == ["NAME", "batch"]
    assert out.splitlines()[1].split()[-2:] == ["1", "5"]


def test_status_of_an_array_shows_its_tasks():
    clock = FakeClock()
    code, out = run(Api(clock, jobs=[array()]), clock, "status", "batch")
    assert code == cli.EXIT_OK
    assert "Tasks:        1000: 979 succeeded, 9 running, 1 backing off, 10 pending, 1 dead-lettered" in out
    assert "  Dead-lettered:  5" in out and "Active tasks (10):" in out


def test_the_plugin_and_its_arrays_need_no_compiled_module():
    # release/plugin.py's zipapp can import no compiled module (pydantic, orjson): what shows an
    # array and plans its redrive, the index ranges (vigil.core.tasks.ranges) with it, loads
    # without them (the client is tests/unit/deploy/test_release.py's: kubernetes 37, here, needs
    # pydantic; the zipapp's 36 does not).
    probe = """
import sys
for name in ("pydantic", "pydantic_core", "orjson"):
    sys.modules[name] = None
from datetime import UTC, datetime
from vigil.plugin import render, report
job = {"metadata": {"name": "a", "namespace": "ns"}, "spec": {"tasks": {"count": 9}},
       "status": {"phase": "Running", "tasks": {"total": 9, "succeeded": 2, "deadLettered": 3,
                  "succeededIndexes": "0-1", "deadLetteredIndexes": "2-4"}}}
now = datetime(2026, 3, 1, tzinfo=UTC)
print(render.job_status(report.job_status(job, now), now, "table").splitlines()[3])
print(report.plan_task_redrive("a", job, "ns", report.parse_tasks("3"), now).value)
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "Tasks:        9: 2 succeeded, 0 running, 0 backing off, 0 pending, 3 dead-lettered (parallelism 10)",
        "3@1772323200",
    ]
