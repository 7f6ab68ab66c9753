"""Killing the operator at any instant loses no job and makes no duplicate attempt.

50 jobs with failures run while the operator is SIGKILLed and restarted at random moments. A
watch records every pod the API server ever held for the namespace, so a pod deleted and made
again under the same attempt would be caught even if it no longer exists at the end.
"""

from __future__ import annotations

import os
import random
import time

import pytest

from tests.support.cluster import Kube, install_crds
from tests.support.jobs import FAST_BACKOFF, GROUP, PLURAL, SCENARIOS, VERSION, vigil_job
from tests.support.operators import OperatorProcess
from tests.support.waits import wait_until
from tests.support.watchers import PodLog

pytestmark = pytest.mark.e2e  # the operator end to end, as a process, on a real cluster

JOBS = 50
CHAOS_SECONDS = 40


def test_sigkilling_the_operator_loses_no_job_and_duplicates_no_attempt(kube: Kube, own_namespace: str, tmp_path):
    seed = int(os.environ.get("VIGIL_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"chaos seed: {seed} (VIGIL_CHAOS_SEED={seed} replays the job mix and kill times)")
    namespace = own_namespace
    install_crds(kube)
    operator = OperatorProcess(kube, [namespace], tmp_path / "operator.log")
    custom = kube.custom
    scenarios = {f"job-{i:02d}": list(SCENARIOS)[i % len(SCENARIOS)] for i in range(JOBS)}
    kills = 0
    try:
        with PodLog(kube, namespace) as recorder:
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
            recorder.caught_up()
        jobs = {
            j["metadata"]["name"]: j
            for j in custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
        }
    finally:
        operator.stop()

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
