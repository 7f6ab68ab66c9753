"""The VigilQueue controller: each queue's status (its counts, the head of its line, its
conditions), read from the queue book and written when it changed, at most every
`STATUS_PERIOD_SECONDS` per queue, never once per job event. While jobs wait, the oldest wait
grows with time alone, so such a queue is looked at again every period.

Remembers, per VigilQueue: the object as last seen (for its conditions and generation), the
status last written (an unchanged one costs no write) and when. All of it goes with the queue.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Mapping
from typing import Any

from vigil.controllers.worker import AfterFailure, Worker
from vigil.core import fields
from vigil.core.objects import is_older
from vigil.core.queueing.book import QueueBook, QueueKey, Standing
from vigil.core.queueing.status import queue_status, same_status, status_patch
from vigil.kube.errors import Conflict
from vigil.kube.operations import Kube
from vigil.kube.seen import Delta
from vigil.metrics import QUEUE_CONTROLLER, Metrics
from vigil.runtime.clock import Clock
from vigil.runtime.workqueue import WorkQueue, namespace_of

log = logging.getLogger(__name__)

STATUS_PERIOD_SECONDS = 2.0  # a queue's status is written at most this often


class QueueStatusController:
    def __init__(
        self, kube: Kube, book: QueueBook, *, clock: Clock, metrics: Metrics, rng: random.Random | None = None
    ) -> None:
        self.kube, self.book, self.clock, self.metrics = kube, book, clock, metrics
        self.queue: WorkQueue[QueueKey] = WorkQueue(
            clock,
            on_add=metrics.workqueue_adds.labels(QUEUE_CONTROLLER).inc,
            on_wait=metrics.workqueue_queue_duration.labels(QUEUE_CONTROLLER).observe,
            tenant=namespace_of,
        )
        self.worker = Worker(QUEUE_CONTROLLER, self.queue, self, workers=1, clock=clock, metrics=metrics, rng=rng)
        self.queues: dict[QueueKey, Mapping[str, Any]] = {}
        self._written: dict[QueueKey, dict[str, Any]] = {}
        self._written_at: dict[QueueKey, float] = {}

    def queue_delta(self, delta: Delta) -> None:
        key = (fields.namespace(delta.obj), fields.name(delta.obj))
        if delta.kind == "delete":
            self.metrics.forget_queue(*key)
            self.queues.pop(key, None)
            self._written.pop(key, None)
            self._written_at.pop(key, None)
            self.queue.forget(key)
            self.worker.forget(key)
            return
        held = self.queues.get(key)
        if held is None or not is_older(delta.obj, held):  # never back behind our own write's answer
            self.queues[key] = delta.obj
        self.changed(key)

    def changed(self, key: QueueKey) -> None:
        """The queue's book changed: its status is looked at once its period since the last
        write has passed."""
        if key not in self.queues:
            return
        due = self._written_at.get(key, -math.inf) + STATUS_PERIOD_SECONDS
        self.queue.add_after(key, max(0.0, due - self.clock.monotonic()))

    async def start(self) -> None:
        self.worker.start()
        for key in list(self.queues):
            self.changed(key)

    async def stop(self) -> None:
        await self.worker.stop()
        self.queue.shutdown()

    async def reconcile(self, key: QueueKey) -> None:
        body = self.queues.get(key)
        status = queue_status(self.book, key, self.clock.wall().timestamp())
        if body is None or status is None:
            return
        patch = status_patch(body, status, self.clock.wall())
        if not same_status(patch, self._written.get(key)):
            updated = await self.kube.patch_queue_status(key[0], key[1], fields.resource_version(body), patch)
            self._written[key], self._written_at[key] = patch, self.clock.monotonic()
            if updated is not None and key in self.queues:
                self.queues[key] = updated
        if self.book.count(key, Standing.QUEUED):  # the oldest wait grows
            self.queue.add_after(key, STATUS_PERIOD_SECONDS)

    async def failed(self, key: QueueKey, err: Exception, in_a_row: int) -> AfterFailure:
        if isinstance(err, Conflict):  # the queue changed since it was read: the watch brings it
            log.debug("conflict writing the status of VigilQueue %s/%s: %s", *key, err)
            return AfterFailure.CONFLICT
        log.warning("could not write the status of VigilQueue %s/%s: %s", *key, err)
        return AfterFailure.ERROR

    async def recovered(self, key: QueueKey) -> None:
        pass
