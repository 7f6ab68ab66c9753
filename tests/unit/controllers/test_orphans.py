"""The releases no look makes, on their own work queue: a failed release is retried with
backoff, a pod handed over twice is released once, a few run at a time, stop leaves nothing
behind, and the periodic sweep never overlaps itself. All on the fake clock."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import pytest

from tests.support.clock import FakeClock, settle
from vigil.controllers.jobs.orphans import RELEASE_WORKERS, RELEASES, Releaser
from vigil.controllers.jobs.podcache import PodCache
from vigil.core.backoff import ERROR_DELAYS
from vigil.core.orphans import SWEEP_JITTER, SWEEP_SECONDS
from vigil.kube.errors import ApiError
from vigil.metrics import Metrics

pytestmark = pytest.mark.unit

FINALIZER = "vigil.dev/attempt-tracking"


def held_pod(name: str, job_name: str = "gone", job_uid: str = "gone-uid") -> dict[str, Any]:
    """A pod of a job, still carrying Vigil's finalizer."""
    owner: dict[str, Any] = {"apiVersion": "vigil.dev/v1beta1", "kind": "VigilJob", "controller": True}
    owner.update(name=job_name, uid=job_uid)
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "labels": {"vigil.dev/job-uid": job_uid},
            "ownerReferences": [owner],
            "finalizers": [FINALIZER],
        }
    }


class Api:
    """The calls the releaser makes. `failing`: release failures left per pod name; `gate`,
    when set, holds every release (and `list_gate` every sweep's second page) until opened."""

    def __init__(self, clock: FakeClock, jobs: dict[str, dict[str, Any]] | None = None) -> None:
        self.clock, self.jobs = clock, jobs or {}
        self.failing: dict[str, int] = {}
        self.tries: list[tuple[str, float]] = []
        self.released: list[str] = []
        self.reads: list[str] = []
        self.in_flight = self.most_in_flight = 0
        self.gate: asyncio.Event | None = None
        self.pages: list[list[dict[str, Any]]] = []
        self.list_gate: asyncio.Event | None = None
        self.list_failures = 0
        self.lists: list[float] = []
        self.listing = self.most_listing = 0

    async def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads.append(name)
        return self.jobs.get(name)

    async def release_pod(self, namespace: str, name: str, uid: str) -> None:
        self.tries.append((name, self.clock.now))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.failing.get(name):
                self.failing[name] -= 1
                raise ApiError("the API server is unavailable", status=503, reason="ServiceUnavailable")
            self.released.append(name)
        finally:
            self.in_flight -= 1

    async def list_vigil_pods(self, namespace: str | None, limit: int = 500):
        self.lists.append(self.clock.now)
        self.listing += 1
        self.most_listing = max(self.most_listing, self.listing)
        try:
            if self.list_failures:
                self.list_failures -= 1
                raise ApiError("the API server is unavailable", status=503, reason="ServiceUnavailable")
            for n, page in enumerate(self.pages):
                if n and self.list_gate is not None:
                    await self.list_gate.wait()
                yield page
        finally:
            self.listing -= 1


def releaser(api: Api, clock: FakeClock, metrics: Metrics | None = None) -> Releaser:
    return Releaser(api, PodCache(), clock, random.Random(0), metrics=metrics or Metrics())  # type: ignore[arg-type]


def sample(metrics: Metrics, metric: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(metric, labels) or 0.0


def test_a_failed_release_is_retried_through_the_queue_with_a_growing_backoff(caplog: pytest.LogCaptureFixture):
    clock, metrics = FakeClock(), Metrics()
    api = Api(clock)
    api.failing["p"] = 3

    async def scenario() -> bool:
        r = releaser(api, clock, metrics)
        r.start()
        r.release([held_pod("p")], "the pods of deleted job ns/gone")
        released = await clock.until(lambda: api.released, within=60)
        idle = not r.busy()
        await r.stop()
        return released and idle

    with caplog.at_level(logging.WARNING, logger="vigil.controllers.jobs.orphans"):
        assert asyncio.run(scenario())
    times = [when for _, when in api.tries]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    first = ERROR_DELAYS[0]
    assert len(times) == 4 and api.released == ["p"]
    for n, gap in enumerate(gaps):
        assert first * 2**n / 2 <= gap <= first * 2**n, gaps
    assert sample(metrics, "workqueue_retries_total", name=RELEASES) == 3
    assert sample(metrics, "controller_runtime_reconcile_errors_total", controller=RELEASES) == 3
    assert sample(metrics, "controller_runtime_reconcile_total", controller=RELEASES, result="success") == 1
    assert "releasing pod ns/p (the pods of deleted job ns/gone) failed (3 in a row)" in caplog.text


def test_a_pod_handed_over_twice_while_it_waits_is_released_once():
    """Twice as a deleted job's pod and once as an orphan: one release, and no question to the
    API server (the job was seen deleted). Twice as an orphan: one question, one release."""
    clock = FakeClock()
    api = Api(clock)

    async def scenario() -> None:
        r = releaser(api, clock)
        r.release([held_pod("of-a-deleted-job")], "the pods of deleted job ns/gone")
        r.release_orphan(held_pod("of-a-deleted-job"))
        r.release([held_pod("of-a-deleted-job")], "the pods of deleted job ns/gone")
        r.release_orphans([held_pod("orphan"), held_pod("orphan")])
        assert len(r.queue) == 2
        r.start()
        await settle()
        assert not r.busy()
        await r.stop()

    asyncio.run(scenario())
    assert sorted(api.released) == ["of-a-deleted-job", "orphan"]
    assert api.reads == ["gone"], "the orphan's job asked about once; the deleted job's pod not at all"


def test_a_pod_handed_over_while_its_release_runs_is_looked_at_again_after_it_never_beside_it():
    clock = FakeClock()
    api = Api(clock)
    api.gate = asyncio.Event()

    async def scenario() -> None:
        r = releaser(api, clock)
        r.start()
        r.release_orphan(held_pod("p"))
        await settle()
        assert api.in_flight == 1
        r.release_orphan(held_pod("p"))
        r.release_orphan(held_pod("p"))
        await settle()
        assert api.in_flight == 1, "one worker at a time holds a pod"
        api.gate.set()
        await settle()
        assert not r.busy()
        await r.stop()

    asyncio.run(scenario())
    assert api.released == ["p", "p"] and api.most_in_flight == 1


def test_a_few_releases_run_at_a_time():
    clock = FakeClock()
    api = Api(clock)
    api.gate = asyncio.Event()

    async def scenario() -> None:
        r = releaser(api, clock)
        r.start()
        r.release([held_pod(f"p{n}") for n in range(6)], "the pods of deleted job ns/gone")
        await settle()
        assert api.in_flight == RELEASE_WORKERS
        api.gate.set()
        await settle()
        assert not r.busy()
        await r.stop()

    asyncio.run(scenario())
    assert sorted(api.released) == [f"p{n}" for n in range(6)] and api.most_in_flight == RELEASE_WORKERS


def test_stop_empties_the_queue_and_nothing_runs_after_it():
    """Releases in flight, waiting, and backing off after a failure: after stop none is left,
    no timer is pending, and nothing reaches the API server however long the clock runs."""
    clock = FakeClock()
    api = Api(clock)
    api.failing["failing"] = 1000

    async def scenario() -> None:
        r = releaser(api, clock)
        r.start()
        r.release([held_pod("failing")], "the pods of deleted job ns/gone")
        await clock.advance(0.1)  # it failed once and backs off
        api.gate = asyncio.Event()
        r.release([held_pod(f"p{n}") for n in range(5)], "the pods of deleted job ns/gone")
        await settle()
        assert api.in_flight == RELEASE_WORKERS and len(r.queue) == 5 - RELEASE_WORKERS
        await r.stop()
        assert len(r.queue) == 0 and not r.busy()
        assert clock.pending() == 0, "no delayed retry, no sweep left"
        tries = len(api.tries)
        r.release([held_pod("late")], "the pods of deleted job ns/gone")
        api.gate.set()
        await clock.advance(3600)
        assert len(api.tries) == tries and api.released == []

    asyncio.run(scenario())


def test_sweeps_never_overlap_and_the_next_comes_a_period_after_the_last_ended():
    """A slow sweep (its listing held here) spans many periods: no second one starts beside it.
    What it found is released while it still lists."""
    clock = FakeClock()
    api = Api(clock)
    api.pages = [[held_pod("first-page")], [held_pod("second-page")]]
    api.list_gate = asyncio.Event()
    longest = SWEEP_SECONDS * (1 + SWEEP_JITTER)

    async def scenario() -> None:
        r = releaser(api, clock)
        r.start()
        await clock.advance(longest)
        assert len(api.lists) == 1 and api.listing == 1
        assert api.released == ["first-page"], "handed to the queue, released by another worker"
        await clock.advance(10 * longest)
        assert len(api.lists) == 1, "the sweep still lists: no other starts"
        ended = clock.now
        api.list_gate.set()
        await settle()
        assert api.listing == 0 and sorted(api.released) == ["first-page", "second-page"]
        await clock.advance(SWEEP_SECONDS * 0.99)
        assert len(api.lists) == 1, "the next a period after this one ended"
        await clock.advance(SWEEP_SECONDS * (SWEEP_JITTER + 0.02))
        assert len(api.lists) == 2 and api.lists[1] - ended >= SWEEP_SECONDS
        await r.stop()

    asyncio.run(scenario())
    assert api.most_listing == 1


def test_a_failed_sweep_is_retried_with_backoff_not_a_period_later():
    clock = FakeClock()
    api = Api(clock)
    api.pages = [[held_pod("p")]]
    api.list_failures = 1

    async def scenario() -> None:
        r = releaser(api, clock)
        r.start()
        await clock.until(lambda: api.released, within=2 * SWEEP_SECONDS)
        await r.stop()

    asyncio.run(scenario())
    assert len(api.lists) == 2 and api.lists[1] - api.lists[0] <= ERROR_DELAYS[0]
    assert api.released == ["p"]
