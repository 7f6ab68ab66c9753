"""The leader's lease state for pulled tasks (vigil.core.pull), driven with the array's own decision
(decide_array) on a fake clock: what a worker pool's users rely on, without a cluster."""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.builders import T0, apply_to_job, make_job
from vigil import api
from vigil.core import pull
from vigil.core.actions import ConfirmVersion, PatchStatus
from vigil.core.tasks.array import decide_array

pytestmark = pytest.mark.unit

POOL = "etl"
TIMING = pull.PoolTiming(interval=5.0, timeout=30.0)


def pulled_job(count: int, **spec: Any) -> dict[str, Any]:
    job = make_job(spec={"pool": POOL, "tasks": {"count": count, "parallelism": spec.pop("parallelism", 10)}, **spec})
    del job["spec"]["template"]
    return job


@dataclass
class Worker:
    """A worker as the protocol sees it: what it holds, what it has not had acknowledged."""

    name: str
    slots: int
    boot: str = "boot-1"
    seq: int = 0
    seen: int = 0
    running: dict[pull.LeaseKey, dict[str, Any]] = field(default_factory=dict)
    unacked: dict[pull.LeaseKey, int] = field(default_factory=dict)
    cancelled: list[pull.LeaseKey] = field(default_factory=list)

    def body(self, *, claim: bool = True) -> bytes:
        self.seq += 1
        return json.dumps(
            {
                "pod": {"namespace": "work", "name": self.name, "uid": f"uid-{self.name}"},
                "boot": self.boot,
                "seq": self.seq,
                "seen": self.seen,
                "free": max(0, self.slots - len(self.running)) if claim else 0,
                "held": [list(key) for key in self.running],
                "results": [{"lease": list(k), "exitCode": c} for k, c in self.unacked.items()],
            }
        ).encode()

    def take(self, answer: dict[str, Any]) -> None:
        self.seen = self.seq
        for lease in answer["leases"]:
            self.running[tuple(lease["lease"])] = lease  # type: ignore[index]
        for key in answer["cancel"]:
            key = tuple(key)
            if key in self.running:
                del self.running[key]  # type: ignore[arg-type]
                self.unacked[key] = 143  # type: ignore[index]
                self.cancelled.append(key)  # type: ignore[arg-type]
        for key in answer["acked"]:
            self.unacked.pop(tuple(key), None)  # type: ignore[arg-type]

    def finish(self, key: pull.LeaseKey, code: int) -> None:
        del self.running[key]
        self.unacked[key] = code


class Bed:
    """A leader (the lease state and the array's decision) on a fake clock, with workers."""

    def __init__(self, job: dict[str, Any], *, started_at: float = 0.0) -> None:
        self.job = job
        self.now = started_at
        self.state = pull.PullState(started_at=started_at, timing=lambda ns, pool: TIMING)
        self.rng = random.Random(7)
        self.writes = 0
        self.ledger: Counter[int] = Counter()  # index -> runs that succeeded (exit 0)

    @property
    def wall(self) -> datetime:
        return T0 + timedelta(seconds=self.now)

    def look(self) -> None:
        pods = self.state.pods_of(self.job, self.now)
        liveness = self.state.liveness(self.job["metadata"]["uid"], self.now, self.wall)
        decided = decide_array(self.job, pods, self.wall, rng=self.rng, starts=1000, liveness=liveness).decision
        for action in decided.actions:
            if isinstance(action, PatchStatus):
                self.writes += 1
                self.job = apply_to_job(self.job, decided)
            elif isinstance(action, ConfirmVersion):
                continue
            else:
                pull.carry_out(self.state, action, POOL, self.now, self.wall)

    def ask(self, worker: Worker, *, claim: bool = True) -> pull.Answer:
        request = pull.read_request(worker.body(claim=claim))
        answer = self.state.request(POOL, request, self.now, self.wall)
        worker.take(answer.body)
        return answer

    def tick(self, seconds: float) -> None:
        self.now += seconds

    @property
    def tasks(self) -> dict[str, Any]:
        return self.job["status"].get("tasks") or {}


def run(bed: Bed, workers: list[Worker], outcome: Any = lambda key: 0, rounds: int = 200) -> None:
    """Looks and requests in turn until the array ends: each worker finishes what it runs with
    `outcome(key)` (an exit code, or None: it keeps running)."""
    for _ in range(rounds):
        bed.look()
        if bed.job["status"].get("phase") in ("Succeeded", "DeadLettered") and not any(w.unacked for w in workers):
            return
        for worker in workers:
            bed.ask(worker)
            for key in list(worker.running):
                code = outcome(key)
                if code is not None:
                    if code == 0:
                        bed.ledger[key[1]] += 1
                    worker.finish(key, code)
        bed.tick(1.0)
    raise AssertionError(f"the array did not end: {bed.job['status'].get('phase')} {bed.tasks.get('progress')}")


def test_an_array_on_a_pool_runs_every_task_once_and_each_result_is_acknowledged() -> None:
    bed = Bed(pulled_job(20, parallelism=6))
    workers = [Worker("w-a", 2), Worker("w-b", 3)]
    run(bed, workers)
    assert bed.job["status"]["phase"] == "Succeeded"
    assert bed.tasks["succeededIndexes"] == "0-19"
    assert bed.ledger == Counter(range(20))  # each task ran once
    assert not any(w.unacked for w in workers)  # every result acknowledged once written
    assert bed.state.leases == {}  # nothing kept once the array ended
    assert bed.writes < 20 * 2  # one write records many tasks' starts and ends


def test_the_env_of_a_lease_is_the_task_pods_and_no_heartbeat_of_its_own() -> None:
    bed = Bed(pulled_job(3, parallelism=3, guarantee="NoOverlap"))
    worker = Worker("w-a", 3)
    bed.look()
    bed.ask(worker)
    leases = sorted(worker.running.values(), key=lambda lease: lease["index"])
    assert [lease["index"] for lease in leases] == [0, 1, 2]
    env = leases[1]["env"]
    uid = bed.job["metadata"]["uid"]
    assert env["VIGIL_TASK_INDEX"] == "1" and env["VIGIL_TASK_COUNT"] == "3"
    assert env["VIGIL_IDEMPOTENCY_KEY"] == f"{uid}-1"
    assert env["VIGIL_ATTEMPT"] == env["VIGIL_FENCING_TOKEN"] == "1"
    assert env["VIGIL_GUARANTEE"] == "NoOverlap"
    assert not [name for name in env if name.startswith("VIGIL_HEARTBEAT")]
    assert leases[1]["job"] == "ledger" and leases[1]["lease"] == [uid, 1, 1]


def test_a_claim_writes_nothing_and_an_offer_goes_to_one_worker() -> None:
    bed = Bed(pulled_job(4, parallelism=4))
    bed.look()
    writes = bed.writes
    a, b = Worker("w-a", 3), Worker("w-b", 3)
    bed.ask(a)
    bed.ask(b)
    assert len(a.running) == 3 and len(b.running) == 1
    assert not set(a.running) & set(b.running)
    bed.look()
    assert bed.writes == writes + 1  # the look that sees them running: one write for all four
    assert bed.tasks["running"] == 4


def test_a_failing_task_is_retried_with_backoff_and_dead_lettered_alone() -> None:
    bed = Bed(pulled_job(5, retry={"maxAttempts": 3, "backoff": {"initialSeconds": 2, "jitter": 0}}))
    workers = [Worker("w-a", 5)]
    run(bed, workers, outcome=lambda key: 3 if key[1] == 2 else 0, rounds=400)
    assert bed.job["status"]["phase"] == "DeadLettered"
    assert bed.tasks["deadLetteredIndexes"] == "2" and bed.tasks["succeededIndexes"] == "0-1,3-4"
    assert bed.tasks["failed"][0]["attempts"] == 3 and bed.tasks["failed"][0]["exitCode"] == 3


def test_a_checkpoint_a_task_reported_is_given_to_its_next_attempt() -> None:
    bed = Bed(pulled_job(1, retry={"maxAttempts": 3, "backoff": {"initialSeconds": 1, "jitter": 0}}))
    worker = Worker("w-a", 1)
    bed.look()
    bed.ask(worker)
    (first,) = worker.running
    body = json.loads(worker.body(claim=False))
    body["checkpoints"] = [{"lease": list(first), "value": '{"row": 1200}'}]
    worker.take(bed.state.request(POOL, pull.read_request(json.dumps(body).encode()), bed.now, bed.wall).body)
    worker.finish(first, 1)
    for _ in range(6):
        bed.ask(worker)
        bed.tick(1.0)
        bed.look()
    (second,) = worker.running.values()
    assert second["attempt"] == 2 and second["env"]["VIGIL_CHECKPOINT"] == '{"row": 1200}'
    assert bed.tasks["active"][0]["lastCheckpoint"] == '{"row": 1200}'


def test_an_attempt_deadline_stops_a_pulled_task_and_retries_it() -> None:
    bed = Bed(
        pulled_job(1, attemptDeadlineSeconds=5, retry={"maxAttempts": 2, "backoff": {"initialSeconds": 1, "jitter": 0}})
    )
    worker = Worker("w-a", 1)
    bed.look()
    bed.ask(worker)
    for _ in range(10):
        bed.tick(1.0)
        bed.look()
        bed.ask(worker)
    assert len(worker.cancelled) == 1 and worker.cancelled[0][2] == 1  # attempt 1 stopped by its deadline
    assert [key[2] for key in worker.running] == [2]


def test_a_non_retryable_exit_code_dead_letters_the_task_at_once() -> None:
    bed = Bed(pulled_job(2, retry={"maxAttempts": 5, "nonRetryableExitCodes": [42]}))
    run(bed, [Worker("w-a", 2)], outcome=lambda key: 42 if key[1] == 0 else 0)
    assert bed.tasks["deadLetteredIndexes"] == "0" and bed.tasks["failed"][0]["attempts"] == 1


def test_a_silent_worker_makes_its_tasks_uncertain_then_lost_and_they_run_elsewhere() -> None:
    bed = Bed(pulled_job(2, parallelism=2, retry={"maxAttempts": 3, "backoff": {"initialSeconds": 1, "jitter": 0}}))
    silent, healthy = Worker("w-silent", 2), Worker("w-ok", 2)
    bed.look()
    bed.ask(silent)
    assert len(silent.running) == 2
    bed.look()
    phases = []
    for _ in range(40):  # the silent worker says nothing more; the healthy one asks every second
        bed.tick(1.0)
        bed.look()
        bed.ask(healthy)
        phases.append(sorted(t["phase"] for t in bed.tasks.get("active") or []))
        if healthy.running:
            break
    assert ["Uncertain", "Uncertain"] in phases  # silent past the pool's Uncertain threshold
    assert bed.now >= TIMING.timeout  # and Lost only at the timeout
    assert sorted(key[2] for key in healthy.running) == [2, 2]  # attempt 2 of each task, elsewhere
    assert [t["last"]["outcome"] for t in bed.tasks["active"]] == ["Lost", "Lost"]


def test_a_late_result_of_a_lost_attempt_does_not_count_for_the_next_one() -> None:
    bed = Bed(pulled_job(1, retry={"maxAttempts": 3, "backoff": {"initialSeconds": 1, "jitter": 0}}))
    silent, healthy = Worker("w-silent", 1), Worker("w-ok", 1)
    bed.look()
    bed.ask(silent)
    first = next(iter(silent.running))
    while not healthy.running:
        bed.tick(1.0)
        bed.look()
        bed.ask(healthy)
    # The silent worker comes back and reports its (superseded) attempt's failure.
    silent.finish(first, 1)
    bed.ask(silent)
    bed.look()
    assert bed.job["status"]["tasks"]["active"][0]["currentAttempt"]["number"] == 2
    assert bed.job["status"]["phase"] == "Running"


def test_no_overlap_offers_a_lost_task_again_only_once_its_worker_is_gone() -> None:
    bed = Bed(
        pulled_job(1, guarantee="NoOverlap", retry={"maxAttempts": 3, "backoff": {"initialSeconds": 1, "jitter": 0}})
    )
    silent, healthy = Worker("w-silent", 1), Worker("w-ok", 1)
    bed.look()
    bed.ask(silent)
    for _ in range(60):
        bed.tick(1.0)
        bed.look()
        bed.ask(healthy)
    assert not healthy.running  # Lost long ago, but its worker may still run it
    assert bed.tasks["active"][0]["reason"] == api.REASON_PREVIOUS_POD
    bed.state.worker_gone("work", "w-silent", bed.wall)  # its pod is deleted
    for _ in range(5):
        bed.tick(1.0)
        bed.look()
        bed.ask(healthy)
    assert [key[2] for key in healthy.running] == [2]


def test_no_overlap_goes_on_once_the_silent_worker_reports_the_end_of_the_cancelled_attempt() -> None:
    bed = Bed(
        pulled_job(1, guarantee="NoOverlap", retry={"maxAttempts": 3, "backoff": {"initialSeconds": 1, "jitter": 0}})
    )
    slow, healthy = Worker("w-slow", 1), Worker("w-ok", 1)
    bed.look()
    bed.ask(slow)
    for _ in range(35):
        bed.tick(1.0)
        bed.look()
    bed.ask(slow)  # back: told to stop its attempt, which it does, and reports
    assert slow.cancelled and not slow.running
    bed.ask(slow, claim=False)
    for _ in range(5):
        bed.tick(1.0)
        bed.look()
        bed.ask(healthy)
    assert [key[2] for key in healthy.running] == [2]


def test_a_lease_the_worker_no_longer_holds_is_retried() -> None:
    bed = Bed(pulled_job(1, retry={"maxAttempts": 3, "backoff": {"initialSeconds": 1, "jitter": 0}}))
    worker = Worker("w-a", 1)
    bed.look()
    bed.ask(worker)
    key = next(iter(worker.running))
    bed.ask(worker, claim=False)  # it names it: it has it
    worker.running.clear()  # then loses it, and says so by leaving it out
    answer = bed.ask(worker, claim=False)
    assert key[0] in answer.touched
    for _ in range(5):
        bed.tick(1.0)
        bed.look()
        bed.ask(worker)
    assert [k[2] for k in worker.running] == [2]


def test_a_lease_whose_answer_never_reached_its_worker_is_offered_again_with_its_attempt() -> None:
    bed = Bed(pulled_job(1, retry={"maxAttempts": 1}))
    worker, other = Worker("w-a", 1), Worker("w-b", 1)
    bed.look()
    lost_answer = pull.read_request(worker.body())
    bed.state.request(POOL, lost_answer, bed.now, bed.wall)  # leased; the answer times out on the way
    worker.seen = worker.seq  # the worker gave up on that request
    bed.ask(worker, claim=False)  # and, not holding it, leaves it out
    bed.ask(other)
    assert [key[2] for key in other.running] == [1]  # attempt 1 again: no attempt spent, no backoff
    bed.look()
    assert bed.job["status"]["phase"] == "Running" and bed.tasks["running"] == 1


def test_a_lease_given_in_an_answer_the_worker_has_not_seen_is_not_taken_as_dropped() -> None:
    bed = Bed(pulled_job(1))
    worker = Worker("w-a", 1)
    bed.look()
    claim = pull.read_request(worker.body())  # the answer to this one is still on its way
    bed.state.request(POOL, claim, bed.now, bed.wall)
    beat = pull.read_request(worker.body(claim=False))  # sent before that answer arrived: seen < seq
    answer = bed.state.request(POOL, beat, bed.now, bed.wall)
    assert answer.touched == frozenset()
    assert all(lease.vanished is None for lease in bed.state.leases.values())


def test_a_restarted_worker_loses_what_it_ran() -> None:
    bed = Bed(pulled_job(2, parallelism=2, retry={"maxAttempts": 3, "backoff": {"initialSeconds": 1, "jitter": 0}}))
    worker = Worker("w-a", 2)
    bed.look()
    bed.ask(worker)
    worker.running.clear()
    worker.boot, worker.seq, worker.seen = "boot-2", 0, 0
    answer = bed.ask(worker, claim=False)
    assert len(answer.touched) == 1 and all(lease.vanished == "WorkerRestarted" for lease in bed.state.leases.values())


def test_a_result_is_acknowledged_only_after_the_write_that_records_it() -> None:
    bed = Bed(pulled_job(1))
    worker = Worker("w-a", 1)
    bed.look()
    bed.ask(worker)
    key = next(iter(worker.running))
    worker.finish(key, 0)
    bed.ask(worker)
    assert worker.unacked == {key: 0}  # not written yet
    bed.ask(worker)  # sent again: taken once
    bed.look()
    assert bed.tasks["succeeded"] == 1
    bed.ask(worker)
    assert worker.unacked == {}


def test_a_new_leader_adopts_what_workers_hold_and_what_they_finished() -> None:
    bed = Bed(pulled_job(4, parallelism=4))
    worker = Worker("w-a", 4)
    bed.look()
    bed.ask(worker)
    bed.look()
    done = sorted(worker.running)[0]
    worker.finish(done, 0)
    bed.ask(worker)  # reported to the old leader, which crashes before writing it
    # A new leader: its lease state is empty; the job's status says four tasks run.
    bed.state = pull.PullState(started_at=bed.now, timing=lambda ns, pool: TIMING)
    bed.look()
    assert bed.state.leases == {}  # nothing offered again while it adopts
    assert bed.tasks["running"] == 4
    bed.tick(2.0)
    bed.ask(worker)  # the worker names what it holds and sends its result again
    bed.look()
    assert bed.tasks["succeeded"] == 1 and bed.tasks["running"] == 3
    for key in list(worker.running):
        worker.finish(key, 0)
    for _ in range(3):
        bed.ask(worker)
        bed.tick(1.0)
        bed.look()
    assert bed.job["status"]["phase"] == "Succeeded"
    assert not worker.cancelled  # nothing was stopped: the failover ran no task again


def test_after_the_adoption_window_a_running_task_nobody_named_is_retried_as_vanished() -> None:
    bed = Bed(pulled_job(3, parallelism=2, retry={"maxAttempts": 3, "backoff": {"initialSeconds": 1, "jitter": 0}}))
    gone = Worker("w-gone", 2)
    bed.look()
    bed.ask(gone)
    bed.look()  # two tasks recorded as running on w-gone
    bed.state = pull.PullState(started_at=bed.now, timing=lambda ns, pool: TIMING)
    fresh = Worker("w-new", 3)
    for _ in range(int(TIMING.timeout + TIMING.interval) - 1):
        bed.tick(1.0)
        bed.look()
        bed.ask(fresh)
    assert not fresh.running  # waited for: w-gone might still name them
    for _ in range(5):
        bed.tick(1.0)
        bed.look()
        bed.ask(fresh)
    # Its worker has fenced them by now: each is retried as a pod that vanished would be, with the
    # next attempt number (a new fencing token), by the retry policy.
    assert sorted((key[1], key[2]) for key in fresh.running) == [(0, 2), (1, 2)]
    assert [t["last"]["outcome"] for t in bed.tasks["active"]] == ["Lost", "Lost"]


def test_a_new_leader_offers_again_at_once_what_no_worker_had_claimed() -> None:
    bed = Bed(pulled_job(2, parallelism=2))
    bed.look()  # offered, not claimed
    bed.state = pull.PullState(started_at=bed.now, timing=lambda ns, pool: TIMING)
    worker = Worker("w-a", 2)
    bed.look()
    bed.ask(worker)
    assert sorted((key[1], key[2]) for key in worker.running) == [(0, 1), (1, 1)]


def test_a_task_offered_again_by_a_new_leader_stays_with_the_worker_that_names_it() -> None:
    bed = Bed(pulled_job(1))
    first, second = Worker("w-a", 1), Worker("w-b", 1)
    bed.look()
    bed.ask(first)  # claimed; the leader crashes before any look sees it running
    bed.state = pull.PullState(started_at=bed.now, timing=lambda ns, pool: TIMING)
    bed.look()  # never seen running: offered again at once
    bed.ask(first, claim=False)  # its worker names it first: it stays there
    bed.ask(second)
    assert len(first.running) == 1 and not second.running and not first.cancelled


def test_a_deleted_jobs_running_tasks_are_stopped_and_their_results_acknowledged() -> None:
    bed = Bed(pulled_job(2, parallelism=2))
    worker = Worker("w-a", 2)
    bed.look()
    bed.ask(worker)
    first, second = sorted(worker.running)
    worker.finish(first, 0)
    bed.state.forget_job(bed.job["metadata"]["uid"])  # the job is deleted
    bed.ask(worker, claim=False)
    assert worker.cancelled == [second] and worker.unacked == {second: 143}
    bed.ask(worker, claim=False)
    assert worker.unacked == {} and bed.state.leases == {}  # nothing kept, nothing adopted


def test_a_worker_cannot_take_or_forge_another_pools_tasks() -> None:
    bed = Bed(pulled_job(2, parallelism=2))
    bed.state.adoptable = lambda namespace, pool, uid: (namespace, pool) == ("work", POOL)  # the job is etl's
    bed.look()  # two tasks offered to pool etl in namespace work
    offered = sorted(bed.state.leases)
    stranger = Worker("w-other", 2)  # a worker of another pool, naming etl's offers and a forged one
    stranger.running = {key: {} for key in [*offered, (bed.job["metadata"]["uid"], 1, 7)]}
    request = pull.read_request(stranger.body(claim=False))
    answer = bed.state.request("other-pool", request, bed.now, bed.wall)
    assert sorted(map(tuple, answer.body["cancel"])) == sorted([*offered, (bed.job["metadata"]["uid"], 1, 7)])
    assert all(lease.worker is None for lease in bed.state.leases.values())  # still offered to etl
    assert len(bed.state.leases) == 2  # nothing adopted
    assert len(bed.state.pods_of(bed.job, bed.now)) == 2


def test_after_the_adoption_window_what_a_worker_names_that_nobody_offered_is_refused() -> None:
    bed = Bed(pulled_job(2, parallelism=2))
    bed.tick(TIMING.timeout + TIMING.interval + 1)
    worker = Worker("w-a", 2)
    forged = (bed.job["metadata"]["uid"], 0, 5)
    worker.running[forged] = {}
    worker.unacked[(bed.job["metadata"]["uid"], 1, 5)] = 0  # a "success" nobody offered
    bed.ask(worker, claim=False)
    assert worker.cancelled == [forged] and bed.state.leases == {}
    bed.ask(worker, claim=False)  # the stopped task's exit code, acknowledged and dropped
    assert worker.unacked == {} and bed.state.leases == {}
    bed.look()
    assert bed.tasks["succeeded"] == 0


def test_a_new_leader_adopts_only_jobs_of_the_workers_own_pool() -> None:
    job = pulled_job(2, parallelism=2)
    bed = Bed(job)
    bed.state.adoptable = lambda namespace, pool, uid: (namespace, pool, uid) == ("work", POOL, "someone-else")
    worker = Worker("w-a", 2)
    worker.running[(job["metadata"]["uid"], 0, 1)] = {}
    bed.ask(worker, claim=False)
    assert worker.cancelled == [(job["metadata"]["uid"], 0, 1)] and bed.state.leases == {}


def test_a_long_polls_end_claims_only_and_reruns_nothing_the_worker_finished_meanwhile() -> None:
    bed = Bed(pulled_job(2, parallelism=1))
    worker = Worker("w-a", 2)
    bed.look()
    bed.ask(worker)  # claims task 0 (the only offer: parallelism 1)
    (first,) = worker.running
    poll = pull.read_request(worker.body())  # a claim of one more slot: nothing ready, it waits
    bed.state.request(POOL, poll, bed.now, bed.wall)
    worker.finish(first, 0)
    bed.ask(worker, claim=False)  # its beat on the other connection reports task 0's end
    bed.tick(1.0)
    bed.look()  # recorded, settled; task 1 offered
    late = bed.state.claim_more(POOL, poll, bed.now, bed.wall)  # the long poll's end
    worker.take(late.body)
    assert [lease["index"] for lease in late.body["leases"]] == [1]
    bed.ask(worker, claim=False)
    assert all(lease.vanished is None for lease in bed.state.leases.values())  # task 0 not adopted back
    assert bed.tasks["succeeded"] == 1 and first not in bed.state.leases


def test_a_request_that_arrives_after_a_newer_one_says_nothing_of_what_is_held() -> None:
    bed = Bed(pulled_job(1))
    worker = Worker("w-a", 1)
    bed.look()
    bed.ask(worker)
    (first,) = worker.running
    stale = pull.read_request(worker.body(claim=False))  # held: task 0; delayed on its connection
    worker.finish(first, 0)
    bed.ask(worker, claim=False)
    bed.tick(1.0)
    bed.look()  # task 0 recorded and settled
    answer = bed.state.request(POOL, stale, bed.now, bed.wall)
    assert answer.body["cancel"] == [] and bed.state.leases == {}  # not adopted back, not dropped


def test_a_result_for_a_task_a_new_leader_offered_again_is_recorded() -> None:
    bed = Bed(pulled_job(1))
    worker = Worker("w-a", 1)
    bed.look()
    bed.ask(worker)  # claimed; the leader crashes before a look sees it running
    (first,) = worker.running
    bed.state = pull.PullState(started_at=bed.now, timing=lambda ns, pool: TIMING)
    bed.look()  # offered again, unclaimed
    worker.finish(first, 0)
    bed.ask(worker, claim=False)  # its result, before anyone claims the offer
    bed.look()
    assert bed.tasks["succeeded"] == 1 and bed.job["status"]["phase"] == "Succeeded"


def test_two_workers_naming_one_lease_the_second_is_told_to_stop() -> None:
    bed = Bed(pulled_job(1))
    a, b = Worker("w-a", 1), Worker("w-b", 1)
    bed.look()
    bed.ask(a)
    key = next(iter(a.running))
    b.running[key] = {}
    bed.ask(b, claim=False)
    assert b.cancelled == [key] and key in a.running


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"[]", "JSON object"),
        (b"{", "not JSON"),
        (b'{"pod": {"name": "x"}}', '"pod"'),
        (b'{"pod": {"namespace": "n", "name": "x"}, "free": 5000}', '"free"'),
        (b'{"pod": {"namespace": "n", "name": "x"}, "waitSeconds": 60}', "waitSeconds"),
        (b'{"pod": {"namespace": "n", "name": "x"}, "held": [["u", -1, 1]]}', "index"),
        (b'{"pod": {"namespace": "n", "name": "x"}, "results": [{"lease": ["u", 1, 1], "exitCode": 300}]}', "exitCode"),
        (b" " * (pull.MAX_BODY_BYTES + 1), "over"),
    ],
)
def test_a_bad_request_is_refused_saying_what_to_fix(body: bytes, says: str) -> None:
    with pytest.raises(pull.BadRequest, match=says):
        pull.read_request(body)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["ask-a", "ask-b", "finish-a", "finish-b", "fail-b", "silence", "look", "failover"]),
            st.integers(0, 5),
        ),
        min_size=10,
        max_size=80,
    )
)
def test_whatever_the_interleaving_no_task_is_held_by_two_live_workers_and_all_end(
    steps: list[tuple[str, int]],
) -> None:
    # NoOverlap: under AtLeastOnce a task claimed just before a failover and not yet seen running
    # is offered again at once, and may run twice (design.md; its own test above).
    bed = Bed(
        pulled_job(
            6,
            parallelism=4,
            guarantee="NoOverlap",
            retry={"maxAttempts": 20, "backoff": {"initialSeconds": 1, "jitter": 0}},
        )
    )
    workers = {"a": Worker("w-a", 2), "b": Worker("w-b", 2)}
    answered = {"a": 0.0, "b": 0.0}  # when each last had an answer
    for step, n in steps:
        for name, worker in workers.items():
            if bed.now - answered[name] >= TIMING.timeout:  # no answer for leaseSeconds: it fences itself
                worker.running.clear()
        if step.startswith("ask-"):
            bed.ask(workers[step[-1]])
            answered[step[-1]] = bed.now
        elif step.startswith(("finish-", "fail-")):
            worker = workers[step[-1]]
            for key in sorted(worker.running)[: n % 2 + 1]:
                if step.startswith("finish"):
                    bed.ledger[key[1]] += 1
                worker.finish(key, 0 if step.startswith("finish") else 1)
        elif step == "silence":
            bed.tick(float(n * 10))
        elif step == "look":
            bed.look()
        elif step == "failover":
            bed.state = pull.PullState(started_at=bed.now, timing=lambda ns, pool: TIMING)
        bed.tick(0.5)
        running = Counter(key[1] for w in workers.values() for key in w.running)
        live = {
            key[1]
            for key, lease in bed.state.leases.items()
            if lease.worker and lease.result is None and lease.vanished is None and lease.cancelled_wall is None
        }
        assert all(count == 1 for index, count in running.items() if index in live), running
    run(bed, list(workers.values()), rounds=600)  # then everybody behaves: all end
    assert bed.job["status"]["phase"] == "Succeeded"
    assert set(bed.ledger) == set(range(6))
