"""Beats to the leader when the network and the leader fail (issue 26, point 2), with real
`vigil-agent` processes beating for kwok pods (the pods' own projected tokens, audience
vigil.dev, in files as the kubelet mounts them):

- a partition between the agent and the operator (a fault proxy in front of the heartbeat
  endpoint) with the API server reachable: the agent beats by its pod's annotation, the attempt
  stays Running, and once the partition heals its beats go back to the leader;
- a graceful handover (SIGTERM) and a SIGKILL of the leader while agents beat to it, through one
  address that follows the leader as the chart's Service does: no attempt is Lost or
  replaced, and the new leader's first counted beat comes within an interval of its takeover.
  (The beats the agents send by annotation while nobody leads, or while the old leader answers
  503, reach the standby too, so this passes even without the takeover floor of
  `HeartbeatTracker.took_over`; the floor is for agents whose fallback fails as well, and its
  tests are tests/unit/core/test_liveness.py and tests/unit/controllers/test_jobs.py.)

Timings: interval 2 s, timeout 12 s (Uncertain after 6 s of silence), startup grace 4 s; an
agent's post to the leader times out after 1 s and the annotation patch follows at once.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from testbed.faults import FaultProxy
from tests.support.agents import Agents, grant_heartbeat_rbac, heartbeat_job
from tests.support.cluster import Kube, free_port, install_crds, read_pod, show_log
from tests.support.jobs import create, pods_per_attempt, status, wait_phase
from tests.support.leader_service import LeaderService
from tests.support.operators import (
    LEASE,
    OperatorProcess,
    beat_args,
    counted_beats,
    holder,
    identity,
    metric_sample,
)
from tests.support.waits import deadline, holds, wait_until
from vigil.servers.webhook import make_self_signed

pytestmark = pytest.mark.e2e

INTERVAL, TIMEOUT = 2, 12
HEARTBEAT = {"intervalSeconds": INTERVAL, "timeoutSeconds": TIMEOUT, "startupGraceSeconds": 4, "required": True}


def beat_value(kube: Kube, namespace: str, pod: str) -> str | None:
    found = read_pod(kube, namespace, pod)
    assert found is not None, f"{pod} is gone"
    return (found.metadata.annotations or {}).get("vigil.dev/heartbeat")


def to_the_leader_alone(kube: Kube, namespace: str, pods: list[str]) -> bool:
    """No annotation beat of any of the pods for two whole intervals and more: their beats go to
    the leader (an agent beats every interval, by one channel or the other)."""
    before = [beat_value(kube, namespace, pod) for pod in pods]
    time.sleep(2.5 * INTERVAL)
    return before == [beat_value(kube, namespace, pod) for pod in pods]


def test_an_agent_cut_off_from_the_leader_beats_by_its_annotation_and_stays_running(
    kube: Kube, own_namespace: str, own_operator, agents: Agents, tmp_path: Path
) -> None:
    grant_heartbeat_rbac(kube, own_namespace)
    make_self_signed(tmp_path / "certs")
    port = free_port()
    proxy = FaultProxy.start(f"beats-{own_namespace}", 0, f"127.0.0.1:{port}")
    try:
        beats_url = f"https://127.0.0.1:{proxy.port}/v1/heartbeat"
        metrics_port = free_port()
        metrics = ("--metrics-address", f"127.0.0.1:{metrics_port}", "--metrics-insecure")
        own_operator(extra_args=beat_args(tmp_path / "certs", port, beats_url) + metrics)
        create(kube, own_namespace, heartbeat_job("cut", heartbeat=HEARTBEAT))
        wait_phase(kube, own_namespace, "cut", "Running")
        agent = agents.start(own_namespace, "cut-1")
        wait_until(lambda: to_the_leader_alone(kube, own_namespace, ["cut-1"]), 30, "beats going to the leader")
        assert counted_beats(metrics_port) > 0, "no beat reached the leader"

        proxy.partition("hang")  # the agent's posts are accepted and never answered
        values = {beat_value(kube, own_namespace, "cut-1")}

        def beating_by_annotation() -> bool:
            values.add(beat_value(kube, own_namespace, "cut-1"))
            return len(values) >= 3  # two new values since the partition

        wait_until(beating_by_annotation, 4 * INTERVAL, "beats by the pod's annotation")

        # More than a whole timeout cut off from the operator: Running all along, one attempt.
        def running() -> None:
            current = status(kube, own_namespace, "cut")
            assert (current.get("phase"), current.get("attempts")) == ("Running", 1), current
            assert agent.proc.poll() is None, "the agent stopped its job"

        counted = counted_beats(metrics_port)
        holds(running, TIMEOUT + INTERVAL)
        assert counted_beats(metrics_port) == counted, "a beat reached the leader through the partition"

        proxy.heal()
        wait_until(lambda: to_the_leader_alone(kube, own_namespace, ["cut-1"]), 30, "beats back to the leader")
        assert counted_beats(metrics_port) > counted
        running()
    finally:
        proxy.stop()


def test_a_leader_at_its_connection_limit_sends_the_agent_past_it_to_the_annotation_and_both_stay_running(
    kube: Kube, own_namespace: str, own_operator, agents: Agents, tmp_path: Path
) -> None:
    """`--beat-connections 1`: the first agent's connection is held and its beats counted; the
    second is answered 503 with a Retry-After (outcome over-capacity) and beats by its pod's
    annotation from then on, without asking the leader again every beat; neither attempt is
    Uncertain, Lost or replaced."""
    grant_heartbeat_rbac(kube, own_namespace)
    make_self_signed(tmp_path / "certs")
    port, metrics_port = free_port(), free_port()
    metrics = ("--metrics-address", f"127.0.0.1:{metrics_port}", "--metrics-insecure")
    beats_url = f"https://127.0.0.1:{port}/v1/heartbeat"
    own_operator(extra_args=beat_args(tmp_path / "certs", port, beats_url) + metrics + ("--beat-connections", "1"))
    create(kube, own_namespace, heartbeat_job("held", heartbeat=HEARTBEAT))
    wait_phase(kube, own_namespace, "held", "Running")
    agents.start(own_namespace, "held-1")
    wait_until(lambda: to_the_leader_alone(kube, own_namespace, ["held-1"]), 30, "the first agent at the leader")
    assert metric_sample(metrics_port, "vigil_beat_connections") == 1
    assert metric_sample(metrics_port, "vigil_beat_connections_limit") == 1

    create(kube, own_namespace, heartbeat_job("past", heartbeat=HEARTBEAT))
    wait_phase(kube, own_namespace, "past", "Running")
    past = agents.start(own_namespace, "past-1")
    wait_until(lambda: counted_beats(metrics_port, "over-capacity") >= 1, 30, "the second agent told over-capacity")
    wait_until(lambda: "at capacity" in past.log.read_text(), 10, "the agent to say the leader is at capacity")
    values = {beat_value(kube, own_namespace, "past-1")}

    def both_running() -> None:
        values.add(beat_value(kube, own_namespace, "past-1"))
        for job in ("held", "past"):
            current = status(kube, own_namespace, job)
            assert (current.get("phase"), current.get("attempts")) == ("Running", 1), (job, current)

    counted = counted_beats(metrics_port)
    holds(both_running, TIMEOUT + INTERVAL)  # a whole timeout and more: neither goes Uncertain
    assert len(values) >= TIMEOUT // INTERVAL - 1, values  # the second beat by its annotation all along
    assert counted_beats(metrics_port) > counted  # and the first to the leader
    # Told to come back in 150-450 s, it asked the leader once in all, not once a beat.
    assert counted_beats(metrics_port, "over-capacity") == 1
    assert to_the_leader_alone(kube, own_namespace, ["held-1"])


class Replica:
    """One `vigil operator --leader-elect` with its own beat and metrics ports."""

    def __init__(self, kube: Kube, namespace: str, log: Path, certs: Path, beats_url: str) -> None:
        self.beat_port, self.metrics_port = free_port(), free_port()
        args = ("--leader-elect", "--lease-namespace", namespace, *LEASE)
        args += ("--metrics-address", f"127.0.0.1:{self.metrics_port}", "--metrics-insecure")
        args += beat_args(certs, self.beat_port, beats_url)
        self.process = OperatorProcess(kube, [namespace], log, extra_args=args)
        self.process.start()
        self.identity: str = wait_until(lambda: identity(self.process), 30, "the replica to campaign")


def test_beats_follow_the_leader_through_a_handover_and_a_sigkill_and_no_attempt_is_lost(
    kube: Kube, own_namespace: str, agents: Agents, tmp_path: Path
) -> None:
    install_crds(kube)
    grant_heartbeat_rbac(kube, own_namespace)
    make_self_signed(tmp_path / "certs")
    replicas: dict[str, Replica] = {}
    service = LeaderService(
        lambda: r.beat_port if (r := replicas.get(holder(kube, own_namespace) or "")) is not None else None
    )
    beats_url = f"https://127.0.0.1:{service.port}/v1/heartbeat"
    logs = iter(tmp_path / f"operator-{i}.log" for i in range(10))

    def replica() -> Replica:
        started = Replica(kube, own_namespace, next(logs), tmp_path / "certs", beats_url)
        replicas[started.identity] = started
        return started

    jobs = [f"j{i}" for i in range(4)]
    pods = [f"{job}-1" for job in jobs]
    try:
        replica(), replica()
        first = wait_until(lambda: holder(kube, own_namespace), 30, "a leader")
        for job in jobs:
            create(kube, own_namespace, heartbeat_job(job, heartbeat=HEARTBEAT))
        for job, pod in zip(jobs, pods, strict=True):
            wait_phase(kube, own_namespace, job, "Running")
            agents.start(own_namespace, pod)
        running_since = time.monotonic()

        def all_running() -> None:
            for job in jobs:
                current = status(kube, own_namespace, job)
                assert (current.get("phase"), current.get("attempts")) == ("Running", 1), (job, current)

        def fail_over(kill: bool, leader: str) -> tuple[str, float]:
            """The leader goes (SIGKILL, or SIGTERM: a handover); returns the new leader and how
            long after its takeover it counted its first beat."""
            wait_until(lambda: to_the_leader_alone(kube, own_namespace, pods), 30, "beats going to the leader")
            # The standby saw these pods start long ago and none of their beats to the leader
            # since: it must not count their silence from its first sight of them.
            time.sleep(max(0.0, running_since + 4 + TIMEOUT + INTERVAL - time.monotonic()))
            going = replicas.pop(leader)
            (going.process.kill if kill else going.process.stop)()
            new = wait_until(lambda: (h := holder(kube, own_namespace)) not in (None, leader) and h, 30, "a new leader")
            took_over = time.monotonic()
            wait_until(lambda: counted_beats(replicas[new].metrics_port) > 0, 10, "a beat counted by the new leader")
            first_beat = time.monotonic() - took_over
            holds(all_running, TIMEOUT + INTERVAL)  # past the new leader's first full timeout
            replica()  # a standby again for what follows
            return new, first_beat

        second, after_handover = fail_over(False, first)
        third, after_kill = fail_over(True, second)
        print(
            f"\nfirst beat counted by the new leader after its takeover: {after_handover:.2f}s after a "
            f"handover (SIGTERM), {after_kill:.2f}s after a SIGKILL (interval {INTERVAL}s); connections "
            f"the leader's address sent to each replica: {service.connections}"
        )
        assert after_handover <= deadline(1.1 * INTERVAL + 1), after_handover
        assert after_kill <= deadline(1.1 * INTERVAL + 1), after_kill
        all_running()
        per_attempt = pods_per_attempt(kube, own_namespace)
        assert sorted(attempt for _, attempt in per_attempt) == ["1"] * len(jobs), per_attempt
        assert set(per_attempt.values()) == {1}, per_attempt
    except BaseException:
        for i, live in enumerate(replicas.values()):
            show_log(live.process.log_path, lines=60 if i else 150)
        raise
    finally:
        service.close()
        for live in replicas.values():
            live.process.stop()
