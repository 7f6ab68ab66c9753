"""The leader's side of pulled arrays (controllers.jobs.pulled.Pulled), on the fake clock: what a
worker names of a job the view does not hold is adopted while a new leader waits for its workers,
and stopped once that window is over (a job deleted while nobody led)."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.support.clock import FakeClock
from vigil.controllers.jobs.pulled import Pulled
from vigil.core import pull

pytestmark = pytest.mark.unit


def holding(seq: int, *keys: list) -> pull.PullRequest:
    body = {"pod": {"namespace": "team-a", "name": "w-a", "uid": "u"}, "seq": seq, "seen": seq - 1, "held": list(keys)}
    return pull.read_request(json.dumps(body).encode())


def test_a_lease_of_a_job_the_view_does_not_hold_is_stopped_once_the_adoption_window_is_over() -> None:
    clock = FakeClock()
    known = {"live-uid"}
    pulled = Pulled(clock, lambda key: None, knows_job=lambda namespace, uid: uid in known)
    pulled.start()
    first = asyncio.run(pulled.request("etl", holding(1, ["gone-uid", 0, 1], ["live-uid", 3, 1])))
    assert first.body["cancel"] == []  # adopting: both kept for now
    clock.tick(pull.PoolTiming().timeout + pull.PoolTiming().interval + 1)
    second = asyncio.run(pulled.request("etl", holding(2, ["gone-uid", 0, 1], ["live-uid", 3, 1])))
    assert second.body["cancel"] == [["gone-uid", 0, 1]]
    assert pulled.state is not None and set(pulled.state.by_job) == {"live-uid"}
