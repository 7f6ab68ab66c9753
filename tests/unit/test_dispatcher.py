"""The dispatcher's reading of a decision: whether it used the start the queue gave."""

from __future__ import annotations

import random

import pytest

from tests.unit.factories import T0, make_job, make_pod
from vigil.dispatcher import _reserves_attempt
from vigil.lifecycle import decide

pytestmark = pytest.mark.unit


def test_a_start_is_used_by_a_decision_that_creates_the_next_attempts_pod_or_reserves_it():
    job = make_job()
    pod_first = decide(job, [], T0, rng=random.Random(0))
    assert _reserves_attempt(job, pod_first), "the pod came first: the start is used, its hold kept"

    held_back = decide(job, [], T0, rng=random.Random(0), may_start=False)
    assert not _reserves_attempt(job, held_back)

    found = decide(job, [make_pod(1)], T0, rng=random.Random(0))  # the look that records attempt 1
    assert _reserves_attempt(job, found)
