"""The VigilQueue status controller: a queue's status is written when it changed, at most once
per period, never once per job event, and again while the oldest wait grows."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import generate_latest

from tests.support.clock import FakeClock
from vigil.controllers.queues import STATUS_PERIOD_SECONDS, QueueStatusController
from vigil.core.backoff import CONFLICT_DELAYS
from vigil.core.queueing.book import QueueBook, QueueSpec, entry_of
from vigil.kube.errors import Conflict
from vigil.kube.seen import Delta
from vigil.metrics import Metrics

pytestmark = pytest.mark.unit

QUEUE = {
    "metadata": {"name": "batch", "namespace": "ns", "generation": 1, "resourceVersion": "5"},
    "spec": {"maxRunning": 2},
}


class Api:
    def __init__(self) -> None:
        self.written: list[tuple[float, dict[str, Any]]] = []
        self.clock: FakeClock | None = None

    async def patch_queue_status(
        self, namespace: str, name: str, resource_version: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        assert self.clock is not None
        assert resource_version == QUEUE["metadata"]["resourceVersion"], "written on the version it read"
        self.written.append((self.clock.now, status))
        return {**QUEUE, "status": status}


def job(name: str, phase: str | None = None) -> dict[str, Any]:
    status = {"phase": phase} if phase else {}
    return {
        "metadata": {"name": name, "namespace": "ns", "creationTimestamp": "2026-03-01T11:59:00Z"},
        "spec": {"queue": "batch"},
        "status": status,
    }


async def started() -> tuple[FakeClock, Api, QueueBook, QueueStatusController]:
    """A status controller started on one VigilQueue (maxRunning 2), its API server recording."""
    clock, api = FakeClock(), Api()
    api.clock = clock
    book = QueueBook()
    book.set_queue("ns", "batch", QueueSpec(max_running=2), clock.wall().timestamp())
    queues = QueueStatusController(api, book, clock=clock, metrics=Metrics())  # type: ignore[arg-type]
    queues.queue_delta(Delta("upsert", QUEUE))
    await queues.start()
    return clock, api, book, queues


def test_a_burst_of_changes_costs_one_write_per_period_and_a_waiting_queue_is_written_again():
    async def scenario() -> list[tuple[float, dict[str, Any]]]:
        clock, api, book, queues = await started()
        await clock.advance(0.1)
        assert len(api.written) == 1, "the queue's first status"
        for n in range(20):  # a burst of job events, each changing the book
            book.observe(entry_of(job(f"j{n}")))
            queues.changed(("ns", "batch"))
        await clock.advance(STATUS_PERIOD_SECONDS / 2)
        assert len(api.written) == 1, "not before the period since the last write"
        await clock.advance(STATUS_PERIOD_SECONDS / 2)
        assert len(api.written) == 2 and api.written[1][1]["queued"] == 20, "the burst: one write"
        await clock.advance(10 * STATUS_PERIOD_SECONDS)  # jobs wait: the oldest wait grows
        await queues.stop()
        return api.written

    written = asyncio.run(scenario())
    times = [at for at, _ in written]
    assert all(b - a >= STATUS_PERIOD_SECONDS - 1e-9 for a, b in zip(times, times[1:], strict=False))
    waits = [status["oldestQueuedSeconds"] for _, status in written[1:]]
    assert waits == sorted(waits) and waits[-1] > waits[0], "written again as the oldest wait grows"


def test_an_unchanged_status_is_not_written_again():
    async def scenario() -> int:
        clock, api, book, queues = await started()
        await clock.advance(1)
        for _ in range(5):
            queues.changed(("ns", "batch"))  # nothing changed in the book
            await clock.advance(STATUS_PERIOD_SECONDS)
        await queues.stop()
        return len(api.written)

    assert asyncio.run(scenario()) == 1


def test_a_status_write_refused_for_a_stale_version_is_retried_soon_on_the_newer_one():
    """The write carries the queue's resourceVersion (a deposed leader's late write cannot land
    over a newer status); a conflict is routine: the watch brings the newer version, written on."""

    async def scenario() -> tuple[list[str], int]:
        clock, api, book, queues = await started()
        versions: list[str] = []
        real = api.patch_queue_status

        async def stale_once(namespace: str, name: str, rv: str, status: dict[str, Any]) -> dict[str, Any]:
            versions.append(rv)
            if len(versions) == 1:
                newer = {**QUEUE, "metadata": {**QUEUE["metadata"], "resourceVersion": "6"}}
                queues.queue_delta(Delta("upsert", newer))
                raise Conflict("the object has been modified")
            return await real(namespace, name, "5", status)

        api.patch_queue_status = stale_once  # type: ignore[method-assign]
        await clock.advance(CONFLICT_DELAYS[0] + 0.01)
        await queues.stop()
        return versions, len(api.written)

    versions, written = asyncio.run(scenario())
    assert versions == ["5", "6"] and written == 1


def test_a_deleted_queue_takes_its_series_with_it():
    async def scenario() -> bytes:
        clock, api, book, queues = await started()
        queues.metrics.queue_starts.labels("ns", "batch").inc()
        queues.queue_delta(Delta("delete", QUEUE))
        await queues.stop()
        return generate_latest(queues.metrics.registry)

    assert b'queue="batch"' not in asyncio.run(scenario())
