"""When the network between the operator and the API server lies, healthy work is not killed.

The operator runs as a process that reaches the API server only through a fault proxy
(`testbed.faults`); agents run as real processes with their pods' identities and reach the API
server directly, so they keep beating while the operator's view is broken. Each test asserts
what users rely on: no healthy attempt is declared Lost or stopped, no attempt number gets a
second pod, and the job is Running again (and other jobs are served) once the network heals.

Timings: heartbeat interval 1 s, timeout 6 s; each fault lasts two timeouts.
"""

from __future__ import annotations

import time

import pytest

from tests.support.agents import HEARTBEAT, Agents, PodAgent, grant_heartbeat_rbac, heartbeat_job
from tests.support.cluster import Kube, pod_phase, proxy_to_api_server
from tests.support.jobs import create, get, status, vigil_job, wait_phase
from tests.support.waits import holds, wait_until

pytestmark = pytest.mark.e2e

FAULT_SECONDS = 2 * HEARTBEAT["timeoutSeconds"]


@pytest.fixture
def proxied(own_operator):
    """(operator, proxy): `vigil operator` for the test's own namespace, through a fault proxy."""
    return own_operator(proxied=True)


def _assert_untouched(kube: Kube, namespace: str, name: str, agent: PodAgent) -> None:
    """The attempt was never judged Lost, never replaced, and its child never stopped."""
    job = status(kube, namespace, name)
    assert job.get("attempts") == 1, f"{name} was replaced: {job}"
    assert not job.get("history"), f"{name} closed an attempt: {job.get('history')}"
    assert not agent.child_marker.exists(), f"{name}'s child was stopped"
    assert agent.proc.poll() is None, f"{name}'s agent exited with {agent.proc.returncode}"
    uid = get(kube, namespace, name)["metadata"]["uid"]
    pods = kube.core.list_namespaced_pod(namespace, label_selector=f"vigil.dev/job-uid={uid}")
    assert [p.metadata.name for p in pods.items] == [f"{name}-1"]
    assert pods.items[0].metadata.deletion_timestamp is None
    assert "vigil.dev/superseded" not in (pods.items[0].metadata.annotations or {})


def _start_beating(kube: Kube, namespace: str, agents: Agents) -> dict[str, PodAgent]:
    running = {}
    grant_heartbeat_rbac(kube, namespace)
    for name, guarantee in (("steady", "AtLeastOnce"), ("careful", "NoOverlap")):
        create(kube, namespace, heartbeat_job(name, guarantee=guarantee))
    for name in ("steady", "careful"):
        running[name] = agents.start(namespace, f"{name}-1")
        wait_phase(kube, namespace, name, "Running", timeout=30)
    return running


def test_a_stalled_watch_kills_nothing_and_other_jobs_go_on(kube: Kube, own_namespace: str, proxied, agents):
    operator, proxy = proxied
    running = _start_beating(kube, own_namespace, agents)
    proxy.stall()  # every open connection of the operator freezes half-open; new ones work
    began = time.monotonic()
    create(kube, own_namespace, vigil_job("meanwhile", exit_code="0", run_for="2s"))
    # The operator keeps serving through new connections while its watches are frozen.
    wait_phase(kube, own_namespace, "meanwhile", "Succeeded", timeout=90)

    # The claim is that nothing happens for two timeouts.
    def untouched() -> None:
        for name, agent in running.items():
            _assert_untouched(kube, own_namespace, name, agent)

    holds(untouched, FAULT_SECONDS - (time.monotonic() - began), interval=1)
    proxy.heal()
    for name, agent in running.items():
        wait_phase(kube, own_namespace, name, "Running", timeout=30)
        _assert_untouched(kube, own_namespace, name, agent)
    log = operator.log_path.read_text(errors="replace")
    assert "contradicts the watch" in log or "watch stalled" in log, "the operator noticed its eyes failed"


def test_a_full_partition_kills_nothing(kube: Kube, own_namespace: str, proxied, agents):
    operator, proxy = proxied
    running = _start_beating(kube, own_namespace, agents)
    proxy.partition()  # open connections freeze, new ones hang: the operator is cut off
    create(kube, own_namespace, vigil_job("meanwhile", exit_code="0", run_for="2s"))

    def untouched() -> None:  # nothing may change while it cannot see
        for name, agent in running.items():
            _assert_untouched(kube, own_namespace, name, agent)

    holds(untouched, FAULT_SECONDS, interval=1)
    proxy.heal()
    wait_phase(kube, own_namespace, "meanwhile", "Succeeded", timeout=90)
    for name, agent in running.items():
        wait_phase(kube, own_namespace, name, "Running", timeout=60)
        _assert_untouched(kube, own_namespace, name, agent)


def test_an_agent_cut_off_is_replaced_and_under_no_overlap_fences_itself_first(
    kube: Kube, own_namespace: str, proxied, agents
):
    operator, _ = proxied
    grant_heartbeat_rbac(kube, own_namespace)
    with proxy_to_api_server(kube, f"agent-{own_namespace}") as agent_link:
        create(kube, own_namespace, heartbeat_job("island", guarantee="NoOverlap"))
        agent = agents.start(own_namespace, "island-1", server=agent_link.url)
        wait_phase(kube, own_namespace, "island", "Running", timeout=30)
        agent_link.partition()  # the agent's node loses the API server; the operator does not
        wait_phase(kube, own_namespace, "island", "Uncertain", timeout=30)
        wait_until(lambda: pod_phase(kube, own_namespace, "island-2") is not None, 60, "attempt 2's pod")
        second = kube.core.read_namespaced_pod("island-2", own_namespace).metadata.creation_timestamp
        wait_until(agent.child_marker.exists, 30, "the cut-off agent to stop its child")
        stopped = agent.child_marker.stat().st_mtime
        # Same machine, same clock: the old child stopped before the new pod existed.
        assert stopped < second.timestamp(), (stopped, second.timestamp())
        job = status(kube, own_namespace, "island")
        assert [(r["number"], r["outcome"]) for r in job["history"]] == [(1, "Lost")], job["history"]
        wait_until(lambda: agent.proc.poll() is not None, 30, "the cut-off agent to exit")
        assert agent.proc.returncode != 0
