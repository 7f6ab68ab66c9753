"""Heartbeats end to end: the operator, and `vigil-agent` running as a real process with the
identity of the kwok pod of an attempt (a token bound to that pod), so every beat travels the
path it takes in a cluster. Crashes are SIGKILL, partitions are SIGSTOP/SIGCONT of the agent.

Timings: interval 1 s, timeout 6 s, so Uncertain after 3 s of silence and Lost after 6 s.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from kubernetes import client, config

from tests.support.agents import HEARTBEAT, JOB_ACCOUNT, grant_heartbeat_rbac, heartbeat_job, pod_token
from tests.support.cluster import Kube, event_reasons, pod_phase, read_pod, token_kubeconfig
from tests.support.jobs import condition, create, get, status, wait_phase
from tests.support.operators import OperatorProcess
from tests.support.waits import deadline, holds, wait_until

pytestmark = pytest.mark.e2e  # the operator end to end, as a process, on a real cluster


@pytest.fixture
def job_account(kube: Kube, namespace: str) -> str:
    grant_heartbeat_rbac(kube, namespace)
    return JOB_ACCOUNT


def _terminating_or_gone(kube: Kube, namespace: str, name: str) -> bool:
    pod = read_pod(kube, namespace, name)
    return pod is None or pod.metadata.deletion_timestamp is not None


def test_beats_keep_a_long_attempt_running(kube: Kube, vigil: OperatorProcess, namespace: str, job_account, agents):
    create(kube, namespace, heartbeat_job("steady"))
    agents.start(namespace, "steady-1")
    wait_phase(kube, namespace, "steady", "Running")

    # Three timeouts long: never Uncertain, never a second attempt.
    def still_running_once() -> None:
        current = status(kube, namespace, "steady")
        assert current["phase"] == "Running", current
        assert current["attempts"] == 1

    holds(still_running_once, 18)
    job = get(kube, namespace, "steady")
    assert condition(job, "HeartbeatHealthy")["status"] == "True"
    assert job["status"]["currentAttempt"].get("lastHeartbeatAt"), "LAST-BEAT is shown"


def test_a_killed_agent_makes_the_attempt_uncertain_then_lost_then_replaced(
    kube: Kube, vigil: OperatorProcess, namespace: str, job_account, agents
):
    # The old pod lingers a while when deleted, so its superseded mark can be seen.
    create(kube, namespace, heartbeat_job("crashy", **{"sim.vigil.dev/delete-delay": "30s"}))
    agent = agents.start(namespace, "crashy-1")
    wait_phase(kube, namespace, "crashy", "Running")
    wait_until(
        lambda: "vigil.dev/heartbeat" in (read_pod(kube, namespace, "crashy-1").metadata.annotations or {}),
        20,
        "a beat",
    )
    killed = time.monotonic()
    agent.signal(signal.SIGKILL)
    wait_phase(kube, namespace, "crashy", "Uncertain", 20)
    uncertain_after = time.monotonic() - killed
    job = get(kube, namespace, "crashy")
    assert condition(job, "HeartbeatHealthy")["status"] == "Unknown"
    wait_until(lambda: status(kube, namespace, "crashy").get("attempts") == 2, 30, "attempt 2 to start")
    lost_after = time.monotonic() - killed
    old = read_pod(kube, namespace, "crashy-1")
    assert old.metadata.annotations.get("vigil.dev/superseded"), "the lost attempt's pod is marked superseded"
    assert old.metadata.deletion_timestamp is not None, "and deleted"
    history = get(kube, namespace, "crashy")["status"]["history"]
    assert [(h["number"], h["outcome"]) for h in history] == [(1, "Lost")]
    # Detection latency against the configured thresholds (3 s Uncertain, 6 s Lost; 1 s backoff).
    print(f"kill -> Uncertain {uncertain_after:.1f}s, kill -> attempt 2 {lost_after:.1f}s (timeout 6s)")
    assert 2 <= uncertain_after <= deadline(6)
    assert 5 <= lost_after <= deadline(11)


def test_a_short_partition_heals_back_to_running_without_a_new_attempt(
    kube: Kube, vigil: OperatorProcess, namespace: str, job_account, agents
):
    # Uncertain after 8 s of silence, Lost after 16: a window wide enough that a loaded machine
    # (the agent thawed late, the operator's look late) cannot turn the heal into a Lost.
    create(kube, namespace, heartbeat_job("healing", heartbeat={**HEARTBEAT, "timeoutSeconds": 16}))
    agent = agents.start(namespace, "healing-1")
    wait_phase(kube, namespace, "healing", "Running")
    agent.signal(signal.SIGSTOP)
    wait_phase(kube, namespace, "healing", "Uncertain", 30)
    agent.signal(signal.SIGCONT)
    job = wait_phase(kube, namespace, "healing", "Running", 10)
    assert job["status"]["attempts"] == 1
    assert condition(job, "HeartbeatHealthy")["status"] == "True"

    # Events are posted beside the work (vigil.kube.events): soon, not at once.
    wait_until(lambda: "HeartbeatResumed" in event_reasons(kube, namespace, "healing"), 10, "a HeartbeatResumed event")


def test_a_partition_past_the_timeout_under_no_overlap(
    kube: Kube, vigil: OperatorProcess, namespace: str, job_account, agents
):
    # The old pod takes 5 s to terminate: NoOverlap must not start attempt 2 while it may still run.
    create(kube, namespace, heartbeat_job("careful", guarantee="NoOverlap", **{"sim.vigil.dev/delete-delay": "5s"}))
    agent = agents.start(namespace, "careful-1")
    wait_phase(kube, namespace, "careful", "Running")
    agent.signal(signal.SIGSTOP)
    wait_until(lambda: _terminating_or_gone(kube, namespace, "careful-1"), 30, "attempt 1 to be replaced")
    # While the old pod may still run, no second pod exists. Once it has stopped (phase Failed:
    # every container exited) it may linger a moment, held by Vigil's own finalizer, and attempt 2
    # may start. The second pod is read first: the first pod, read after it and still able to
    # run, was so when the second one already existed.
    reasons = set()

    def first_gone_and_never_beside_a_second() -> bool:
        second = read_pod(kube, namespace, "careful-2")
        first = read_pod(kube, namespace, "careful-1")
        if first is None:
            return True
        if second is not None:
            assert first.status.phase in ("Succeeded", "Failed"), (
                f"attempt 2 started while attempt 1's pod could still run (phase {first.status.phase})"
            )
        reasons.add(status(kube, namespace, "careful")["reason"])
        return False

    wait_until(first_gone_and_never_beside_a_second, 30, "attempt 1's pod to go (its delete delay is 5 s)")
    assert "WaitingForPreviousPod" in reasons, "once its backoff is over, the job says what it waits for"
    wait_until(lambda: read_pod(kube, namespace, "careful-2") is not None, 30, "attempt 2 once attempt 1's pod is gone")
    # The old agent wakes up: it finds its pod superseded or gone, and stops its child.
    agent.signal(signal.SIGCONT)
    wait_until(lambda: agent.proc.poll() is not None, 30, "the old agent to fence itself")
    assert agent.proc.returncode != 0
    assert agent.child_marker.exists(), "the old agent stopped its child"


def test_no_overlap_waits_for_a_pod_that_never_finishes_terminating(
    kube: Kube, vigil: OperatorProcess, namespace: str, job_account, agents
):
    create(kube, namespace, heartbeat_job("stuck", guarantee="NoOverlap", **{"sim.vigil.dev/never-terminate": "true"}))
    agent = agents.start(namespace, "stuck-1")
    wait_phase(kube, namespace, "stuck", "Running")
    agent.signal(signal.SIGKILL)
    wait_until(lambda: status(kube, namespace, "stuck").get("reason") == "WaitingForPreviousPod", 30, "the job to wait")
    assert "stuck-1" in status(kube, namespace, "stuck")["message"]

    def no_second_pod() -> None:
        assert read_pod(kube, namespace, "stuck-2") is None, "a second pod while the first still terminates"

    holds(no_second_pod, 8)
    kube.core.delete_namespaced_pod("stuck-1", namespace, grace_period_seconds=0)  # the node comes back
    wait_until(lambda: read_pod(kube, namespace, "stuck-2") is not None, 30, "attempt 2 once the first pod is gone")


def test_a_late_success_wins(kube: Kube, vigil: OperatorProcess, namespace: str, job_account, agents):
    # Attempt 1 goes silent and is replaced, but its pod lingers and then reports success.
    create(kube, namespace, heartbeat_job("late", **{"sim.vigil.dev/never-terminate": "true"}))
    agent = agents.start(namespace, "late-1")
    wait_phase(kube, namespace, "late", "Running")
    agent.signal(signal.SIGSTOP)
    wait_until(lambda: read_pod(kube, namespace, "late-2") is not None, 30, "attempt 2")
    old = read_pod(kube, namespace, "late-1")
    container = old.status.container_statuses[0]
    kube.core.patch_namespaced_pod_status(
        "late-1",
        namespace,
        {
            "status": {
                "phase": "Succeeded",
                "containerStatuses": [
                    {
                        "name": container.name,
                        "image": container.image,
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {
                            "terminated": {
                                "exitCode": 0,
                                "reason": "Completed",
                                "startedAt": container.state.running.started_at.isoformat(),
                                "finishedAt": container.state.running.started_at.isoformat(),
                            }
                        },
                    }
                ],
            }
        },
    )
    job = wait_phase(kube, namespace, "late", "Succeeded", 30)
    outcomes = {h["number"]: h["outcome"] for h in job["status"]["history"]}
    assert outcomes[1] == "Succeeded" and outcomes[2] == "Cancelled", job["status"]["history"]
    wait_until(lambda: _terminating_or_gone(kube, namespace, "late-2"), 30, "the replacement to be cancelled")
    agent.signal(signal.SIGCONT)


def test_a_checkpoint_reaches_status_and_the_next_attempt(
    kube: Kube, vigil: OperatorProcess, namespace: str, job_account, tmp_path: Path
):
    create(kube, namespace, heartbeat_job("resumable"))
    wait_until(lambda: pod_phase(kube, namespace, "resumable-1") == "Running", 30, "attempt 1 to run")
    # As the agent publishes what its child checkpointed: with the pod's own identity.
    pod = read_pod(kube, namespace, "resumable-1")
    token = pod_token(kube, namespace, {"name": "resumable-1", "uid": pod.metadata.uid})
    as_pod = client.CoreV1Api(
        config.new_client_from_config(str(token_kubeconfig(kube, token, tmp_path / "pod.kubeconfig")))
    )
    beat = {"vigil.dev/heartbeat": "1", "vigil.dev/checkpoint": '{"offset":42}'}
    as_pod.patch_namespaced_pod("resumable-1", namespace, {"metadata": {"annotations": beat}})
    wait_until(
        lambda: status(kube, namespace, "resumable").get("lastCheckpoint") == '{"offset":42}',
        30,
        "the checkpoint in status",
    )
    # Silence from now on: attempt 1 is lost, attempt 2 starts from the checkpoint.
    wait_until(lambda: read_pod(kube, namespace, "resumable-2") is not None, 40, "attempt 2")
    env = {e.name: e.value for e in read_pod(kube, namespace, "resumable-2").spec.containers[0].env}
    assert env["VIGIL_CHECKPOINT"] == '{"offset":42}'
    assert int(env["VIGIL_FENCING_TOKEN"]) > 1
