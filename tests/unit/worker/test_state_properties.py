"""The worker's bookkeeping under any interleaving (hypothesis): requests in flight side by side,
answered in any order or failing, tasks ending, checkpoints, cancels, acks, time passing. What
the protocol asks of the worker (docs/pull.md, "The worker's part") holds after every step."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.clock import FakeClock
from vigil.core import pull
from vigil.worker.state import MAX_BODY_BYTES, Forget, Start, Stop, WorkerState

pytestmark = pytest.mark.unit

LEASE_SECONDS = 30.0


def answer(leases, cancel, acked) -> bytes:
    return json.dumps(
        {
            "leases": [{"lease": list(x), "graceSeconds": 5, "env": {"VIGIL_TASK_INDEX": str(x[1])}} for x in leases],
            "cancel": [list(x) for x in cancel],
            "acked": [list(x) for x in acked],
            "beatSeconds": 5,
            "leaseSeconds": LEASE_SECONDS,
        }
    ).encode()


class Model:
    """The test's own record of what happened, to check the state's against."""

    def __init__(self, slots: int) -> None:
        self.clock = FakeClock()
        self.state = WorkerState(pod={"namespace": "n", "name": "p", "uid": "u"}, boot="b", slots=slots)
        self.next_index = 0
        self.granted_for: dict[tuple, int] = {}  # lease -> the seq whose answer started it
        self.started: set[tuple] = set()
        self.given_up: set[tuple] = set()  # forgotten (fenced): never held or reported again
        self.recorded: set[tuple] = set()  # results recorded and not acked yet
        self.acked: set[tuple] = set()
        self.stopped: set[tuple] = set()
        self.last_seq = 0
        self.last_seen = 0
        self.ok_sent_at: float | None = None
        self.sent_at: dict[int, float] = {}

    def now(self) -> float:
        return self.clock.monotonic()

    def take(self, seq: int, actions) -> None:
        for action in actions:
            if isinstance(action, Start):
                lease = action.grant.lease
                assert lease not in self.started, "a lease started twice"
                self.started.add(lease)
                self.granted_for[lease] = seq
            elif isinstance(action, Stop):
                assert action.lease in self.started and action.lease not in self.stopped, "stopped twice"
                self.stopped.add(action.lease)
            elif isinstance(action, Forget) and action.lease in self.started:
                self.given_up.add(action.lease)

    def send(self, claim: bool) -> None:
        inflight = set(self.state.inflight)
        out = self.state.request(self.now(), claim=claim, wait_seconds=10)
        body = json.loads(out.body)
        assert len(out.body) <= MAX_BODY_BYTES
        pull.read_request(out.body)  # the leader reads it (vigil.core.pull)
        assert body["seq"] == self.last_seq + 1, "seq grows by one"
        assert self.last_seen <= body["seen"] < body["seq"], "seen never goes back"
        assert all(body["seen"] < seq for seq in inflight), "seen stays below every request in flight"
        self.last_seq, self.last_seen = body["seq"], body["seen"]
        self.sent_at[out.seq] = self.now()
        held = {tuple(x) for x in body["held"]}
        results = {tuple(r["lease"]) for r in body["results"]}
        assert not held & results
        assert results == self.recorded, "every result is sent until acked"
        assert not (held | results) & self.given_up, "a lease given up is never named again"
        assert len(held) <= self.state.slots and body["free"] <= self.state.slots - len(held)
        if not claim or self.state.draining:
            assert body["free"] == 0
        # held is the truth: a lease granted for seq s and not named once seen >= s is over
        for lease, s in self.granted_for.items():
            if body["seen"] >= s and lease not in held and lease not in results:
                assert lease in self.given_up or lease in self.acked, f"{lease} lost by omission"

    def answer(self, seq: int, kind: str, grants: int, cancel: list, acked: list) -> None:
        now = self.now()
        if kind == "fail":
            verdict = self.state.failed(seq, now)
        elif kind == "503":
            verdict = self.state.answered(seq, 503, b"busy", now, retry_after=7)
        elif kind == "malformed":
            verdict = self.state.answered(seq, 200, b'{"leases": "no"}', now)
        else:
            leases = []
            for _ in range(grants):
                self.next_index += 1
                leases.append(("job", self.next_index, 1))
            verdict = self.state.answered(seq, 200, answer(leases, cancel, acked), now)
            assert verdict.ok
            sent = self.sent_at[seq]
            self.ok_sent_at = sent if self.ok_sent_at is None else max(self.ok_sent_at, sent)
            self.acked |= set(acked) & self.recorded
            self.recorded -= set(acked)
        self.take(seq, verdict.actions)

    def finish(self, lease: tuple, code: int) -> None:
        reported = self.state.finished(lease, code, f"exit {code}")
        assert reported == (lease not in self.given_up)
        if reported:
            self.recorded.add(lease)

    def check(self) -> None:
        s = self.state
        assert 0 <= s.free == s.slots - len(s.tasks)
        assert set(s.results) == self.recorded
        assert not set(s.held()) & self.given_up
        if self.ok_sent_at is not None and self.now() >= self.ok_sent_at + LEASE_SECONDS:
            assert s.held() == [], "no 200 for leaseSeconds: nothing is held"


step = st.one_of(
    st.tuples(st.just("send"), st.booleans()),
    st.tuples(st.just("answer"), st.integers(0, 3), st.sampled_from(["ok", "ok", "ok", "fail", "503", "malformed"])),
    st.tuples(st.just("finish"), st.integers(0, 10), st.sampled_from([0, 1, 143, 256, -1])),
    st.tuples(st.just("checkpoint"), st.integers(0, 10), st.integers(0, 3)),
    st.tuples(st.just("advance"), st.sampled_from([0.1, 1.0, 5.0, 12.0, 31.0])),
    st.tuples(st.just("tick"), st.none()),
    st.tuples(st.just("to the fence"), st.sampled_from([-1e-6, 0.0])),
    st.tuples(st.just("drain"), st.none()),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(slots=st.integers(1, 4), steps=st.lists(step, max_size=60), data=st.data())
def test_the_protocols_promises_hold_under_any_interleaving(slots, steps, data):
    m = Model(slots)
    for op in steps:
        kind = op[0]
        if kind == "send":
            if len(m.state.inflight) < 3:
                m.send(op[1])
        elif kind == "answer" and m.state.inflight:
            seqs = sorted(m.state.inflight)
            seq = seqs[op[1] % len(seqs)]
            held, results = m.state.held(), list(m.state.results)
            cancel = data.draw(st.lists(st.sampled_from(held), max_size=2)) if held else []
            acked = data.draw(st.lists(st.sampled_from(results), max_size=3)) if results else []
            m.answer(seq, op[2], data.draw(st.integers(0, slots + 1)), cancel, acked)
        elif kind == "finish" and m.state.tasks:
            tasks = list(m.state.tasks)
            m.finish(tasks[op[1] % len(tasks)], op[2])
        elif kind == "checkpoint" and m.state.tasks:
            tasks = list(m.state.tasks)
            m.state.checkpoint(tasks[op[1] % len(tasks)], json.dumps({"row": op[2]}))
        elif kind == "advance":
            m.clock.tick(op[1])
        elif kind == "tick":
            m.take(-1, m.state.tick(m.now()))
        elif kind == "to the fence" and m.state.fence_deadline() is not None:
            m.clock.now = max(m.now(), m.state.fence_deadline() + op[1])
        elif kind == "drain":
            m.state.drain()
        if kind in ("advance", "finish", "checkpoint", "to the fence"):
            m.take(-1, m.state.tick(m.now()))  # the thin part looks at the clock at least every second
        m.check()
