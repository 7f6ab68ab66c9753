"""The VigilJob lifecycle on a real API server, with `vigil operator` running as a process and
kwok pods finishing as their annotations say."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from tests.support.cluster import Kube, event_reasons, pod_phase, simulated_pod_spec
from tests.support.jobs import (
    FAST_BACKOFF,
    GROUP,
    PLURAL,
    VERSION,
    condition,
    create,
    get,
    pods_of,
    status,
    vigil_job,
    wait_dead_letter_label,
    wait_phase,
)
from tests.support.operators import OperatorProcess
from tests.support.waits import deadline, wait_until

pytestmark = pytest.mark.e2e  # the operator end to end, as a process, on a real cluster


def ts(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_a_job_succeeds_and_kubectl_wait_sees_it(kube: Kube, vigil: OperatorProcess, namespace: str):
    create(kube, namespace, vigil_job("hello", "0", "2s"))
    waited = kube.kubectl(
        "wait", "-n", namespace, "--for=condition=Succeeded", "vj/hello", f"--timeout={deadline(60):.0f}s"
    )
    assert "condition met" in waited.stdout

    job = get(kube, namespace, "hello")
    assert job["status"]["phase"] == "Succeeded"
    assert job["status"]["attempts"] == 1
    assert [h["outcome"] for h in job["status"]["history"]] == ["Succeeded"]
    assert condition(job, "Succeeded")["status"] == "True"
    assert condition(job, "Succeeded")["observedGeneration"] == job["metadata"]["generation"]
    [pod] = pods_of(kube, namespace, job)
    assert pod.metadata.name == "hello-1"
    assert pod.spec.restart_policy == "Never"
    assert pod.metadata.labels["vigil.dev/attempt"] == "1"
    env = {e.name: e.value for e in pod.spec.containers[0].env}
    assert env["VIGIL_JOB"] == "hello" and env["VIGIL_ATTEMPT"] == "1" and env["VIGIL_FENCING_TOKEN"] == "1"
    assert env["VIGIL_JOB_UID"] == job["metadata"]["uid"]
    [owner] = pod.metadata.owner_references
    assert (owner.kind, owner.uid, owner.controller) == ("VigilJob", job["metadata"]["uid"], True)

    # Vigil puts no finalizer on the job and no trace of another framework on what it watches;
    # the pod's attempt-tracking finalizer goes once its outcome is in status.
    assert not job["metadata"].get("finalizers")
    wait_until(lambda: not kube.core.read_namespaced_pod("hello-1", namespace).metadata.finalizers, 30, "release")
    for meta in (job["metadata"], pod.metadata.to_dict()):
        assert not [a for a in (meta.get("annotations") or {}) if "kopf" in a]
    assert job["metadata"]["generation"] == 1

    # Events are posted beside the work (vigil.kube.events): soon, not at once.
    wait_until(
        lambda: {"AttemptStarting", "AttemptSucceeded"} <= event_reasons(kube, namespace, "hello"), 10, "the events"
    )


def test_a_flaky_job_is_retried_with_backoff_until_it_succeeds(kube: Kube, vigil: OperatorProcess, namespace: str):
    create(
        kube,
        namespace,
        vigil_job("flaky", "1,1,0", "1s", retry={"maxAttempts": 5, "backoff": {**FAST_BACKOFF, "initialSeconds": 2}}),
    )
    job = wait_phase(kube, namespace, "flaky", "Succeeded", 90)
    history = job["status"]["history"]
    assert [(h["number"], h["outcome"], h.get("exitCode")) for h in history] == [
        (1, "Failed", 1),
        (2, "Failed", 1),
        (3, "Succeeded", 0),
    ]
    # Backoff: 2 s after the first failure, 4 s after the second (no jitter), within a second.
    gaps = [(ts(history[i + 1]["startedAt"]) - ts(history[i]["finishedAt"])).total_seconds() for i in range(2)]
    assert 2 <= gaps[0] <= deadline(3.5), gaps
    assert 4 <= gaps[1] <= deadline(5.5), gaps
    assert sorted(p.metadata.name for p in pods_of(kube, namespace, job)) == ["flaky-1", "flaky-2", "flaky-3"]


def test_a_poison_exit_code_dead_letters_at_once(kube: Kube, vigil: OperatorProcess, namespace: str):
    create(kube, namespace, vigil_job("poison", "42", "1s", retry={"maxAttempts": 5, "nonRetryableExitCodes": [42]}))
    job = wait_phase(kube, namespace, "poison", "DeadLettered")
    assert job["status"]["attempts"] == 1
    job = wait_dead_letter_label(kube, namespace, job["metadata"]["name"])
    dead = condition(job, "DeadLettered")
    assert dead["status"] == "True" and "42" in dead["message"]
    listed = kube.kubectl("get", "vj", "-n", namespace, "-l", "vigil.dev/dead-letter=true", "-o", "name").stdout.split()
    assert listed == ["vigiljob.vigil.dev/poison"]


def test_exhausted_attempts_dead_letter_the_job(kube: Kube, vigil: OperatorProcess, namespace: str):
    create(kube, namespace, vigil_job("doomed", "1", "1s", retry={"maxAttempts": 2, "backoff": FAST_BACKOFF}))
    job = wait_phase(kube, namespace, "doomed", "DeadLettered", 60)
    assert job["status"]["attempts"] == 2
    assert [h["outcome"] for h in job["status"]["history"]] == ["Failed", "Failed"]
    job = wait_dead_letter_label(kube, namespace, job["metadata"]["name"])


def test_redrive_runs_a_dead_lettered_job_again(kube: Kube, vigil: OperatorProcess, namespace: str):
    create(kube, namespace, vigil_job("redo", "1,0", "1s", retry={"maxAttempts": 1, "backoff": FAST_BACKOFF}))
    wait_phase(kube, namespace, "redo", "DeadLettered")
    kube.custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        "redo",
        {"metadata": {"annotations": {"vigil.dev/redrive": "fixed-the-input"}}},
    )
    job = wait_phase(kube, namespace, "redo", "Succeeded")
    assert job["status"]["redrives"] == 1
    assert [(h["number"], h["outcome"]) for h in job["status"]["history"]] == [(1, "Failed"), (2, "Succeeded")]
    assert "vigil.dev/dead-letter" not in (job["metadata"].get("labels") or {})
    env = {e.name: e.value for e in kube.core.read_namespaced_pod("redo-2", namespace).spec.containers[0].env}
    assert env["VIGIL_FENCING_TOKEN"] == "2", "the fencing token keeps growing across redrives"


def test_an_attempt_past_its_deadline_is_stopped_and_retried(kube: Kube, vigil: OperatorProcess, namespace: str):
    create(
        kube,
        namespace,
        vigil_job(
            "slow",
            exit_code=None,
            run_for=None,
            attemptDeadlineSeconds=2,
            retry={"maxAttempts": 2, "backoff": FAST_BACKOFF},
        ),
    )
    job = wait_phase(kube, namespace, "slow", "DeadLettered", 60)
    assert [h["outcome"] for h in job["status"]["history"]] == ["DeadlineExceeded", "DeadlineExceeded"]
    wait_until(lambda: not pods_of(kube, namespace, job), 30, "the timed-out attempts' pods to be deleted")


def test_the_active_deadline_dead_letters_the_whole_job(kube: Kube, vigil: OperatorProcess, namespace: str):
    create(
        kube,
        namespace,
        vigil_job(
            "bounded",
            exit_code=None,
            run_for=None,
            activeDeadlineSeconds=3,
            retry={"maxAttempts": 5, "backoff": FAST_BACKOFF},
        ),
    )
    job = wait_phase(kube, namespace, "bounded", "DeadLettered", 60)
    assert job["status"]["reason"] == "DeadlineExceeded"
    assert condition(job, "DeadLettered")["reason"] == "DeadlineExceeded"
    started, finished = ts(job["status"]["startedAt"]), ts(job["status"]["finishedAt"])
    assert 3 <= (finished - started).total_seconds() <= deadline(6)
    wait_until(lambda: not pods_of(kube, namespace, job), 30, "the running attempt's pod to be deleted")


def test_suspend_holds_a_job_and_resume_runs_it(kube: Kube, vigil: OperatorProcess, namespace: str):
    create(kube, namespace, vigil_job("held", "0", "1s", suspend=True))
    job = wait_phase(kube, namespace, "held", "Suspended")
    assert not pods_of(kube, namespace, job)
    kube.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "held", {"spec": {"suspend": False}})
    job = wait_phase(kube, namespace, "held", "Succeeded")
    assert job["status"]["attempts"] == 1


def test_suspending_a_running_job_stops_the_attempt_without_counting_it(
    kube: Kube, vigil: OperatorProcess, namespace: str
):
    create(kube, namespace, vigil_job("paused", "0", "3s", retry={"maxAttempts": 1}))
    wait_phase(kube, namespace, "paused", "Running")
    kube.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "paused", {"spec": {"suspend": True}})
    job = wait_phase(kube, namespace, "paused", "Suspended")
    assert [h["outcome"] for h in job["status"]["history"]] == ["Cancelled"]
    wait_until(lambda: not pods_of(kube, namespace, job), 30, "the stopped attempt's pod to be deleted")
    kube.custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "paused", {"spec": {"suspend": False}}
    )
    # maxAttempts is 1: the cancelled attempt did not use it up.
    job = wait_phase(kube, namespace, "paused", "Succeeded")
    assert [h["outcome"] for h in job["status"]["history"]] == ["Cancelled", "Succeeded"]


def test_a_finished_job_is_deleted_after_its_ttl(kube: Kube, vigil: OperatorProcess, namespace: str):
    create(kube, namespace, vigil_job("brief", "0", "1s", ttlSecondsAfterFinished=2))
    job = wait_phase(kube, namespace, "brief", "Succeeded")
    finished = ts(job["status"]["finishedAt"])
    wait_until(lambda: get(kube, namespace, "brief") is None, 30, "the job to be deleted after its TTL")
    assert dt.datetime.now(dt.UTC) - finished >= dt.timedelta(seconds=2)
    wait_until(lambda: not pods_of(kube, namespace, job), 30, "its pods to be garbage-collected")


def test_a_pod_template_kubernetes_refuses_dead_letters_with_its_message(
    kube: Kube, vigil: OperatorProcess, namespace: str
):
    job = vigil_job("malformed", "0")
    job["spec"]["template"]["spec"]["containers"][0]["name"] = "Not_A_DNS_Label"
    create(kube, namespace, job)
    job = wait_phase(kube, namespace, "malformed", "DeadLettered")
    assert job["status"]["reason"] == "InvalidPodTemplate"
    assert "Not_A_DNS_Label" in condition(job, "DeadLettered")["message"]
    assert job["status"]["attempts"] == 1


def test_a_pod_of_the_same_name_not_owned_by_the_job_is_never_adopted(
    kube: Kube, vigil: OperatorProcess, namespace: str
):
    # A leftover of a deleted job of the same name: it even carries Vigil's labels, with the old UID.
    annotations, spec = simulated_pod_spec(exit_code=None)
    leftover = {"name": "squatted-1", "labels": {"vigil.dev/job-uid": "uid-of-a-deleted-job", "vigil.dev/attempt": "1"}}
    kube.core.create_namespaced_pod(namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": leftover, "spec": spec})
    create(kube, namespace, vigil_job("squatted", "0", "1s"))
    wait_until(
        lambda: "squatted-1" in (status(kube, namespace, "squatted").get("message") or ""),
        30,
        "status to name the pod in the way",
    )
    stranger = kube.core.read_namespaced_pod("squatted-1", namespace)
    assert not stranger.metadata.owner_references
    assert stranger.metadata.labels["vigil.dev/job-uid"] == "uid-of-a-deleted-job"
    assert status(kube, namespace, "squatted").get("phase") != "Succeeded"
    # Once the leftover is gone, the job runs in a pod of its own.
    kube.core.delete_namespaced_pod("squatted-1", namespace, grace_period_seconds=0)
    job = wait_phase(kube, namespace, "squatted", "Succeeded", 90)
    [pod] = pods_of(kube, namespace, job)
    assert pod.metadata.uid != stranger.metadata.uid


@pytest.mark.parametrize(
    ("spec_patch", "message"),
    [
        (
            {"retry": {"backoff": {"initialSeconds": 60, "maxSeconds": 10}}},
            "retry.backoff.maxSeconds must be >= retry.backoff.initialSeconds",
        ),
        ({"retry": {"maxAttempts": 0}}, "retry.maxAttempts must be at least 1"),
        ({"retry": {"backoff": {"jitter": 1.5}}}, "retry.backoff.jitter must be between 0"),
        (
            {"heartbeat": {"intervalSeconds": 30, "timeoutSeconds": 10}},
            "heartbeat.timeoutSeconds must be greater than heartbeat.intervalSeconds",
        ),
    ],
)
def test_kubectl_apply_refuses_invalid_specs_with_the_rule_message(
    kube: Kube, namespace: str, vigil: OperatorProcess, spec_patch: dict, message: str
):
    job = vigil_job("invalid")
    job["spec"].update(spec_patch)
    result = kube.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(job), check=False)
    assert result.returncode != 0
    assert message in result.stderr
    assert get(kube, namespace, "invalid") is None


def test_the_template_is_immutable(kube: Kube, vigil: OperatorProcess, namespace: str):
    create(kube, namespace, vigil_job("fixed", exit_code=None, run_for=None))
    changed = vigil_job("fixed", exit_code="0")
    result = kube.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(changed), check=False)
    assert result.returncode != 0
    assert "spec.template is immutable: create a new VigilJob instead" in result.stderr


def test_deleting_a_job_deletes_its_pods(kube: Kube, vigil: OperatorProcess, namespace: str):
    create(kube, namespace, vigil_job("gone", exit_code=None, run_for=None))
    job = wait_phase(kube, namespace, "gone", "Running")
    kube.custom.delete_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "gone", propagation_policy="Background"
    )
    wait_until(lambda: not pods_of(kube, namespace, job), 60, "the garbage collector to delete the job's pod")


@pytest.mark.parametrize("exit_on_term", ["143", "0"])
def test_a_pod_deleted_by_someone_else_is_a_lost_attempt_with_its_exit_code_even_an_exit_0(
    kube: Kube, vigil: OperatorProcess, namespace: str, exit_on_term: str
):
    job = vigil_job("deleted", exit_code=None, run_for=None, retry={"maxAttempts": 3, "backoff": FAST_BACKOFF})
    job["spec"]["template"]["metadata"]["annotations"]["sim.vigil.dev/exit-on-term"] = exit_on_term
    create(kube, namespace, job)
    wait_phase(kube, namespace, "deleted", "Running")
    kube.kubectl("delete", "pod", "deleted-1", "-n", namespace, "--wait=false")
    # The finalizer keeps the pod until its exit code is in status; then it goes.
    wait_until(lambda: pod_phase(kube, namespace, "deleted-1") is None, 60, "the deleted pod to be released")
    history = wait_until(lambda: status(kube, namespace, "deleted").get("history"), 30, "attempt 1's record")
    assert (history[0]["outcome"], history[0]["reason"]) == ("Lost", "PodDeleted"), history
    assert history[0]["exitCode"] == int(exit_on_term), "stopped, not finished: an exit 0 is no success"
    wait_until(lambda: pod_phase(kube, namespace, "deleted-2") is not None, 30, "attempt 2")
