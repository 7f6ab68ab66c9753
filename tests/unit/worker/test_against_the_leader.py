"""The worker's bookkeeping (vigil.worker.state) against the leader's own (vigil.core.pull), both pure,
on a fake clock: every body the worker builds is one the leader reads, and every answer the leader
gives is one the worker takes (claims, env, checkpoints, results acknowledged once settled, cancel,
a lease given up by self-fencing and reported by omission)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from tests.support.clock import FakeClock
from vigil import api
from vigil.core import pull
from vigil.worker.state import Forget, Start, Stop, WorkerState

pytestmark = pytest.mark.unit

POOL = "etl-pool"
WALL = datetime(2026, 3, 1, tzinfo=UTC)
POD = {"namespace": "team-a", "name": "etl-pool-x7k2q", "uid": "pod-uid"}


def manifest(index: int, attempt: int = 1) -> dict:
    return {
        "metadata": {
            "namespace": "team-a",
            "labels": {
                api.LABEL_JOB_UID: "job-uid",
                api.LABEL_TASK_INDEX: str(index),
                api.LABEL_ATTEMPT: str(attempt),
            },
        },
        "spec": {
            "containers": [
                {
                    "env": [
                        {"name": "VIGIL_JOB", "value": "etl"},
                        {"name": "VIGIL_TASK_INDEX", "value": str(index)},
                        {"name": "VIGIL_IDEMPOTENCY_KEY", "value": f"job-uid-{index}"},
                    ]
                }
            ]
        },
    }


class Pair:
    def __init__(self, slots: int = 2) -> None:
        self.clock = FakeClock()
        self.leader = pull.PullState(started_at=self.clock.monotonic(), adoption_seconds=0)
        self.worker = WorkerState(pod=POD, boot="boot-1", slots=slots)

    def exchange(self, *, claim: bool = True, answered: bool = True):
        now = self.clock.monotonic()
        out = self.worker.request(now, claim=claim, wait_seconds=10)
        request = pull.read_request(out.body)  # the leader reads every body the worker builds
        answer = self.leader.request(POOL, request, now, WALL)
        if not answered:
            return self.worker.failed(out.seq, now), request
        body = json.dumps(answer.body, separators=(",", ":")).encode()
        return self.worker.answered(out.seq, 200, body, now), request


def test_a_claim_a_checkpoint_a_result_and_its_ack_go_through_the_leaders_own_state():
    pair = Pair()
    for index in range(3):
        pair.leader.offer(manifest(index), POOL, pair.clock.monotonic(), WALL, grace_seconds=7)
    verdict, _ = pair.exchange()
    starts = [a.grant for a in verdict.actions if isinstance(a, Start)]
    assert [g.lease for g in starts] == [("job-uid", 0, 1), ("job-uid", 1, 1)]
    assert starts[0].env["VIGIL_IDEMPOTENCY_KEY"] == "job-uid-0" and starts[0].grace_seconds == 7
    assert starts[0].job == "etl" and starts[0].namespace == "team-a"
    lease = starts[0].lease
    pair.worker.checkpoint(lease, '{"row":5}')
    pair.worker.finished(lease, 3, "exit code 3")
    pair.clock.tick(1)
    verdict, request = pair.exchange()
    assert request.results == ((lease, 3, "exit code 3"),) and request.held == (("job-uid", 1, 1),)
    assert pair.leader.leases[lease].result == {"exitCode": 3, "message": "exit code 3"}
    assert pair.leader.leases[lease].checkpoint == '{"row":5}'
    assert [a.grant.lease for a in verdict.actions if isinstance(a, Start)] == [("job-uid", 2, 1)]
    pair.clock.tick(1)
    pair.exchange()
    assert lease in pair.worker.results  # not acked before its end is in the job's status
    pair.leader.settle(pair.leader.leases[lease].uid)
    pair.exchange()
    assert lease not in pair.worker.results
    _, request = pair.exchange()
    assert request.results == ()


def test_a_cancel_from_the_leader_stops_the_task_and_its_exit_code_reaches_the_leader():
    pair = Pair()
    pair.leader.offer(manifest(0), POOL, pair.clock.monotonic(), WALL, grace_seconds=4)
    pair.exchange()
    key = ("job-uid", 0, 1)
    pair.leader.cancel(pair.leader.leases[key].uid, WALL)
    verdict, _ = pair.exchange()
    assert verdict.actions == (Stop(key, 4, "cancelled by the leader"),)
    pair.worker.finished(key, 143, "killed by SIGTERM")
    pair.exchange()
    assert pair.leader.leases[key].result == {"exitCode": 143, "message": "killed by SIGTERM"}


def test_a_lease_given_up_by_self_fencing_is_lost_by_omission_on_the_leaders_side():
    pair = Pair()
    pair.leader.offer(manifest(0), POOL, pair.clock.monotonic(), WALL)
    pair.exchange()
    key = ("job-uid", 0, 1)
    actions = []
    for _ in range(7):  # requests that get no answer: no 200 for leaseSeconds (30)
        pair.clock.tick(5)
        verdict, _ = pair.exchange(claim=False, answered=False)
        actions += verdict.actions
    assert [type(a) for a in actions] == [Stop, Forget]
    pair.exchange(claim=False)
    assert pair.leader.leases[key].vanished == "LeaseDropped"


def test_bodies_at_the_worker_bounds_are_within_the_leaders():
    pair = Pair(slots=1000)
    for index in range(1001):
        pair.leader.offer(manifest(index), POOL, pair.clock.monotonic(), WALL)
    pair.exchange()
    assert len(pair.worker.held()) == 1000
    for lease in list(pair.worker.tasks)[:-1]:
        pair.worker.checkpoint(lease, '"' + "x" * 2000 + '"')  # 2 KiB each: 2 MiB in all
        pair.worker.finished(lease, 7, "y" * 5000)
    last = list(pair.worker.tasks)[-1]
    pair.worker.finished(last, 300)  # the leader takes an exit status: 0 to 255
    assert pair.worker.results[last].exit_code == 255
    reported: list[tuple] = []
    checkpointed: set[tuple] = set()
    for _ in range(20):
        verdict, request = pair.exchange(claim=False)
        assert verdict.ok and len(request.results) <= pull.MAX_RESULTS and len(request.checkpoints) <= pull.MAX_HELD
        if not request.results:
            break
        checkpointed |= {key for key, _ in request.checkpoints}
        assert checkpointed >= {key for key, _, _ in request.results} - {last}  # never a result before its checkpoint
        reported += [key for key, _, _ in request.results if key not in reported]  # resent until acked
        for key, _, _ in request.results:
            if key in pair.leader.leases:  # a result sent again after its settling is acknowledged, unkept
                pair.leader.settle(pair.leader.leases[key].uid)
    assert reported == [("job-uid", i, 1) for i in range(1000)]  # oldest first, all of them in the end
    verdict, _ = pair.exchange()  # the one left is claimed now
    assert [a.grant.lease for a in verdict.actions if isinstance(a, Start)] == [("job-uid", 1000, 1)]
