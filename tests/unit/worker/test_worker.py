"""The worker's thin part (vigil.worker.runner, vigil.worker.handlers) against a fake leader served
in-process over HTTPS: tasks run as `python -c` processes with the lease's env, their exit codes,
checkpoints, cancel (SIGTERM, then SIGKILL), self-fencing, a 503's Retry-After, the token re-read,
the drain on SIGTERM, the command line, and tasks that are a function call."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support.pull_leader import JOB_UID, FakeLeader, leader, lease_of
from tests.support.waits import wait_until
from vigil.servers.webhook import make_self_signed
from vigil.worker import TaskFailed
from vigil.worker.client import ConfigError, Reply, Settings
from vigil.worker.handlers import HandlerRunner, Task
from vigil.worker.runner import ProcessRunner, Worker

pytestmark = pytest.mark.unit

TOKEN = "token-one.secret-part"

TASK = r"""
import json, os, signal, sys, time
item = json.loads(os.environ.get("VIGIL_TASK_ITEM") or "{}")
out, index = os.environ["OUT_DIR"], os.environ["VIGIL_TASK_INDEX"]
if item.get("ignore_term"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if "checkpoint" in item:
    from vigil.agent import checkpoint
    checkpoint(item["checkpoint"])
for name, text in (("env", json.dumps(dict(os.environ))), ("pid", str(os.getpid()))):
    with open(os.path.join(out, f"{index}.{name}.tmp"), "w") as f:
        f.write(text)
    os.replace(os.path.join(out, f"{index}.{name}.tmp"), os.path.join(out, f"{index}.{name}"))
if item.get("wait_for"):
    while not os.path.exists(item["wait_for"]):
        time.sleep(0.02)
if item.get("sleep"):
    time.sleep(item["sleep"])
sys.exit(item.get("exit", 0))
"""


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("certs")
    make_self_signed(directory)
    return directory


@pytest.fixture
def out(tmp_path: Path) -> Path:
    directory = tmp_path / "out"
    directory.mkdir()
    return directory


def pool_env(fake: FakeLeader, certs: Path, tmp_path: Path, slots: int = 2) -> dict[str, str]:
    token = tmp_path / "token"
    if not token.exists():
        token.write_text(TOKEN + "\n")
    return {
        **os.environ,
        "VIGIL_PULL_URL": fake.url,
        "VIGIL_PULL_CA": (certs / "ca.crt").read_text(),
        "VIGIL_PULL_TOKEN_FILE": str(token),
        "VIGIL_POOL": "etl-pool",
        "VIGIL_POOL_SLOTS": str(slots),
        "VIGIL_POD_NAME": "etl-pool-x7k2q",
        "VIGIL_POD_NAMESPACE": "team-a",
        "VIGIL_POD_UID": "pod-uid-1",
    }


@contextlib.contextmanager
def running(worker: Worker, *, drain: bool = True, within: float = 30.0):
    """Runs the worker on a thread; on the way out drains it and checks it ended with 0."""
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(worker.run()), daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        if drain:
            worker.drain()
        thread.join(within)
        assert not thread.is_alive(), "the worker did not stop"
    assert codes == [0]


def process_worker(fake, certs, tmp_path, out, *, slots=2, grace=5.0, **env_over) -> Worker:
    env = {**pool_env(fake, certs, tmp_path, slots), "OUT_DIR": str(out), "WORKERS_OWN": "kept", **env_over}
    settings = Settings.from_env(env)
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    return Worker(settings, ProcessRunner([sys.executable, "-c", TASK], env, workdir), grace=grace, wait_seconds=2)


def task_env(out: Path, index: int) -> dict[str, str]:
    return json.loads((out / f"{index}.env").read_text())


# --- processes -----------------------------------------------------------------------------------------


def test_each_task_runs_as_a_process_with_the_leases_env_and_its_exit_code_is_reported(certs, tmp_path, out, caplog):
    caplog.set_level(logging.INFO, logger="vigil.worker")
    with leader(certs) as fake:
        for index, item in enumerate([{"exit": 0}, {"exit": 3}, {"exit": 0, "sleep": 0.2}, {"exit": 42}]):
            fake.add(index, item=item)
        with running(process_worker(fake, certs, tmp_path, out, slots=2)):
            fake.wait_for(lambda: len(fake.results) == 4)
            fake.wait_for(lambda: all(not r["results"] for r in fake.requests[-1:]))  # all acked
        assert {lease[1]: r["exitCode"] for lease, r in fake.results.items()} == {0: 0, 1: 3, 2: 0, 3: 42}
        assert fake.results[lease_of(1)]["message"] == "exit code 3"
        assert fake.max_held <= 2  # never more than its slots at once
        env = task_env(out, 1)
        assert env["VIGIL_TASK_INDEX"] == "1" and env["VIGIL_IDEMPOTENCY_KEY"] == f"{JOB_UID}-1"
        assert env["VIGIL_ATTEMPT"] == "1" and env["VIGIL_JOB"] == "etl" and env["VIGIL_TASK_ITEM"] == '{"exit": 3}'
        assert env["WORKERS_OWN"] == "kept"  # the worker's own env under the lease's
        assert env["VIGIL_CHECKPOINT_FILE"] != task_env(out, 0)["VIGIL_CHECKPOINT_FILE"]  # a file per task
        first = min(fake.requests, key=lambda r: r["seq"])
        assert first["pod"] == {"namespace": "team-a", "name": "etl-pool-x7k2q", "uid": "pod-uid-1"}
        assert (first["seq"], first["seen"], first["_path"]) == (1, 0, "/v1/pull")
        assert sorted(r["seq"] for r in fake.requests) == list(range(1, len(fake.requests) + 1))
        assert {r["_token"] for r in fake.requests} == {TOKEN}
    lines = [r.getMessage() for r in caplog.records]
    assert sum(line.startswith("task started: team-a/etl index") for line in lines) == 4
    assert sum(line.startswith("task ended: team-a/etl index") for line in lines) == 4
    assert any("index 1 attempt 1" in line and "exit code 3" in line for line in lines)
    assert not any(TOKEN in line or "secret-part" in line for line in lines)


def test_a_checkpoint_written_by_the_task_is_sent_before_or_with_its_result(certs, tmp_path, out):
    with leader(certs) as fake:
        lease = fake.add(0, item={"checkpoint": {"row": 1200}}, checkpoint='{"row": 7}')
        with running(process_worker(fake, certs, tmp_path, out)):
            fake.wait_for(lambda: lease in fake.results)
        assert fake.checkpoints[lease][-1] == '{"row":1200}'
        assert task_env(out, 0)["VIGIL_CHECKPOINT"] == '{"row": 7}'
        sent_with = next(r for r in fake.requests if r["results"])
        first_cp = next(r for r in fake.requests if r["checkpoints"])
        assert first_cp["seq"] <= sent_with["seq"]


def test_a_result_is_reported_at_once_not_at_the_next_beat_and_beats_go_on_during_a_long_poll(certs, tmp_path, out):
    with leader(certs, beat=0.3, max_hold=60) as fake:
        worker = process_worker(fake, certs, tmp_path, out, slots=1)
        worker.wait_seconds = 20
        with running(worker):
            # nothing ready: the claim is held by the leader, the beats go on beside it
            fake.wait_for(lambda: sum(r["free"] == 0 for r in fake.requests) >= 3)
            assert any(r["free"] == 1 and r["waitSeconds"] == 20 for r in fake.requests)
            fake.beat = 600.0  # from the next answers on, no beat is due for ten minutes
            count = len(fake.requests)
            fake.wait_for(lambda: any(r["free"] == 0 for r in fake.requests[count:]))  # answered with it
            lease = fake.add(0, item={"sleep": 0.2})
            fake.wait_for(lambda: lease in fake.results)  # the task's end brought the request, not a beat


def test_a_cancelled_task_gets_sigterm_then_sigkill_after_its_grace_and_its_exit_code_is_reported(certs, tmp_path, out):
    with leader(certs) as fake:
        stubborn = fake.add(0, item={"ignore_term": True, "sleep": 600}, grace=0.5)
        polite = fake.add(1, item={"sleep": 600}, grace=30)
        with running(process_worker(fake, certs, tmp_path, out)):
            fake.wait_for(lambda: (out / "0.pid").exists() and (out / "1.pid").exists())
            fake.cancel(stubborn)
            fake.cancel(polite)
            fake.wait_for(lambda: stubborn in fake.results and polite in fake.results)
        assert fake.results[stubborn]["exitCode"] == 128 + signal.SIGKILL
        assert fake.results[polite]["exitCode"] == 128 + signal.SIGTERM
        assert fake.results[polite]["message"] == "killed by SIGTERM"


def test_with_no_200_for_lease_seconds_the_worker_stops_its_tasks_and_forgets_their_leases(certs, tmp_path, out):
    with leader(certs, lease=1.5) as fake:
        lease = fake.add(0, item={"sleep": 600}, grace=0.5)
        with running(process_worker(fake, certs, tmp_path, out)):
            fake.wait_for(lambda: (out / "0.pid").exists() and lease in fake.held())
            pid = int((out / "0.pid").read_text())
            fake.status = 500
            fake.wait_for(lambda: not _alive(pid))  # stopped by the worker itself
            count = len(fake.requests)
            fake.status = 200
            fake.wait_for(lambda: len(fake.requests) > count + 2)
        assert all(list(lease) not in r["held"] for r in fake.requests[count:])
        assert lease not in fake.results  # forgotten: its end is not reported


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie not yet reaped by the worker's waiter counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


class Frozen:
    """A monotonic clock that moves only when the test moves it (the worker's waits stay real)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_503s_retry_after_is_honoured(certs, tmp_path, out):
    clock = Frozen()
    with leader(certs) as fake:
        fake.status, fake.retry_after = 503, "5"
        worker = process_worker(fake, certs, tmp_path, out)
        worker.clock = clock
        with running(worker):
            fake.wait_for(lambda: worker.state.rest_until == 1005.0)  # the 503 taken: no request before 1005
            count = len(fake.requests)
            assert count <= 2  # the claim, and perhaps the first beat beside it
            clock.now = 1004.9
            threading.Event().wait(0.5)  # nothing may come meanwhile: the clock says it is not time yet
            assert len(fake.requests) == count
            fake.status = 200
            lease = fake.add(0)
            clock.now = 1005.0
            fake.wait_for(lambda: len(fake.requests) > count)
            clock.now = 1010.0  # and on, as time goes
            fake.wait_for(lambda: lease in fake.results)


def test_the_token_is_read_again_before_each_request(certs, tmp_path, out):
    with leader(certs) as fake:
        worker = process_worker(fake, certs, tmp_path, out)
        with running(worker):
            fake.wait_for(lambda: len(fake.requests) >= 2)
            (tmp_path / "token").write_text("token-two\n")
            fake.wait_for(lambda: fake.requests[-1]["_token"] == "token-two")


def test_on_drain_tasks_finish_within_the_grace_or_are_stopped_then_reported(certs, tmp_path, out):
    with leader(certs) as fake:
        quick = fake.add(0, item={"wait_for": str(out / "go")})
        slow = fake.add(1, item={"sleep": 600}, grace=5)
        worker = process_worker(fake, certs, tmp_path, out, grace=1.0)
        with running(worker, drain=False):
            fake.wait_for(lambda: (out / "0.pid").exists() and (out / "1.pid").exists())
            worker.drain()
            count = len(fake.requests)
            fake.wait_for(lambda: len(fake.requests) > count + 1)
            (out / "go").touch()
        assert fake.results[quick]["exitCode"] == 0  # finished within the grace
        assert fake.results[slow]["exitCode"] == 128 + signal.SIGTERM  # stopped at its end
        assert all(r["free"] == 0 for r in fake.requests[count:])  # no claim since the drain
        assert worker.state.results == {}  # every result acked before the exit


# --- the command line ---------------------------------------------------------------------------------------


def test_vigil_worker_runs_the_command_and_drains_on_sigterm(certs, tmp_path, out):
    with leader(certs) as fake:
        lease = fake.add(0, item={"exit": 5})
        env = {**pool_env(fake, certs, tmp_path, slots=3), "OUT_DIR": str(out)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "vigil.worker", "--slots", "1", "--grace", "2", "--", sys.executable, "-c", TASK],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            fake.wait_for(lambda: lease in fake.results)
            assert all(r["free"] <= 1 for r in fake.requests)  # --slots over VIGIL_POOL_SLOTS
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, err
        assert fake.results[lease]["exitCode"] == 5
        assert "task started: team-a/etl index 0 attempt 1" in err and "stopping: no more claims" in err
        assert TOKEN not in err


def test_a_missing_variable_is_named_and_exits_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
    env |= {"VIGIL_PULL_URL": "https://leader:8443/v1/pull", "VIGIL_PULL_CA": "", "VIGIL_POD_NAME": "p"}
    result = subprocess.run(
        [sys.executable, "-m", "vigil.worker", "--", "true"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "VIGIL_PULL_TOKEN_FILE" in result.stderr and "VIGIL_POD_NAMESPACE" in result.stderr
    assert "VIGIL_POOL_SLOTS" in result.stderr and "VIGIL_PULL_URL" not in result.stderr.split("not set")[0]
    usage = subprocess.run([sys.executable, "-m", "vigil.worker"], env=env, capture_output=True, text=True)
    assert usage.returncode == 2 and "no command" in usage.stderr


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({"VIGIL_PULL_URL": "http://leader/v1/pull"}, "not an https://"),
        ({"VIGIL_POOL_SLOTS": "many"}, "VIGIL_POOL_SLOTS='many'"),
        ({"VIGIL_POOL_SLOTS": "0"}, "from 1 to"),
    ],
)
def test_settings_are_checked(tmp_path, over, says):
    env = {
        "VIGIL_PULL_URL": "https://leader:8443/v1/pull",
        "VIGIL_PULL_CA": "",
        "VIGIL_PULL_TOKEN_FILE": "/t",
        "VIGIL_POD_NAME": "p",
        "VIGIL_POD_NAMESPACE": "n",
        "VIGIL_POD_UID": "u",
        "VIGIL_POOL_SLOTS": "2",
    }
    assert Settings.from_env(env).slots == 2 and Settings.from_env(env, 5).slots == 5
    with pytest.raises(ConfigError, match=says):
        Settings.from_env(env | over)


# --- function calls -------------------------------------------------------------------------------------------


def test_handlers_results_exceptions_checkpoints_and_cancel(certs, tmp_path):
    seen: dict[int, Task] = {}
    go = threading.Event()

    def handle(task: Task) -> None:
        seen[task.index] = task
        if task.item == "fail":
            raise TaskFailed(3, "bad row")
        if task.item == "boom":
            raise ValueError("boom")
        if isinstance(task.item, dict) and "checkpoint" in task.item:
            task.checkpoint(task.item["checkpoint"])
        if task.item == "wait":
            assert task.cancelled.wait(30)
            raise TaskFailed(143, "cancelled")
        go.wait(30)

    with leader(certs) as fake:
        fine = fake.add(0, item={"checkpoint": {"row": 3}}, checkpoint='{"row": 1}')
        failed = fake.add(1, item="fail")
        boom = fake.add(2, item="boom")
        cancelled = fake.add(3, item="wait")
        settings = Settings.from_env(pool_env(fake, certs, tmp_path, slots=4))
        worker = Worker(settings, HandlerRunner(handle, settings.slots), grace=5.0, wait_seconds=2)
        with running(worker):
            fake.wait_for(lambda: failed in fake.results and boom in fake.results and cancelled in fake.held())
            fake.cancel(cancelled)
            fake.wait_for(lambda: cancelled in fake.results)
            go.set()
            fake.wait_for(lambda: fine in fake.results)
        assert fake.results[fine]["exitCode"] == 0 and fake.checkpoints[fine][-1] == '{"row":3}'
        assert (fake.results[failed]["exitCode"], fake.results[failed]["message"]) == (3, "bad row")
        assert (fake.results[boom]["exitCode"], fake.results[boom]["message"]) == (1, "ValueError: boom")
        assert fake.results[cancelled]["exitCode"] == 143
        task = seen[0]
        assert (task.index, task.count, task.attempt) == (0, 200, 1)
        assert task.item == {"checkpoint": {"row": 3}} and seen[1].item == "fail"
        assert task.previous_checkpoint == {"row": 1} and task.idempotency_key == f"{JOB_UID}-0"


SERVE = """
import os, sys, vigil.worker
def handle(task):
    open(os.path.join(os.environ["OUT_DIR"], str(task.index)), "w").write(repr(task.item))
    if task.item == "fail":
        raise vigil.worker.TaskFailed(7, "no")
vigil.worker.serve(handle, slots=1)
print("served", file=sys.stderr)
"""


def test_serve_runs_the_handler_until_sigterm(certs, tmp_path, out):
    with leader(certs) as fake:
        ok, failed = fake.add(0, item={"a": 1}), fake.add(1, item="fail")
        env = {**pool_env(fake, certs, tmp_path), "OUT_DIR": str(out)}
        proc = subprocess.Popen([sys.executable, "-c", SERVE], env=env, stderr=subprocess.PIPE, text=True)
        try:
            fake.wait_for(lambda: ok in fake.results and failed in fake.results)
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0 and "served" in err, err
        assert (fake.results[ok]["exitCode"], fake.results[failed]["exitCode"]) == (0, 7)
        assert (out / "0").read_text() == "{'a': 1}"


def test_the_workers_entry_points_import_no_aiohttp_nor_the_kubernetes_client():
    code = (
        "import sys; import vigil.worker, vigil.worker.runner, vigil.worker.handlers; "
        "sys.exit(int(any(m.split('.')[0] in ('aiohttp', 'kubernetes') for m in sys.modules)))"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_a_request_that_fails_unexpectedly_leaves_the_flight_and_the_worker_goes_on(tmp_path, caplog):
    class Client:
        def __init__(self) -> None:
            self.bodies: list[dict] = []

        def post(self, body: bytes, timeout: float) -> Reply:
            self.bodies.append(json.loads(body))
            if len(self.bodies) <= 2:
                raise RuntimeError("a bug")
            answer = {"leases": [], "cancel": [], "acked": [], "beatSeconds": 0.05, "leaseSeconds": 30}
            return Reply(200, json.dumps(answer).encode(), None)

        def close(self) -> None:
            pass

    env = {
        "VIGIL_PULL_URL": "https://leader:8443/v1/pull",
        "VIGIL_PULL_CA": "",
        "VIGIL_PULL_TOKEN_FILE": str(tmp_path / "token"),
        "VIGIL_POD_NAME": "p",
        "VIGIL_POD_NAMESPACE": "n",
        "VIGIL_POD_UID": "u",
        "VIGIL_POOL_SLOTS": "1",
    }
    client = Client()
    worker = Worker(
        Settings.from_env(env),
        HandlerRunner(lambda task: None, 1),
        client=client,
        wait_seconds=0,  # type: ignore[arg-type]
    )
    with running(worker):
        wait_until(lambda: any(b["seen"] >= 2 for b in list(client.bodies)), 20, "a request past the failed one", 0.02)
    assert "failed unexpectedly" in caplog.text
