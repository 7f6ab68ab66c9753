"""The leader's side of pulled arrays (controllers.jobs.pulled.Pulled), on the fake clock: after a
failover a worker's leases are adopted only for the arrays of its own pool that the view holds; a
lease of any other job (deleted while nobody led, another pool's, or made up) is stopped."""

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


def test_a_new_leader_adopts_only_its_pools_arrays_that_the_view_holds() -> None:
    clock = FakeClock()
    pools = {("team-a", "live-uid"): "etl", ("team-a", "other-pool-uid"): "batch"}
    pulled = Pulled(clock, lambda key: None, pool_of_job=lambda namespace, uid: pools.get((namespace, uid)))
    pulled.start()
    answer = asyncio.run(
        pulled.request("etl", holding(1, ["gone-uid", 0, 1], ["live-uid", 3, 1], ["other-pool-uid", 0, 1]))
    )
    assert answer.body["cancel"] == [["gone-uid", 0, 1], ["other-pool-uid", 0, 1]]
    assert pulled.state is not None and set(pulled.state.by_job) == {"live-uid"}
