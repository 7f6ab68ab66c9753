"""Releases of Vigil's attempt-tracking finalizer that no reconcile of a job makes: the pods of
a job deleted (nothing they say can be written anywhere any more), and orphans, pods whose job
this operator does not know (deleted while no operator ran, while the job watch lagged, or while
a look of it was cut short by its 404), released once the API server confirms their job is gone
(`vigil.core.orphans`). A periodic sweep lists Vigil's pods from the API server, so that an
orphan no event brings back (a finished pod, Terminating, that will never change again) is
found too.

The releases wait on a work queue of their own, keyed by the pod (namespace, name, UID), run by
a few workers of the generic `Worker`: a pod handed over twice while it waits is released once,
one worker at a time holds it, and a release that fails is retried with backoff; the sweep is a
key of that queue as well, so one sweep runs at a time. Remembers: what each key waiting or
being worked on is to do (`Release`), and the sweep's timer.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Callable, Iterable
from typing import Literal, NamedTuple

from vigil.controllers.jobs.podcache import PodCache
from vigil.controllers.worker import AfterFailure, Worker
from vigil.core import fields, orphans, podstate
from vigil.core.fields import Pod
from vigil.kube.operations import Kube
from vigil.metrics import Metrics
from vigil.runtime.clock import Clock
from vigil.runtime.timers import Timers
from vigil.runtime.workqueue import WorkQueue, namespace_of

log = logging.getLogger(__name__)

RELEASES = "vigiljob-orphans"  # the release queue's name in the workqueue and reconcile metrics
# Releases at once: each is a read and a patch, beside the looks' writes on the same connections;
# a sweep takes one of them while it lists.
RELEASE_WORKERS = 2


class PodRef(NamedTuple):
    """A pod to release: its UID fences the release, so a pod of the same name is left alone."""

    namespace: str
    name: str
    uid: str


Sweep = Literal["sweep"]
SWEEP: Sweep = "sweep"
ReleaseKey = PodRef | Sweep


@dataclasses.dataclass(frozen=True)
class Release:
    """What a key of the queue is to do. `confirm`: the API server is asked first whether the
    pod's job is gone (an orphan); else it is released outright (its job's deletion was seen).
    `forget`: the pod leaves the pod cache once released. `why`: for the logs."""

    pod: Pod
    tracked: bool
    confirm: bool
    forget: bool
    why: str

    def merged(self, newer: Release) -> Release:
        """Both asked of one pod: one release does what each would have done."""
        confirm = self.confirm and newer.confirm  # a job seen deleted needs no confirming
        return Release(
            newer.pod,
            tracked=self.tracked or newer.tracked,
            confirm=confirm,
            forget=self.forget or newer.forget,
            why=newer.why if newer.confirm == confirm else self.why,
        )


def ref_of(pod: Pod) -> PodRef:
    return PodRef(fields.namespace(pod), fields.name(pod), fields.uid(pod))


class Releaser:
    """`knows_job((namespace, uid))`: whether the operator holds that job (its pods are then its looks').
    `scopes` and `accept`: where the sweep lists pods and which it keeps, as the watches do
    (`vigil.manager.watch_scopes`). Releases handed over before `start()` wait for it; those
    handed over after `stop()` are left to the next leader's sweep."""

    def __init__(
        self,
        kube: Kube,
        pods: PodCache,
        clock: Clock,
        rng: random.Random | None = None,
        *,
        metrics: Metrics,
        knows_job: Callable[[tuple[str, str]], bool] = lambda job: False,
        scopes: Iterable[str | None] = (None,),
        accept: Callable[[Pod], bool] = lambda pod: True,
        sweep_seconds: float = orphans.SWEEP_SECONDS,
        workers: int = RELEASE_WORKERS,
    ) -> None:
        self.kube, self.pods, self.clock = kube, pods, clock
        self.rng = rng or random.Random()
        self.knows_job, self.scopes, self.accept = knows_job, list(scopes), accept
        self.sweep_seconds = sweep_seconds
        self.queue: WorkQueue[ReleaseKey] = WorkQueue(
            clock,
            on_add=metrics.workqueue_adds.labels(RELEASES).inc,
            on_wait=metrics.workqueue_queue_duration.labels(RELEASES).observe,
            tenant=namespace_of,
        )
        self.worker = Worker(RELEASES, self.queue, self, workers=workers, clock=clock, metrics=metrics, rng=self.rng)
        self._releases: dict[PodRef, Release] = {}
        self._sweeps: Timers[Sweep] = Timers(clock, self.queue.add)
        self._stopped = False

    def release(self, pods: Iterable[Pod], what: str) -> None:
        """Releases those of `pods` that carry the finalizer."""
        for pod in pods:
            if podstate.is_tracked(pod):
                self._hand_over(pod, Release(pod, tracked=True, confirm=False, forget=False, why=what))

    def release_orphan(self, pod: Pod) -> None:
        """Releases the pod once the API server confirms that its job is gone."""
        tracked = podstate.is_tracked(pod)
        self._hand_over(pod, Release(pod, tracked=tracked, confirm=True, forget=True, why="its job is gone"))

    def release_orphans(self, pods: Iterable[Pod]) -> None:
        """As `release_orphan`, for each of `pods`."""
        for pod in pods:
            self.release_orphan(pod)

    def start(self) -> None:
        """Starts the workers, and sweeps for orphans every `sweep_seconds` (jittered), the first
        a period from now (the first listing's orphans are handed over by the controller)."""
        self._stopped = False
        self.worker.start()
        self._next_sweep()

    def busy(self) -> bool:
        """Whether a release waits or is being worked on."""
        return bool(self._releases)

    async def stop(self) -> None:
        """Stops the workers (a release in flight is cancelled: a pod's release is idempotent and
        the next leader's sweep finds what is left) and empties the queue."""
        self._stopped = True
        self._sweeps.shutdown()
        await self.worker.stop()
        self.queue.shutdown()
        while len(self.queue):  # no worker holds a key any more: every one left is ready
            key = await self.queue.get()
            self.queue.done(key)
            self.worker.forget(key)
        for ref in self._releases:
            self.worker.forget(ref)
        self.worker.forget(SWEEP)
        self._releases.clear()

    def _hand_over(self, pod: Pod, release: Release) -> None:
        if self._stopped:
            return
        ref = ref_of(pod)
        held = self._releases.get(ref)
        self._releases[ref] = release if held is None else held.merged(release)
        self.queue.add(ref)

    def _next_sweep(self) -> None:
        self._sweeps.set_after(SWEEP, orphans.next_sweep_in(self.sweep_seconds, self.rng.random()))

    async def sweep(self) -> None:
        """One sweep (the queue runs one every `sweep_seconds`): lists Vigil's pods from the API
        server, page by page, as their metadata; hands over every one that still carries the
        finalizer and whose job the operator does not know, to be asked about."""
        for scope in self.scopes:
            async for page in self.kube.list_vigil_pods(scope):
                found = orphans.candidates([pod for pod in page if self.accept(pod)], self.knows_job)
                if found:
                    log.info("the sweep found %d pods whose job is not known; asking about them", len(found))
                    self.release_orphans(found)

    # --- the Worker's reconciler ------------------------------------------------------------

    async def reconcile(self, key: ReleaseKey) -> None:
        if not isinstance(key, PodRef):
            await self.sweep()
            self._next_sweep()  # a period after this one ended: sweeps never overlap
            return
        release = self._releases.get(key)
        if release is None:
            return
        await self._release(key, release)
        if self._releases.get(key) is release:  # else handed over again meanwhile: the queue brings it back
            del self._releases[key]

    async def failed(self, key: ReleaseKey, err: Exception, in_a_row: int) -> AfterFailure:
        log.warning("%s failed (%d in a row), retrying with backoff: %s", self._describe(key), in_a_row, err)
        return AfterFailure.ERROR

    async def recovered(self, key: ReleaseKey) -> None:
        pass

    async def _release(self, ref: PodRef, release: Release) -> None:
        pod = release.pod
        if release.confirm:
            key, owner = podstate.owner_key(pod), podstate.owning_job(pod)
            job = await self.kube.read_job(*key) if key is not None else None
            if owner is not None and not orphans.orphaned(pod, job):  # the API server's word, not the cache's
                return
        if release.tracked:
            await self.kube.release_pod(ref.namespace, ref.name, ref.uid)
        owner = podstate.owning_job(pod)
        if release.forget and owner is not None:
            self.pods.gone(owner, ref.uid)

    def _describe(self, key: ReleaseKey) -> str:
        if not isinstance(key, PodRef):
            return "sweeping for pods whose job is gone"
        release = self._releases.get(key)
        why = f" ({release.why})" if release is not None else ""
        return f"releasing pod {key.namespace}/{key.name}{why}"
