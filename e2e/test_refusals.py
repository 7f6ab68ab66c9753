"""A job never looks idle while Vigil cannot move it on: refusals and failures are shown on the
job, retried with backoff, and cleared once they pass."""

from __future__ import annotations

import pytest
from kubernetes import client

from tests.support.cluster import Kube, event_reasons
from tests.support.jobs import create, get, pods_of, status, vigil_job, wait_phase
from tests.support.operators import OperatorProcess
from tests.support.waits import holds, wait_until

pytestmark = pytest.mark.e2e


def _condition(kube: Kube, namespace: str, name: str, type_: str) -> dict | None:
    return next((c for c in status(kube, namespace, name).get("conditions") or [] if c["type"] == type_), None)


def _events(kube: Kube, namespace: str, name: str, reason: str) -> list:
    selector = f"involvedObject.name={name},reason={reason}"
    return kube.core.list_namespaced_event(namespace, field_selector=selector).items


def test_a_pod_refused_by_a_quota_is_shown_on_the_job_retried_and_then_runs(
    kube: Kube, vigil: OperatorProcess, namespace: str
):
    quota = client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="no-pods"), spec=client.V1ResourceQuotaSpec(hard={"pods": "0"})
    )
    kube.core.create_namespaced_resource_quota(namespace, quota)
    # The quota controller must have counted usage before the quota admits or refuses anything.
    wait_until(
        lambda: (kube.core.read_namespaced_resource_quota("no-pods", namespace).status.used or {}).get("pods") == "0",
        30,
        "the quota's usage to be counted",
    )
    create(kube, namespace, vigil_job("blocked"))
    refused = wait_until(
        lambda: (c := _condition(kube, namespace, "blocked", "ReconcileError")) and c["status"] == "True" and c,
        30,
        "ReconcileError on the job",
    )
    assert refused["reason"] == "PodCreateRefused"
    assert "exceeded quota" in refused["message"] and "blocked-1" in refused["message"], refused["message"]

    # Retried with backoff (1 s, 2 s, 4 s, ... jittered), not in a loop: one event for the cause.
    wait_until(lambda: _events(kube, namespace, "blocked", "PodCreateRefused"), 10, "the PodCreateRefused event")

    def one_event() -> None:  # the event must not repeat meanwhile
        assert len(_events(kube, namespace, "blocked", "PodCreateRefused")) == 1

    holds(one_event, 6, interval=1)
    assert pods_of(kube, namespace, get(kube, namespace, "blocked")) == []

    kube.core.delete_namespaced_resource_quota("no-pods", namespace)
    # The backoff may be at up to ~16 s by now.
    wait_phase(kube, namespace, "blocked", "Succeeded", timeout=90)
    wait_until(lambda: _condition(kube, namespace, "blocked", "ReconcileError") is None, 30, "the condition to go")


def test_the_longest_job_name_gets_valid_pod_and_event_names(kube: Kube, vigil: OperatorProcess, namespace: str):
    name = "a" * 253  # the longest name Kubernetes allows
    create(kube, namespace, vigil_job(name))
    job = wait_phase(kube, namespace, name, "Succeeded", timeout=60)
    pod_names = [pod.metadata.name for pod in pods_of(kube, namespace, job)]
    assert len(pod_names) == 1 and len(pod_names[0]) <= 63, pod_names

    # Events are posted beside the work (vigil.kube.events): soon, not at once.
    wait_until(
        lambda: {"AttemptStarting", "AttemptSucceeded"} <= event_reasons(kube, namespace, name), 10, "the events"
    )
