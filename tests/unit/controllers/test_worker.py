"""The generic worker: a failure is retried after the backoff its kind deserves, a forgotten key
is not retried, the first success after failures is heard of, and metrics count each result."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.clock import FakeClock
from vigil.controllers.worker import AfterFailure, Worker
from vigil.core.backoff import CONFLICT_DELAYS, ERROR_DELAYS
from vigil.core.supervision import CRASH_WINDOW_SECONDS, CRASHES_TOLERATED, DOWN_GRACE_SECONDS, RESTART_DELAYS
from vigil.metrics import Metrics
from vigil.runtime.workqueue import WorkQueue

pytestmark = pytest.mark.unit


class Scripted:
    """Raises the scripted errors in turn, then succeeds; says what each failure means."""

    def __init__(self, clock: FakeClock, *errors: Exception, verdict: AfterFailure = AfterFailure.ERROR) -> None:
        self.clock, self.errors, self.verdict = clock, list(errors), verdict
        self.looks: list[float] = []
        self.recoveries: list[str] = []
        self.failures: list[int] = []

    async def reconcile(self, key: str) -> None:
        self.looks.append(self.clock.now)
        if self.errors:
            raise self.errors.pop(0)

    async def failed(self, key: str, err: Exception, in_a_row: int) -> AfterFailure:
        self.failures.append(in_a_row)
        return self.verdict

    async def recovered(self, key: str) -> None:
        self.recoveries.append(key)


def run(reconciler: Scripted, clock: FakeClock, seconds: float) -> Metrics:
    async def scenario() -> Metrics:
        metrics = Metrics()
        queue: WorkQueue[str] = WorkQueue(clock)
        worker = Worker("test", queue, reconciler, workers=1, clock=clock, metrics=metrics)
        worker.start()
        queue.add("k")
        await clock.advance(seconds)
        await worker.stop()
        return metrics

    return asyncio.run(scenario())


def value(metrics: Metrics, name: str, *labels: str) -> float:
    return metrics.registry.get_sample_value(name, dict(zip(("controller", "result"), labels, strict=False))) or 0.0


def test_errors_are_retried_with_a_growing_backoff_and_the_recovery_is_heard():
    clock = FakeClock()
    reconciler = Scripted(clock, RuntimeError("1"), RuntimeError("2"), RuntimeError("3"))
    metrics = run(reconciler, clock, 60)
    gaps = [b - a for a, b in zip(reconciler.looks, reconciler.looks[1:], strict=False)]
    first = ERROR_DELAYS[0]
    assert len(reconciler.looks) == 4 and reconciler.failures == [1, 2, 3]
    assert first / 2 <= gaps[0] <= first and 2 * first / 2 <= gaps[1] <= 2 * first, gaps
    assert 4 * first / 2 <= gaps[2] <= 4 * first, gaps
    assert reconciler.recoveries == ["k"], "the first success after failures is reported once"
    assert value(metrics, "controller_runtime_reconcile_total", "test", "error") == 3
    assert value(metrics, "controller_runtime_reconcile_total", "test", "success") == 1
    assert metrics.registry.get_sample_value("workqueue_retries_total", {"name": "test"}) == 3


def test_a_conflict_is_looked_at_again_soon():
    clock = FakeClock()
    reconciler = Scripted(clock, RuntimeError("409"), verdict=AfterFailure.CONFLICT)
    metrics = run(reconciler, clock, 10)
    assert len(reconciler.looks) == 2
    assert reconciler.looks[1] - reconciler.looks[0] <= CONFLICT_DELAYS[0]
    assert value(metrics, "controller_runtime_reconcile_total", "test", "requeue") == 1
    assert metrics.registry.get_sample_value("controller_runtime_reconcile_errors_total", {"controller": "test"}) in (
        None,
        0.0,
    ), "a conflict is routine, not an error"


def test_a_forgotten_key_is_not_retried():
    clock = FakeClock()
    reconciler = Scripted(clock, RuntimeError("404"), verdict=AfterFailure.FORGET)
    run(reconciler, clock, 600)
    assert len(reconciler.looks) == 1 and reconciler.recoveries == []


class HandlerFails(Scripted):
    """Every reconcile fails, and so does the error handler for the first `broken` failures (as
    the job controller's does when the status write that reports the failure fails too)."""

    def __init__(self, clock: FakeClock, broken: int, looks: int = 1000) -> None:
        super().__init__(clock, *[RuntimeError("look") for _ in range(looks)])
        self.broken = broken

    async def failed(self, key: str, err: Exception, in_a_row: int) -> AfterFailure:
        self.failures.append(in_a_row)
        if self.broken:
            self.broken -= 1
            raise RuntimeError("the handler failed too")
        return AfterFailure.ERROR


def test_a_worker_whose_error_handler_raises_is_restarted_and_the_key_is_looked_at_again():
    async def scenario() -> tuple[HandlerFails, Metrics, list[str | None]]:
        clock = FakeClock()
        metrics = Metrics()
        queue: WorkQueue[str] = WorkQueue(clock)
        reconciler = HandlerFails(clock, broken=1, looks=1)
        worker = Worker("test", queue, reconciler, workers=1, clock=clock, metrics=metrics)
        worker.start()
        queue.add("k")
        await clock.advance(0)
        healths = [worker.health()]  # crashed, its restart due: not dead yet
        await clock.advance(30)
        healths.append(worker.health())
        queue.add("other")  # the restarted worker takes new keys too
        await clock.advance(1)
        await worker.stop()
        return reconciler, metrics, healths

    reconciler, metrics, healths = asyncio.run(scenario())
    looks = reconciler.looks
    assert len(looks) == 3, "the key held by the crashed worker is looked at again, then a new key"
    assert ERROR_DELAYS[0] / 2 <= looks[1] - looks[0] <= ERROR_DELAYS[0] + 1, looks
    assert metrics.registry.get_sample_value("vigil_worker_crashes_total", {"controller": "test"}) == 1
    assert healths == [None, None], "one crash, restarted: healthy"


def test_health_fails_while_workers_keep_dying_and_recovers_once_they_stop():
    async def scenario() -> tuple[str | None, str | None]:
        clock = FakeClock()
        queue: WorkQueue[str] = WorkQueue(clock)
        reconciler = HandlerFails(clock, broken=CRASHES_TOLERATED + 1)
        worker = Worker("test", queue, reconciler, workers=2, clock=clock, metrics=Metrics())
        worker.start()
        for key in "abc":
            queue.add(key)
        assert await clock.until(lambda: reconciler.broken == 0, 60)
        dying = worker.health()
        await clock.advance(CRASH_WINDOW_SECONDS)  # the handler works again: no more crashes
        calm = worker.health()
        await worker.stop()
        return dying, calm

    dying, calm = asyncio.run(scenario())
    assert dying is not None and "crashed" in dying, dying
    assert calm is None


def test_health_fails_when_a_worker_stays_dead():
    async def scenario() -> str | None:
        clock = FakeClock()
        queue: WorkQueue[str] = WorkQueue(clock)
        worker = Worker("test", queue, HandlerFails(clock, broken=1), workers=1, clock=clock, metrics=Metrics())
        worker.start()
        queue.add("k")
        await clock.advance(0)
        worker._restarts.shutdown()  # a restart that never comes (say, the supervisor's own bug)
        await clock.advance(RESTART_DELAYS[1] + DOWN_GRACE_SECONDS + 1)
        why = worker.health()
        await worker.stop()
        return why

    why = asyncio.run(scenario())
    assert why is not None and "dead" in why, why


def test_a_stopped_or_unstarted_worker_is_not_unhealthy():
    clock = FakeClock()
    worker = Worker("test", WorkQueue(clock), Scripted(clock), workers=1, clock=clock, metrics=Metrics())
    assert worker.health() is None
