"""Releases of Vigil's attempt-tracking finalizer that no reconcile of a job makes: the pods of
a job deleted (nothing they say can be written anywhere any more), and orphans, pods whose job
this operator does not know (deleted while no operator ran, while the job watch lagged, or while
a look of it was cut short by its 404), released once the API server confirms their job is gone
(`vigil.core.orphans`). A periodic sweep lists Vigil's pods from the API server, so that an
orphan no event brings back (a finished pod, Terminating, that will never change again) is
found too.

Each runs apart from the work queue, retried with backoff until it succeeds (releasing a
finalizer already gone is done). Remembers: the tasks running, the pods whose job is being
looked up (so a pod's every event does not start another lookup), and the sweep's timer.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from vigil.controllers.jobs.podcache import PodCache
from vigil.core import orphans, podstate
from vigil.core.backoff import reconcile_retry_delay
from vigil.kube.operations import Kube
from vigil.runtime.clock import Clock
from vigil.runtime.timers import Timers

log = logging.getLogger(__name__)

Pod = Mapping[str, Any]


class Releaser:
    """`knows_job((namespace, uid))`: whether the operator holds that job (its pods are then its looks').
    `scopes` and `accept`: where the sweep lists pods and which it keeps, as the watches do
    (`vigil.manager.watch_scopes`)."""

    def __init__(
        self,
        kube: Kube,
        pods: PodCache,
        clock: Clock,
        rng: random.Random | None = None,
        *,
        knows_job: Callable[[tuple[str, str]], bool] = lambda job: False,
        scopes: Iterable[str | None] = (None,),
        accept: Callable[[Pod], bool] = lambda pod: True,
        sweep_seconds: float = orphans.SWEEP_SECONDS,
    ) -> None:
        self.kube, self.pods, self.clock = kube, pods, clock
        self.rng = rng or random.Random()
        self.knows_job, self.scopes, self.accept = knows_job, list(scopes), accept
        self.sweep_seconds = sweep_seconds
        self._tasks: set[asyncio.Task] = set()
        self._looking_up: set[str] = set()  # pod UIDs whose job is being looked up
        self._sweeps: Timers[str] = Timers(clock, lambda _: self._sweep_now())
        self._sweep_task: asyncio.Task | None = None

    def release(self, pods: Iterable[Pod], what: str) -> None:
        """Releases those of `pods` that carry the finalizer."""
        tracked = [pod for pod in pods if podstate.is_tracked(pod)]
        if tracked:
            self._in_background(lambda: self._release(tracked), f"releasing {what}")

    def release_orphan(self, pod: Pod) -> None:
        """Releases the pod once the API server confirms that its job is gone (once at a time)."""
        uid = pod["metadata"]["uid"]
        if uid in self._looking_up:
            return
        self._looking_up.add(uid)

        async def check() -> None:
            try:
                await self._release_orphans([pod])
            finally:
                self._looking_up.discard(uid)

        self._in_background(check, f"releasing pod {pod['metadata']['name']}, whose job is gone")

    def release_orphans(self, pods: list[Pod]) -> None:
        """As `release_orphan`, for the pods a first listing found without a known job."""
        if pods:
            self._in_background(lambda: self._release_orphans(pods), "releasing pods whose job is gone")

    def start_sweeping(self) -> None:
        """Sweeps for orphans every `sweep_seconds` (jittered), the first a period from now (the
        first listing's orphans are released by `release_orphans` at once)."""
        self._sweeps.set_after("sweep", orphans.next_sweep_in(self.sweep_seconds, self.rng.random()))

    def busy(self) -> bool:
        return bool(self._tasks)

    async def stop(self) -> None:
        self._sweeps.shutdown()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _release(self, pods: list[Pod]) -> None:
        for pod in pods:
            meta = pod["metadata"]
            await self.kube.release_pod(meta["namespace"], meta["name"], meta["uid"])

    async def _release_orphans(self, pods: list[Pod]) -> None:
        for pod in pods:
            key, owner = podstate.owner_key(pod), podstate.owning_job(pod)
            job = await self.kube.read_job(*key) if key is not None else None
            if owner is None or orphans.orphaned(pod, job):  # the API server's word, not the cache's
                await self._release([pod] if podstate.is_tracked(pod) else [])
                if owner is not None:
                    self.pods.gone(owner, pod["metadata"]["uid"])

    def _sweep_now(self) -> None:
        if self._sweep_task is None or self._sweep_task.done():  # a slow sweep does not pile up
            self._sweep_task = self._in_background(self.sweep, "sweeping for pods whose job is gone")
        self.start_sweeping()

    async def sweep(self) -> None:
        """One sweep (the timer runs one every `sweep_seconds`): lists Vigil's pods from the API
        server, page by page, as their metadata; asks about every one that still carries the
        finalizer and whose job the operator does not know."""
        for scope in self.scopes:
            async for page in self.kube.list_vigil_pods(scope):
                found = orphans.candidates([pod for pod in page if self.accept(pod)], self.knows_job)
                if found:
                    log.info("the sweep found %d pods whose job is not known; asking about them", len(found))
                    await self._release_orphans(found)

    def _in_background(self, work: Callable[[], Awaitable[None]], what: str) -> asyncio.Task:
        async def attempts() -> None:
            failures = 0
            while True:
                try:
                    await work()
                    return
                except Exception as err:
                    failures += 1
                    delay = reconcile_retry_delay(failures, self.rng.random())
                    log.warning("%s failed (%s); retrying in %.0fs", what, err, delay)
                    await self.clock.sleep(delay)

        task = asyncio.ensure_future(attempts())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
