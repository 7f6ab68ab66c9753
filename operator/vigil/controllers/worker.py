"""Workers that take keys from a work queue and reconcile them: the loop every controller of
Vigil runs, with controller-runtime's metrics and client-go's retry with backoff.

A key is reconciled by one worker at a time (the work queue's guarantee). What a failure means
is the reconciler's to say (`Reconciler.failed`): forget the key, retry it after a conflict
(soon), or retry it after an error (backing off further); the delays are `core.backoff`'s. The
failures in a row per key are counted here and dropped on the first success, which the
reconciler hears of (`recovered`) so it can take back what it said about the failure.

The workers are supervised: one that ends by an exception (say, its reconciler's `failed`
raised) is logged and restarted after a backoff (`core.supervision`), and the key it held is
looked at again after its retry delay, not dropped. `health()` is what `/healthz` asks: it fails
while a worker is dead or keeps dying.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
from collections.abc import Hashable
from typing import Generic, Protocol, TypeVar

from vigil.core.backoff import reconcile_retry_delay
from vigil.core.supervision import Crashes
from vigil.metrics import Metrics
from vigil.runtime import logs
from vigil.runtime.clock import Clock
from vigil.runtime.timers import Timers
from vigil.runtime.workqueue import WorkQueue

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
K_contra = TypeVar("K_contra", contravariant=True)


class AfterFailure(enum.Enum):
    FORGET = "forget"  # the object is gone: nothing to retry
    CONFLICT = "requeue"  # routine: someone wrote first; look again soon
    ERROR = "error"  # retried with a longer backoff


class Reconciler(Protocol[K_contra]):
    async def reconcile(self, key: K_contra) -> None: ...

    async def failed(self, key: K_contra, err: Exception, in_a_row: int) -> AfterFailure:
        """What reconciling `key` raising `err` (the `in_a_row`-th failure in a row) means."""
        ...

    async def recovered(self, key: K_contra) -> None:
        """The first success after failures."""
        ...


class Worker(Generic[K]):
    def __init__(
        self,
        name: str,
        queue: WorkQueue[K],
        reconciler: Reconciler[K],
        *,
        workers: int,
        clock: Clock,
        metrics: Metrics,
        rng: random.Random | None = None,
    ) -> None:
        self.name, self.queue, self.reconciler = name, queue, reconciler
        self.workers, self.clock, self.metrics = workers, clock, metrics
        self.rng = rng or random.Random()
        self._failures: dict[K, int] = {}
        self._tasks: dict[int, asyncio.Task] = {}
        self._running = False
        self._crashes = Crashes()
        self._down_since: dict[int, float] = {}  # crashed workers not restarted yet
        self._restarts: Timers[int] = Timers(clock, self._spawn)

    def start(self) -> None:
        self._running = True
        for i in range(self.workers):
            self._spawn(i)

    async def stop(self) -> None:
        self._running = False
        self._restarts.shutdown()
        self._down_since.clear()
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = {}

    def health(self) -> str | None:
        """None while every worker runs or is about to be restarted; else what is wrong."""
        if not self._running:
            return None  # not started (a standby) or stopped: nothing to supervise
        why = self._crashes.verdict(self.clock.monotonic(), self._down_since.values())
        return None if why is None else f"{self.name}: {why}"

    def _spawn(self, i: int) -> None:
        if not self._running:
            return
        self._down_since.pop(i, None)
        task = asyncio.create_task(self._work(), name=f"{self.name}-worker-{i}")
        self._tasks[i] = task
        task.add_done_callback(lambda done: self._ended(i, done))

    def _ended(self, i: int, task: asyncio.Task) -> None:
        if not self._running or task.cancelled() or self._tasks.get(i) is not task:
            return
        now = self.clock.monotonic()
        delay = self._crashes.crashed(now, self.rng.random())
        self.metrics.worker_crashes.labels(self.name).inc()
        err = task.exception()
        log.error(
            "worker %s-%d crashed (%d in the last minute); restarting it in %.1fs",
            self.name,
            i,
            self._crashes.recent(now),
            delay,
            exc_info=(type(err), err, err.__traceback__) if err is not None else None,
        )
        self._down_since[i] = now
        self._restarts.set_after(i, delay)

    def forget(self, key: K) -> None:
        """The object is gone: drop its count of failures."""
        self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    async def process(self, key: K) -> None:
        """One reconcile of `key`, taken from the queue by the caller, with its outcome handled."""
        m, name = self.metrics, self.name
        m.workqueue_depth.labels(name).set(len(self.queue))
        began, result = self.clock.monotonic(), "success"
        context = logs.reconciling(name, key)  # every line logged until done() names the object
        try:
            await self.reconciler.reconcile(key)
            if self._failures.pop(key, None):
                await self.reconciler.recovered(key)
        except Exception as err:
            in_a_row = self._failures.get(key, 0) + 1
            outcome = await self.reconciler.failed(key, err, in_a_row)
            if outcome is AfterFailure.FORGET:
                self.forget(key)
            else:
                result = outcome.value
                if outcome is AfterFailure.ERROR:
                    m.reconcile_errors.labels(name).inc()
                m.workqueue_retries.labels(name).inc()
                self._failures[key] = in_a_row
                delay = reconcile_retry_delay(in_a_row, self.rng.random(), conflict=outcome is AfterFailure.CONFLICT)
                self.queue.add_after(key, delay)
        finally:
            elapsed = self.clock.monotonic() - began
            m.reconcile_total.labels(name, result).inc()
            m.reconcile_time.labels(name).observe(elapsed)
            m.workqueue_work_duration.labels(name).observe(elapsed)
            logs.done(context)

    async def _work(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                await self.process(key)
            except Exception:
                # The worker dies (its supervisor restarts it), not the key: it is looked at
                # again after the delay its failures in a row deserve.
                in_a_row = self._failures[key] = self._failures.get(key, 0) + 1
                self.queue.add_after(key, reconcile_retry_delay(in_a_row, self.rng.random()))
                raise
            finally:
                self.queue.done(key)
