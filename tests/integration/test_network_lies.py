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
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from testbed.faults import FaultProxy, kubeconfig_via
from tests.conftest import Kube, OperatorProcess, holds, install_crds, release_attempt_pods, wait_until
from tests.integration.test_agent import grant_heartbeat_rbac
from tests.integration.test_heartbeats import HEARTBEAT, PodAgent, heartbeat_job
from tests.integration.test_lifecycle import create, status, vigil_job, wait_phase

pytestmark = pytest.mark.e2e

FAULT_SECONDS = 2 * HEARTBEAT["timeoutSeconds"]


@pytest.fixture
def lies_namespace(kube: Kube) -> Iterator[str]:
    """A namespace of its own, outside the session operator's t-* patterns: only the proxied
    operator of the test acts in it."""
    name = f"f-{uuid.uuid4().hex[:10]}"
    kube.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    wait_until(lambda: kube.core.list_namespaced_service_account(name).items, 30, f"ServiceAccount in {name}")
    grant_heartbeat_rbac(kube, name)
    try:
        yield name
    finally:
        release_attempt_pods(kube, name)  # its operator is gone by now
        kube.core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture
def proxied(kube: Kube, lies_namespace: str, tmp_path: Path, request: pytest.FixtureRequest):
    """(operator, proxy): `vigil operator` for the test's namespace, through a fault proxy."""
    install_crds(kube)
    upstream = kube.api.configuration.host.removeprefix("https://")
    proxy = FaultProxy.start(f"operator-{lies_namespace}", 0, upstream)
    kubeconfig = kubeconfig_via(proxy, kube.kubeconfig, tmp_path / "operator-via-proxy.kubeconfig")
    operator = OperatorProcess(kube, [lies_namespace], tmp_path / "operator.log", kubeconfig=kubeconfig)
    operator.start()
    failed_before = request.session.testsfailed
    try:
        yield operator, proxy
    finally:
        proxy.heal()
        operator.stop()
        proxy.stop()
        if request.session.testsfailed > failed_before:  # CI keeps no files: show what it said
            print(operator.log_path.read_text(errors="replace")[-8000:])


@pytest.fixture
def agents(kube: Kube, lies_namespace: str, tmp_path: Path):
    started: list[PodAgent] = []

    def start(pod_name: str, server: str | None = None) -> PodAgent:
        wait_until(lambda: _phase(kube, lies_namespace, pod_name) == "Running", 30, f"{pod_name} to run")
        agent = PodAgent(kube, lies_namespace, pod_name, tmp_path, server=server)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.stop()


def _phase(kube: Kube, namespace: str, name: str) -> str | None:
    try:
        return kube.core.read_namespaced_pod(name, namespace).status.phase
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise


def _assert_untouched(kube: Kube, namespace: str, name: str, agent: PodAgent) -> None:
    """The attempt was never judged Lost, never replaced, and its child never stopped."""
    job = status(kube, namespace, name)
    assert job.get("attempts") == 1, f"{name} was replaced: {job}"
    assert not job.get("history"), f"{name} closed an attempt: {job.get('history')}"
    assert not agent.child_marker.exists(), f"{name}'s child was stopped"
    assert agent.proc.poll() is None, f"{name}'s agent exited with {agent.proc.returncode}"
    pods = kube.core.list_namespaced_pod(namespace, label_selector=f"vigil.dev/job-uid={_uid(kube, namespace, name)}")
    assert [p.metadata.name for p in pods.items] == [f"{name}-1"]
    assert pods.items[0].metadata.deletion_timestamp is None
    assert "vigil.dev/superseded" not in (pods.items[0].metadata.annotations or {})


def _uid(kube: Kube, namespace: str, name: str) -> str:
    return kube.custom.get_namespaced_custom_object("vigil.dev", "v1alpha1", namespace, "vigiljobs", name)["metadata"][
        "uid"
    ]


def _start_beating(kube: Kube, namespace: str, agents) -> dict[str, PodAgent]:
    running = {}
    for name, guarantee in (("steady", "AtLeastOnce"), ("careful", "NoOverlap")):
        create(kube, namespace, heartbeat_job(name, guarantee=guarantee))
    for name in ("steady", "careful"):
        running[name] = agents(f"{name}-1")
        wait_phase(kube, namespace, name, "Running", timeout=30)
    return running


def test_a_stalled_watch_kills_nothing_and_other_jobs_go_on(kube: Kube, lies_namespace: str, proxied, agents):
    operator, proxy = proxied
    running = _start_beating(kube, lies_namespace, agents)
    proxy.stall()  # every open connection of the operator freezes half-open; new ones work
    began = time.monotonic()
    create(kube, lies_namespace, vigil_job("meanwhile", exit_code="0", run_for="2s"))
    # The operator keeps serving through new connections while its watches are frozen.
    wait_phase(kube, lies_namespace, "meanwhile", "Succeeded", timeout=90)

    # The claim is that nothing happens for two timeouts.
    def untouched() -> None:
        for name, agent in running.items():
            _assert_untouched(kube, lies_namespace, name, agent)

    holds(untouched, FAULT_SECONDS - (time.monotonic() - began), interval=1)
    proxy.heal()
    for name, agent in running.items():
        wait_phase(kube, lies_namespace, name, "Running", timeout=30)
        _assert_untouched(kube, lies_namespace, name, agent)
    log = operator.log_path.read_text(errors="replace")
    assert "contradicts the watch" in log or "watch stalled" in log, "the operator noticed its eyes failed"


def test_a_full_partition_kills_nothing(kube: Kube, lies_namespace: str, proxied, agents):
    operator, proxy = proxied
    running = _start_beating(kube, lies_namespace, agents)
    proxy.partition()  # open connections freeze, new ones hang: the operator is cut off
    create(kube, lies_namespace, vigil_job("meanwhile", exit_code="0", run_for="2s"))

    def untouched() -> None:  # nothing may change while it cannot see
        for name, agent in running.items():
            _assert_untouched(kube, lies_namespace, name, agent)

    holds(untouched, FAULT_SECONDS, interval=1)
    proxy.heal()
    wait_phase(kube, lies_namespace, "meanwhile", "Succeeded", timeout=90)
    for name, agent in running.items():
        wait_phase(kube, lies_namespace, name, "Running", timeout=60)
        _assert_untouched(kube, lies_namespace, name, agent)


def test_an_agent_cut_off_is_replaced_and_under_no_overlap_fences_itself_first(
    kube: Kube, lies_namespace: str, proxied, agents
):
    operator, _ = proxied
    upstream = kube.api.configuration.host.removeprefix("https://")
    with FaultProxy.start(f"agent-{lies_namespace}", 0, upstream) as agent_link:
        create(kube, lies_namespace, heartbeat_job("island", guarantee="NoOverlap"))
        agent = agents("island-1", server=agent_link.url)
        wait_phase(kube, lies_namespace, "island", "Running", timeout=30)
        agent_link.partition()  # the agent's node loses the API server; the operator does not
        wait_phase(kube, lies_namespace, "island", "Uncertain", timeout=30)
        wait_until(lambda: _phase(kube, lies_namespace, "island-2") is not None, 60, "attempt 2's pod")
        second = kube.core.read_namespaced_pod("island-2", lies_namespace).metadata.creation_timestamp
        wait_until(agent.child_marker.exists, 30, "the cut-off agent to stop its child")
        stopped = agent.child_marker.stat().st_mtime
        # Same machine, same clock: the old child stopped before the new pod existed.
        assert stopped < second.timestamp(), (stopped, second.timestamp())
        job = status(kube, lies_namespace, "island")
        assert [(r["number"], r["outcome"]) for r in job["history"]] == [(1, "Lost")], job["history"]
        wait_until(lambda: agent.proc.poll() is not None, 30, "the cut-off agent to exit")
        assert agent.proc.returncode != 0
