"""Vigil's controllers built for unit tests: on a fake clock, with whatever stands in for the
API server (`kube`), and every collaborator the manager would give them."""

from __future__ import annotations

import random
from typing import Any

from tests.support.clock import FakeClock
from vigil.controllers.dispatcher import Dispatcher
from vigil.controllers.jobs import JobController, job_queue
from vigil.core.queueing.book import QueueBook
from vigil.kube.events import EventRecorder
from vigil.metrics import Metrics


class NoApi:
    """An API server that must not be called: each call fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the API server was called ({name}) where nothing should be")


def job_controller(kube: Any = None, clock: FakeClock | None = None, **options: Any) -> JobController:
    """A job controller as the manager builds it; `options` go to JobController (workers,
    pods_fresh, repair, pod_batch_seconds, ...). Its dispatcher has listed already."""
    clock = clock or FakeClock()
    kube = kube if kube is not None else NoApi()
    metrics = Metrics()
    queue = job_queue(clock, metrics)
    dispatcher = Dispatcher(QueueBook(), wake=queue.add, clock=clock, metrics=metrics)
    dispatcher.listed()  # no VigilQueue: a job's default queue runs unlimited
    events = EventRecorder(lambda *event: kube.post_event(*event), lambda *event: kube.patch_event(*event), clock=clock)
    options.setdefault("rng", random.Random(0))
    return JobController(kube, queue, dispatcher, events, clock=clock, metrics=metrics, **options)
