"""Runs Vigil's watches and controller in a thread of their own, with their own event loop, so
that whatever decides *whether* the operator runs (the CLI now, a Lease-based leader election
later) can start and stop it cleanly from outside: `start()`, `stop()`, `wait()`.

Jobs and pods are observed by Vigil's own list+watch (`vigil.kube.informer`), not kopf's: kopf's
watch cannot say whether it is fresh, reports nothing for objects that vanished while it was
relisting after 410 Gone, and spends about 1.4 ms of CPU per event on machinery Vigil does not
use (see the issue "When the network lies" and shared/notes/kopf.md). Pods are watched with a
server-side label filter, so only Vigil's pods reach the operator. Nothing is written by the
watches: no annotations, no finalizers.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import threading
from collections.abc import Callable, Collection, Mapping
from typing import Any

from aiohttp import web
from prometheus_client.aiohttp import make_aiohttp_handler

from vigil import api
from vigil.controllers.jobs import Controller
from vigil.core.admission import Pending
from vigil.core.election import ElectionConfig
from vigil.core.objects import strip
from vigil.core.podstate import strip_pod
from vigil.core.queueing import Standing
from vigil.kube import config, events
from vigil.kube.client import ApiClient, pool_size, resource_path, user_agent
from vigil.kube.informer import POD_WATCH_PACE_SECONDS, Informer
from vigil.kube.operations import Kube
from vigil.leaderelection.elector import LeaderElector, default_identity
from vigil.leaderelection.mark import LeaderMark, OwnPod
from vigil.metrics import Metrics, StateCollector
from vigil.servers.webhook import WebhookServer

log = logging.getLogger(__name__)

_GLOB = frozenset("*?[")


def watch_scopes(patterns: Collection[str]) -> tuple[list[str | None], Callable[[Mapping], bool]]:
    """Where to list and watch, and which objects to keep. Literal namespaces are watched one by
    one (so a namespaced Role suffices); any glob means watching all namespaces and keeping those
    that match; no pattern at all means every namespace."""
    if not patterns:
        return [None], lambda _: True
    if not any(_GLOB & set(pattern) for pattern in patterns):
        return list(dict.fromkeys(patterns)), lambda _: True

    def matches(obj: Mapping) -> bool:
        namespace = obj.get("metadata", {}).get("namespace", "")
        return any(fnmatch.fnmatchcase(namespace, pattern) for pattern in patterns)

    return [None], matches


def build_informers(
    reader: ApiClient,
    controller: Controller,
    namespaces: Collection[str],
    pod_watch_pace: float = POD_WATCH_PACE_SECONDS,
) -> tuple[list[Informer], list[Informer]]:
    """(job and queue informers, pod informers), one of each kind per watched scope. Pods are
    filtered by the API server: only those labelled with a job's UID reach the operator; their
    watches rest `pod_watch_pace` seconds after each read, and each pod is kept without the spec
    Vigil does not read (`strip_pod`)."""
    scopes, accept = watch_scopes(namespaces)
    kinds = (  # (name, group, version, plural, handler, query)
        ("jobs", api.GROUP, api.VERSION, api.PLURAL, controller.job_delta, {}),
        ("queues", api.GROUP, api.VERSION, api.QUEUE_PLURAL, controller.queue_delta, {}),
        ("pods", "", "v1", "pods", controller.pod_delta, {"labelSelector": api.LABEL_JOB_UID}),
    )
    objects, pods = [], []
    for scope in scopes:
        for name, group, version, plural, handler, query in kinds:
            informer = Informer(
                reader,
                resource_path(group, version, plural, scope),
                handler,
                params=query,
                name=f"{name} in {scope or 'all namespaces'}",
                accept=accept,
                on_relist=controller.metrics.watch_relists.labels(plural).inc,
                pace=pod_watch_pace if plural == "pods" else 0.0,
                trim=strip_pod if plural == "pods" else strip,
            )
            (pods if plural == "pods" else objects).append(informer)
    return objects, pods


class LeadershipLost(RuntimeError):
    """The lease could not be renewed in time, or another process took it: this one stops."""


class OperatorRuntime:
    """Vigil's watches plus its controller, in a thread; start and stop from anywhere."""

    def __init__(
        self,
        namespaces: Collection[str] = (),
        workers: int = 4,
        health_address: str | None = None,
        webhook: tuple[str, str, str] | None = None,
        metrics_address: str | None = None,
        lease: tuple[ElectionConfig, str, str] | None = None,
        pod_watch_pace: float = POD_WATCH_PACE_SECONDS,
    ) -> None:
        self.namespaces = tuple(namespaces)
        self.workers = workers
        self.pod_watch_pace = pod_watch_pace
        self.health_address = health_address
        self.webhook = webhook  # (HOST:PORT, certificate file, key file) of the admission webhook
        self.metrics_address = metrics_address
        self.lease = lease  # (timings, namespace, name) of the Lease to lead; None: act alone
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self.ready = threading.Event()  # every watch has listed; reconciling has begun
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="vigil-operator", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)

    def wait(self, timeout: float | None = None) -> bool:
        """Waits for the operator to end; true if it did within `timeout`."""
        assert self._thread is not None
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        # asyncio's own event loop, not uvloop: uvloop can leave a TCP transport registered on the
        # descriptor of a connection attempt that failed or was cancelled, and every later
        # connection given that descriptor then fails ("File descriptor N is used by transport";
        # MagicStack/uvloop#653, unfixed). It struck here when the API server restarted.
        try:
            with asyncio.Runner() as runner:
                runner.run(self._main())
        except BaseException as err:  # the caller decides what a dead operator means
            self.error = err
            log.exception("the operator stopped with an error")

    async def _main(self) -> None:
        self._loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
        if self._stop.is_set():
            return
        credentials = config.load()
        # The holder identity is chosen before any request, so that every write of this process
        # names it in its User-Agent: an audit log then tells the replicas apart (election.user_agent).
        identity = default_identity() if self.lease is not None else None
        agent = user_agent(identity)
        reader = ApiClient(credentials, agent)
        writer = ApiClient(credentials, agent, connections=pool_size(self.workers, events.CONCURRENCY))
        metrics = Metrics()
        kube = Kube(writer, metrics)
        controller = Controller(kube, workers=self.workers, metrics=metrics)
        metrics.collect_from(
            StateCollector(lambda: list(controller.jobs.values()), controller.dispatcher.queue_numbers)
        )
        elector = mark = lease_client = None
        if self.lease is not None:
            timings, lease_namespace, lease_name = self.lease
            lease_client = ApiClient(credentials, user_agent(identity, "leader-election"))
            elector = LeaderElector.for_lease(lease_client, lease_namespace, lease_name, timings, identity=identity)
            own_pod = OwnPod.from_environment()
            mark = LeaderMark(kube, own_pod, lease_name) if own_pod is not None else None
            kube.fence = elector.check  # no write leaves this process unless it leads, renewed in time
            metrics.leader.labels(lease_name).set_function(lambda: 1.0 if elector.deadline_ok() else 0.0)
        else:
            metrics.leader.labels("vigil").set(1)  # no election: this process acts
        object_informers, pod_informers = build_informers(reader, controller, self.namespaces, self.pod_watch_pace)
        informers = object_informers + pod_informers
        controller.hearing = lambda: all(informer.fresh() for informer in pod_informers)

        def repair(reason: str) -> None:
            for informer in pod_informers:
                informer.repair(reason)

        controller.on_missed = repair
        watches = [asyncio.create_task(informer.run(), name=informer.name) for informer in informers]
        health = await _serve_health(self.health_address, informers) if self.health_address else None
        webhook = await _serve_webhook(self.webhook, controller) if self.webhook else None
        scrape = await _serve_metrics(self.metrics_address, metrics) if self.metrics_address else None
        campaign = asyncio.ensure_future(elector.run()) if elector is not None else None
        ends = [*watches, *([campaign] if campaign is not None else [])]
        led = False
        marking: asyncio.Future | None = None
        try:
            synced = asyncio.gather(*(informer.synced.wait() for informer in informers))
            stopping = asyncio.ensure_future(self._stopping.wait())
            await asyncio.wait([synced, stopping, *ends], return_when=asyncio.FIRST_COMPLETED)
            if synced.done():
                self.ready.set()  # leader or warm standby: the caches are listed and watched
                listed = f"listed {len(controller.jobs)} jobs and {len(controller.pods)} pods"
                if elector is not None:  # a standby keeps its caches warm and writes nothing
                    log.info("%s; standing by until this process leads", listed)
                    leading = asyncio.ensure_future(elector.leading.wait())
                    await asyncio.wait([leading, stopping, *ends], return_when=asyncio.FIRST_COMPLETED)
                    leading.cancel()
                if elector is None or elector.leading.is_set():
                    led = True
                    controller.start()
                    log.info("%s; reconciling", "leading" if elector is not None else listed)
                    if mark is not None:  # the webhook's Service selects the leader's pod alone
                        marking = asyncio.ensure_future(mark.claim())
            await asyncio.wait([stopping, *ends], return_when=asyncio.FIRST_COMPLETED)
            for task in ends:
                if task.done() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            if campaign is not None and campaign.done() and campaign.result().lost:
                # Its pod restarts it as a standby; the fence already stopped every write.
                raise LeadershipLost(f"lost the lease ({campaign.result().value}): exiting to restart as a standby")
        finally:
            for task in watches:
                task.cancel()
            await asyncio.gather(*watches, return_exceptions=True)
            if marking is not None:
                marking.cancel()
                await asyncio.gather(marking, return_exceptions=True)
            await controller.stop()  # in-flight writes end before the lease is given up
            if elector is not None and campaign is not None and not campaign.done():
                if led:
                    if mark is not None:
                        await mark.drop()
                    await elector.release()
                campaign.cancel()
                await asyncio.gather(campaign, return_exceptions=True)
            if health is not None:
                await health.cleanup()
            if webhook is not None:
                await webhook.stop()
            if scrape is not None:
                await scrape.cleanup()
            await reader.close()
            await writer.close()
            if lease_client is not None:
                await lease_client.close()


async def _serve_webhook(where: tuple[str, str, str], controller: Controller) -> WebhookServer:
    """The admission webhook, answering from the controller's queue book: a job is refused while
    its queue holds maxQueued waiting jobs, counting those admitted but not yet watched."""
    book, pending = controller.dispatcher.book, Pending()

    def lookup(namespace: str, queue: str) -> tuple[Any, int]:  # memory only, no await (admission.py)
        key = (namespace, queue)
        return book.spec(key), book.count(key, Standing.QUEUED)

    def seen(namespace: str, name: str, uid: str | None) -> None:
        pending.seen(namespace, name, uid or "")

    controller.on_job = seen
    server = WebhookServer(
        lookup,
        pending,
        exists=lambda namespace, name: (namespace, name) in controller.jobs,
        on_refused=lambda namespace, queue: controller.metrics.queue_refusals.labels(namespace, queue).inc(),
    )
    address, cert_file, key_file = where
    await server.start(address, cert_file, key_file)
    log.info("admission webhook listening on %s", address)
    return server


async def _serve_metrics(address: str, metrics: Metrics) -> web.AppRunner:
    """/metrics in Prometheus' text format."""
    app = web.Application()
    app.add_routes([web.get("/metrics", make_aiohttp_handler(metrics.registry))])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, _, port = address.rpartition(":")
    await web.TCPSite(runner, host or "0.0.0.0", int(port)).start()
    return runner


async def _serve_health(address: str, informers: list[Informer]) -> web.AppRunner:
    """/healthz: the event loop answers. /readyz: every watch has listed and is fresh."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        stale = [informer.name for informer in informers if not informer.fresh()]
        if stale:
            return web.Response(status=503, text=f"not fresh: {', '.join(stale)}\n")
        return web.Response(text="ok\n")

    app = web.Application()
    app.add_routes([web.get("/healthz", healthz), web.get("/readyz", readyz)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, _, port = address.rpartition(":")
    await web.TCPSite(runner, host or "0.0.0.0", int(port)).start()
    return runner

