"""The injected agent as the operator asks for it, on the real API server: a job with the default
heartbeat gets a pod the API server accepts (a native sidecar `vigil-agent` from the operator's
agent image, one PID namespace, the shared directory), and a job that asks for the injected agent
of an operator without one waits as AgentImageMissing, with a Warning, and starts no attempt.

kwok runs no containers, so these are about the pod Vigil writes; e2e/test_sidecar_agent.py
runs the agent itself beside a job from an image with no Python."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import Kube, event_reasons, install_crds
from tests.support.jobs import create, pods_of, status, vigil_job
from tests.support.operators import OperatorProcess
from tests.support.waits import holds, wait_until
from vigil import api

pytestmark = pytest.mark.e2e

AGENT_IMAGE = "localhost/vigil:0.1.0"  # the chart's default, which it passes as --agent-image


@pytest.fixture
def operator_with(kube: Kube, own_namespace: str, tmp_path: Path) -> Iterator:
    install_crds(kube)
    started: list[OperatorProcess] = []

    def start(*args: str) -> OperatorProcess:
        process = OperatorProcess(kube, [own_namespace], tmp_path / f"operator-{len(started)}.log", extra_args=args)
        process.start()
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in started:
            process.stop()


def test_a_job_with_the_default_heartbeat_gets_the_agent_injected(kube: Kube, own_namespace: str, operator_with):
    ns = own_namespace
    operator_with("--agent-image", AGENT_IMAGE)
    # heartbeat left as the default (required, agent unset): nothing of Vigil in the job's image
    job = create(kube, ns, vigil_job("any-image", "0", "600s", heartbeat={"startupGraceSeconds": 600}))
    (pod,) = wait_until(lambda: pods_of(kube, ns, job), 30, "the attempt's pod")
    spec = pod.spec
    assert spec.share_process_namespace is True
    agent = spec.init_containers[-1]
    assert (agent.name, agent.image, agent.restart_policy) == (api.AGENT_CONTAINER, AGENT_IMAGE, "Always")
    assert agent.command == ["vigil-agent", "--sidecar"]
    for container in [agent, *spec.containers]:
        assert api.LIVENESS_DIR in [m.mount_path for m in container.volume_mounts or []], container.name
        assert {e.name: e.value for e in container.env}[api.ENV_CHECKPOINT_FILE] == api.CHECKPOINT_FILE
    # The API server took it as a pod with a native sidecar, and the (simulated) node runs it.
    wait_until(lambda: status(kube, ns, "any-image").get("phase") == "Running", 30, "the attempt to run")


def test_a_job_asking_for_the_injected_agent_of_an_operator_without_one_waits_and_says_why(
    kube: Kube, own_namespace: str, operator_with
):
    ns = own_namespace
    operator_with()  # no --agent-image
    job = create(kube, ns, vigil_job("wants-sidecar", "0", "1s", heartbeat={"agent": "Sidecar"}))
    ok = create(kube, ns, vigil_job("brings-its-own", "0", "1s", heartbeat={"required": False}))
    waiting = wait_until(
        lambda: (s := status(kube, ns, "wants-sidecar")).get("reason") == api.REASON_AGENT_IMAGE_MISSING and s,
        30,
        "the job to say it waits for an agent image",
    )
    assert waiting["phase"] == "Queued"
    assert "--agent-image" in waiting["message"]
    assert api.REASON_AGENT_IMAGE_MISSING in event_reasons(kube, ns, "wants-sidecar")
    wait_until(lambda: status(kube, ns, "brings-its-own").get("phase") == "Succeeded", 60, "the other job to run")
    assert pods_of(kube, ns, ok)

    def no_attempt() -> None:
        assert pods_of(kube, ns, job) == [] and not status(kube, ns, "wants-sidecar").get("currentAttempt")

    holds(no_attempt, 3)
