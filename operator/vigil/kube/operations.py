"""The few writes (and direct reads) Vigil makes to the API server, each idempotent, with the
outcomes a reconciler tells apart: done or already done (returned), a conflict (`Conflict`:
decide again), the job gone (`NotFound`: forget it), a refusal (`Refused`). Every call goes
through `vigil.kube.client` with a timeout, and every write passes the fence just before it is
sent.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from vigil.api import FINALIZER_ATTEMPT_TRACKING, GROUP, LABEL_JOB_UID, PLURAL, POOL_PLURAL, QUEUE_PLURAL, VERSION
from vigil.core import fields
from vigil.core.events import Write
from vigil.core.objects import strip, strip_job
from vigil.core.podstate import strip_pod
from vigil.core.pools import keep_pool_pod
from vigil.kube.client import JSON, MERGE_PATCH, METADATA_LIST, STRATEGIC_MERGE_PATCH, ApiClient, resource_path
from vigil.kube.errors import ApiError, Conflict, NotFound
from vigil.metrics import Metrics
from vigil.runtime.clock import SYSTEM, Clock

log = logging.getLogger(__name__)

MAX_EVENT_MESSAGE = 1024  # as events.k8s.io/v1 bounds an event's note
JOBS = f"/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/{PLURAL}"
QUEUES = f"/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/{QUEUE_PLURAL}"
PODS = "/api/v1/namespaces/{namespace}/pods"
POOLS = f"/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/{POOL_PLURAL}"


class Kube:
    """Vigil's writes. Each method returns once the write is done or found already done."""

    def __init__(
        self,
        http: ApiClient,
        metrics: Metrics | None = None,
        clock: Clock = SYSTEM,
        fence: Callable[[], float | None] = lambda: None,
    ):
        self.http = http
        self.metrics = metrics or Metrics()
        self.clock = clock
        # Called before every write: raises while this process may not act (leader election's
        # fence: no write leaves a leader that could not renew within its renew deadline), else
        # returns the seconds left before it closes (None: no election, no bound).
        self.fence = fence

    async def _call(
        self,
        verb: str,
        resource: str,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON,
        accept: str = JSON,
    ) -> Any:
        """One request, timed and counted by verb. A write passes the fence before it is queued
        for a connection, and again on the connection right before it is sent (and before the
        one resend aiohttp makes of a PUT or DELETE on a dead kept-alive connection). Its answer
        must come before the fence closes (the client's fenced deadline)."""
        fence = None if verb in ("get", "list") else (lambda: self.fence())
        try:
            with self.metrics.timed_request(verb, resource):
                return await self.http.request(
                    method, path, params=params, body=body, content_type=content_type, fence=fence, accept=accept
                )
        except ApiError as err:
            err.verb, err.resource = verb, resource
            raise

    # --- pods ---------------------------------------------------------------------------

    async def create_pod(self, namespace: str, manifest: Mapping[str, Any]) -> dict | None:
        """Creates the pod; None when a pod of that name exists already (deterministic names
        make that the same attempt, or a stranger the core will refuse to adopt)."""
        try:
            pod = await self._call("create", "pods", "POST", PODS.format(namespace=namespace), body=manifest)
        except Conflict:
            return None
        return strip_pod(pod)

    async def read_pod(self, namespace: str, name: str) -> dict | None:
        try:
            pod = await self._call("get", "pods", "GET", f"{PODS.format(namespace=namespace)}/{name}")
        except NotFound:
            return None
        return strip_pod(pod)

    async def list_job_pods(self, namespace: str, job_uid: str) -> list[dict]:
        """The job's pods as the API server has them now: a consistent read, not this
        process's cache, though since consistent reads from cache (KEP-2340) the API server
        answers it from its own watch cache (the controller reads a pod the list lacks by name)."""
        pods = await self._call(
            "list",
            "pods",
            "GET",
            PODS.format(namespace=namespace),
            params={"labelSelector": f"{LABEL_JOB_UID}={job_uid}"},
        )
        return [strip_pod(pod) for pod in pods.get("items") or []]

    async def list_vigil_pods(self, namespace: str | None, limit: int = 500) -> AsyncIterator[list[dict]]:
        """Every pod labelled with a job's UID, in one namespace or all (None), a page at a time,
        as its metadata alone: what the orphan sweep reads (identity, labels, owner, finalizers),
        without decoding specs and statuses it would drop (bench/README.md)."""
        async for page in self.list_pods(namespace, LABEL_JOB_UID, limit, metadata_only=True):
            yield page

    async def list_pods(
        self, namespace: str | None, label_selector: str | None = None, limit: int = 100, *, metadata_only: bool = False
    ) -> AsyncIterator[list[dict]]:
        """The pods of one namespace or all (None), a page at a time (small pages, each stripped
        before the next is asked for: a tenant's pods may be large). `metadata_only`: each pod's
        metadata alone (no spec, no status)."""
        path = resource_path("", "v1", "pods", namespace)
        params = {"limit": str(limit)}
        if label_selector:
            params["labelSelector"] = label_selector
        accept = METADATA_LIST if metadata_only else JSON
        while True:
            page = await self._call("list", "pods", "GET", path, params=params, accept=accept)
            yield [strip_pod(pod) for pod in page.get("items") or []]
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return
            params = {**params, "continue": token}

    async def list_labelled_pods(self, namespace: str, label_selector: str) -> list[dict]:
        """The few pods of one namespace that a selector picks (the leader's mark), in one read."""
        pods = await self._call(
            "list", "pods", "GET", PODS.format(namespace=namespace), params={"labelSelector": label_selector}
        )
        return [strip_pod(pod) for pod in pods.get("items") or []]

    async def label_pod(
        self, namespace: str, name: str, uid: str, resource_version: str, labels: dict[str, str | None]
    ) -> None:
        """Sets (None: removes) labels of the pod as it was read: only if it is still that pod
        (uid) at that resourceVersion, else Conflict (read it again and decide again). A pod gone
        meanwhile needs none. (The leader's mark: a late write from a leader deposed since
        cannot undo what happened to the pod after it read it.)"""
        patch = {"metadata": {"uid": uid, "resourceVersion": resource_version, "labels": labels}}
        with contextlib.suppress(NotFound):
            await self._patch("pods", f"{PODS.format(namespace=namespace)}/{name}", patch)

    async def release_pod(self, namespace: str, name: str, uid: str) -> dict | None:
        """Removes Vigil's attempt-tracking finalizer from the pod of that uid; a pod gone or
        replaced is left alone. Returns the pod as released (None if gone or replaced)."""
        return await self._patch_pod(
            namespace, name, uid, {"$deleteFromPrimitiveList/finalizers": [FINALIZER_ATTEMPT_TRACKING]}
        )

    async def delete_pod(self, namespace: str, name: str, uid: str | None, grace_seconds: int | None = None) -> None:
        """Deletes the pod of that uid; a pod already gone, or replaced by another uid, is left."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        try:
            await self._call("delete", "pods", "DELETE", f"{PODS.format(namespace=namespace)}/{name}", body=body)
        except (NotFound, Conflict):
            return

    async def annotate_pod(self, namespace: str, name: str, uid: str, annotations: dict[str, str | None]) -> None:
        """Merges annotations into the pod of that uid; a pod gone or replaced is left alone."""
        await self._patch_pod(namespace, name, uid, {"annotations": annotations})

    async def _patch_pod(self, namespace: str, name: str, uid: str, metadata: dict) -> dict | None:
        """A strategic merge patch of the pod's metadata, only if it is still the pod of that uid
        (the uid in the patch acts as a precondition); NotFound and a conflict mean it is gone.
        Returns the pod as patched, trimmed as the pod watch trims it."""
        patch = {"metadata": {"uid": uid, **metadata}}
        path = f"{PODS.format(namespace=namespace)}/{name}"
        try:
            pod = await self._call("patch", "pods", "PATCH", path, body=patch, content_type=STRATEGIC_MERGE_PATCH)
        except (NotFound, Conflict):
            return None
        return strip_pod(pod) if isinstance(pod, dict) else None

    async def _patch(self, resource: str, path: str, patch: dict) -> Any:
        """A PATCH with the content type the official client chose for it: a strategic merge
        patch for pods (a core kind), a merge patch for Vigil's custom resources."""
        kind = STRATEGIC_MERGE_PATCH if resource == "pods" else MERGE_PATCH
        answer = await self._call("patch", resource, "PATCH", path, body=patch, content_type=kind)
        # The answer becomes the cached version of the job or queue (the watch's echo of the same
        # resourceVersion is then skipped): stripped as the watch's copies are.
        if not isinstance(answer, dict):
            return answer
        return strip_job(answer) if resource.startswith("vigiljobs") else strip(answer)

    # --- jobs ---------------------------------------------------------------------------

    async def patch_job_status(self, namespace: str, name: str, resource_version: str, status: dict) -> dict:
        """Replaces status, only if the job is still at resource_version (else Conflict).
        The precondition is what makes a decision taken on a stale read harmless."""
        patch = {"metadata": {"resourceVersion": resource_version}, "status": status}
        return await self._patch("vigiljobs/status", f"{JOBS.format(namespace=namespace)}/{name}/status", patch)

    async def patch_queue_status(self, namespace: str, name: str, resource_version: str, status: dict) -> dict | None:
        """Merges `status` into a VigilQueue's status, only if the queue is still at
        resource_version (else Conflict); None if the queue is gone. Only the leader writes it
        and people edit a queue's spec rarely, so a conflict is rare; without the precondition
        a write of a deposed leader, late, could overwrite the next leader's newer status."""
        patch = {"metadata": {"resourceVersion": resource_version}, "status": status}
        try:
            return await self._patch("vigilqueues/status", f"{QUEUES.format(namespace=namespace)}/{name}/status", patch)
        except NotFound:
            return None

    # --- worker pools (vigil.controllers.pools) ---------------------------------------------

    async def create_pool_pod(self, namespace: str, manifest: Mapping[str, Any]) -> dict | None:
        """Creates a worker pod of a VigilWorkerPool; None when a pod of that name exists already
        (the pool's next look, which sees it, picks another name). Returns the pod as the pool
        pods' watch keeps it (`core.pools.keep_pool_pod`)."""
        try:
            pod = await self._call("create", "pods", "POST", PODS.format(namespace=namespace), body=manifest)
        except Conflict:
            return None
        return keep_pool_pod(pod) if isinstance(pod, dict) else None

    async def patch_pool_status(self, namespace: str, name: str, resource_version: str, status: dict) -> dict | None:
        """Merges `status` into a VigilWorkerPool's status, only if the pool is still at
        resource_version (else Conflict: a decision on an older spec is void); None if the pool is
        gone."""
        patch = {"metadata": {"resourceVersion": resource_version}, "status": status}
        path = f"{POOLS.format(namespace=namespace)}/{name}/status"
        try:
            return await self._patch("vigilworkerpools/status", path, patch)
        except NotFound:
            return None

    async def read_job(self, namespace: str, name: str, *, whole_template: bool = False) -> dict | None:
        """The job as the API server has it now, trimmed as the view keeps jobs (`strip_job`), or
        with its pod template whole (`whole_template`: the look that makes a pod from a template
        the view did not keep); None if it is gone."""
        try:
            job = await self._call("get", "vigiljobs", "GET", f"{JOBS.format(namespace=namespace)}/{name}")
        except NotFound:
            return None
        return strip_job(job, whole_template=whole_template)

    async def patch_job_labels(
        self, namespace: str, name: str, resource_version: str, labels: dict[str, str | None]
    ) -> dict | None:
        """Merges labels into the job, only if it is still at resource_version (else Conflict);
        None if it is gone. The dead-letter label follows the status write (or the read) that
        fenced the same decision, whose resourceVersion it carries: nothing else writes the job
        in between but a person, so a conflict is rare, and a deposed leader's late label (say,
        dead-letter set again after a redrive) cannot land over a newer status."""
        patch = {"metadata": {"resourceVersion": resource_version, "labels": labels}}
        try:
            return await self._patch("vigiljobs", f"{JOBS.format(namespace=namespace)}/{name}", patch)
        except NotFound:
            return None

    async def delete_job(self, namespace: str, name: str, uid: str) -> None:
        body = {"preconditions": {"uid": uid}, "propagationPolicy": "Background"}
        try:
            await self._call("delete", "vigiljobs", "DELETE", f"{JOBS.format(namespace=namespace)}/{name}", body=body)
        except (NotFound, Conflict):
            return

    # --- the operator's own Deployment (`vigil release-finalizers --stop-deployment`) -------

    async def scale_deployment(self, namespace: str, name: str, replicas: int) -> bool:
        """Sets the Deployment's replicas through its scale subresource; False if it is gone."""
        path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale"
        try:
            body = {"spec": {"replicas": replicas}}
            await self._call("patch", "deployments/scale", "PATCH", path, body=body, content_type=MERGE_PATCH)
        except NotFound:
            return False
        return True

    async def deployment_selector(self, namespace: str, name: str) -> str | None:
        """The Deployment's pod selector as a label selector (its matchLabels); None if it is gone."""
        try:
            deployment = await self._call(
                "get", "deployments", "GET", f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}"
            )
        except NotFound:
            return None
        labels = (fields.spec(deployment).get("selector") or {}).get("matchLabels") or {}
        return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))

    # --- events -------------------------------------------------------------------------

    async def post_event(self, job: Mapping[str, Any], event: Write) -> None:
        """Creates the Event `event` on the job. Best effort: an event lost is never worth a
        retry loop."""
        name, namespace = fields.name(job), fields.namespace(job)
        involved = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "VigilJob",
            "name": name,
            "namespace": namespace,
            "uid": fields.uid(job),
        }
        version = fields.metadata(job).get("resourceVersion")
        if version is not None:
            involved["resourceVersion"] = version
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": event.name, "namespace": namespace},
            "involvedObject": involved,
            "type": event.type_,
            "reason": event.reason,
            "message": event.message[:MAX_EVENT_MESSAGE],
            "firstTimestamp": event.first.isoformat(),  # as the official client sent them
            "lastTimestamp": event.last.isoformat(),
            "count": event.count,
            "source": {"component": "vigil"},
            "reportingComponent": "vigil.dev/operator",
            "reportingInstance": "vigil",
        }
        try:
            await self._call("create", "events", "POST", f"/api/v1/namespaces/{namespace}/events", body=body)
        except ApiError as err:
            log.warning("could not post event %s on %s/%s: %s", event.reason, namespace, name, err)

    async def patch_event(self, namespace: str, event: Write) -> bool:
        """The Event `event.name` happened again: its count, lastTimestamp and message, as
        client-go patches a repeat. False if the Event is gone (events live an hour): the caller
        creates it again. Best effort otherwise: a refusal is logged."""
        body = {
            "count": event.count,
            "lastTimestamp": event.last.isoformat(),
            "message": event.message[:MAX_EVENT_MESSAGE],
        }
        path = f"/api/v1/namespaces/{namespace}/events/{event.name}"
        try:
            await self._call("patch", "events", "PATCH", path, body=body, content_type=MERGE_PATCH)
        except NotFound:
            return False
        except ApiError as err:
            log.warning("could not update event %s in %s: %s", event.name, namespace, err)
        return True
