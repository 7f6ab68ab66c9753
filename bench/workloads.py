"""The workloads bench.compare runs, each as N batch/v1 Jobs and as N VigilJobs that do the same:
every pod runs about 1 s on a kwok node and exits as the workload says (kwok's vigil-sim stages)."""

from __future__ import annotations

from typing import Any

WORKLOADS = ("all-succeed", "fail-twice", "queued")
KINDS = ("native", "vigil")
RUN_FOR = "1s"
FAIL_SHARE = 0.3  # fail-twice: this share of the jobs fails on attempts 1 and 2
# The Job controller's default pod-failure backoff: 10 s, doubling, at most 6 min; Vigil's retry
# policy is set to the same curve without jitter for fail-twice, so both sides wait alike.
BACKOFF = {"initialSeconds": 10, "factor": 2, "maxSeconds": 360, "jitter": 0}


def pod_spec() -> dict:
    """A pod for a kwok node, as tests/support/cluster.py's simulated_pod_spec() makes it."""
    return {
        "containers": [{"name": "main", "image": "registry.invalid/vigil/sim:none"}],
        "nodeSelector": {"type": "kwok"},
        "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
    }


def fails(workload: str, i: int) -> bool:
    return workload == "fail-twice" and (i % 10) < round(FAIL_SHARE * 10)


def annotations(workload: str, i: int) -> dict:
    # The same annotations on both sides: kwok's vigil-sim stages run and finish every pod alike.
    return {"sim.vigil.dev/exit-code": "1,1,0" if fails(workload, i) else "0", "sim.vigil.dev/run-for": RUN_FOR}


def native_job(workload: str, i: int) -> dict:
    spec: dict[str, Any] = {
        "template": {
            "metadata": {"annotations": annotations(workload, i)},
            "spec": {**pod_spec(), "restartPolicy": "Never"},
        }
    }
    if workload == "fail-twice":
        # Indexed with one completion: the only shape whose pods carry their attempt number
        # (the per-index failure count, with backoffLimitPerIndex); 3 attempts as Vigil's.
        spec.update(completionMode="Indexed", completions=1, parallelism=1, backoffLimitPerIndex=2)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"job-{i}"}, "spec": spec}


def vigil_job(workload: str, i: int) -> dict:
    spec: dict[str, Any] = {
        "template": {"metadata": {"annotations": annotations(workload, i)}, "spec": pod_spec()},
        "heartbeat": {"required": False},
    }
    if workload == "fail-twice":
        spec["retry"] = {"maxAttempts": 3, "backoff": BACKOFF}
    if workload == "queued":
        spec["queue"] = "bench"
    return {"apiVersion": "vigil.dev/v1beta1", "kind": "VigilJob", "metadata": {"name": f"job-{i}"}, "spec": spec}
