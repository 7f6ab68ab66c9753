"""`vigil-agent` as a real process, with the identity of a kwok pod: a token bound to that pod,
made with the TokenRequest API, so every heartbeat travels the path it takes in a cluster
(authentication, RBAC, admission)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client

from tests.support.agents import (
    AGENT,
    CHECKPOINT_ANNOTATION,
    HEARTBEAT_ANNOTATION,
    create_job_pod,
    grant_heartbeat_rbac,
    pod_token,
)
from tests.support.cluster import Kube, free_port, token_kubeconfig
from tests.support.waits import deadline, wait_until
from vigil.core.fencing import EXIT_FENCED, UNAUTHORIZED_GRACE_SECONDS

pytestmark = pytest.mark.integration


def annotations(kube: Kube, namespace: str, name: str) -> dict[str, str] | None:
    try:
        return kube.core.read_namespaced_pod(name, namespace).metadata.annotations or {}
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise


# --- the agent as a process -------------------------------------------------------------------------


@dataclass
class Agent:
    proc: subprocess.Popen
    stderr_path: Path
    workdir: Path

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def child_pid(self) -> int:
        return int(wait_until(lambda: _read(self.workdir / "pid"), 30, "the child to start"))

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(deadline(timeout))
        except subprocess.TimeoutExpired:
            pytest.fail(f"the agent did not exit within {deadline(timeout):g}s; stderr:\n{self.stderr}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# A job: writes its pid, optionally checkpoints, then waits for a "go" file and exits with its code.
CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    from vigil.agent import checkpoint
    work = Path(sys.argv[1])
    def on_term(signum, frame):
        (work / "got").write_text(signal.Signals(signum).name)
        sys.exit(int(os.environ.get("CHILD_TERM_EXIT", "0")))
    signal.signal(signal.SIGTERM, signal.SIG_IGN if os.environ.get("CHILD_IGNORE_TERM") else on_term)
    if os.environ.get("CHILD_CHECKPOINT"):
        checkpoint({"step": int(os.environ["CHILD_CHECKPOINT"]), "note": "d\\u00e9j\\u00e0"})
    (work / "pid").write_text(str(os.getpid()))
    while not (work / "go").exists():
        time.sleep(0.05)  # the job itself, polling for its go file (a child process, no test wait)
    code = (work / "go").read_text()
    if code == "SIGKILL":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(int(code))
    """
)


def start_agent(tmp_path: Path, kubeconfig: Path, namespace: str, pod: str, **env: str) -> Agent:
    workdir = tmp_path / "child"
    workdir.mkdir()
    stderr_path = tmp_path / "agent.stderr"
    full_env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "POD_NAME": pod,
        "POD_NAMESPACE": namespace,
        "VIGIL_HEARTBEAT_INTERVAL": "1",
        "VIGIL_HEARTBEAT_TIMEOUT": "60",
        "VIGIL_STOP_GRACE_SECONDS": "2",
        **env,
    }
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(
            [str(AGENT), "--", sys.executable, "-c", CHILD, str(workdir)],
            env=full_env,
            stdin=subprocess.DEVNULL,
            stderr=err,
        )
    return Agent(proc, stderr_path, workdir)


@pytest.fixture
def job_pod(kube: Kube, namespace: str, tmp_path: Path) -> tuple[str, Path]:
    """A running kwok pod as the job account, and a kubeconfig with a token bound to it."""
    grant_heartbeat_rbac(kube, namespace)
    pod = create_job_pod(kube, namespace, "job-1", **{"sim.vigil.dev/delete-delay": "30s"})
    return pod["name"], token_kubeconfig(kube, pod_token(kube, namespace, pod), tmp_path / "kubeconfig")


def test_beats_publish_the_checkpoint_and_pass_on_the_exit_code(
    kube: Kube, namespace: str, job_pod, tmp_path: Path, agents
):
    name, kubeconfig = job_pod
    agent = start_agent(tmp_path, kubeconfig, namespace, name, CHILD_CHECKPOINT="3")
    agents.add(agent)
    seen: set[str] = set()

    def beats() -> bool:
        beat = (annotations(kube, namespace, name) or {}).get(HEARTBEAT_ANNOTATION)
        if beat:
            seen.add(beat)
        return len(seen) >= 3

    wait_until(beats, 30, "three different heartbeat values")
    published = wait_until(
        lambda: (annotations(kube, namespace, name) or {}).get(CHECKPOINT_ANNOTATION), 30, "the checkpoint"
    )
    assert json.loads(published) == {"step": 3, "note": "déjà"}
    (agent.workdir / "go").write_text("7")
    assert agent.wait(30) == 7, agent.stderr


def test_a_child_killed_by_a_signal_exits_as_a_shell_reports_it(
    kube: Kube, namespace: str, job_pod, tmp_path: Path, agents
):
    name, kubeconfig = job_pod
    agent = start_agent(tmp_path, kubeconfig, namespace, name)
    agents.add(agent)
    agent.child_pid()
    (agent.workdir / "go").write_text("SIGKILL")
    assert agent.wait(30) == 128 + signal.SIGKILL, agent.stderr


def test_sigterm_to_the_agent_reaches_the_child(kube: Kube, namespace: str, job_pod, tmp_path: Path, agents):
    name, kubeconfig = job_pod
    agent = start_agent(tmp_path, kubeconfig, namespace, name, CHILD_TERM_EXIT="42")
    agents.add(agent)
    agent.child_pid()
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait(30) == 42, agent.stderr
    assert _read(agent.workdir / "got") == "SIGTERM"


def test_a_superseded_pod_stops_its_child_even_one_that_ignores_sigterm(
    kube: Kube, namespace: str, job_pod, tmp_path: Path, agents
):
    name, kubeconfig = job_pod
    agent = start_agent(tmp_path, kubeconfig, namespace, name, CHILD_IGNORE_TERM="1")
    agents.add(agent)
    pid = agent.child_pid()
    wait_until(lambda: HEARTBEAT_ANNOTATION in (annotations(kube, namespace, name) or {}), 30, "a first heartbeat")
    kube.core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": {"vigil.dev/superseded": "2"}}})
    assert agent.wait(30) == EXIT_FENCED, agent.stderr
    assert not _alive(pid)
    assert "superseded" in agent.stderr and "SIGKILL" in agent.stderr, agent.stderr


@pytest.mark.parametrize("delete_delay", ["30s", None], ids=["terminating", "gone-at-once"])
def test_deleting_the_pod_stops_the_child(kube: Kube, namespace: str, tmp_path: Path, agents, delete_delay: str | None):
    # Terminating: the agent sees deletionTimestamp. Gone at once: its pod-bound token stops
    # working (401), which after earlier successes, and for UNAUTHORIZED_GRACE_SECONDS (longer
    # than a restarted API server refuses good tokens), means the pod may be gone: under
    # NoOverlap the agent stops its child (under AtLeastOnce it only warns: an authentication
    # outage must not stop healthy work; tests/unit/agent/test_fencing.py).
    grant_heartbeat_rbac(kube, namespace)
    extra = {"sim.vigil.dev/delete-delay": delete_delay} if delete_delay else {}
    pod = create_job_pod(kube, namespace, "job-1", **extra)
    kubeconfig = token_kubeconfig(kube, pod_token(kube, namespace, pod), tmp_path / "kubeconfig")
    guarantee = "AtLeastOnce" if delete_delay else "NoOverlap"
    agent = start_agent(tmp_path, kubeconfig, namespace, pod["name"], CHILD_TERM_EXIT="0", VIGIL_GUARANTEE=guarantee)
    agents.add(agent)
    pid = agent.child_pid()
    wait_until(
        lambda: HEARTBEAT_ANNOTATION in (annotations(kube, namespace, pod["name"]) or {}), 30, "a first heartbeat"
    )
    kube.core.delete_namespaced_pod(pod["name"], namespace)
    assert agent.wait(30 + (0 if delete_delay else UNAUTHORIZED_GRACE_SECONDS)) == EXIT_FENCED, agent.stderr
    assert not _alive(pid)
    assert _read(agent.workdir / "got") == "SIGTERM"
    assert ("deleted" if delete_delay else "gone") in agent.stderr, agent.stderr


def test_unreachable_api_under_no_overlap_stops_the_child_after_the_timeout(kube: Kube, tmp_path: Path, agents):
    kubeconfig = token_kubeconfig(kube, "unused", tmp_path / "kubeconfig", server=f"https://127.0.0.1:{free_port()}")
    agent = start_agent(
        tmp_path, kubeconfig, "nowhere", "job-1", VIGIL_GUARANTEE="NoOverlap", VIGIL_HEARTBEAT_TIMEOUT="3"
    )
    agents.add(agent)
    pid = agent.child_pid()
    assert _alive(pid)
    assert agent.wait(30) == EXIT_FENCED, agent.stderr
    assert not _alive(pid)
    assert "fenced" in agent.stderr and "heartbeat failed" in agent.stderr, agent.stderr


def test_unreachable_api_under_at_least_once_keeps_the_child(kube: Kube, tmp_path: Path, agents):
    kubeconfig = token_kubeconfig(kube, "unused", tmp_path / "kubeconfig", server=f"https://127.0.0.1:{free_port()}")
    agent = start_agent(tmp_path, kubeconfig, "nowhere", "job-1", VIGIL_HEARTBEAT_TIMEOUT="3")
    agents.add(agent)
    pid = agent.child_pid()
    wait_until(lambda: "no heartbeat renewed" in agent.stderr, 30, "the agent to notice the timeout")
    # Past the timeout, and past more retries: the child still runs.
    failures = agent.stderr.count("heartbeat failed")
    wait_until(lambda: agent.stderr.count("heartbeat failed") > failures, 60, "the agent to keep trying")
    assert agent.proc.poll() is None and _alive(pid), agent.stderr
    (agent.workdir / "go").write_text("0")
    assert agent.wait(30) == 0, agent.stderr
