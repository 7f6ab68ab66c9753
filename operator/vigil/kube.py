"""The few writes Vigil makes to the API server, each idempotent, with the outcomes the shell
needs to tell apart (done, already done, conflict). The official client is synchronous: every
call runs in a worker thread so the event loop never blocks.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import uuid

from kubernetes import client
from kubernetes.client.rest import ApiException

from vigil.api import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)


class Conflict(Exception):
    """The object changed since it was read (409): re-read and decide again."""


class Refused(Exception):
    """The API server refused a write as invalid (422): retrying the same write cannot help."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


def _refusal(err: ApiException) -> Refused:
    try:
        body = json.loads(err.body or "{}")
    except ValueError:
        body = {}
    return Refused(err.status, body.get("reason", err.reason or ""), body.get("message", str(err.body)))


class Kube:
    """Vigil's writes. Each method returns once the write is done or found already done."""

    def __init__(self, api: client.ApiClient):
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    # --- pods ---------------------------------------------------------------------------

    async def create_pod(self, namespace: str, manifest: dict) -> dict | None:
        """Creates the pod; None when a pod of that name exists already (deterministic names
        make that the same attempt, or a stranger the core will refuse to adopt)."""
        try:
            pod = await asyncio.to_thread(self.core.create_namespaced_pod, namespace, manifest)
        except ApiException as err:
            if err.status == 409:
                return None
            if err.status == 422:  # Invalid: the manifest itself; 403 may be a terminating namespace
                raise _refusal(err) from err
            raise
        return self.api.sanitize_for_serialization(pod)

    async def read_pod(self, namespace: str, name: str) -> dict | None:
        try:
            pod = await asyncio.to_thread(self.core.read_namespaced_pod, name, namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return self.api.sanitize_for_serialization(pod)

    async def delete_pod(self, namespace: str, name: str, uid: str | None, grace_seconds: int | None = None) -> None:
        """Deletes the pod of that uid; a pod already gone, or replaced by another uid, is left."""
        body = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid=uid) if uid else None,
            grace_period_seconds=grace_seconds,
            propagation_policy="Background",
        )
        try:
            await asyncio.to_thread(self.core.delete_namespaced_pod, name, namespace, body=body)
        except ApiException as err:
            if err.status in (404, 409):
                return
            raise

    async def annotate_pod(self, namespace: str, name: str, uid: str, annotations: dict[str, str | None]) -> None:
        """Merges annotations into the pod of that uid; a pod gone or replaced is left alone."""
        patch = {"metadata": {"uid": uid, "annotations": annotations}}  # the uid acts as a precondition
        try:
            await asyncio.to_thread(self.core.patch_namespaced_pod, name, namespace, patch)
        except ApiException as err:
            if err.status in (404, 409):
                return
            raise

    # --- jobs ---------------------------------------------------------------------------

    async def patch_job_status(self, namespace: str, name: str, resource_version: str, status: dict) -> dict:
        """Replaces status, only if the job is still at resource_version (else Conflict).
        The precondition is what makes a decision taken on a stale read harmless."""
        patch = {"metadata": {"resourceVersion": resource_version}, "status": status}
        try:
            return await asyncio.to_thread(
                self.custom.patch_namespaced_custom_object_status, GROUP, VERSION, namespace, PLURAL, name, patch
            )
        except ApiException as err:
            if err.status == 409:
                raise Conflict(f"{namespace}/{name} changed since resourceVersion {resource_version}") from err
            if err.status == 404:
                raise Conflict(f"{namespace}/{name} is gone") from err
            raise

    async def patch_job_labels(self, namespace: str, name: str, labels: dict[str, str | None]) -> dict | None:
        try:
            return await asyncio.to_thread(
                self.custom.patch_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                {"metadata": {"labels": labels}},
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    async def delete_job(self, namespace: str, name: str, uid: str) -> None:
        body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid), propagation_policy="Background")
        try:
            await asyncio.to_thread(
                self.custom.delete_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name, body=body
            )
        except ApiException as err:
            if err.status in (404, 409):
                return
            raise

    # --- events -------------------------------------------------------------------------

    async def post_event(self, job: dict, type_: str, reason: str, message: str) -> None:
        """A Kubernetes Event on the job. Best effort: an event lost is never worth a retry loop."""
        meta = job["metadata"]
        now = dt.datetime.now(dt.UTC)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=f"{meta['name']}.{uuid.uuid4().hex[:16]}", namespace=meta["namespace"]),
            involved_object=client.V1ObjectReference(
                api_version=f"{GROUP}/{VERSION}",
                kind="VigilJob",
                name=meta["name"],
                namespace=meta["namespace"],
                uid=meta["uid"],
                resource_version=meta.get("resourceVersion"),
            ),
            type=type_,
            reason=reason,
            message=message[:1024],
            first_timestamp=now,
            last_timestamp=now,
            event_time=None,
            count=1,
            source=client.V1EventSource(component="vigil"),
            reporting_component="vigil.dev/operator",
            reporting_instance="vigil",
        )
        try:
            await asyncio.to_thread(self.core.create_namespaced_event, meta["namespace"], event)
        except ApiException as err:
            log.warning("could not post event %s on %s/%s: %s", reason, meta["namespace"], meta["name"], err.reason)
