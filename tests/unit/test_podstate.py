"""Reading an observed pod: its state, exit code and reason, and the freshest of its snapshots."""

from __future__ import annotations

import pytest

from tests.unit.factories import JOB_UID, make_pod
from vigil.podstate import PodReport, attempt_of, freshest_by_uid, is_controlled_by, read_pod

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (make_pod(1, phase="Pending", node=None), PodReport("Pending")),
        (make_pod(1, phase="Running"), PodReport("Running", node_name="node-a")),
        (make_pod(1, phase="Unknown"), PodReport("Unknown", node_name="node-a")),
        (make_pod(1, phase="Succeeded", exit_code=0), PodReport("Succeeded", 0, "Completed", "node-a")),
        (make_pod(1, phase="Failed", exit_code=2), PodReport("Failed", 2, "Error", "node-a")),
        (
            make_pod(1, phase="Failed", exit_code=137, container_reason="OOMKilled"),
            PodReport("Failed", 137, "OOMKilled", "node-a"),
        ),
        (
            make_pod(1, phase="Failed", reason="DeadlineExceeded"),
            PodReport("Failed", None, "DeadlineExceeded", "node-a"),
        ),
        (make_pod(1, phase="Failed", reason="Evicted"), PodReport("Disrupted", None, "Evicted", "node-a")),
        (make_pod(1, phase="Failed", reason="Preempted"), PodReport("Disrupted", None, "Preempted", "node-a")),
        (
            make_pod(1, phase="Running", conditions=[{"type": "DisruptionTarget", "status": "True"}]),
            PodReport("Disrupted", None, "DisruptionTarget", "node-a"),
        ),
        (
            make_pod(1, phase="Running", conditions=[{"type": "DisruptionTarget", "status": "False"}]),
            PodReport("Running", node_name="node-a"),
        ),
        (make_pod(1, phase="Running", deleting=True), PodReport("Deleted", None, "PodDeleted", "node-a")),
        (make_pod(1, phase="Running", checkpoint="{}"), PodReport("Running", node_name="node-a", checkpoint="{}")),
    ],
)
def test_read_pod(pod: dict, expected: PodReport) -> None:
    assert read_pod(pod) == expected


def test_a_pod_without_status_is_pending() -> None:
    pod = make_pod(1)
    del pod["status"]
    assert read_pod(pod).state == "Pending"


def test_ownership_needs_the_controller_reference_of_this_job() -> None:
    assert is_controlled_by(make_pod(1), JOB_UID)
    assert not is_controlled_by(make_pod(1, owner_uid="other"), JOB_UID)
    assert not is_controlled_by(make_pod(1, owner_uid=None), JOB_UID)
    not_controller = make_pod(1)
    not_controller["metadata"]["ownerReferences"][0]["controller"] = False
    assert not is_controlled_by(not_controller, JOB_UID)


def test_the_attempt_comes_from_the_label_only_when_it_is_a_number() -> None:
    pod = make_pod(5)
    assert attempt_of(pod) == 5
    pod["metadata"]["labels"]["vigil.dev/attempt"] = "five"
    assert attempt_of(pod) is None


def test_the_freshest_snapshot_is_the_one_furthest_along() -> None:
    pending = make_pod(1, phase="Pending", resource_version="3")
    running = make_pod(1, phase="Running", resource_version="5")
    running_later = make_pod(1, phase="Running", resource_version="8", checkpoint="c")
    failed = make_pod(1, phase="Failed", exit_code=1, resource_version="6")
    other = make_pod(2, phase="Pending")

    for pods in ([pending, running, failed, running_later, other], [failed, running_later, other, running, pending]):
        freshest = {p["metadata"]["uid"]: p for p in freshest_by_uid(pods)}
        assert freshest == {"pod-1": failed, "pod-2": other}
    assert freshest_by_uid([running_later, running, pending]) == [running_later]
