"""The worker's bookkeeping on the pull protocol (vigil.worker.state, docs/pull.md), on a fake clock:
numbering, leases, results kept until acked, checkpoints, cancel, self-fencing, bounded bodies,
and answers that are no verdict."""

from __future__ import annotations

import json

import pytest

from tests.support.clock import FakeClock
from vigil.worker.state import (
    MAX_BODY_BYTES,
    MAX_MESSAGE_CHARS,
    Forget,
    Start,
    Stop,
    WorkerState,
    lease_text,
    parse_answer,
)

pytestmark = pytest.mark.unit

POD = {"namespace": "team-a", "name": "etl-pool-x7k2q", "uid": "pod-uid"}
L1, L2, L3 = ("job-uid", 1, 1), ("job-uid", 2, 1), ("job-uid", 3, 1)


def grant(lease, grace: float = 30, **env: str) -> dict:
    uid, index, attempt = lease
    return {
        "lease": list(lease),
        "job": "etl",
        "namespace": "team-a",
        "index": index,
        "attempt": attempt,
        "graceSeconds": grace,
        "deadlineSeconds": None,
        "env": {"VIGIL_TASK_INDEX": str(index), "VIGIL_IDEMPOTENCY_KEY": f"{uid}-{index}", **env},
    }


def answer(leases=(), cancel=(), acked=(), beat: float = 5, lease: float = 30) -> bytes:
    return json.dumps(
        {
            "leases": [grant(x) if isinstance(x, tuple) else x for x in leases],
            "cancel": [list(x) for x in cancel],
            "acked": [list(x) for x in acked],
            "beatSeconds": beat,
            "leaseSeconds": lease,
        }
    ).encode()


def new(slots: int = 3) -> WorkerState:
    return WorkerState(pod=POD, boot="boot-1", slots=slots)


def body(out) -> dict:
    return json.loads(out.body)


def exchange(state: WorkerState, now: float, reply: bytes = b"", *, claim: bool = False, status: int = 200):
    out = state.request(now, claim=claim, wait_seconds=10)
    return out, state.answered(out.seq, status, reply or answer(), now)


def run_leases(state: WorkerState, now: float, *leases) -> None:
    out = state.request(now, claim=True, wait_seconds=10)
    verdict = state.answered(out.seq, 200, answer(leases), now)
    assert [a.grant.lease for a in verdict.actions if isinstance(a, Start)] == list(leases)


# --- the request ------------------------------------------------------------------------------------


def test_the_first_claim_names_the_pod_and_asks_for_every_slot():
    state = new(slots=3)
    out = state.request(1000.0, claim=True, wait_seconds=10)
    assert body(out) == {
        "pod": POD,
        "boot": "boot-1",
        "seq": 1,
        "seen": 0,
        "free": 3,
        "waitSeconds": 10,
        "held": [],
        "checkpoints": [],
        "results": [],
    }
    assert out.claim and out.free == 3 and out.wait_seconds == 10


def test_a_beat_claims_nothing_and_is_not_held_and_a_wait_is_bounded_by_20s():
    state = new()
    beat = body(state.request(1000.0, claim=False, wait_seconds=10))
    assert beat["free"] == 0 and beat["waitSeconds"] == 0
    assert body(state.request(1000.0, claim=True, wait_seconds=60))["waitSeconds"] == 20


def test_seq_grows_by_one_and_seen_waits_for_every_request_in_flight():
    state = new()
    claim = state.request(1000.0, claim=True, wait_seconds=10)  # seq 1: a long poll, held by the leader
    beat = state.request(1001.0, claim=False)  # seq 2
    state.answered(beat.seq, 200, answer(), 1001.1)
    # the answer to 1 may yet bring leases: seen stays below it, so none is reported lost by omission
    third = body(state.request(1002.0, claim=False))
    assert (third["seq"], third["seen"]) == (3, 0)
    state.answered(claim.seq, 200, answer([L1]), 1010.0)
    fourth = body(state.request(1011.0, claim=False))
    assert (fourth["seq"], fourth["seen"], fourth["held"]) == (4, 2, [list(L1)])  # 3 is still in flight
    state.failed(3, 1012.0)
    state.answered(4, 200, answer(), 1012.0)
    fifth = body(state.request(1013.0, claim=False))
    assert (fifth["seq"], fifth["seen"]) == (5, 4)


def test_seen_counts_a_failed_request_as_taken():
    state = new()
    out = state.request(1000.0, claim=True, wait_seconds=10)
    state.failed(out.seq, 1001.0, "reset")
    assert body(state.request(1002.0, claim=False))["seen"] == 1


# --- leases and results ------------------------------------------------------------------------------------


def test_leases_granted_are_started_held_and_take_their_slots():
    state = new(slots=2)
    out = state.request(1000.0, claim=True, wait_seconds=10)
    verdict = state.answered(out.seq, 200, answer([L1, L2]), 1000.5)
    assert verdict.ok
    starts = [a for a in verdict.actions if isinstance(a, Start)]
    assert [s.grant.lease for s in starts] == [L1, L2]
    assert starts[0].grant.env["VIGIL_IDEMPOTENCY_KEY"] == "job-uid-1" and starts[0].grant.grace_seconds == 30
    assert state.free == 0
    nxt = body(state.request(1001.0, claim=True, wait_seconds=10))
    assert nxt["held"] == [list(L1), list(L2)] and nxt["free"] == 0 and nxt["waitSeconds"] == 0


def test_a_lease_is_never_started_twice_nor_beyond_the_free_slots():
    state = new(slots=2)
    run_leases(state, 1000.0, L1)
    out = state.request(1001.0, claim=True, wait_seconds=10)
    verdict = state.answered(out.seq, 200, answer([L1, L2, L3]), 1001.0)  # L1 again, and one too many
    assert [type(a).__name__ for a in verdict.actions] == ["Start", "Forget"]
    assert verdict.actions[0].grant.lease == L2 and verdict.actions[1] == Forget(L3, "no free slot")
    assert state.held() == [L1, L2]


def test_a_result_is_resent_with_every_request_until_acked():
    state = new()
    run_leases(state, 1000.0, L1)
    assert state.finished(L1, 3, "exit code 3")
    assert state.free == 3 and state.held() == []
    assert state.has_unsent_results()
    result = {"lease": list(L1), "exitCode": 3, "message": "exit code 3"}
    out = state.request(1001.0, claim=False)
    assert body(out)["results"] == [result] and out.results == (L1,)
    assert not state.has_unsent_results()
    state.failed(out.seq, 1002.0)
    out = state.request(1003.0, claim=False)
    assert body(out)["results"] == [result]
    state.answered(out.seq, 200, answer(), 1003.0)  # a 200 that does not ack it
    out = state.request(1004.0, claim=False)
    assert body(out)["results"] == [result]
    state.answered(out.seq, 200, answer(acked=[L1]), 1004.0)
    assert body(state.request(1005.0, claim=False))["results"] == []


def test_a_lease_given_for_a_result_kept_is_not_run_again():
    state = new()
    run_leases(state, 1000.0, L1)
    state.finished(L1, 0)
    out, verdict = exchange(state, 1001.0, answer([L1]), claim=True)
    assert verdict.actions == () and state.held() == []


def test_a_messages_length_is_bounded():
    state = new()
    run_leases(state, 1000.0, L1)
    state.finished(L1, 1, "x" * 10_000)
    message = body(state.request(1001.0, claim=False))["results"][0]["message"]
    assert len(message) == MAX_MESSAGE_CHARS and message.endswith("...")


@pytest.mark.parametrize(("code", "reported"), [(0, 0), (255, 255), (256, 255), (-1, 255)])
def test_an_exit_code_outside_0_to_255_is_reported_as_255(code: int, reported: int):
    state = new()
    run_leases(state, 1000.0, L1)
    state.finished(L1, code, "why")
    result = body(state.request(1001.0, claim=False))["results"][0]
    assert result["exitCode"] == reported and (result["message"] == "why") == (code == reported)


def test_a_body_is_bounded_and_the_oldest_results_go_first():
    state = new(slots=1000)
    leases = [("u" * 64, i, 1) for i in range(400)]
    run_leases(state, 1000.0, *leases)
    for lease in leases:
        state.finished(lease, 1, "é" * MAX_MESSAGE_CHARS)  # 6 bytes each in the body's JSON
    batches: list[list[int]] = []
    now = 1001.0
    while results := body(out := state.request(now, claim=False))["results"]:
        assert len(out.body) <= MAX_BODY_BYTES
        batches.append([r["lease"][1] for r in results])
        state.answered(out.seq, 200, answer(acked=[tuple(r["lease"]) for r in results]), now)
        now += 1
    assert len(batches) > 1 and [i for batch in batches for i in batch] == list(range(400))


def test_a_lease_given_for_seq_s_and_not_held_any_more_is_reported_by_omission():
    clock = FakeClock()
    state = new()
    out = state.request(clock.monotonic(), claim=True, wait_seconds=10)
    s = out.seq
    state.answered(s, 200, answer([L1, L2]), clock.monotonic())
    clock.tick(1)
    beat, _ = exchange(state, clock.monotonic())
    assert body(beat)["held"] == [list(L1), list(L2)] and body(beat)["seen"] >= s
    # no 200 for leaseSeconds: both are fenced
    for _ in range(6):
        clock.tick(5)
        out = state.request(clock.monotonic(), claim=False)
        state.failed(out.seq, clock.monotonic())
    assert {type(a).__name__ for a in state.tick(clock.monotonic())} <= {"Stop", "Forget"}
    assert state.held() == []
    assert not state.finished(L1, 143, "killed")  # its end is not reported: the lease was given up
    out = state.request(clock.monotonic(), claim=True, wait_seconds=10)
    sent = body(out)
    assert sent["seen"] >= s and sent["held"] == [] and sent["results"] == []
    assert sent["free"] == 2  # L2 still holds its slot until its process ends


def test_leases_granted_while_draining_are_not_started_but_forgotten():
    state = new()
    out = state.request(1000.0, claim=True, wait_seconds=10)
    state.drain()
    verdict = state.answered(out.seq, 200, answer([L1]), 1001.0)
    assert verdict.actions == (Forget(L1, "the worker is stopping"),)
    assert body(state.request(1002.0, claim=True, wait_seconds=10))["free"] == 0


def test_leases_in_an_answer_later_than_leaseSeconds_after_its_request_are_not_started():
    state = new()
    out = state.request(1000.0, claim=True, wait_seconds=10)
    verdict = state.answered(out.seq, 200, answer([L1], lease=30), 1030.0)
    assert [type(a) for a in verdict.actions] == [Forget] and state.held() == []


# --- self-fencing ----------------------------------------------------------------------------------------------


def test_self_fencing_comes_exactly_leaseSeconds_after_the_sending_of_the_last_request_that_got_a_200():
    clock = FakeClock()
    state = new()
    run_leases(state, clock.monotonic(), L1)
    clock.tick(2)
    sent_at = clock.monotonic()
    out = state.request(sent_at, claim=False)
    clock.tick(4)  # the answer takes 4 s: the lease counts from the sending
    state.answered(out.seq, 200, answer(lease=30), clock.monotonic())
    assert state.fence_deadline() == sent_at + 30
    while clock.monotonic() + 3 < sent_at + 30:
        clock.tick(3)
        out = state.request(clock.monotonic(), claim=False)
        state.answered(out.seq, 503, b"not the leader", clock.monotonic())
    clock.now = sent_at + 30 - 1e-6
    assert state.tick(clock.monotonic()) == [] and state.held() == [L1]
    clock.now = sent_at + 30
    actions = state.tick(clock.monotonic())
    assert [type(a) for a in actions] == [Stop, Forget]
    assert actions[0].lease == L1 and actions[0].grace_seconds == 30 and "self-fenced" in actions[0].reason
    assert state.held() == [] and state.tick(clock.monotonic() + 100) == []
    # a 200 afterwards brings nothing back
    out, verdict = exchange(state, clock.monotonic())
    assert verdict.ok and state.held() == []


def test_a_malformed_200_renews_nothing():
    clock = FakeClock()
    state = new()
    run_leases(state, clock.monotonic(), L1)
    clock.tick(10)
    out = state.request(clock.monotonic(), claim=False)
    verdict = state.answered(out.seq, 200, b'{"beatSeconds": 5, "leaseSeconds": "30"}', clock.monotonic())
    assert not verdict.ok and "leaseSeconds" in verdict.why
    assert state.fence_deadline() == FakeClock().monotonic() + 30


def test_answers_before_the_first_200_fence_nothing():
    state = new()
    assert state.fence_deadline() is None and state.tick(10**9) == []


# --- cancel, checkpoints --------------------------------------------------------------------------------------


def test_cancel_stops_the_task_with_its_grace_and_its_exit_code_is_reported():
    state = new()
    out = state.request(1000.0, claim=True, wait_seconds=10)
    state.answered(out.seq, 200, answer([grant(L1, grace=7)]), 1000.0)
    out, verdict = exchange(state, 1001.0, answer(cancel=[L1, L2]))
    assert verdict.actions == (Stop(L1, 7, "cancelled by the leader"),)
    out, verdict = exchange(state, 1002.0, answer(cancel=[L1]))  # told again: stopping already
    assert verdict.actions == ()
    assert body(state.request(1003.0, claim=False))["held"] == [list(L1)]  # runs until it ends
    assert state.finished(L1, 143, "killed by SIGTERM")
    out = state.request(1004.0, claim=False)
    assert body(out)["held"] == []
    assert body(out)["results"] == [{"lease": list(L1), "exitCode": 143, "message": "killed by SIGTERM"}]


def test_a_checkpoint_is_sent_until_a_200_confirms_it_and_again_when_it_changes():
    state = new()
    run_leases(state, 1000.0, L1)
    assert state.checkpoint(L1, '{"row":1}')
    assert not state.checkpoint(L1, '{"row":1}')  # unchanged
    out = state.request(1001.0, claim=False)
    assert body(out)["checkpoints"] == [{"lease": list(L1), "value": '{"row":1}'}]
    state.failed(out.seq, 1001.5)
    out = state.request(1002.0, claim=False)
    assert body(out)["checkpoints"] == [{"lease": list(L1), "value": '{"row":1}'}]
    state.answered(out.seq, 200, answer(), 1002.0)
    assert body(state.request(1003.0, claim=False))["checkpoints"] == []
    state.checkpoint(L1, '{"row":2}')
    out = state.request(1004.0, claim=False)
    assert body(out)["checkpoints"] == [{"lease": list(L1), "value": '{"row":2}'}]


def test_the_last_checkpoint_goes_with_the_result_and_a_fenced_tasks_is_dropped():
    state = new()
    run_leases(state, 1000.0, L1, L2)
    state.checkpoint(L1, '"done"')
    state.finished(L1, 0)
    out = state.request(1001.0, claim=False)
    sent = body(out)
    assert sent["checkpoints"] == [{"lease": list(L1), "value": '"done"'}] and sent["results"][0]["lease"] == list(L1)
    state.answered(out.seq, 200, answer(acked=[L1]), 1001.0)
    assert state.checkpoints == {} and state.results == {}
    state.checkpoint(L2, '"half"')
    state.tick(1001.0 + 31)  # fenced
    assert not state.checkpoint(L2, '"more"')
    assert body(state.request(1040.0, claim=False))["checkpoints"] == []


# --- answers that are no verdict ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        b"",
        b"{half",
        b"\xff\xfe",
        b"[]",
        b"{}",
        b'{"beatSeconds": 5}',
        b'{"beatSeconds": 5, "leaseSeconds": 0}',
        b'{"beatSeconds": 5, "leaseSeconds": true}',
        b'{"beatSeconds": 5, "leaseSeconds": NaN}',
        b'{"beatSeconds": -1, "leaseSeconds": 30}',
        b'{"beatSeconds": 5, "leaseSeconds": 30, "leases": {}}',
        b'{"beatSeconds": 5, "leaseSeconds": 30, "leases": [1]}',
        b'{"beatSeconds": 5, "leaseSeconds": 30, "leases": [{"lease": ["u", 1]}]}',
        b'{"beatSeconds": 5, "leaseSeconds": 30, "leases": [{"lease": ["u", "1", 1]}]}',
        b'{"beatSeconds": 5, "leaseSeconds": 30, "leases": [{"lease": ["u", 1, true]}]}',
        b'{"beatSeconds": 5, "leaseSeconds": 30, "leases": [{"lease": ["", 1, 1]}]}',
        b'{"beatSeconds": 5, "leaseSeconds": 30, "leases": [{"lease": ["u", 1, 1], "env": {"A": 1}}]}',
        b'{"beatSeconds": 5, "leaseSeconds": 30, "leases": [{"lease": ["u", 1, 1], "env": []}]}',
        b'{"beatSeconds": 5, "leaseSeconds": 30, "leases": [{"lease": ["u", 1, 1], "env": {"A=B": "x"}}]}',
        b'{"beatSeconds": 5, "leaseSeconds": 30, "leases": [{"lease": ["u", 1, 1], "index": 2}]}',
        b'{"beatSeconds": 5, "leaseSeconds": 30, "leases": [{"lease": ["u", 1, 1], "graceSeconds": "x"}]}',
        b'{"beatSeconds": 5, "leaseSeconds": 30, "cancel": [["u", 1]]}',
        b'{"beatSeconds": 5, "leaseSeconds": 30, "acked": "all"}',
        b"[" * 100_000,
    ],
)
def test_a_malformed_200_is_no_verdict_never_a_crash(reply: bytes):
    state = new()
    run_leases(state, 1000.0, L1)
    state.finished(L1, 0)
    out = state.request(1001.0, claim=True, wait_seconds=10)
    verdict = state.answered(out.seq, 200, reply, 1001.0)
    assert not verdict.ok and verdict.why.startswith("HTTP 200 but") and verdict.actions == ()
    assert L1 in state.results  # kept: no ack came


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 500, 503])
def test_other_statuses_are_no_verdict_and_change_nothing(status: int):
    state = new()
    run_leases(state, 1000.0, L1)
    out = state.request(1001.0, claim=False)
    verdict = state.answered(out.seq, status, answer(cancel=[L1]), 1001.0)
    assert not verdict.ok and verdict.why == f"HTTP {status}" and state.held() == [L1]


def test_a_503s_retry_after_is_honoured_but_never_past_self_fencing():
    state = new()
    out = state.request(1000.0, claim=False)
    verdict = state.answered(out.seq, 503, b"busy", 1000.0, retry_after=20)
    assert verdict.rest_seconds == 20 and state.rest_until == 1020.0  # nothing held: the whole of it
    assert state.beat_due_at() == 1020.0
    state = new()
    run_leases(state, 1000.0, L1)  # a 200 sent at 1000: fences at 1030
    out = state.request(1010.0, claim=False)
    verdict = state.answered(out.seq, 503, b"busy", 1010.0, retry_after=600)
    assert verdict.rest_seconds == 15  # back by 1025: leaseSeconds less min(beatSeconds, leaseSeconds / 3)
    assert state.rest_until == 1025.0


def test_an_answer_to_a_request_not_in_flight_is_no_verdict():
    state = new()
    assert not state.answered(7, 200, answer([L1]), 1000.0).ok and state.held() == []


def test_the_answers_fields_are_parsed():
    parsed = parse_answer(answer([grant(L1, grace=3, VIGIL_TASK_ITEM='{"a": 1}')], acked=[L2], beat=0.001))
    assert parsed.leases[0].grace_seconds == 3 and parsed.leases[0].env["VIGIL_TASK_ITEM"] == '{"a": 1}'
    assert parsed.acked == (L2,) and parsed.beat_seconds == 0.05  # no busy loop on a tiny beatSeconds
    assert lease_text(L1) == "job-uid/1#1"


def test_slots_are_bounded():
    with pytest.raises(ValueError):
        new(slots=0)
