"""The few writes (and direct reads) Vigil makes to the API server, each idempotent, with the
outcomes the shell needs to tell apart (done, already done, conflict, gone, refused). The official
client is synchronous: every call runs in a worker thread so the event loop never blocks, and
every call has a timeout, so a half-open connection cannot hold a worker for ever.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import uuid
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.util.retry import Retry

from vigil.api import FINALIZER_ATTEMPT_TRACKING, GROUP, LABEL_JOB_UID, PLURAL, QUEUE_PLURAL, VERSION
from vigil.metrics import Metrics

log = logging.getLogger(__name__)

# (connect, read) seconds for every call: long enough for a loaded API server, short enough that
# a dead connection is given up well within a heartbeat timeout.
REQUEST_TIMEOUT = (5, 20)
MAX_EVENT_NAME = 253  # a DNS subdomain


class Conflict(Exception):
    """The object changed since it was read (409): re-read and decide again."""


class Gone(Exception):
    """The job no longer exists (404): forget it."""


class Refused(Exception):
    """The API server refused a write: invalid (422), forbidden (403: a quota, a policy) or a bad
    request (400: a webhook). `status` tells them apart."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


def _refusal(err: ApiException) -> Refused:
    try:
        body = json.loads(err.body or "{}")
    except ValueError:
        body = {}
    return Refused(err.status, body.get("reason", err.reason or ""), body.get("message", str(err.body)))


class FencedRetry(Retry):
    """urllib3's retries (the client's default: 3), except that a write is sent again only while
    `fence()` allows it. urllib3 retries on its own, inside the call: PUT and DELETE even after a
    read timed out, so without this a DELETE checked once could go out again 20 s and 40 s later,
    long after the fence closed (a leader cut off, or frozen and woken)."""

    def __init__(self, *args: Any, fence: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fence = fence or (lambda: None)

    def new(self, **kwargs: Any) -> FencedRetry:
        retry = super().new(**kwargs)
        retry.fence = self.fence
        return retry

    def increment(self, method: str | None = None, *args: Any, **kwargs: Any) -> Retry:
        if method is None or method.upper() not in ("GET", "HEAD"):
            self.fence()  # NotLeading ends the call here: nothing more is sent
        return super().increment(method, *args, **kwargs)


def fenced_pool_classes(fence: Any) -> dict[str, type[HTTPConnectionPool]]:
    """urllib3 connection pools whose connections pass the fence as they begin to send a write,
    after the connection is made (urllib3 connects before it sends) and before the first byte.
    A check any earlier leaves a window in which the process can be frozen with a write past
    its fence: client-side validation and serialization take milliseconds on a loaded machine,
    and a leader SIGSTOPped there sent the write on SIGCONT, seconds after its lease had moved
    (test_split_brain caught one, 3.8 s late). What remains is the building of the request's
    headers, microseconds; the body follows the headers, so the request was received in time."""

    def guard(method: str) -> None:
        if method.upper() not in ("GET", "HEAD"):
            fence()

    class FencedHTTPConnection(HTTPConnection):
        def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
            guard(method)
            super().request(method, url, *args, **kwargs)

    class FencedHTTPSConnection(HTTPSConnection):
        def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
            guard(method)
            super().request(method, url, *args, **kwargs)

    class FencedHTTPConnectionPool(HTTPConnectionPool):
        ConnectionCls = FencedHTTPConnection

    class FencedHTTPSConnectionPool(HTTPSConnectionPool):
        ConnectionCls = FencedHTTPSConnection

    return {"http": FencedHTTPConnectionPool, "https": FencedHTTPSConnectionPool}


class Kube:
    """Vigil's writes. Each method returns once the write is done or found already done."""

    def __init__(self, api: client.ApiClient, metrics: Metrics | None = None):
        self.api = api
        self.metrics = metrics or Metrics()
        # Called before every write: raises while this process may not act (leader election's
        # fence: no write leaves a leader that could not renew within its renew deadline).
        self.fence: Any = lambda: None
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        # Every write passes the fence again as its connection begins to send it, and each retry
        # urllib3 makes of a write passes it too (FencedRetry). The pools are made lazily, per
        # host, from these classes and keywords: set before the first request.
        pools = api.rest_client.pool_manager
        pools.pool_classes_by_scheme = fenced_pool_classes(lambda: self.fence())
        given = pools.connection_pool_kw.get("retries")
        if given is None or (isinstance(given, Retry) and not isinstance(given, FencedRetry)):
            base = given if isinstance(given, Retry) else Retry.DEFAULT
            pools.connection_pool_kw["retries"] = FencedRetry(
                total=base.total,
                connect=base.connect,
                read=base.read,
                redirect=base.redirect,
                status=base.status,
                other=base.other,
                allowed_methods=base.allowed_methods,
                backoff_factor=base.backoff_factor,
                fence=lambda: self.fence(),
            )

    async def _call(self, verb: str, resource: str, function: Any, *args: Any, **kwargs: Any) -> Any:
        """One call of the synchronous client, in a thread, timed and counted by verb. A write
        passes the fence before it is queued for a thread, again in the thread just before it is
        sent (the default executor has a few threads: under load, or after the process was
        frozen, a write can wait there well past the moment it was queued), and again before
        any retry urllib3 makes (FencedRetry)."""
        if verb in ("get", "list"):
            call = function
        else:
            self.fence()

            def call(*args: Any, **kwargs: Any) -> Any:
                self.fence()
                return function(*args, **kwargs)

        with self.metrics.timed_request(verb, resource):
            return await asyncio.to_thread(call, *args, **kwargs)

    # --- pods ---------------------------------------------------------------------------

    async def create_pod(self, namespace: str, manifest: dict) -> dict | None:
        """Creates the pod; None when a pod of that name exists already (deterministic names
        make that the same attempt, or a stranger the core will refuse to adopt)."""
        try:
            pod = await self._call(
                "create", "pods", self.core.create_namespaced_pod, namespace, manifest, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as err:
            if err.status == 409:
                return None
            if err.status in (400, 403, 422):  # 422: the manifest itself; 400/403: a webhook, quota, policy
                raise _refusal(err) from err
            raise
        return self.api.sanitize_for_serialization(pod)

    async def read_pod(self, namespace: str, name: str) -> dict | None:
        try:
            pod = await self._call(
                "get", "pods", self.core.read_namespaced_pod, name, namespace, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return self.api.sanitize_for_serialization(pod)

    async def list_job_pods(self, namespace: str, job_uid: str) -> list[dict]:
        """The job's pods as the API server has them now (a consistent read, not the watch cache):
        the source of truth Vigil asks before anything destructive."""
        pods = await self._call(
            "list",
            "pods",
            self.core.list_namespaced_pod,
            namespace,
            label_selector=f"{LABEL_JOB_UID}={job_uid}",
            _request_timeout=REQUEST_TIMEOUT,
        )
        return [self.api.sanitize_for_serialization(pod) for pod in pods.items]

    async def list_pod_names(self, namespace: str, label_selector: str) -> list[str]:
        pods = await self._call(
            "list",
            "pods",
            self.core.list_namespaced_pod,
            namespace,
            label_selector=label_selector,
            _request_timeout=REQUEST_TIMEOUT,
        )
        return [pod.metadata.name for pod in pods.items]

    async def label_pod(self, namespace: str, name: str, labels: dict[str, str | None]) -> None:
        """Sets (None: removes) labels of a pod by name; a pod gone meanwhile needs none."""
        try:
            await self._call(
                "patch",
                "pods",
                self.core.patch_namespaced_pod,
                name,
                namespace,
                {"metadata": {"labels": labels}},
                _request_timeout=REQUEST_TIMEOUT,
            )
        except ApiException as err:
            if err.status != 404:
                raise

    async def release_pod(self, namespace: str, name: str, uid: str) -> None:
        """Removes Vigil's attempt-tracking finalizer from the pod of that uid; a pod gone or
        replaced is left alone."""
        await self._patch_pod(
            namespace, name, uid, {"$deleteFromPrimitiveList/finalizers": [FINALIZER_ATTEMPT_TRACKING]}
        )

    async def delete_pod(self, namespace: str, name: str, uid: str | None, grace_seconds: int | None = None) -> None:
        """Deletes the pod of that uid; a pod already gone, or replaced by another uid, is left."""
        body = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid=uid) if uid else None,
            grace_period_seconds=grace_seconds,
            propagation_policy="Background",
        )
        try:
            await self._call(
                "delete",
                "pods",
                self.core.delete_namespaced_pod,
                name,
                namespace,
                body=body,
                _request_timeout=REQUEST_TIMEOUT,
            )
        except ApiException as err:
            if err.status in (404, 409):
                return
            raise

    async def annotate_pod(self, namespace: str, name: str, uid: str, annotations: dict[str, str | None]) -> None:
        """Merges annotations into the pod of that uid; a pod gone or replaced is left alone."""
        await self._patch_pod(namespace, name, uid, {"annotations": annotations})

    async def _patch_pod(self, namespace: str, name: str, uid: str, metadata: dict) -> None:
        """A strategic merge patch of the pod's metadata, only if it is still the pod of that uid
        (the uid in the patch acts as a precondition); NotFound and a conflict mean it is gone."""
        patch = {"metadata": {"uid": uid, **metadata}}
        try:
            await self._call(
                "patch",
                "pods",
                self.core.patch_namespaced_pod,
                name,
                namespace,
                patch,
                _request_timeout=REQUEST_TIMEOUT,
            )
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
            return await self._call(
                "patch",
                "vigiljobs/status",
                self.custom.patch_namespaced_custom_object_status,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                patch,
                _request_timeout=REQUEST_TIMEOUT,
            )
        except ApiException as err:
            if err.status == 409:
                raise Conflict(f"{namespace}/{name} changed since resourceVersion {resource_version}") from err
            if err.status == 404:
                raise Gone(f"{namespace}/{name} is gone") from err
            raise

    async def patch_queue_status(self, namespace: str, name: str, status: dict) -> dict | None:
        """Merges `status` into a VigilQueue's status (Vigil alone writes it: no precondition);
        None if the queue is gone."""
        try:
            return await self._call(
                "patch",
                "vigilqueues/status",
                self.custom.patch_namespaced_custom_object_status,
                GROUP,
                VERSION,
                namespace,
                QUEUE_PLURAL,
                name,
                {"status": status},
                _request_timeout=REQUEST_TIMEOUT,
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    async def read_job(self, namespace: str, name: str) -> dict | None:
        try:
            return await self._call(
                "get",
                "vigiljobs",
                self.custom.get_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                _request_timeout=REQUEST_TIMEOUT,
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    async def patch_job_labels(self, namespace: str, name: str, labels: dict[str, str | None]) -> dict | None:
        try:
            return await self._call(
                "patch",
                "vigiljobs",
                self.custom.patch_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                {"metadata": {"labels": labels}},
                _request_timeout=REQUEST_TIMEOUT,
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    async def delete_job(self, namespace: str, name: str, uid: str) -> None:
        body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid), propagation_policy="Background")
        try:
            await self._call(
                "delete",
                "vigiljobs",
                self.custom.delete_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                body=body,
                _request_timeout=REQUEST_TIMEOUT,
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
            metadata=client.V1ObjectMeta(name=_event_name(meta["name"]), namespace=meta["namespace"]),
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
            await self._call(
                "create",
                "events",
                self.core.create_namespaced_event,
                meta["namespace"],
                event,
                _request_timeout=REQUEST_TIMEOUT,
            )
        except ApiException as err:
            log.warning("could not post event %s on %s/%s: %s", reason, meta["namespace"], meta["name"], err.reason)


def _event_name(job_name: str) -> str:
    """A unique event name that is valid for any job name (up to 253 characters)."""
    suffix = f".{uuid.uuid4().hex[:16]}"
    return job_name[: MAX_EVENT_NAME - len(suffix)].rstrip(".-") + suffix
