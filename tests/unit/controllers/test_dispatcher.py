"""The dispatcher's reading of a decision: whether it used the start the queue gave, and whether
it is a start that the queue's rate spaces."""

from __future__ import annotations

import random

import pytest

from tests.support.builders import T0, make_job, make_pod
from tests.support.clock import FakeClock
from vigil.controllers.dispatcher import Dispatcher, _reserves_attempt
from vigil.core.lifecycle import decide
from vigil.core.queueing.book import QueueBook, QueueSpec, StartPermit, entry_of
from vigil.metrics import Metrics

pytestmark = pytest.mark.unit


def test_a_start_is_used_by_a_decision_that_creates_the_next_attempts_pod_or_reserves_it():
    job = make_job()
    pod_first = decide(job, [], T0, rng=random.Random(0))
    assert _reserves_attempt(job, pod_first), "the pod came first: the start is used, its hold kept"

    held_back = decide(job, [], T0, rng=random.Random(0), may_start=False)
    assert not _reserves_attempt(job, held_back)

    found = decide(job, [make_pod(1)], T0, rng=random.Random(0))  # the look that records attempt 1
    assert _reserves_attempt(job, found)


def test_a_start_rate_spaces_pod_creations_but_not_the_look_that_records_an_attempt_already_started():
    """maxStartsPerSecond 5: a second creation within 0.2 s waits; the look that records attempt 1,
    whose pod came first, starts nothing and goes at once. Spaced like a start, each recording took
    a slot of its own and was put off again by newer starts, and a burst started at half the rate
    (e2e/test_queues.py::test_max_starts_per_second_spaces_a_burst: 2.5 a second)."""
    now = T0.timestamp()
    dispatcher = Dispatcher(QueueBook(), wake=lambda key: None, clock=FakeClock(wall=T0), metrics=Metrics())
    dispatcher.book.set_queue("work", "paced", QueueSpec(max_starts_per_second=5.0), now)
    first = make_job(name="first", spec={"queue": "paced"})
    second = make_job(name="second", uid="uid-second", spec={"queue": "paced"})
    for job in (first, second):
        dispatcher.book.observe(entry_of(job))
    admitted = StartPermit(True, "Admitted", "queue paced admitted it")

    assert dispatcher.pace(first, admitted, decide(first, [], T0, rng=random.Random(0))) is None
    waits = dispatcher.pace(second, admitted, decide(second, [], T0, rng=random.Random(0)))
    assert waits == pytest.approx(0.2), "a second creation in the same instant waits for the rate"

    recording = decide(first, [make_pod(1)], T0, rng=random.Random(0))
    assert _reserves_attempt(first, recording)  # its hold is kept: the attempt did start
    assert dispatcher.pace(first, admitted, recording) is None, "recording a started attempt is not a start"
