"""The operator as a process: its parts built from its settings, and the manager that runs them.

Two kinds of runnables, as in controller-runtime's manager:

- always on, in every replica: the watches (jobs, queues, worker pools and Vigil's pods, one
  informer per watched scope), and the health, metrics and admission servers;
- leader-only, while this process leads (`--leader-elect`) or always (without election): the
  queue dispatcher, the event recorder, the VigilJob, VigilQueue and VigilWorkerPool controllers,
  and the leader mark on this pod. A standby keeps its watches warm and writes nothing.

Leader-only runnables start once every watch has listed (before, a job whose pods are not
listed yet would look as if its pods had vanished) and stop in reverse order, before the Lease
is released: in-flight writes end first. Every write passes the elector's fence, so no write
leaves a leader that could not renew within its renew deadline. A leader that loses the Lease
exits (`LeadershipLost`); its pod restarts it as a standby.

Each part is given its collaborators when it is built (`Operator`); the watches take their
handlers by registration, as controller-runtime's sources do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fnmatch
import logging
import signal
import ssl
import time
from collections.abc import Awaitable, Callable, Collection, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from vigil import api
from vigil.controllers.dispatcher import Dispatcher
from vigil.controllers.jobs import JobController, job_queue
from vigil.controllers.jobs.orphans import RELEASE_WORKERS
from vigil.controllers.pools import PoolController, no_load
from vigil.controllers.queues import QueueStatusController
from vigil.core import beats, fields, podstate
from vigil.core.certs import Managed
from vigil.core.election import ElectionConfig
from vigil.core.liveness import STAMP_WRITES_PER_SECOND
from vigil.core.manifest import BeatChannel
from vigil.core.objects import strip, strip_job
from vigil.core.podstate import keep_job_pod
from vigil.core.pools import keep_pool_pod
from vigil.core.pull import timing_of
from vigil.core.queueing.book import QueueBook, QueueSpec, Standing
from vigil.kube import events
from vigil.kube.client import ApiClient, pool_size, resource_path, user_agent
from vigil.kube.config import Credentials
from vigil.kube.events import EventRecorder
from vigil.kube.informer import POD_WATCH_PACE_SECONDS, Informer, Watches
from vigil.kube.issuer import IssuerKeySource
from vigil.kube.operations import Kube
from vigil.leaderelection.elector import LeaderElector, default_identity
from vigil.leaderelection.mark import LeaderMark, OwnPod
from vigil.metrics import Metrics
from vigil.metrics.collectors import MemoryLimitCollector, PoolCollector, StateCollector
from vigil.runtime.background import Background
from vigil.runtime.clock import SYSTEM, Clock
from vigil.runtime.heap import LongLivedHeap
from vigil.runtime.stalls import CollectorPauses, CollectorWatch, LagProbe
from vigil.servers import health
from vigil.servers import metrics as metrics_server
from vigil.servers.beats import BeatEndpoint, outcome_counter
from vigil.servers.certsecret import CertificateKeeper, ensure_at_start
from vigil.servers.http import (
    REFUSALS,
    SPARE_CONNECTIONS,
    Bounds,
    Server,
    memory_limit,
    process_connection_limit,
    serve,
    serve_fast,
)
from vigil.servers.pull import PullEndpoint
from vigil.servers.tls import ServingCertificate
from vigil.servers.webhook import WebhookServer

log = logging.getLogger(__name__)

_GLOB = frozenset("*?[")


class Runnable(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class LeadershipLost(RuntimeError):
    """The lease could not be renewed in time, or another process took it: this one stops."""


@dataclass(frozen=True)
class OperatorSettings:
    """What `vigil operator`'s flags say (`vigil.cli`)."""

    namespaces: tuple[str, ...] = ()
    workers: int = 4
    health_address: str | None = None
    metrics_address: str | None = None
    # (certificate file, key file): /metrics over HTTPS behind a TokenReview and a
    # SubjectAccessReview; None with metrics_insecure: plain HTTP, no authentication.
    metrics_tls: tuple[str, str] | None = None
    metrics_insecure: bool = False
    webhook: tuple[str, str, str] | None = None  # (HOST:PORT, certificate file, key file)
    # Where pods post beats (the Service in front of beat_server); None: every beat patches its pod.
    beat_channel: BeatChannel | None = None
    beat_server: tuple[str, str, str] | None = None  # (HOST:PORT, certificate file, key file)
    # The image of the injected agent (heartbeat.agent: Sidecar, and the default when set).
    agent_image: str | None = None
    # The lastHeartbeatAt stamps written alone, a second, across all jobs (liveness.stamp_floor).
    stamp_writes_per_second: float = STAMP_WRITES_PER_SECOND
    # The connections the beat server holds open; None: from the memory and open-file limits.
    beat_connections: int | None = None
    beat_connections_per_source: int = beats.CONNECTIONS_PER_SOURCE
    lease: tuple[ElectionConfig, str, str] | None = None  # (timings, namespace, name); None: act alone
    pod_watch_pace: float = POD_WATCH_PACE_SECONDS
    # The limits of a namespace's `default` queue while it has no VigilQueue `default`; None:
    # its jobs run unlimited (the chart sets one: docs/design.md, "VigilQueue").
    default_queue: QueueSpec | None = None
    # --self-managed-certs-secret: the servers' certificates made and kept by this process
    # (vigil.servers.certsecret); their files are those of webhook, beat_server and metrics_tls.
    certificates: Managed | None = None


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


def _watcher(client: ApiClient, namespaces: Collection[str], metrics: Metrics, clock: Clock) -> Callable[..., Watches]:
    """`watches(name, group, version, plural, **options)`: one informer of that resource per
    watched scope, keeping what the scopes' filter accepts."""
    scopes, accept = watch_scopes(namespaces)

    def watches(name: str, group: str, version: str, plural: str, **options: object) -> Watches:
        return Watches(
            [
                Informer(
                    client,
                    resource_path(group, version, plural, scope),
                    name=f"{name} in {scope or 'all namespaces'}",
                    accept=accept,
                    on_relist=metrics.watch_relists.labels(plural).inc,
                    clock=clock,
                    **options,  # type: ignore[arg-type]
                )
                for scope in scopes
            ]
        )

    return watches


def build_watches(
    client: ApiClient,
    namespaces: Collection[str],
    metrics: Metrics,
    clock: Clock = SYSTEM,
    pod_watch_pace: float = POD_WATCH_PACE_SECONDS,
) -> tuple[Watches, Watches, Watches]:
    """(jobs, queues, pods), one informer of each per watched scope. Pods are filtered by the API
    server to those labelled with a job's UID, and then by the operator as each arrives: only
    pods that belong to a VigilJob are kept, and of those only what Vigil reads
    (`podstate.keep_job_pod`; anyone who may create pods can put the label on one). Every list
    comes in pages sized by bytes, each trimmed as it arrives; the pod watches rest
    `pod_watch_pace` seconds after each read."""
    watches = _watcher(client, namespaces, metrics, clock)
    return (
        watches("jobs", api.GROUP, api.VERSION, api.PLURAL, trim=strip_job),
        watches("queues", api.GROUP, api.VERSION, api.QUEUE_PLURAL, trim=strip),
        watches(
            "pods",
            "",
            "v1",
            "pods",
            params={"labelSelector": api.LABEL_JOB_UID},
            pace=pod_watch_pace,
            trim=keep_job_pod,
        ),
    )


def build_pool_watches(
    client: ApiClient,
    namespaces: Collection[str],
    metrics: Metrics,
    clock: Clock = SYSTEM,
    pod_watch_pace: float = POD_WATCH_PACE_SECONDS,
) -> tuple[Watches, Watches]:
    """(worker pools, their pods), one informer of each per watched scope, as `build_watches`
    builds the others. Pods are filtered by the API server to those labelled vigil.dev/pool, and
    then to those a pool controls, trimmed to what the pool's decision reads
    (`core.pools.keep_pool_pod`)."""
    watches = _watcher(client, namespaces, metrics, clock)
    return (
        watches("worker pools", api.GROUP, api.VERSION, api.POOL_PLURAL, trim=strip),
        watches(
            "worker pods",
            "",
            "v1",
            "pods",
            params={"labelSelector": api.LABEL_POOL},
            pace=pod_watch_pace,
            trim=keep_pool_pod,
        ),
    )


# The metrics' server: a few Prometheus replicas, a port-forward. More is a flood, not a scrape.
METRICS_SERVER = Bounds(max_connections=64, per_source=16)
# The probes': the operator's own node alone (the chart's NetworkPolicy), whose kubelet opens a
# connection per probe; a person or a test polling /healthz may ask many times a second.
HEALTH_SERVER = Bounds(max_connections=64, per_source=64, per_source_rate=100.0)


class _Served:
    """A server as a runnable: started with the process, stopped with it. `start_server` is
    given the TLS context of `tls` (certificate and key files, reloaded when renewed), or None."""

    def __init__(
        self,
        what: str,
        address: str,
        start_server: Callable[[ssl.SSLContext | None], Awaitable[Server]],
        tls: tuple[str, str] | None = None,
        clock: Clock = SYSTEM,
    ) -> None:
        self.what, self.address, self.start_server, self.tls, self.clock = what, address, start_server, tls, clock
        self.server: Server | None = None
        self.certificate: ServingCertificate | None = None

    async def start(self) -> None:
        if self.tls is not None:
            self.certificate = ServingCertificate(*self.tls, what=self.what, clock=self.clock)
        self.server = await self.start_server(self.certificate.context if self.certificate else None)
        if self.certificate is not None:
            self.certificate.start()
        log.info("%s listening on %s", self.what, self.address)

    async def stop(self) -> None:
        if self.certificate is not None:
            await self.certificate.stop()
        if self.server is not None:
            await self.server.stop()


class _Webhook:
    def __init__(self, server: WebhookServer, where: tuple[str, str, str]) -> None:
        self.server, self.where = server, where

    async def start(self) -> None:
        await self.server.start(*self.where)

    async def stop(self) -> None:
        await self.server.stop()


class _Warm:
    """The issuer's keys fetched at once, in the background: the first beats are not kept waiting
    for them, and a cluster that refuses them says so in the log at start."""

    def __init__(self, warm: Callable[[], Coroutine[Any, Any, object]]) -> None:
        self._warming = Background(warm)

    async def start(self) -> None:
        self._warming.start()

    async def stop(self) -> None:
        await self._warming.stop()


class Operator:
    """Every part of one operator, each given its collaborators as it is built."""

    def __init__(
        self,
        settings: OperatorSettings,
        credentials: Credentials,
        clock: Clock = SYSTEM,
        keeper: Runnable | None = None,
    ) -> None:
        self.settings, self.clock = settings, clock
        # The holder identity is chosen before any request, so that every write of this process
        # names it in its User-Agent: an audit log then tells the replicas apart.
        identity = default_identity() if settings.lease is not None else None
        agent = user_agent(identity)
        writers = settings.workers + RELEASE_WORKERS  # each holds at most one request at a time
        self.clients = [
            work := ApiClient(credentials, agent, connections=pool_size(writers, events.CONCURRENCY)),
            watch := ApiClient(credentials, agent),
        ]
        self.metrics = metrics = Metrics()
        self.elector: LeaderElector | None = None
        if settings.lease is not None:
            timings, lease_namespace, lease_name = settings.lease
            lease_client = ApiClient(credentials, user_agent(identity, "leader-election"))
            self.clients.append(lease_client)
            self.elector = LeaderElector.for_lease(
                lease_client, lease_namespace, lease_name, timings, identity=identity, clock=clock
            )
        # No write leaves this process unless it leads, renewed in time (the elector's fence).
        fence = self.elector.check if self.elector is not None else (lambda: None)
        self.kube = kube = Kube(work, metrics, clock, fence)
        self.jobs_watch, self.queues_watch, self.pods_watch = build_watches(
            watch, settings.namespaces, metrics, clock, settings.pod_watch_pace
        )
        self.pools_watch, self.pool_pods_watch = build_pool_watches(
            watch, settings.namespaces, metrics, clock, settings.pod_watch_pace
        )
        self.informers = [*self.jobs_watch.informers, *self.queues_watch.informers, *self.pods_watch.informers]
        self.informers += [*self.pools_watch.informers, *self.pool_pods_watch.informers]

        book = QueueBook(settings.default_queue)
        queue = job_queue(clock, metrics)
        self.queues = QueueStatusController(kube, book, clock=clock, metrics=metrics)
        self.dispatcher = Dispatcher(book, wake=queue.add, clock=clock, metrics=metrics, on_changed=self.queues.changed)
        self.events = EventRecorder(
            kube.post_event,
            kube.patch_event,
            on_drop=lambda cause: metrics.events_dropped.labels(cause).inc(),
            clock=clock,
        )
        self.jobs = JobController(
            kube,
            queue,
            self.dispatcher,
            self.events,
            clock=clock,
            metrics=metrics,
            workers=settings.workers,
            pods_fresh=self.pods_watch.fresh,
            repair=self.pods_watch.repair,
            # The orphan sweep lists pods where the watches do, and keeps what they keep.
            sweep_scopes=watch_scopes(settings.namespaces)[0],
            beat_channel=settings.beat_channel,
            agent_image=settings.agent_image,
            stamp_writes_per_second=settings.stamp_writes_per_second,
            accept=watch_scopes(settings.namespaces)[1],
            pool_timing=lambda namespace, pool: timing_of(self.pools.pools.get((namespace, pool))),
        )
        self.jobs_watch.add_handler(self.jobs.handlers.job_delta)
        self.queues_watch.add_handler(self.dispatcher.queue_delta)
        self.queues_watch.add_handler(self.queues.queue_delta)
        self.pods_watch.add_handler(self.jobs.handlers.pod_delta)
        # Each VigilWorkerPool's workers. Its load (tasks waiting and leased) is the lease state's
        # to give: until it does, `no_load` (no backlog: each pool keeps its minReplicas, or its
        # spec.replicas); it sets `self.pools.pool_load` and calls `self.pools.poke`.
        self.pools = PoolController(
            kube,
            clock=clock,
            metrics=metrics,
            beat_channel=settings.beat_channel,
            pool_load=no_load,
            pods_fresh=self.pool_pods_watch.fresh,
        )
        self.pools_watch.add_handler(self.pools.pool_delta)
        self.pool_pods_watch.add_handler(self.pools.pod_delta)
        # The pools and the lease state of pulled arrays (docs/pull.md): a pool scales by its
        # backlog, and a worker pod that goes takes its leases with it.
        pulled = self.jobs.pulled
        self.pools.pool_load = pulled.load
        pulled.backlog_changed = self.pools.poke
        self.pool_pods_watch.add_handler(
            lambda delta: (
                pulled.worker_gone(fields.namespace(delta.obj), fields.name(delta.obj))
                if delta.kind == "delete" or podstate.is_finished(delta.obj)
                else None
            )
        )
        metrics.collect_from(StateCollector(lambda: self.jobs.view.phases, self.dispatcher.queue_numbers))
        # Each pool's workers (every replica watches them) and its load (the leader's lease state;
        # a replica standing by has none and shows the pool's status).
        metrics.collect_from(
            PoolCollector(
                lambda: self.pools.pools,
                lambda namespace, pool: self.pools.pods.get((namespace, pool), {}).values(),
                lambda namespace, pool: None if pulled.state is None else pulled.load(namespace, pool),
            )
        )
        metrics.collect_from(MemoryLimitCollector(memory_limit))  # beside process_resident_memory_bytes

        # The loop's lag and the collector's pauses, whether or not this process leads; the
        # long-lived heap kept out of full collections (vigil.runtime.heap: they held the loop). A
        # collection's pause is real time: the machine's clock, as a request's latency.
        self.always: list[Runnable] = [
            LagProbe(clock, metrics.loop_lag.observe),
            CollectorWatch(
                CollectorPauses(time.perf_counter, lambda gen, s: metrics.gc_pauses.labels(str(gen)).observe(s))
            ),
            LongLivedHeap(clock),
            # The certificates' hourly re-check (their first check ran before this was built).
            *([keeper] if keeper is not None else []),
        ]

        def refused(server: str) -> Callable[[str], None]:
            series = {reason: metrics.connections_refused.labels(server, reason) for reason in REFUSALS}
            return lambda reason: series[reason].inc()

        if (health_address := settings.health_address) is not None:
            self.always.append(
                _Served(
                    "health",
                    health_address,
                    lambda _: serve(
                        self._health_routes(), health_address, bounds=HEALTH_SERVER, on_refused=refused("health")
                    ),
                )
            )
        if (metrics_address := settings.metrics_address) is not None and settings.metrics_tls is not None:
            # The reviews have a client of their own, so a flood of scrapes never takes the
            # work's connections; its pool bounds the reviews in flight.
            review_client = ApiClient(credentials, agent, connections=metrics_server.REVIEW_CONNECTIONS)
            self.clients.append(review_client)
            access = metrics_server.Access(review_client, metrics, clock)
            self.always.append(
                _Served(
                    "metrics (https, authenticated)",
                    metrics_address,
                    lambda context: serve(
                        metrics_server.secure_routes(metrics.registry, access, metrics),
                        metrics_address,
                        bounds=METRICS_SERVER,
                        ssl_context=context,
                        on_refused=refused("metrics"),
                    ),
                    settings.metrics_tls,
                    clock,
                )
            )
        elif metrics_address is not None and settings.metrics_insecure:
            self.always.append(
                _Served(
                    "metrics (plain http, no authentication: --metrics-insecure)",
                    metrics_address,
                    lambda _: serve(
                        metrics_server.routes(metrics.registry),
                        metrics_address,
                        bounds=METRICS_SERVER,
                        on_refused=refused("metrics"),
                    ),
                )
            )
        if settings.webhook:

            def lookup(namespace: str, queue: str) -> tuple[QueueSpec | None, int]:  # memory only, no await
                return book.spec((namespace, queue)), book.count((namespace, queue), Standing.QUEUED)

            self.webhook = WebhookServer(
                lookup,
                exists=lambda namespace, name: (namespace, name) in self.jobs.view.jobs,
                on_refused=lambda namespace, queue: metrics.queue_refusals.labels(namespace, queue).inc(),
                on_connection_refused=refused("webhook"),
                clock=clock,
            )
            self.always.append(_Webhook(self.webhook, settings.webhook))
        if settings.beat_channel is not None and (beat_server := settings.beat_server) is not None:
            jobs, elector_or_none = self.jobs, self.elector
            keys = IssuerKeySource(work, clock)
            self.beats = BeatEndpoint(
                # The leader alone counts beats; it leads while its elector's fence holds.
                leading=lambda: jobs.reconciling and (elector_or_none is None or elector_or_none.deadline_ok()),
                keys=keys.keys,
                held=keys.held,
                pod_of=jobs.view.pods.by_uid,
                heard=jobs.handlers.beat_heard,
                count=outcome_counter(metrics.heartbeat_posts),
                audience=settings.beat_channel.audience,
                clock=clock,
                budget=beats.VerificationBudget(
                    source_burst=max(beats.SOURCE_CHECK_BURST, settings.beat_connections_per_source)
                ),
            )
            # The workers of pools pull on the same port (docs/pull.md): the same token check and budget.
            self.pull = PullEndpoint(
                self.beats,
                leading=self.beats.leading,
                request=jobs.pulled.request,
                pool_of=self.pools.worker_pod,
                requests=metrics.pull_requests,
            )
            routes = [*self.beats.routes(), *self.pull.routes()]
            address = beat_server[0]
            bounds = Bounds(
                max_connections=settings.beat_connections or process_connection_limit(),
                per_source=settings.beat_connections_per_source,
                spare=SPARE_CONNECTIONS,
            )
            served = _Served(
                "beats (https)",
                address,
                lambda context: serve_fast(
                    routes, address, bounds=bounds, ssl_context=context, on_refused=refused("beats")
                ),
                (beat_server[1], beat_server[2]),
                clock,
            )
            self.always += [served, _Warm(keys.keys)]
            metrics.beat_connections.set_function(lambda: float(served.server.connections()[0] if served.server else 0))
            metrics.beat_connections_limit.set_function(lambda: float(bounds.max_connections))

        mark: list[Runnable] = []
        if (elector := self.elector) is not None and settings.lease is not None:
            lease_name = settings.lease[2]
            metrics.leader.labels(lease_name).set_function(lambda: 1.0 if elector.deadline_ok() else 0.0)
            own_pod = OwnPod.from_environment()
            if own_pod is not None:  # the webhook's Service selects the leader's pod alone
                mark = [LeaderMark(kube, own_pod, lease_name, clock)]
        else:
            metrics.leader.labels("vigil").set(1)  # no election: this process acts
        # Started in this order, stopped in the reverse: the controllers' in-flight writes end,
        # then their last events are posted, then the mark goes, then the Lease.
        self.leader_only: list[Runnable] = [*mark, self.dispatcher, self.events, self.queues, self.pools, self.jobs]

    def _health_routes(self) -> list:
        checks = [self.jobs.worker.health, self.jobs.releaser.worker.health, self.queues.worker.health]
        checks.append(self.pools.worker.health)
        return health.routes(self.informers, checks=checks)

    def manager(self) -> Manager:
        return Manager(
            informers=self.informers,
            always=self.always,
            leader_only=self.leader_only,
            elector=self.elector,
            clients=self.clients,
            listed=lambda: f"listed {len(self.jobs.view.jobs)} jobs and {len(self.jobs.view.pods)} pods",
        )


# How long a stopping operator waits for its watches to end once cancelled.
STOP_WATCHES_SECONDS = 10.0


class Manager:
    """Runs the always-on runnables, then the leader-only ones while this process leads."""

    def __init__(
        self,
        *,
        informers: Sequence[Informer],
        always: Sequence[Runnable],
        leader_only: Sequence[Runnable],
        elector: LeaderElector | None,
        clients: Sequence[ApiClient],
        listed: Callable[[], str] = lambda: "listed",
    ) -> None:
        self.informers, self.always, self.leader_only = list(informers), list(always), list(leader_only)
        self.elector, self.clients, self.listed = elector, list(clients), listed
        self.ready = asyncio.Event()  # every watch has listed (leader or warm standby)

    async def run(self, stopping: asyncio.Event) -> None:
        """Until `stopping` is set, a watch fails, or leadership is lost (LeadershipLost)."""
        elector = self.elector
        watches = [asyncio.create_task(informer.run(), name=informer.name) for informer in self.informers]
        started: list[Runnable] = []
        leading: list[Runnable] = []
        campaign = asyncio.ensure_future(elector.run()) if elector is not None else None
        ends: list[asyncio.Future[Any]] = [*watches, *([campaign] if campaign is not None else [])]
        stop: asyncio.Future[Any] = asyncio.ensure_future(stopping.wait())
        try:
            for runnable in self.always:
                await runnable.start()
                started.append(runnable)
            synced: asyncio.Future[Any] = asyncio.ensure_future(
                asyncio.gather(*(informer.synced.wait() for informer in self.informers))
            )
            await asyncio.wait([synced, stop, *ends], return_when=asyncio.FIRST_COMPLETED)
            if synced.done():
                self.ready.set()
                if elector is not None:  # a standby keeps its caches warm and writes nothing
                    log.info("%s; standing by until this process leads", self.listed())
                    led: asyncio.Future[Any] = asyncio.ensure_future(elector.leading.wait())
                    await asyncio.wait([led, stop, *ends], return_when=asyncio.FIRST_COMPLETED)
                    led.cancel()
                if elector is None or elector.leading.is_set():
                    for runnable in self.leader_only:
                        await runnable.start()
                        leading.append(runnable)
                    log.info("%s; reconciling", "leading" if elector is not None else self.listed())
            else:
                synced.cancel()
            await asyncio.wait([stop, *ends], return_when=asyncio.FIRST_COMPLETED)
            for task in ends:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            if campaign is not None and campaign.done() and campaign.result().lost:
                # Its pod restarts it as a standby; the fence already stopped every write.
                raise LeadershipLost(f"lost the lease ({campaign.result().value}): exiting to restart as a standby")
        finally:
            stop.cancel()
            if campaign is not None and not leading:
                # A process on its way out (a server that could not bind, say) must not take the
                # Lease meanwhile: it would lead and run nothing until the Lease ran out.
                campaign.cancel()
            for task in watches:
                task.cancel()
            if watches:
                _, stuck = await asyncio.wait(watches, timeout=STOP_WATCHES_SECONDS)
                for task in stuck:  # never a reason to stay up: the process is ending
                    name = task.get_name()
                    log.warning("the watch %s did not stop within %.0f s; leaving it", name, STOP_WATCHES_SECONDS)
            for runnable in reversed(leading):
                await runnable.stop()
            if campaign is not None and not campaign.done():
                if leading and elector is not None:
                    await elector.release()
                campaign.cancel()
                await asyncio.gather(campaign, return_exceptions=True)
            for runnable in reversed(started):
                await runnable.stop()
            for client in self.clients:
                await client.close()


def run_operator(settings: OperatorSettings, credentials: Credentials) -> int:
    """Builds the operator and runs it until SIGTERM or SIGINT; 1 if it stopped with an error
    (a lost lease among them: its pod restarts it as a standby), else 0."""

    async def main() -> None:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, _stop, stopping, signum)
        run_settings = settings
        if run_settings.certificates is None:
            await Operator(run_settings, credentials).manager().run(stopping)
            return
        # The certificates before anything that serves them, or hands their CA to pods.
        api = ApiClient(credentials, user_agent(None, "certificates"))
        try:
            managed = run_settings.certificates
            keeper = CertificateKeeper(api, managed, ca_name=f"{managed.secret}-ca")
            ca_pem = await ensure_at_start(keeper, stopping)
            if ca_pem is None:
                return
            if run_settings.beat_channel is not None:
                beat_channel = dataclasses.replace(run_settings.beat_channel, ca_pem=ca_pem.decode())
                run_settings = dataclasses.replace(run_settings, beat_channel=beat_channel)
            await Operator(run_settings, credentials, keeper=keeper).manager().run(stopping)
        finally:
            await api.close()

    # asyncio's own event loop, not uvloop: uvloop can leave a TCP transport registered on the
    # descriptor of a connection attempt that failed or was cancelled, and every later
    # connection given that descriptor then fails ("File descriptor N is used by transport";
    # MagicStack/uvloop#653, unfixed). It struck here when the API server restarted.
    try:
        asyncio.run(main())
    except Exception:
        log.exception("the operator stopped with an error")
        return 1
    return 0


def _stop(stopping: asyncio.Event, signum: int) -> None:
    log.info("received %s: stopping", signal.Signals(signum).name)
    stopping.set()
