"""Releases of Vigil's attempt-tracking finalizer that no reconcile of a job makes: the pods of
a job deleted (nothing they say can be written anywhere any more), and orphans, pods whose job
this operator does not know (deleted while no operator ran, or while the job watch lagged),
released once the API server confirms their job is gone.

Each runs apart from the work queue, retried with backoff until it succeeds (releasing a
finalizer already gone is done). Remembers: the tasks running, and the pods whose job is being
looked up (so a pod's every event does not start another lookup).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from vigil.controllers.jobs.podcache import PodCache
from vigil.core import podstate
from vigil.core.backoff import reconcile_retry_delay
from vigil.kube.operations import Kube
from vigil.runtime.clock import Clock

log = logging.getLogger(__name__)

Pod = Mapping[str, Any]


class Releaser:
    def __init__(self, kube: Kube, pods: PodCache, clock: Clock, rng: random.Random | None = None) -> None:
        self.kube, self.pods, self.clock = kube, pods, clock
        self.rng = rng or random.Random()
        self._tasks: set[asyncio.Task] = set()
        self._looking_up: set[str] = set()  # pod UIDs whose job is being looked up

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

    def busy(self) -> bool:
        return bool(self._tasks)

    async def stop(self) -> None:
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
            if owner is None or job is None or job["metadata"]["uid"] != owner[1]:
                await self._release([pod] if podstate.is_tracked(pod) else [])
                if owner is not None:
                    self.pods.gone(owner, pod["metadata"]["uid"])

    def _in_background(self, work: Callable[[], Awaitable[None]], what: str) -> None:
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
