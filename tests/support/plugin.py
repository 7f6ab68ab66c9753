"""VigilJobs and VigilQueues as the API server sends them to `kubectl vigil`, for its unit tests."""

from __future__ import annotations

from typing import Any


def sample_job(
    name: str = "j",
    namespace: str = "ns",
    *,
    queue: str | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    **status: Any,
) -> dict:
    """A job with `status` as given (phase, reason, conditions... in the CRD's names)."""
    spec: dict[str, Any] = {"retry": {"maxAttempts": 6}, "heartbeat": {"required": True}}
    if queue:
        spec["queue"] = queue
    return {
        "apiVersion": "vigil.dev/v1beta1",
        "kind": "VigilJob",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "resourceVersion": "7",
            "creationTimestamp": "2026-03-01T11:00:00Z",
            "annotations": annotations or {},
            "labels": labels or {},
        },
        "spec": spec,
        "status": status,
    }


def dead_job(name: str, finished: str = "2026-03-01T11:30:00Z", **fields: Any) -> dict:
    """A job dead-lettered by a non-retryable exit code after one attempt, labelled as Vigil does."""
    status = {
        "phase": "DeadLettered",
        "reason": "NonRetryableExitCode",
        "message": "dead-lettered: attempt 1 exited 7",
        "attempts": 1,
        "finishedAt": finished,
        **fields,
    }
    return sample_job(name, labels={"vigil.dev/dead-letter": "true"}, **status)


def queue(name: str, namespace: str = "ns", spec: dict | None = None, status: dict | None = None) -> dict:
    return {
        "apiVersion": "vigil.dev/v1beta1",
        "kind": "VigilQueue",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": "3"},
        "spec": spec or {},
        "status": status or {},
    }
