"""The injected agent's pure part (which processes are the job's, when the job has started or
ended, when it is stale) and its thin part on fake inputs: scans, clocks, a real loopback port."""

from __future__ import annotations

import os
import signal
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vigil.agent import heart as agent_heart
from vigil.agent import runner, sidecar
from vigil.agent.sidecar import (
    JobProcesses,
    JobState,
    Proc,
    Touches,
    image_agent_warning,
    job_processes,
    read_procs,
    stale_for,
)

pytestmark = pytest.mark.unit

OWN = 40  # the agent's PID in these scans
PAUSE = Proc(1, 0, "S", ("/pause",))
AGENT = Proc(OWN, 0, "S", ("/opt/vigil/bin/python3", "/opt/vigil/bin/vigil-agent", "--sidecar"))


def test_the_job_is_every_process_but_the_pause_process_and_the_agent() -> None:
    job = [Proc(7, 0, "S", ("sh", "-c", "work")), Proc(9, 7, "R", ("work",))]
    assert job_processes([PAUSE, AGENT, *job], OWN) == {7, 9}


def test_pid_1_is_the_job_when_it_is_not_a_pause_process() -> None:
    # podman --pid container:JOB, or a pod without shareProcessNamespace's pause: the job is init.
    assert job_processes([Proc(1, 0, "S", ("sleep", "3600")), AGENT], OWN) == {1}
    assert job_processes([Proc(1, 0, "S", ("/catatonit", "-P")), AGENT], OWN) == frozenset()
    # Only PID 1 is taken for the pod's infrastructure: a job's own `pause` binary elsewhere counts.
    assert job_processes([PAUSE, Proc(5, 0, "S", ("/usr/bin/pause",)), AGENT], OWN) == {5}


def test_the_agents_descendants_another_injected_agent_and_zombies_are_not_the_job() -> None:
    procs = [
        PAUSE,
        AGENT,
        Proc(41, OWN, "S", ("helper",)),
        Proc(42, 41, "S", ("grandchild",)),
        Proc(50, 0, "S", ("vigil-agent", "--sidecar")),  # a second agent (an earlier restart)
        Proc(60, 0, "Z", ("defunct",)),
        Proc(61, 0, "S", ("vigil-agent", "--", "job")),  # the in-image agent is the job's own
    ]
    assert job_processes(procs, OWN) == {61}


@given(
    st.lists(
        st.tuples(st.integers(2, 60), st.integers(0, 60), st.sampled_from("RSDZ"), st.booleans()),
        unique_by=lambda t: t[0],
        max_size=25,
    )
)
def test_the_job_never_holds_the_agent_its_descendants_or_pid_1_pause(rows) -> None:
    procs = [PAUSE, AGENT, *(Proc(pid, ppid, state, ("x",)) for pid, ppid, state, _ in rows if pid != OWN)]
    found = job_processes(procs, OWN)
    assert found <= {p.pid for p in procs} - {1, OWN}
    # a descendant of the agent, however deep, is never the job's
    parents = {p.pid: p.ppid for p in procs}
    for pid in found:
        seen, at = set(), pid
        while at in parents and at not in seen:
            assert at != OWN
            seen.add(at)
            at = parents[at]
        assert {p.pid: p for p in procs}[pid].state != "Z"


def test_the_job_waits_runs_then_ends_and_a_gap_before_it_starts_is_not_its_end() -> None:
    state = JobState(started_at=100.0, startup_grace=30.0)
    assert state.update(False, 100.0) == JobState.WAITING
    assert state.update(False, 129.9) == JobState.WAITING
    assert state.update(True, 129.95) == JobState.RUNNING
    assert state.first_seen_at == 129.95
    assert state.update(True, 500.0) == JobState.RUNNING  # no limit once it runs
    assert state.update(False, 500.5) == JobState.ENDED


def test_a_job_that_never_appears_within_the_grace_never_started() -> None:
    state = JobState(started_at=100.0, startup_grace=30.0)
    assert state.update(False, 130.0) == JobState.NEVER_STARTED


@given(
    first=st.one_of(st.none(), st.floats(0, 1e6)),
    touch=st.one_of(st.none(), st.floats(0, 1e6)),
    elapsed=st.floats(0, 1e4),
    timeout=st.floats(1, 1e3),
)
def test_stale_exactly_when_the_newest_touch_or_the_start_is_a_timeout_old(first, touch, elapsed, timeout) -> None:
    since = touch if touch is not None else first
    now = (since or 0.0) + elapsed
    silent = stale_for(now, first, touch, timeout)
    if since is None:
        assert silent is None  # nothing to judge before the job runs
    elif now - since >= timeout:
        assert silent == now - since
    else:
        assert silent is None


def test_a_touch_resets_the_staleness() -> None:
    assert stale_for(200.0, first_seen_at=100.0, last_touch_at=None, timeout=60.0) == 100.0
    assert stale_for(200.0, first_seen_at=100.0, last_touch_at=150.0, timeout=60.0) is None
    assert stale_for(200.0, first_seen_at=100.0, last_touch_at=140.0, timeout=60.0) == 60.0


# --- the thin part, on fake scans and clocks ---------------------------------------------------------


class Ticks:
    """A monotonic clock that moves one second per reading."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_wait_returns_0_once_the_jobs_processes_have_all_gone() -> None:
    job = [Proc(7, 0, "S", ("work",))]
    scans = iter([[PAUSE, AGENT], [PAUSE, AGENT, *job], [PAUSE, AGENT, *job], [PAUSE, AGENT]])
    processes = JobProcesses(startup_grace=100.0, scan=lambda: next(scans), own_pid=OWN, clock=Ticks(), poll=0)
    assert processes.wait() == 0
    assert processes.state.first_seen_at is not None


def test_wait_gives_up_with_a_usage_error_when_no_job_process_appears() -> None:
    processes = JobProcesses(startup_grace=5.0, scan=lambda: [PAUSE, AGENT], own_pid=OWN, clock=Ticks(), poll=0)
    assert processes.wait() == runner.EXIT_USAGE


def test_release_ends_the_wait_as_the_kubelet_stopping_the_pod() -> None:
    processes = JobProcesses(startup_grace=1e9, scan=lambda: [PAUSE, AGENT], own_pid=OWN, clock=Ticks(), poll=0)
    processes.release()
    assert processes.wait() == 0


def test_signal_reaches_every_job_process_and_a_refusal_is_told_once(monkeypatch, capsys) -> None:
    job = [Proc(7, 0, "S", ("work",)), Proc(8, 7, "S", ("child",)), Proc(9, 0, "S", ("other",))]
    sent: list[tuple[int, int]] = []

    def kill(pid: int, signum: int) -> None:
        sent.append((pid, signum))
        if pid == 9:
            raise PermissionError(1, "Operation not permitted")
        if pid == 8:
            raise ProcessLookupError(3, "gone")

    monkeypatch.setattr(sidecar.os, "kill", kill)
    processes = JobProcesses(startup_grace=1.0, scan=lambda: [PAUSE, AGENT, *job], own_pid=OWN, clock=Ticks())
    processes.signal(signal.SIGTERM)
    processes.signal(signal.SIGKILL)
    assert sorted(sent) == sorted([(p, s) for p in (7, 8, 9) for s in (signal.SIGTERM, signal.SIGKILL)])
    assert capsys.readouterr().err.count("cannot signal the job's process 9") == 1


def test_read_procs_finds_this_process_and_its_command_line() -> None:
    mine = {p.pid: p for p in read_procs()}[os.getpid()]
    assert mine.ppid == os.getppid() and mine.state in "RS"
    assert mine.argv and "python" in os.path.basename(mine.argv[0])


def test_read_procs_reads_a_command_name_with_spaces_and_parentheses(tmp_path: Path) -> None:
    (tmp_path / "12").mkdir()
    (tmp_path / "12" / "stat").write_text("12 (a (b) c) S 3 12 12 0 -1\n")
    (tmp_path / "12" / "cmdline").write_bytes(b"/bin/a\0-x\0")
    (tmp_path / "self").mkdir()  # not a PID: skipped
    (tmp_path / "13").mkdir()  # exited meanwhile: nothing to read, skipped
    assert read_procs(tmp_path) == [Proc(12, 3, "S", ("/bin/a", "-x"))]


def test_the_liveness_file_counts_by_its_age_on_the_monotonic_clock(tmp_path: Path) -> None:
    alive = tmp_path / "alive"
    touches = Touches(str(alive), None, clock=lambda: 500.0, wall=lambda: 10_000.0)
    assert touches.watched and touches.last_at() is None  # not touched yet
    alive.touch()
    os.utime(alive, (9_990.0, 9_990.0))  # touched 10 s ago by the wall clock
    assert touches.last_at() == 490.0


def test_no_liveness_source_means_the_process_alone_decides() -> None:
    assert not Touches("", None).watched


def test_the_liveness_port_counts_a_get_or_post_of_beat_and_nothing_else() -> None:
    now = [100.0]
    touches = Touches("", 0, clock=lambda: now[0])  # port 0: any free port, for the test
    assert touches.server is not None
    port = touches.server.server_address[1]
    try:
        assert touches.watched and touches.last_at() is None
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=5)
        assert refused.value.code == 404 and touches.last_at() is None
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/beat", timeout=5) as answer:
            assert answer.status == 204
        assert touches.last_at() == 100.0
        now[0] = 130.0
        posted = urllib.request.Request(f"http://127.0.0.1:{port}/beat", data=b"", method="POST")
        with urllib.request.urlopen(posted, timeout=5) as answer:
            assert answer.status == 204
        assert touches.last_at() == 130.0
    finally:
        touches.close()


def test_the_heart_holds_its_beat_back_while_the_gate_says_why(capsys) -> None:
    settings = agent_heart.Settings(pod_name="p", namespace="n")
    why = ["the job has not touched its liveness file or port for 61s"]
    heart = agent_heart.Heart(settings, None, None, None, gate=lambda: why[0])  # type: ignore[arg-type]
    assert heart.holds_back() and heart.holds_back()
    why[0] = ""
    assert not heart.holds_back()
    err = capsys.readouterr().err
    assert err.count("not beating: the job has not touched") == 1 and err.count("beating again") == 1
    assert heart.new_checkpoint() == (None, None)  # no checkpoint file: the injected agent has none


def test_sidecar_takes_no_command() -> None:
    assert runner.main(["--sidecar", "sleep", "1"]) == runner.EXIT_USAGE


def test_sidecar_without_its_pod_is_a_usage_error(monkeypatch) -> None:
    monkeypatch.delenv("POD_NAME", raising=False)
    assert runner.main(["--sidecar"]) == runner.EXIT_USAGE


def test_a_job_that_runs_its_own_agent_is_told_once_and_still_watched(capsys) -> None:
    in_image = Proc(61, 0, "S", ("/usr/local/bin/python3", "/usr/local/bin/vigil-agent", "--", "job"))
    child = Proc(62, 61, "S", ("job",))
    procs = [PAUSE, AGENT, in_image, child]
    job = job_processes(procs, OWN)
    assert job == {61, 62}  # still the job's: watched, and stopped when fenced
    warning = image_agent_warning(procs, job)
    assert warning is not None and "pid 61" in warning and "heartbeat.agent: Image" in warning
    plain = [PAUSE, AGENT, Proc(7, 0, "S", ("sh", "-c", "vigil-agent is only a word here"))]
    assert image_agent_warning(plain, job_processes(plain, OWN)) is None
    processes = JobProcesses(60, scan=lambda: procs, own_pid=OWN)
    processes.pids()
    processes.pids()
    assert capsys.readouterr().err.count("runs its own vigil-agent") == 1
