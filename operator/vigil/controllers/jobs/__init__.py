"""The VigilJob controller: level-triggered reconciliation of jobs, their attempts and pods.

Its parts, each in a module of its own:

- `view.ClusterView`: the jobs, their pods and the failure detector's record of each pod;
- `handlers.JobEvents`: watch deltas into the view and keys into the work queue;
- `reconciler.JobReconciler`: one look at one job (decide, after asking the API server where
  the view is not to be trusted), and what a failure means;
- `executor.Executor`: a decision's actions against the API server;
- `orphans.Releaser`: finalizer releases that belong to no look, on a work queue of their own;
- `alarms`, `rechecks`: the timers that bring a job back without an event;
- the generic `vigil.controllers.worker.Worker` that runs the looks (and the releases).

`JobController` builds them with their collaborators and is what the manager runs.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from vigil.controllers.dispatcher import Dispatcher
from vigil.controllers.jobs.executor import Executor
from vigil.controllers.jobs.handlers import POD_BATCH_SECONDS, JobEvents
from vigil.controllers.jobs.orphans import Releaser
from vigil.controllers.jobs.pulled import Pulled
from vigil.controllers.jobs.reconciler import JobReconciler
from vigil.controllers.jobs.view import ClusterView
from vigil.controllers.worker import Worker
from vigil.core import fields
from vigil.core.liveness import STAMP_WRITES_PER_SECOND
from vigil.core.manifest import BeatChannel
from vigil.core.objects import Key
from vigil.core.orphans import SWEEP_SECONDS
from vigil.core.pull import PoolTiming
from vigil.kube.events import EventRecorder
from vigil.kube.operations import Kube
from vigil.metrics import CONTROLLER, Metrics
from vigil.runtime.clock import Clock
from vigil.runtime.workqueue import WorkQueue, namespace_of


def pool_of(job: Mapping[str, Any] | None) -> str | None:
    """A pulled array's spec.pool (None for any other job, or none)."""
    return (fields.spec(job).get("pool") or None) if job is not None else None


def job_queue(clock: Clock, metrics: Metrics) -> WorkQueue[Key]:
    """The job controller's work queue (the dispatcher wakes jobs into it too), fair across
    namespaces: one namespace's flood of jobs does not hold back another's."""
    return WorkQueue(
        clock,
        on_add=metrics.workqueue_adds.labels(CONTROLLER).inc,
        on_wait=metrics.workqueue_queue_duration.labels(CONTROLLER).observe,
        tenant=namespace_of,
    )


class JobController:
    """`pods_fresh()` and `repair(reason)` are the pod watches' (see
    `JobReconciler`); `sweep_scopes` and `accept`, the watches' scopes and filter, say where
    the orphan sweep lists pods (`Releaser`)."""

    def __init__(
        self,
        kube: Kube,
        queue: WorkQueue[Key],
        dispatcher: Dispatcher,
        events: EventRecorder,
        *,
        clock: Clock,
        metrics: Metrics,
        workers: int = 4,
        rng: random.Random | None = None,
        pods_fresh: Callable[[], bool] = lambda: True,
        repair: Callable[[str], None] = lambda reason: None,
        pod_batch_seconds: float = POD_BATCH_SECONDS,
        sweep_scopes: Iterable[str | None] = (None,),
        accept: Callable[[Mapping[str, Any]], bool] = lambda obj: True,
        sweep_seconds: float = SWEEP_SECONDS,
        beat_channel: BeatChannel | None = None,
        agent_image: str | None = None,
        stamp_writes_per_second: float = STAMP_WRITES_PER_SECOND,
        pool_timing: Callable[[str, str], PoolTiming] = lambda namespace, pool: PoolTiming(),
    ) -> None:
        self.kube, self.dispatcher, self.events, self.metrics = kube, dispatcher, events, metrics
        self.clock = clock
        rng = rng or random.Random()
        self.reconciling = False  # between start() and stop(): this process leads (beats count)
        self.view = ClusterView(stamp_writes_per_second)
        self.queue = queue
        self.releaser = Releaser(
            kube,
            self.view.pods,
            clock,
            rng,
            metrics=metrics,
            knows_job=self.view.knows_job,
            scopes=sweep_scopes,
            accept=accept,
            sweep_seconds=sweep_seconds,
        )
        self.handlers = JobEvents(
            self.view,
            self.queue,
            dispatcher,
            self.releaser,
            clock=clock,
            metrics=metrics,
            forget=self.forget,
            pod_batch_seconds=pod_batch_seconds,
        )
        self.executor = Executor(
            kube, self.view, self.queue, events, job_seen=self.handlers.job_seen, clock=clock, metrics=metrics
        )
        # The leases of pulled arrays (spec.pool): the leader's alone, made anew when it starts.
        self.pulled = Pulled(
            clock,
            self.queue.add,
            pool_timing,
            metrics.pull_claim_latency.observe,
            pool_of_job=lambda namespace, uid: pool_of(self.view.job_by_uid(namespace, uid)),
        )
        self.reconciler = JobReconciler(
            kube,
            self.view,
            self.queue,
            dispatcher,
            self.handlers,
            self.executor,
            events,
            clock=clock,
            rng=rng,
            pods_fresh=pods_fresh,
            repair=repair,
            beat_channel=beat_channel,
            agent_image=agent_image,
            task_outcomes=metrics.task_outcome,
            pulled=self.pulled,
        )
        self.worker = Worker(
            CONTROLLER, self.queue, self.reconciler, workers=workers, clock=clock, metrics=metrics, rng=rng
        )

    def forget(self, key: Key) -> None:
        """Everything known of the job goes (its pods aside: they are the watch's)."""
        job = self.view.drop(key)
        if job is not None:
            self.dispatcher.job_gone(*key)
            self.pulled.forget(fields.uid(job))
        self.queue.forget(key)
        self.reconciler.forget(key)
        self.executor.forget(key)
        self.worker.forget(key)

    async def start(self) -> None:
        """Begin reconciling: call once every watch has listed (before, a job whose pods are not
        listed yet would look as if its pods had vanished). Pods whose job is not known are
        released once the API server confirms their job is gone."""
        self.handlers.listed = True
        # Before this, beats posted to the leader went to another process: silence counts from now.
        self.view.tracker.took_over(self.clock.monotonic())
        self.pulled.start()  # before the looks: a pulled array's first look adopts
        self.reconciling = True
        self.releaser.start()  # before the looks, which hand it releases
        self.worker.start()
        pods = self.view.pods
        orphans = [pod for job in pods.jobs() if not self.view.knows_job(job) for pod in pods.of_job(job)]
        self.releaser.release_orphans(orphans)

    async def stop(self) -> None:
        """In the reverse order of `start`: the looks end before the releases they hand over."""
        self.reconciling = False
        await self.worker.stop()
        self.pulled.stop()
        await self.releaser.stop()
        self.queue.shutdown()
        self.reconciler.shutdown()
        self.executor.shutdown()
