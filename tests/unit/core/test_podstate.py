"""Reading an observed pod: its state, exit code and reason, and the freshest of its snapshots."""

from __future__ import annotations

import copy
import dataclasses
from datetime import timedelta

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.builders import JOB_UID, T0, at, make_pod, stamp
from vigil import api
from vigil.controllers.jobs.handlers import more_than_a_beat
from vigil.core.liveness import _is_running
from vigil.core.podstate import (
    CLOCK_SKEW_ALLOWANCE,
    MAX_KEPT_ANNOTATION,
    PodReport,
    attempt_of,
    belongs_to,
    checkpoint_problem,
    fingerprint,
    freshest_by_uid,
    is_controlled_by,
    is_force_deleted,
    is_tracked,
    keep_job_pod,
    owning_job,
    read_pod,
    strip_pod,
)

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


# ------------------------------------------------------------------------ stopped by deletion

DELETED_AT = at(100)
BEFORE = DELETED_AT - CLOCK_SKEW_ALLOWANCE - timedelta(seconds=1)


def deleted_pod(phase: str, ends: list[tuple[int, object]], *, grace: int = 30, **kwargs: object) -> dict:
    """A pod whose deletion was requested at DELETED_AT, its containers ended as (exit code,
    finishedAt: a datetime, a raw value, or None for none)."""
    pod = make_pod(1, phase=phase, deleted_at=DELETED_AT, grace=grace, **kwargs)
    statuses = []
    for i, (code, end) in enumerate(ends):
        terminated: dict = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
        if end is not None:
            terminated["finishedAt"] = stamp(end) if not isinstance(end, str) else end
        statuses.append({"name": f"c{i}", "state": {"terminated": terminated}})
    pod["status"]["containerStatuses"] = statuses
    return pod


STOPPED_0 = PodReport("Stopped", 0, "PodDeleted", "node-a")


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param(
            deleted_pod("Succeeded", [(0, BEFORE)]),
            PodReport("Succeeded", 0, "Completed", "node-a"),
            id="success before the deletion request",
        ),
        pytest.param(deleted_pod("Succeeded", [(0, DELETED_AT)]), STOPPED_0, id="exit 0 at the request: stopped"),
        pytest.param(deleted_pod("Succeeded", [(0, at(102))]), STOPPED_0, id="exit 0 on SIGTERM: stopped"),
        pytest.param(
            deleted_pod("Succeeded", [(0, DELETED_AT - CLOCK_SKEW_ALLOWANCE)]),
            STOPPED_0,
            id="within the clock skew allowance: stopped",
        ),
        pytest.param(
            deleted_pod("Succeeded", [(0, BEFORE), (0, at(101))]),
            STOPPED_0,
            id="a success is decided by the last container to end",
        ),
        pytest.param(
            deleted_pod("Failed", [(3, BEFORE), (143, at(101))]),
            PodReport("Failed", 3, "Error", "node-a"),
            id="a failure by the first container that failed",
        ),
        pytest.param(
            deleted_pod("Failed", [(143, at(101))]),
            PodReport("Stopped", 143, "PodDeleted", "node-a"),
            id="killed by SIGTERM: stopped",
        ),
        pytest.param(deleted_pod("Succeeded", [(0, None)]), STOPPED_0, id="no finishedAt proves nothing"),
        pytest.param(deleted_pod("Succeeded", [(0, "yesterday")]), STOPPED_0, id="an unreadable one neither"),
        pytest.param(deleted_pod("Succeeded", [(0, "2025-03-01T12:00:00")]), STOPPED_0, id="nor one without zone"),
        pytest.param(
            deleted_pod("Failed", []),
            PodReport("Stopped", None, "PodDeleted", "node-a"),
            id="a failed pod without container states",
        ),
        pytest.param(
            deleted_pod("Succeeded", [(0, BEFORE)], grace=0),
            STOPPED_0,
            id="grace 0: the request time is unknown",
        ),
        pytest.param(
            deleted_pod("Succeeded", [(0, BEFORE)], grace=1),
            STOPPED_0,
            id="grace 1: a shortened deletion, unknown too",
        ),
        pytest.param(
            deleted_pod("Succeeded", [(0, at(101))], conditions=[{"type": "DisruptionTarget", "status": "True"}]),
            PodReport("Disrupted", 0, "DisruptionTarget", "node-a"),
            id="an eviction that stopped it is a disruption",
        ),
        pytest.param(
            deleted_pod("Succeeded", [(0, BEFORE)], conditions=[{"type": "DisruptionTarget", "status": "True"}]),
            PodReport("Succeeded", 0, "Completed", "node-a"),
            id="a success before the eviction still wins",
        ),
    ],
)
def test_a_deleted_pod_that_ended_after_the_request_was_stopped(pod: dict, expected: PodReport) -> None:
    assert read_pod(pod) == expected


def test_the_kubelets_final_deletion_leaves_no_proof_of_an_earlier_end() -> None:
    # As seen on kube-apiserver v1.36 with kwok's kubelet: deleted at 04:04:04 with 30s of grace,
    # stopped at 04:04:05 with exit 0, then deleted with grace 0 by the kubelet, which moved
    # deletionTimestamp to that moment (the API server never moves it into the past).
    pod = make_pod(1, phase="Succeeded", exit_code=0, finished_at=at(5))
    pod["metadata"].update(deletionTimestamp=stamp(at(5)), deletionGracePeriodSeconds=0)
    assert read_pod(pod).state == "Stopped"


def test_an_absurd_grace_period_proves_nothing_and_raises_nothing() -> None:
    pod = deleted_pod("Succeeded", [(0, BEFORE)])
    pod["metadata"]["deletionGracePeriodSeconds"] = 2**63 - 1
    assert read_pod(pod) == STOPPED_0


def test_a_finished_pod_deleted_later_is_read_as_it_ended() -> None:
    failed = make_pod(1, phase="Failed", exit_code=2, finished_at=BEFORE, deleted_at=DELETED_AT)
    assert read_pod(failed) == PodReport("Failed", 2, "Error", "node-a")


def test_force_deletion_and_tracking_are_read_from_the_metadata() -> None:
    assert not is_force_deleted(make_pod(1, phase="Running"))
    assert not is_force_deleted(make_pod(1, phase="Running", deleting=True))
    assert is_force_deleted(make_pod(1, phase="Running", deleting=True, grace=0))
    assert is_tracked(make_pod(1, tracked=True))
    assert not is_tracked(make_pod(1))
    other = make_pod(1)
    other["metadata"]["finalizers"] = ["example.com/other"]
    assert not is_tracked(other)
    assert api.FINALIZER_ATTEMPT_TRACKING == "vigil.dev/attempt-tracking"


@given(
    grace=st.sampled_from([0, 1, 2, 30]),
    ends=st.lists(st.none() | st.integers(-60, 60), min_size=1, max_size=3),
    disrupted=st.booleans(),
)
def test_a_deleted_pod_is_a_success_only_with_proof_that_it_ended_before_the_request(
    grace: int, ends: list[int | None], disrupted: bool
) -> None:
    conditions = [{"type": "DisruptionTarget", "status": "True"}] if disrupted else []
    times = [None if end is None else DELETED_AT + timedelta(seconds=end) for end in ends]
    pod = deleted_pod("Succeeded", [(0, t) for t in times], grace=grace, conditions=conditions)
    report = read_pod(pod)
    ends = [t for t in times if t is not None]
    proven = grace > 1 and len(ends) == len(times) and max(ends) < DELETED_AT - CLOCK_SKEW_ALLOWANCE
    assert (report.state == "Succeeded") == proven
    assert report.state in (("Succeeded",) if proven else ("Disrupted",) if disrupted else ("Stopped",))
    assert report.exit_code == 0


whole_pods = st.builds(
    make_pod,
    st.integers(1, 3),
    phase=st.sampled_from(["Pending", "Running", "Unknown", "Succeeded", "Failed"]),
    exit_code=st.none() | st.sampled_from([0, 1, 137]),
    reason=st.none() | st.sampled_from(["Evicted", "DeadlineExceeded"]),
    conditions=st.sampled_from([None, [{"type": "DisruptionTarget", "status": "True"}]]),
    node=st.none() | st.sampled_from(["node-a", "node-b"]),
    deleting=st.booleans(),
    grace=st.sampled_from([0, 1, 30]),
    finished_at=st.none() | st.sampled_from([T0 - timedelta(seconds=60), T0 + timedelta(seconds=10)]),
    tracked=st.booleans(),
    checkpoint=st.none() | st.just("{}"),
    heartbeat=st.none() | st.sampled_from(["1", "2"]),
    resource_version=st.sampled_from(["1", "2"]),
)


@st.composite
def pods(draw: st.DrawFn) -> dict:
    """A pod as a kubelet reports it: besides what Vigil reads, the kubelet's bookkeeping (Ready
    and other conditions, IPs, images, container IDs, a termination message), which varies
    between two snapshots of the same attempt; sometimes a terminated init container too."""
    pod = draw(whole_pods)
    status = pod["status"]
    if draw(st.booleans()):
        ready = draw(st.sampled_from(["True", "False"]))
        status["conditions"] = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2025-03-01T12:00:00Z"},
            *status["conditions"],
            {"type": "Ready", "status": ready, "lastTransitionTime": f"2025-03-01T12:00:0{draw(st.integers(0, 9))}Z"},
        ]
        status.update(podIP="10.244.0.7", hostIP="127.0.0.1", qosClass="BestEffort", startTime="2025-03-01T12:00:00Z")
        for container in status.get("containerStatuses") or []:
            container.update(image="registry.example/ledger:1", imageID="sha256:ab", ready=ready == "True")
            container.update(restartCount=0, started=False, lastState={}, containerID="containerd://0f")
            if terminated := container["state"].get("terminated"):
                terminated.update(containerID="containerd://0f", startedAt="2025-03-01T12:00:00Z")
                terminated["message"] = draw(st.sampled_from(["", "x" * 4096]))  # up to 4 KiB
    if draw(st.booleans()):
        state = draw(st.sampled_from([{"terminated": {"exitCode": draw(st.sampled_from([0, 2]))}}, {"running": {}}]))
        status["initContainerStatuses"] = [{"name": "setup", "state": state}]
    if draw(st.booleans()):  # a terminated state that says nothing Vigil reads: still a container that ended
        status.setdefault("containerStatuses", []).append({"name": "side", "state": {"terminated": {"signal": 9}}})
    return pod


def kept(pod: dict) -> dict:
    """The pod as the operator keeps it (its watch, creations and reads all trim it)."""
    return strip_pod(copy.deepcopy(pod))


def readings(pod: dict) -> tuple:
    report = read_pod(pod)
    checkpoint = report.checkpoint
    # A checkpoint is read for its value if it is good, else for why it is refused and its name.
    verdict = (
        checkpoint
        if checkpoint is None or checkpoint_problem(checkpoint) is None
        else (
            checkpoint_problem(checkpoint),
            fingerprint(checkpoint),
        )
    )
    return (
        dataclasses.replace(report, checkpoint=None),
        verdict,
        owning_job(pod),
        attempt_of(pod),
        is_controlled_by(pod, JOB_UID),
        is_tracked(pod),
        is_force_deleted(pod),
        _is_running(pod),
    )


@given(pod=pods(), other=pods())
def test_a_kept_pod_reads_as_the_whole_pod(pod: dict, other: dict) -> None:
    """The operator keeps pods without the spec and the status it does not read (memory at
    10,000 jobs): every reading of a kept pod gives what it gives on the whole pod, and the test of
    whether a pod changed in more than its heartbeat sees every change a reading sees, and no
    change the whole pods do not show."""
    kept_pod, kept_other = kept(pod), kept(other)
    assert readings(kept_pod) == readings(pod)
    assert freshest_by_uid([kept_pod, kept_other]) == [kept(p) for p in freshest_by_uid([pod, other])]
    changed = more_than_a_beat(kept_pod, kept_other)
    if readings(pod) != readings(other) or but_the_beat(pod) != but_the_beat(other):
        assert changed
    if not more_than_a_beat(pod, other):
        assert not changed
    assert (beat(kept_pod) == beat(kept_other)) == (beat(pod) == beat(other)), "a new beat is a new beat"


def beat(pod: dict) -> str | None:
    return pod["metadata"]["annotations"].get(api.ANNOTATION_HEARTBEAT)


@st.composite
def foreign_metadata(draw: st.DrawFn) -> dict:
    """What a pod's author may add that Vigil never reads: labels and annotations of their own
    (many, long), owner references that are not the controller, finalizers of their own,
    kubectl's and the API server's bookkeeping."""
    many = draw(st.integers(0, 300))
    return {
        "labels": {f"team.example/l{i}": "v" * 63 for i in range(many)},
        "annotations": {"team.example/blob": "x" * draw(st.sampled_from([0, 150_000])), "team.example/n": "1"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "cm-uid"}],
        "finalizers": draw(st.sampled_from([[], ["team.example/keep"]])),
        "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:metadata": {}}}],
        "generateName": "ledger-",
    }


def with_foreign(pod: dict, foreign: dict) -> dict:
    pod = copy.deepcopy(pod)
    metadata = pod["metadata"]
    for key in ("labels", "annotations"):
        metadata[key] = {**foreign[key], **metadata.get(key, {})}
    metadata["ownerReferences"] = [*foreign["ownerReferences"], *metadata.get("ownerReferences", [])]
    metadata["finalizers"] = [*foreign["finalizers"], *metadata.get("finalizers", [])]
    metadata.update(managedFields=foreign["managedFields"], generateName=foreign["generateName"])
    return pod


@given(pod=pods(), foreign=foreign_metadata())
def test_what_a_pods_author_adds_beside_vigils_names_is_not_kept(pod: dict, foreign: dict) -> None:
    """Nothing a pod's author adds beside Vigil's own names changes what is kept of it, so a pod
    costs the same bounded amount whatever it carries (on the bed, 2,500 labels and a 150 KB
    annotation cost about 0.5 MiB a pod when they were kept)."""
    assert kept(with_foreign(pod, foreign)) == kept(pod)
    assert len(orjson.dumps(kept(with_foreign(pod, foreign)))) < 4096


def test_a_kept_pod_keeps_of_its_metadata_only_what_vigil_reads():
    pod = with_foreign(make_pod(1, tracked=True, heartbeat="7:0a1b2c3d", checkpoint='{"step": 3}'), FOREIGN)
    pod["metadata"].update(creationTimestamp=stamp(T0), generation=1)
    pod["metadata"]["annotations"][api.ANNOTATION_STARTED_AT] = T0.isoformat()
    pod["metadata"]["labels"][api.LABEL_QUEUE] = "default"  # Vigil's, but never read from a pod
    assert kept(pod)["metadata"] == {
        "name": "ledger-1",
        "namespace": "work",
        "uid": "pod-1",
        "resourceVersion": "1",
        "creationTimestamp": stamp(T0),
        "labels": {api.LABEL_JOB_UID: JOB_UID, api.LABEL_ATTEMPT: "1"},
        "annotations": {
            api.ANNOTATION_HEARTBEAT: "7:0a1b2c3d",
            api.ANNOTATION_STARTED_AT: T0.isoformat(),
            api.ANNOTATION_CHECKPOINT: '{"step": 3}',
        },
        "ownerReferences": [
            {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": "ledger", "uid": JOB_UID, "controller": True}
        ],
        "finalizers": [api.FINALIZER_ATTEMPT_TRACKING],
    }


FOREIGN = {
    "labels": {f"team.example/l{i}": "v" * 63 for i in range(2500)},
    "annotations": {"team.example/blob": "x" * 150_000},
    "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "cm-uid"}],
    "finalizers": ["team.example/keep"],
    "managedFields": [{"manager": "kubectl"}],
    "generateName": "ledger-",
}


def test_an_oversize_value_of_vigils_annotations_is_not_kept_whole_and_reads_the_same():
    """An annotation may hold 256 KB; each of Vigil's is kept within MAX_KEPT_ANNOTATION, as a
    stand-in that reads as the whole value does."""
    huge_beat, other_beat = "1:" + "a" * 200_000, "2:" + "a" * 200_000
    huge_checkpoint = '{"blob": "' + "x" * 200_000 + '"}'
    pod = make_pod(1, heartbeat=huge_beat, checkpoint=huge_checkpoint)
    pod["metadata"]["annotations"][api.ANNOTATION_STARTED_AT] = "9" * 100_000
    pod["metadata"]["annotations"][api.ANNOTATION_SUPERSEDED] = "Lost" * 100_000
    annotations = kept(pod)["metadata"]["annotations"]
    assert all(len(annotations[key]) <= limit for key, limit in MAX_KEPT_ANNOTATION.items())
    assert beat(kept(pod)) != beat(kept(make_pod(1, heartbeat=other_beat))), "another beat is still a beat"
    assert beat(kept(pod)) == beat(kept(make_pod(1, heartbeat=huge_beat))), "the same beat is no beat"
    stand_in = annotations[api.ANNOTATION_CHECKPOINT]
    assert checkpoint_problem(stand_in) == checkpoint_problem(huge_checkpoint)
    assert "over the limit" in (checkpoint_problem(stand_in) or "")
    assert fingerprint(stand_in) == fingerprint(huge_checkpoint)
    assert annotations[api.ANNOTATION_SUPERSEDED].startswith("Lost"), "superseded: its presence is read"
    assert read_pod(kept(pod)).state == read_pod(pod).state
    assert len(orjson.dumps(kept(pod))) < 4096


def test_a_pod_is_a_jobs_only_when_namespace_owner_and_label_agree():
    assert owning_job(make_pod(1)) == ("work", JOB_UID)
    assert belongs_to(make_pod(1), "work", JOB_UID)
    forged = make_pod(1, phase="Succeeded", exit_code=0)
    forged["metadata"]["namespace"] = "attacker"  # the victim's UID in label and owner, elsewhere
    assert owning_job(forged) == ("attacker", JOB_UID)
    assert not belongs_to(forged, "work", JOB_UID)
    assert owning_job(make_pod(1, owner_uid="other-uid")) is None, "label and owner disagree"
    assert owning_job(make_pod(1, job_uid="other-uid")) is None, "label and owner disagree"
    assert owning_job(make_pod(1, owner_uid=None)) is None, "no owner: the label alone is nobody's"
    not_controller = make_pod(1)
    not_controller["metadata"]["ownerReferences"][0]["controller"] = False
    assert owning_job(not_controller) is None
    for field, value in [("kind", "Job"), ("apiVersion", "batch/v1"), ("apiVersion", "vigil.example/v1")]:
        other = make_pod(1)
        other["metadata"]["ownerReferences"][0][field] = value
        assert owning_job(other) is None, f"{field}: {value}"


def test_the_pod_watch_keeps_no_pod_that_belongs_to_no_job():
    foreign = with_foreign(make_pod(1, owner_uid=None), FOREIGN)  # Vigil's label, no owner
    assert keep_job_pod(copy.deepcopy(foreign)) is None
    assert keep_job_pod(make_pod(1, owner_uid="other-uid")) is None
    assert keep_job_pod(make_pod(1)) == kept(make_pod(1))


def but_the_beat(pod: dict) -> dict:
    annotations = {k: v for k, v in pod["metadata"]["annotations"].items() if k != api.ANNOTATION_HEARTBEAT}
    return {**pod["metadata"], "annotations": annotations, "resourceVersion": None}


def test_a_kept_pod_has_of_its_status_only_what_vigil_reads():
    pod = make_pod(
        1,
        phase="Failed",
        exit_code=1,
        finished_at=T0,
        conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}],
    )
    pod["status"]["containerStatuses"][0].update(image="registry.example/ledger:1", ready=False, restartCount=0)
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = "x" * 4096
    pod["status"].update(podIP="10.244.0.7", qosClass="BestEffort")
    pod["status"]["conditions"].append({"type": "Ready", "status": "False"})
    assert kept(pod)["status"] == {
        "phase": "Failed",
        "conditions": [{"type": "DisruptionTarget", "status": "True"}],
        "containerStatuses": [{"state": {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": stamp(T0)}}}],
    }


def test_a_kept_pod_has_of_its_spec_only_the_node():
    pod = make_pod(1, phase="Running", node="node-a")
    pod["metadata"]["managedFields"] = [{"manager": "kube-scheduler"}]
    assert kept(pod) == {
        **pod,
        "metadata": kept(pod)["metadata"],  # test_a_kept_pod_keeps_of_its_metadata_only_what_vigil_reads
        "spec": {"nodeName": "node-a"},
        "status": {"phase": "Running"},  # a running container's state is not read
    }
    assert kept(make_pod(1, node=None))["spec"] == {}
