"""VigilJobs and VigilQueues on the cluster under test: bodies whose pods kwok runs and finishes
as told, and reading them back."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from tests.support.cluster import Kube, simulated_pod_spec
from tests.support.waits import deadline, wait_until

GROUP, VERSION, PLURAL = "vigil.dev", "v1beta1", "vigiljobs"
QUEUE_PLURAL = "vigilqueues"
FAST_BACKOFF = {"initialSeconds": 1, "factor": 2.0, "maxSeconds": 30, "jitter": 0.0}

# Exit codes per attempt -> (the final phase, the attempts it must take exactly), with
# retry {maxAttempts: 3, nonRetryableExitCodes: [7]}: jobs that succeed at once, after one or
# two failures, that use up their attempts, and a poison one.
SCENARIOS = {
    "0": ("Succeeded", 1),
    "1,0": ("Succeeded", 2),
    "1,1,0": ("Succeeded", 3),
    "1": ("DeadLettered", 3),  # maxAttempts 3, all failing
    "7": ("DeadLettered", 1),  # non-retryable
}


def vigil_job(name: str, exit_code: str | None = "0", run_for: str | None = "1s", **spec: Any) -> dict:
    """A VigilJob whose attempts' pods exit with `exit_code` (one code per attempt, comma
    separated; None: run until deleted) after `run_for`; no heartbeat required."""
    annotations, pod_spec = simulated_pod_spec(exit_code, run_for)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "VigilJob",
        "metadata": {"name": name},
        "spec": {
            "template": {"metadata": {"annotations": annotations}, "spec": pod_spec},
            "heartbeat": {"required": False},
            **spec,
        },
    }


def vigil_queue(name: str, **spec: object) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VigilQueue", "metadata": {"name": name}, "spec": spec}


def create(kube: Kube, namespace: str, job: dict) -> dict:
    return kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job)


def get(kube: Kube, namespace: str, name: str) -> dict | None:
    try:
        return kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def status(kube: Kube, namespace: str, name: str) -> dict:
    return (get(kube, namespace, name) or {}).get("status") or {}


def wait_phase(kube: Kube, namespace: str, name: str, phase: str, timeout: float = 60) -> dict:
    wait_until(
        lambda: status(kube, namespace, name).get("phase") == phase,
        timeout,
        f"{name} to reach {phase} (now {status(kube, namespace, name).get('phase')})",
    )
    return get(kube, namespace, name)


def wait_dead_letter_label(kube: Kube, namespace: str, name: str) -> dict:
    """The label follows the DeadLettered status in a write of its own: it may lag a moment."""
    wait_until(
        lambda: (
            ((get(kube, namespace, name) or {})["metadata"].get("labels") or {}).get("vigil.dev/dead-letter") == "true"
        ),
        30,
        f"{name} to carry the dead-letter label",
    )
    return get(kube, namespace, name)


def condition(job: dict, type_: str) -> dict:
    return next(c for c in job["status"]["conditions"] if c["type"] == type_)


def pods_of(kube: Kube, namespace: str, job: dict) -> list:
    selector = f"vigil.dev/job-uid={job['metadata']['uid']}"
    return kube.core.list_namespaced_pod(namespace, label_selector=selector).items


def pods_per_attempt(kube: Kube, namespace: str) -> dict[tuple[str, str], int]:
    """How many pods exist for each (job uid, attempt) in the namespace."""
    seen: dict[tuple[str, str], int] = {}
    for pod in kube.core.list_namespaced_pod(namespace).items:
        labels = pod.metadata.labels or {}
        key = (labels.get("vigil.dev/job-uid", ""), labels.get("vigil.dev/attempt", ""))
        seen[key] = seen.get(key, 0) + 1
    return seen


def create_at_once(kube: Kube, namespace: str, jobs: Sequence[dict]) -> list[ApiException | None]:
    """Creates the jobs all at once (one thread and connection each, released together); for
    each, None or the API server's refusal."""
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kube.kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = len(jobs)
    barrier = threading.Barrier(len(jobs))
    with client.ApiClient(configuration) as api_client:
        custom = client.CustomObjectsApi(api_client)

        def create_one(job: dict) -> ApiException | None:
            barrier.wait(deadline(30))
            try:
                custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job)
            except ApiException as err:
                return err
            return None

        with ThreadPoolExecutor(len(jobs)) as pool:
            return list(pool.map(create_one, jobs))
