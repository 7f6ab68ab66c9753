"""A hostile tenant's flood must not starve another tenant (issue 25, finding 8).

One namespace floods the operator with failing jobs at the shortest backoff the API admits
(initialSeconds 1, factor 1, jitter 1, maxAttempts 10000) and no VigilQueue of its own; another
namespace's submit -> pod created is timed, first on a quiet bed, then during the flood. The
operator runs as the chart runs it (its default queue policy for namespaces without a `default`
VigilQueue). What keeps the quiet tenant's time within 2x: the work queue's round robin over
namespaces, the 1 s floor under every retry, the default policy's maxRunning and retry budget.

    VIGIL_FLOOD_JOBS=200 .venv/bin/pytest -s tests/e2e/test_hostile_flood.py

- VIGIL_FLOOD_JOBS (default 200): the flood's jobs.
"""

from __future__ import annotations

import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kubernetes.client.rest import ApiException

from tests.support.cluster import Kube, fresh_namespace, install_crds, show_log
from tests.support.jobs import create, vigil_job
from tests.support.operators import OperatorProcess
from tests.support.waits import wait_until
from tests.support.watchers import PodWatch

pytestmark = pytest.mark.e2e

FLOOD_JOBS = int(os.environ.get("VIGIL_FLOOD_JOBS", "200"))
SAMPLES = 3  # quiet submissions timed on each bed; the median is compared
# As charts/vigil/values.yaml runs the operator (operator.defaultQueue).
CHART_DEFAULT_QUEUE = ("--default-queue-max-running=100", "--default-queue-retry-budget=0.2")
# The least backoff the API admits, its jitter as short as it goes: the floor is what holds it.
SHORTEST = {"maxAttempts": 10_000, "backoff": {"initialSeconds": 1, "factor": 1.0, "maxSeconds": 1, "jitter": 1.0}}


def submit_to_pod(kube: Kube, namespace: str, pods: PodWatch, name: str) -> float:
    """Seconds from a job's submission to its first pod's appearance in the test's watch."""
    began = time.monotonic()
    create(kube, namespace, vigil_job(name, "0", "1s"))
    record = wait_until(
        lambda: next((r for r in pods.in_order() if r.job == name), None), 30, f"{name}'s pod", interval=0.01
    )
    return record.added - began


def timed(kube: Kube, namespace: str, pods: PodWatch, prefix: str) -> list[float]:
    return [submit_to_pod(kube, namespace, pods, f"{prefix}-{i}") for i in range(SAMPLES)]


def test_a_flood_of_failing_jobs_in_one_namespace_does_not_delay_another_namespaces_start(kube: Kube, tmp_path: Path):
    install_crds(kube)
    with fresh_namespace(kube, "o-flood-") as flood, fresh_namespace(kube, "o-quiet-") as quiet:
        # The API server refuses a backoff of 0 and says why.
        with pytest.raises(ApiException) as refused:
            create(kube, flood, vigil_job("zero", "1", None, retry={"backoff": {"initialSeconds": 0}}))
        assert refused.value.status == 422
        assert "retry.backoff.initialSeconds must be at least 1" in refused.value.body

        operator = OperatorProcess(kube, [flood, quiet], tmp_path / "operator.log", extra_args=CHART_DEFAULT_QUEUE)
        operator.start()
        try:
            with PodWatch(kube, quiet) as quiet_pods, PodWatch(kube, flood) as flood_pods:
                submit_to_pod(kube, quiet, quiet_pods, "warm")  # the operator has listed and leads
                calm = timed(kube, quiet, quiet_pods, "calm")

                jobs = [vigil_job(f"flood-{i}", "1", None, retry=SHORTEST) for i in range(FLOOD_JOBS)]
                with ThreadPoolExecutor(8) as pool:
                    list(pool.map(lambda job: create(kube, flood, job), jobs))
                # The flood is under way: its first attempts start and fail, its retries come back.
                wait_until(lambda: flood_pods.started() >= min(FLOOD_JOBS, 50), 60, "the flood's pods", interval=0.05)
                stormy = timed(kube, quiet, quiet_pods, "stormy")
                flood_pods_seen = flood_pods.started()

            print(
                f"\nsubmit -> pod in the quiet namespace: calm {[f'{t:.3f}' for t in calm]} s, "
                f"during a flood of {FLOOD_JOBS} failing jobs {[f'{t:.3f}' for t in stormy]} s "
                f"({flood_pods_seen} flood pods by then)"
            )
            assert statistics.median(stormy) <= 2 * statistics.median(calm), (
                f"the flood slowed another namespace's start from {statistics.median(calm):.3f}s "
                f"to {statistics.median(stormy):.3f}s (median of {SAMPLES})"
            )
        except BaseException:
            operator.stop()
            show_log(operator.log_path)  # CI keeps no files
            raise
        operator.stop()
