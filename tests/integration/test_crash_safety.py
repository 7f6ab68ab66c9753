"""Killing the operator at any instant loses no job and makes no duplicate attempt.

50 jobs with failures run while the operator is SIGKILLed and restarted at random moments. A
watch records every pod the API server ever held for the namespace, so a pod deleted and made
again under the same attempt would be caught even if it no longer exists at the end.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections import defaultdict

import pytest
from kubernetes import client, watch

from tests.conftest import Kube, OperatorProcess, install_crds, wait_until
from tests.integration.test_lifecycle import FAST_BACKOFF, GROUP, PLURAL, VERSION, vigil_job

pytestmark = pytest.mark.e2e  # the operator end to end, as a process, on a real cluster

JOBS = 50
CHAOS_SECONDS = 40
# exit codes per attempt -> (final phase, attempts it must take exactly)
SCENARIOS = {
    "0": ("Succeeded", 1),
    "1,0": ("Succeeded", 2),
    "1,1,0": ("Succeeded", 3),
    "1": ("DeadLettered", 3),  # maxAttempts 3, all failing
    "7": ("DeadLettered", 1),  # non-retryable
}


class PodRecorder:
    """Every pod UID ever seen per (job uid, attempt), from a watch on the namespace."""

    def __init__(self, kube: Kube, namespace: str):
        self.kube, self.namespace = kube, namespace
        self.seen: dict[tuple[str, str], set[str]] = defaultdict(set)
        self.resource_version = 0  # of the newest pod event seen
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PodRecorder:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def _run(self) -> None:
        core = client.CoreV1Api(self.kube.api)
        resource_version = None
        while not self._stop.is_set():
            stream = watch.Watch()
            try:
                for event in stream.stream(
                    core.list_namespaced_pod, self.namespace, timeout_seconds=5, resource_version=resource_version
                ):
                    pod = event["object"]
                    resource_version = pod.metadata.resource_version
                    self.resource_version = max(self.resource_version, int(resource_version))
                    labels = pod.metadata.labels or {}
                    if "vigil.dev/job-uid" in labels:
                        self.seen[labels["vigil.dev/job-uid"], labels["vigil.dev/attempt"]].add(pod.metadata.uid)
                    if self._stop.is_set():
                        break
            except client.ApiException as err:
                if err.status == 410:  # expired: relist from now; pods persist, so nothing is missed
                    resource_version = None
                else:
                    raise


def test_sigkilling_the_operator_loses_no_job_and_duplicates_no_attempt(kube: Kube, tmp_path):
    seed = int(os.environ.get("VIGIL_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"chaos seed: {seed} (VIGIL_CHAOS_SEED={seed} replays the job mix and kill times)")
    namespace = f"crash-{uuid.uuid4().hex[:8]}"
    kube.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    wait_until(lambda: kube.core.list_namespaced_service_account(namespace).items, 30, "the default ServiceAccount")
    install_crds(kube)
    operator = OperatorProcess(kube, [namespace], tmp_path / "operator.log")
    custom = kube.custom
    scenarios = {f"job-{i:02d}": list(SCENARIOS)[i % len(SCENARIOS)] for i in range(JOBS)}
    kills = 0
    try:
        with PodRecorder(kube, namespace) as recorder:
            operator.start()
            for name, codes in scenarios.items():
                run_for = f"{rng.choice([0.5, 1, 1.5, 2])}s"
                retry = {"maxAttempts": 3, "backoff": FAST_BACKOFF, "nonRetryableExitCodes": [7]}
                custom.create_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, vigil_job(name, codes, run_for, retry=retry)
                )
            chaos_ends = time.monotonic() + CHAOS_SECONDS
            while time.monotonic() < chaos_ends:
                time.sleep(rng.uniform(0.3, 3.0))
                operator.kill()
                kills += 1
                time.sleep(rng.uniform(0.0, 1.0))
                operator.start()

            def all_terminal():
                jobs = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
                return len(jobs) == JOBS and all(
                    (j.get("status") or {}).get("phase") in ("Succeeded", "DeadLettered") for j in jobs
                )

            wait_until(all_terminal, 180, "every job to finish after the chaos", interval=1)
            pods = kube.core.list_namespaced_pod(namespace).items
            newest = max(int(p.metadata.resource_version) for p in pods)
            wait_until(lambda: recorder.resource_version >= newest, 30, "the pod watch to catch up with the list")
        jobs = {
            j["metadata"]["name"]: j
            for j in custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
        }
    finally:
        operator.stop()
        kube.core.delete_namespace(namespace)

    assert kills >= 10, f"only {kills} kills: the chaos did not happen"
    assert sorted(jobs) == sorted(scenarios), "no job is lost"
    for name, codes in scenarios.items():
        job, (phase, attempts) = jobs[name], SCENARIOS[codes]
        status, uid = job["status"], job["metadata"]["uid"]
        assert status["phase"] == phase, (name, status)
        assert status["attempts"] == attempts, (name, codes, status)
        assert [h["number"] for h in status["history"]] == list(range(1, attempts + 1)), (name, status["history"])
        for number in range(1, attempts + 1):
            assert len(recorder.seen[uid, str(number)]) == 1, (
                f"{name} attempt {number}: pods {recorder.seen[uid, str(number)]}"
            )
        assert not [key for key in recorder.seen if key[0] == uid and int(key[1]) > attempts], name
        live = sorted(p.metadata.name for p in pods if (p.metadata.labels or {}).get("vigil.dev/job-uid") == uid)
        assert live == sorted(f"{name}-{n}" for n in range(1, attempts + 1)), (name, live)
