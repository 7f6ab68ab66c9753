"""The VigilWorkerPool controller: each pool's worker pods and status, as `core.pools.decide_pool`
decides them, on the leader alone.

A pool is looked at when it changes, when one of its pods changes (both from the watches, batched
over half a second), when the lease state pokes it (`poke`: its backlog changed; batched over
`POKE_BATCH_SECONDS`), and at least every `RESYNC_SECONDS` (its load is asked for, not watched).
A look writes the status first when it changed (a merge patch fenced by the pool's
resourceVersion: a conflict voids the look, and the watch brings the newer pool), then creates
and deletes pods (each delete fenced by the pod's UID, and a worker chosen as idle kept if the lease state says it
took a task meanwhile). No pod is created or deleted while the pod
watch cannot be believed (`pods_fresh`).

Remembers, per pool: the object as last seen (its template makes the pods), its pods (trimmed by
`core.pools.keep_pool_pod`), the pods it deleted and the watch has not shown going yet (so the
next look does not count them again and delete another worker), the scale-down window
(`core.pools.ScaleMemory`: in memory, see that module for why), and the last failure to create a
pod (shown in the Ready condition until a create succeeds).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping
from typing import Any

from vigil.controllers.worker import AfterFailure, Worker
from vigil.core import fields, podstate
from vigil.core.manifest import BeatChannel
from vigil.core.objects import is_older
from vigil.core.pools import EMPTY_LOAD, PoolLoad, ScaleMemory, decide_pool, has_ended, pool_of, random_suffix
from vigil.core.pull import PoolPod
from vigil.kube.errors import ApiError, Conflict
from vigil.kube.operations import Kube
from vigil.kube.seen import Delta
from vigil.metrics import Metrics
from vigil.runtime.clock import Clock
from vigil.runtime.workqueue import WorkQueue, namespace_of

log = logging.getLogger(__name__)

POOL_CONTROLLER = "vigilworkerpool"  # the controller's name in the workqueue and reconcile metrics
PoolKey = tuple[str, str]  # (namespace, pool name)

EVENT_BATCH_SECONDS = 0.5  # a pool's and its pods' changes of this long cost one look
POKE_BATCH_SECONDS = 2.0  # the backlog's changes: one look (and at most one status write) per this
RESYNC_SECONDS = 5.0  # every pool is looked at this often: its load is not watched
UNFRESH_RETRY_SECONDS = 1.0  # a look while the pod watch cannot be believed comes back after this
CREATES_AT_ONCE = 16  # pod creations of one look in flight at once


def no_load(namespace: str, name: str) -> PoolLoad:
    """The load of a pool while nothing reports it: no task waits, none runs."""
    return EMPTY_LOAD


class PoolController:
    def __init__(
        self,
        kube: Kube,
        *,
        clock: Clock,
        metrics: Metrics,
        beat_channel: BeatChannel | None,
        pool_load: Callable[[str, str], PoolLoad] = no_load,
        pods_fresh: Callable[[], bool] = lambda: True,
        rng: random.Random | None = None,
    ) -> None:
        self.kube, self.clock, self.metrics = kube, clock, metrics
        self.beat_channel, self.pool_load, self.pods_fresh = beat_channel, pool_load, pods_fresh
        self.rng = rng or random.Random()
        self.queue: WorkQueue[PoolKey] = WorkQueue(
            clock,
            on_add=metrics.workqueue_adds.labels(POOL_CONTROLLER).inc,
            on_wait=metrics.workqueue_queue_duration.labels(POOL_CONTROLLER).observe,
            tenant=namespace_of,
        )
        self.worker = Worker(POOL_CONTROLLER, self.queue, self, workers=1, clock=clock, metrics=metrics, rng=self.rng)
        self.pools: dict[PoolKey, Mapping[str, Any]] = {}
        self.pods: dict[PoolKey, dict[str, Mapping[str, Any]]] = {}
        self._deleted: dict[PoolKey, set[str]] = {}  # UIDs of pods deleted, not yet seen deleting or gone
        self._memory: dict[PoolKey, ScaleMemory] = {}
        self._create_error: dict[PoolKey, str] = {}
        self._running = False

    # --- what the watches and the lease state say --------------------------------------------

    def pool_delta(self, delta: Delta) -> None:
        key = (fields.namespace(delta.obj), fields.name(delta.obj))
        if delta.kind == "delete":
            self.pools.pop(key, None)
            self._memory.pop(key, None)
            self._create_error.pop(key, None)
            self.queue.forget(key)
            self.worker.forget(key)
            return
        held = self.pools.get(key)
        if held is None or not is_older(delta.obj, held):  # never back behind our own write's answer
            self.pools[key] = delta.obj
        self._look(key, EVENT_BATCH_SECONDS)

    def pod_delta(self, delta: Delta) -> None:
        key = pool_of(delta.obj)
        if key is None:
            return
        name, uid = fields.name(delta.obj), fields.uid(delta.obj)
        pods = self.pods.setdefault(key, {})
        held = pods.get(name)
        if delta.kind == "delete":
            if held is not None and fields.uid(held) == uid:
                del pods[name]
            self._deleted.get(key, set()).discard(uid)
            if not pods:
                self.pods.pop(key, None)
        else:
            if held is None or not is_older(delta.obj, held):
                pods[name] = delta.obj
            if fields.deletion_timestamp(delta.obj):
                self._deleted.get(key, set()).discard(uid)
        self._look(key, EVENT_BATCH_SECONDS)

    def worker_pod(self, namespace: str, name: str) -> PoolPod | None:
        """The pool pod of that name as the watch holds it, for the pull endpoint: which pool it
        works for, its UID, and whether it is being deleted or has ended (it claims nothing)."""
        for (ns, pool), pods in self.pods.items():
            if ns != namespace:
                continue
            pod = pods.get(name)
            if pod is not None:
                ended = bool(fields.deletion_timestamp(pod)) or podstate.is_finished(pod)
                return PoolPod(pool, fields.uid(pod), ended)
        return None

    def poke(self, namespace: str, name: str) -> None:
        """The pool's load changed (the lease state says so): a look soon, batched."""
        self._look((namespace, name), POKE_BATCH_SECONDS)

    def _look(self, key: PoolKey, within: float) -> None:
        if self._running and key in self.pools:
            self.queue.add_batched(key, within)

    # --- the runnable ---------------------------------------------------------------------

    async def start(self) -> None:
        self._running = True
        self.worker.start()
        for key in list(self.pools):
            self.queue.add(key)

    async def stop(self) -> None:
        self._running = False
        await self.worker.stop()
        self.queue.shutdown()

    # --- one look -------------------------------------------------------------------------

    async def reconcile(self, key: PoolKey) -> None:
        body = self.pools.get(key)
        if body is None:
            return
        if not self.pods_fresh():
            self.queue.add_after(key, UNFRESH_RETRY_SECONDS)
            return
        namespace, name = key
        deleted = self._deleted.get(key, set())
        pods = [
            {**pod, "metadata": {**pod["metadata"], "deletionTimestamp": "deleted by Vigil"}}
            if fields.uid(pod) in deleted
            else pod
            for pod in self.pods.get(key, {}).values()
        ]
        decision = decide_pool(
            body,
            pods,
            self.pool_load(namespace, name),
            now=self.clock.wall(),
            monotonic=self.clock.monotonic(),
            memory=self._memory.get(key),
            beat_channel=self.beat_channel,
            suffix=lambda: random_suffix(self.rng),
            create_error=self._create_error.get(key),
        )
        if decision.memory is None:
            self._memory.pop(key, None)
        else:
            self._memory[key] = decision.memory
        if decision.status is not None:
            updated = await self.kube.patch_pool_status(
                namespace, name, decision.resource_version or "", decision.status
            )
            if updated is None:
                return  # the pool is gone: its pods go with it
            if key in self.pools:
                self.pools[key] = updated
        await self._create(key, [action.manifest for action in decision.create])
        for action in decision.delete:
            if self._claimed_since(key, action.name):
                log.debug("the worker pod %s of VigilWorkerPool %s/%s took a task: kept", action.name, namespace, name)
                continue
            await self.kube.delete_pod(namespace, action.name, action.uid)
            self._deleted.setdefault(key, set()).add(action.uid)
            log.info("deleted the worker pod %s of VigilWorkerPool %s/%s", action.name, namespace, name)
        again = RESYNC_SECONDS if decision.requeue_after is None else min(RESYNC_SECONDS, decision.requeue_after)
        self.queue.add_after(key, again)

    def _claimed_since(self, key: PoolKey, pod_name: str) -> bool:
        """Whether a worker the look chose to remove as idle has taken a task since (a claim
        may have been answered while the look awaited its writes): asked again right before its
        deletion. A pod that ended runs nothing, whatever the load says."""
        pod = self.pods.get(key, {}).get(pod_name)
        if pod is None or has_ended(pod):
            return False
        return self.pool_load(*key).busy.get(pod_name, 0) > 0

    async def _create(self, key: PoolKey, manifests: list[dict[str, Any]]) -> None:
        """The pods, CREATES_AT_ONCE at a time; each created goes into this controller's pods at
        once (the next look counts it whatever the watch has shown). The first failure is raised
        after the others, and kept for the Ready condition."""
        if not manifests:
            return
        namespace, name = key
        gate = asyncio.Semaphore(CREATES_AT_ONCE)

        async def one(manifest: dict[str, Any]) -> None:
            async with gate:
                created = await self.kube.create_pool_pod(namespace, manifest)
            if created is not None:
                self.pods.setdefault(key, {})[fields.name(created)] = created
                log.info("created the worker pod %s of VigilWorkerPool %s/%s", fields.name(created), namespace, name)

        results = await asyncio.gather(*(one(m) for m in manifests), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if not failures:
            self._create_error.pop(key, None)
            return
        first = failures[0]
        self._create_error[key] = str(first)
        raise first

    async def failed(self, key: PoolKey, err: Exception, in_a_row: int) -> AfterFailure:
        if isinstance(err, Conflict):  # the pool changed since it was read: the watch brings it
            log.debug("conflict writing the status of VigilWorkerPool %s/%s: %s", *key, err)
            return AfterFailure.CONFLICT
        if key not in self.pools:
            return AfterFailure.FORGET
        level = logging.WARNING if isinstance(err, ApiError) else logging.ERROR
        log.log(level, "VigilWorkerPool %s/%s: %s", *key, err, exc_info=not isinstance(err, ApiError))
        return AfterFailure.ERROR

    async def recovered(self, key: PoolKey) -> None:
        pass
