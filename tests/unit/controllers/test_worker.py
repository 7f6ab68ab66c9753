"""The generic worker: a failure is retried after the backoff its kind deserves, a forgotten key
is not retried, the first success after failures is heard of, and metrics count each result."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.clock import FakeClock
from vigil.controllers.worker import AfterFailure, Worker
from vigil.core.backoff import CONFLICT_DELAYS, ERROR_DELAYS
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
