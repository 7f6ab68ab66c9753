"""Runs Vigil's kopf operator in a thread of its own, with its own event loop, so that whatever
decides *whether* it runs (the CLI now, a Lease-based leader election later) can start it and
stop it cleanly from outside: `start()`, `stop()`, `wait()`.

kopf watches; it writes nothing to any object. Jobs are observed with `on.event`, pods with an
index plus `on.event`, both filtered server-side by the `vigil.dev/job-uid` label, so kopf puts no
annotations and no finalizers on pods or jobs. The `Controller` does the rest.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Collection, Mapping
from typing import Any

import kopf
from kubernetes import client, config

from vigil import api
from vigil.controller import Controller
from vigil.kube import Kube

log = logging.getLogger(__name__)


class PodIndex:
    """The kopf index of Vigil's pods by job UID, as a function the controller calls."""

    def __init__(self) -> None:
        self.index: Any = None  # kopf.Index, handed over with the first event

    def __call__(self, job_uid: str) -> list[Mapping[str, Any]]:
        return list(self.index.get(job_uid, [])) if self.index is not None else []


def build_registry(controller: Controller, pods: PodIndex) -> kopf.OperatorRegistry:
    """kopf handlers: glue that hands what the watches see to the controller."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_via_client(**kwargs)

    @kopf.index("pods", id="vigil_pods", labels={api.LABEL_JOB_UID: kopf.PRESENT}, registry=registry)
    async def vigil_pods(body: kopf.Body, **_: Any) -> dict[str, dict]:
        return {body["metadata"]["labels"][api.LABEL_JOB_UID]: _plain(body)}

    def ready(index: Any) -> None:
        # kopf calls on.event handlers only once every index is populated from the initial
        # listing, so the first call is when reconciling may begin: before it, a job whose pods
        # are not indexed yet would look as if its pods had vanished.
        if pods.index is None:
            pods.index = index
            controller.start()

    # Handlers are async so they run in the operator's loop, where the work queue lives.
    @kopf.on.event("pods", id="pod_event", labels={api.LABEL_JOB_UID: kopf.PRESENT}, registry=registry)
    async def pod_event(type: str | None, body: kopf.Body, vigil_pods: Any, **_: Any) -> None:
        ready(vigil_pods)
        controller.pod_changed(body, deleted=type == "DELETED")

    @kopf.on.event(api.GROUP, api.VERSION, api.PLURAL, id="job_event", registry=registry)
    async def job_event(type: str | None, body: kopf.Body, vigil_pods: Any, **_: Any) -> None:
        ready(vigil_pods)
        if type == "DELETED":
            controller.job_gone(body)
        else:
            controller.job_seen(_plain(body))

    return registry


def _plain(body: kopf.Body) -> dict[str, Any]:
    return {key: body[key] for key in body}


def build_settings() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.peering.standalone = True  # HA is a Lease, not kopf's peering
    # Only Vigil's pods reach the operator: the API server filters the watch.
    settings.watching.label_selectors["pods"] = api.LABEL_JOB_UID
    # A watch that goes silent without closing is reopened (kopf issue 585).
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.posting.level = logging.WARNING
    return settings


class OperatorRuntime:
    """One kopf operator plus Vigil's controller, in a thread; start and stop from anywhere."""

    def __init__(self, namespaces: Collection[str] = (), workers: int = 4, health_address: str | None = None) -> None:
        self.namespaces = tuple(namespaces)
        self.workers = workers
        self.liveness_endpoint = f"http://{health_address}/healthz" if health_address else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ready = threading.Event()
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="vigil-operator", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Waits for the operator to end; true if it did within `timeout`."""
        assert self._thread is not None
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as err:  # the caller decides what a dead operator means
            self.error = err
            log.exception("the operator stopped with an error")

    async def _main(self) -> None:
        api_client = client.ApiClient(_client_configuration())
        pods = PodIndex()
        controller = Controller(Kube(api_client), pods, workers=self.workers)
        try:
            await kopf.operator(
                registry=build_registry(controller, pods),
                settings=build_settings(),
                standalone=True,
                clusterwide=not self.namespaces,
                namespaces=self.namespaces,
                liveness_endpoint=self.liveness_endpoint,
                stop_flag=self._stop,
                ready_flag=self.ready,
            )
        finally:
            await controller.stop()
            api_client.close()


def _client_configuration() -> client.Configuration:
    """In a pod, its service account; elsewhere, the kubeconfig (KUBECONFIG or ~/.kube/config)."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)
    return configuration
