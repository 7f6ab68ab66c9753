"""Leader election: the pure core, a model of several candidates racing through a lying network
with clocks that run at different rates, and the shell under virtual time.

The model (`World`) keeps a reference clock T that no candidate reads: each candidate only reads
its own clock, which starts at an offset of its own and runs at a rate of its own within
[1/SKEW, SKEW], so the ratio between any two clocks stays below lease duration / renew deadline
(the bound client-go documents); a test beyond the bound shows the checker catching the overlap.
Requests travel through a network that delays them arbitrarily, serves them late, loses them
before or after they are served, answers slowly, and lets a candidate give up on one (a
timeout) while it may still land. The API server applies resourceVersion preconditions. A
candidate's right to act (`may_act`) is tracked as intervals of T; no two may overlap.

Two scenario shapes are drawn on purpose, because random steps alone almost never line them up:
an answer that arrives seconds after its write landed (while the others read the new record),
and a node cut off for a while as the others go on. Without them, counting the fence from the
answer instead of the send passed 300 examples.
"""

from __future__ import annotations

import argparse
import asyncio
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st

from tests.support.clock import FakeClock
from vigil.cli import add_election_flags, election_config, lease_namespace
from vigil.core.election import (
    JITTER_FACTOR,
    Candidate,
    ElectionConfig,
    ElectionPhase,
    InvalidTimings,
    LeaseRecord,
    LeaseVerdict,
    SeenRecord,
    StopReason,
    fenced_timeout,
    go_duration,
    micro_time,
    observe,
)
from vigil.kube.errors import ApiError, Conflict, NotFound
from vigil.leaderelection.elector import LeaderElector, NotLeading, default_identity

pytestmark = pytest.mark.unit

CFG = ElectionConfig()  # 15 s / 10 s / 2 s
WALL = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def held_by(holder: str, *, seconds: int = 15, transitions: int = 0, stamp: str = "2026-03-01T12:00:00.000000Z"):
    return LeaseRecord(holder, seconds, stamp, stamp, transitions)


def following(identity: str, record: LeaseRecord | None, version: str = "1", since: float = 0.0) -> Candidate:
    seen = None if record is None else SeenRecord(record, version, since)
    return Candidate(identity, seen=seen)


def leading(identity: str = "me", renewed_at: float = 0.0, transitions: int = 3) -> Candidate:
    record = held_by(identity, transitions=transitions, stamp="2026-01-01T00:00:00.000000Z")
    return Candidate(identity, ElectionPhase.LEADING, SeenRecord(record, "7", renewed_at), renewed_at)


# --------------------------------------------------------------------------------- configuration


def test_the_defaults_are_client_gos():
    assert (CFG.lease_duration, CFG.renew_deadline, CFG.retry_period) == (15.0, 10.0, 2.0)
    assert CFG.lease_seconds == 15


@pytest.mark.parametrize(
    ("lease", "renew", "retry", "flag_first", "words"),
    [
        (10, 10, 2, "--lease-duration", "greater than --renew-deadline"),
        (9, 10, 2, "--lease-duration", "greater than --renew-deadline"),
        (15, 2.4, 2, "--renew-deadline", "1.2 x --retry-period"),  # equal to 1.2 x retry is refused too
        (15, 10, 9, "--renew-deadline", "1.2 x --retry-period"),
        (0, 10, 2, "--lease-duration", "greater than zero"),
        (15, -1, 2, "--renew-deadline", "greater than zero"),
        (15, 10, 0, "--retry-period", "greater than zero"),
        (math.inf, 10, 2, "--lease-duration", "greater than zero"),
        (15, math.nan, 2, "--renew-deadline", "greater than zero"),
    ],
)
def test_invalid_timings_are_refused_naming_the_flag_to_fix(lease, renew, retry, flag_first, words):
    with pytest.raises(InvalidTimings) as err:
        ElectionConfig(lease, renew, retry)
    message = str(err.value)
    assert message.startswith(flag_first), message
    assert words in message


@given(
    lease=st.floats(0.001, 1000, allow_nan=False),
    renew=st.floats(0.001, 1000, allow_nan=False),
    retry=st.floats(0.001, 1000, allow_nan=False),
)
def test_validation_accepts_exactly_what_client_go_accepts(lease, renew, retry):
    valid = lease > renew > JITTER_FACTOR * retry
    try:
        ElectionConfig(lease, renew, retry)
    except InvalidTimings:
        assert not valid
    else:
        assert valid


def test_the_record_promises_whole_seconds_rounded_up():
    assert ElectionConfig(3.2, 2, 0.5).lease_seconds == 4
    assert ElectionConfig(3, 2, 0.5).lease_seconds == 3


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vigil operator")
    add_election_flags(parser)
    return parser.parse_args(list(argv))


def test_the_flags_default_to_client_gos_timings_and_no_election():
    args = parse()
    assert (args.leader_elect, args.lease_name, args.lease_namespace) == (False, "vigil-operator", None)
    assert election_config(args) == CFG
    args = parse("--leader-elect", "--lease-duration", "30", "--renew-deadline", "20", "--retry-period", "4")
    assert args.leader_elect and election_config(args) == ElectionConfig(30, 20, 4)


def test_flags_that_cannot_work_together_are_refused_naming_the_flag():
    refused = r"^--lease-duration \(10s\) must be greater than --renew-deadline \(10s\)"
    with pytest.raises(InvalidTimings, match=refused):
        election_config(parse("--lease-duration", "10"))


def test_the_lease_namespace_comes_from_the_flag_the_environment_or_the_pod(monkeypatch, tmp_path):
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    missing = str(tmp_path / "none")
    assert lease_namespace(parse("--lease-namespace", "ops"), missing) == "ops"
    with pytest.raises(InvalidTimings, match="--lease-namespace is required"):
        lease_namespace(parse(), missing)
    mounted = tmp_path / "namespace"
    mounted.write_text("vigil-system\n")
    assert lease_namespace(parse(), str(mounted)) == "vigil-system"
    monkeypatch.setenv("POD_NAMESPACE", "from-env")
    assert lease_namespace(parse(), str(mounted)) == "from-env"


# ----------------------------------------------------------------------------------- the record


def test_micro_time_always_has_six_fractional_digits_in_utc():
    assert micro_time(WALL) == "2026-03-01T12:00:00.000000Z"
    plus_two = datetime(2026, 3, 1, 14, 0, 0, 123, tzinfo=UTC).astimezone(tz=None)
    assert micro_time(plus_two) == "2026-03-01T14:00:00.000123Z"


def test_a_record_goes_to_a_spec_and_back():
    record = LeaseRecord("a_1", 15, "2026-03-01T12:00:00.000000Z", "2026-03-01T12:00:05.000000Z", 4)
    spec = record.to_spec()
    assert spec == {
        "holderIdentity": "a_1",
        "leaseDurationSeconds": 15,
        "acquireTime": "2026-03-01T12:00:00.000000Z",
        "renewTime": "2026-03-01T12:00:05.000000Z",
        "leaseTransitions": 4,
    }
    assert LeaseRecord.from_spec(spec) == record


def test_a_spec_missing_fields_reads_as_empty():
    assert LeaseRecord.from_spec({}) == LeaseRecord()
    assert LeaseRecord.from_spec(None) == LeaseRecord()
    assert LeaseRecord.from_spec({"holderIdentity": None, "leaseTransitions": None}) == LeaseRecord()


# --------------------------------------------------------------------------------- observations


def test_the_same_record_at_the_same_version_keeps_when_it_was_first_seen():
    first = observe(None, held_by("a"), "5", now=10.0)
    assert observe(first, held_by("a"), "5", now=30.0) is first
    assert observe(first, held_by("a"), "6", now=30.0).since == 30.0  # written again, same content
    renewed = held_by("a", stamp="2026-03-01T12:00:02.000000Z")
    assert observe(first, renewed, "5", now=30.0).since == 30.0


# ------------------------------------------------------------------------------------- decisions


def test_no_lease_is_created_naming_us_with_no_transition():
    decision = following("me", None).decide(0.0, WALL, CFG)
    assert decision.verdict is LeaseVerdict.ACQUIRE
    assert decision.version is None  # a create
    assert decision.write == LeaseRecord("me", 15, micro_time(WALL), micro_time(WALL), 0)


def test_a_held_lease_is_taken_only_after_a_full_lease_duration_unchanged_on_our_clock():
    candidate = following("me", held_by("other", transitions=2), version="9", since=100.0)
    early = candidate.decide(114.999, WALL, CFG)
    assert early.verdict is LeaseVerdict.WAIT
    assert early.retry_in == pytest.approx(0.001)
    taken = candidate.decide(115.0, WALL, CFG)
    assert taken.verdict is LeaseVerdict.ACQUIRE
    assert taken.version == "9"  # the write carries the version decided on
    assert taken.write == LeaseRecord("me", 15, micro_time(WALL), micro_time(WALL), 3)


@given(
    acquire=st.one_of(st.none(), st.text(max_size=40)),
    renew=st.one_of(st.none(), st.text(max_size=40)),
    elapsed=st.floats(0, 100, allow_nan=False),
    wall=st.datetimes(timezones=st.just(UTC)),
)
def test_the_timestamps_in_the_record_never_matter(acquire, renew, elapsed, wall):
    record = LeaseRecord("other", 15, acquire, renew, 1)
    decision = following("me", record, since=50.0).decide(50.0 + elapsed, wall, CFG)
    assert decision.verdict is (LeaseVerdict.ACQUIRE if elapsed >= 15 else LeaseVerdict.WAIT)


def test_a_follower_waits_the_longer_of_the_records_duration_and_its_own():
    longer = following("me", held_by("other", seconds=40), since=0.0)
    assert longer.decide(39.9, WALL, CFG).verdict is LeaseVerdict.WAIT
    assert longer.decide(40.0, WALL, CFG).verdict is LeaseVerdict.ACQUIRE
    shorter = following("me", held_by("other", seconds=2), since=0.0)
    assert shorter.decide(14.9, WALL, CFG).verdict is LeaseVerdict.WAIT
    none_written = following("me", held_by("other", seconds=0), since=0.0)
    assert none_written.decide(14.9, WALL, CFG).verdict is LeaseVerdict.WAIT


def test_a_released_lease_is_taken_at_once_and_counts_a_transition():
    released = LeaseRecord("", 1, "t", "t", 5)
    decision = following("me", released, version="12", since=1000.0).decide(1000.0, WALL, CFG)
    assert decision.verdict is LeaseVerdict.ACQUIRE
    assert decision.write is not None and decision.write.transitions == 6
    assert decision.version == "12"


def test_a_leader_renews_keeping_acquire_time_and_transitions():
    decision = leading(renewed_at=0.0).decide(2.0, WALL, CFG)
    assert decision.verdict is LeaseVerdict.RENEW
    assert decision.version == "7"
    assert decision.write == LeaseRecord("me", 15, "2026-01-01T00:00:00.000000Z", micro_time(WALL), 3)


def test_a_follower_that_finds_its_own_name_renews_without_a_transition():
    # its acquire timed out but landed after all
    candidate = following("me", held_by("me", transitions=4), since=0.0)
    decision = candidate.decide(0.0, WALL, CFG)
    assert decision.verdict is LeaseVerdict.RENEW
    assert decision.write is not None and decision.write.transitions == 4


def test_a_stopped_candidate_or_a_leader_past_its_deadline_writes_nothing():
    assert leading().stopped(StopReason.DEADLINE).decide(1.0, WALL, CFG).verdict is LeaseVerdict.WAIT
    assert leading(renewed_at=0.0).decide(10.0, WALL, CFG).verdict is LeaseVerdict.WAIT


# ------------------------------------------------------------------------ leading and the fence


def test_the_fence_counts_from_when_the_write_was_sent_not_when_it_was_answered():
    candidate = following("me", held_by("", seconds=1)).wrote(held_by("me"), "8", sent_at=10.0, now=19.0)
    assert candidate.phase is ElectionPhase.LEADING
    assert candidate.may_act(19.999, CFG)
    assert not candidate.may_act(20.0, CFG)  # 10 + renew deadline, strict
    assert candidate.deadline(CFG) == 20.0


def test_a_leader_past_its_deadline_stops_for_good():
    stopped = leading(renewed_at=0.0).expired(10.0, CFG)
    assert stopped.phase is ElectionPhase.STOPPED and stopped.stop_reason is StopReason.DEADLINE
    # a renewal that was in flight and lands now does not bring leadership back
    late = stopped.wrote(held_by("me"), "9", sent_at=9.0, now=10.5)
    assert late.phase is ElectionPhase.STOPPED and not late.may_act(10.5, CFG)
    assert leading(renewed_at=0.0).expired(9.99, CFG).phase is ElectionPhase.LEADING


def test_a_leader_that_reads_another_holder_or_no_lease_stops_at_once():
    assert leading().observed(held_by("other"), "10", 1.0).stop_reason is StopReason.SUPERSEDED
    assert leading().observed(LeaseRecord("", 1), "10", 1.0).stop_reason is StopReason.SUPERSEDED
    assert leading().observed(None, "", 1.0).stop_reason is StopReason.DELETED
    still = leading().observed(held_by("me"), "10", 1.0)
    assert still.phase is ElectionPhase.LEADING and still.may_act(1.0, CFG)


def test_the_first_stop_reason_is_kept():
    assert leading().stopped(StopReason.RELEASED).stopped(StopReason.DEADLINE).stop_reason is StopReason.RELEASED


def test_only_losses_are_lost():
    assert {r for r in StopReason if r.lost} == {
        StopReason.DEADLINE,
        StopReason.SUPERSEDED,
        StopReason.DELETED,
        StopReason.CALLBACK_FAILED,
    }


def test_release_writes_an_empty_holder_for_one_second_keeping_the_transitions():
    decision = leading(transitions=3).release_decision(WALL)
    assert decision.verdict is LeaseVerdict.RENEW and decision.version == "7"
    assert decision.write == LeaseRecord("", 1, micro_time(WALL), micro_time(WALL), 3)
    assert following("me", held_by("other")).release_decision(WALL).verdict is LeaseVerdict.WAIT
    assert following("me", None).release_decision(WALL).verdict is LeaseVerdict.WAIT


def test_an_identity_is_unique_per_process_and_names_the_pod(monkeypatch):
    monkeypatch.setenv("POD_NAME", "vigil-7d9f-abcde")
    first, second = default_identity(), default_identity()
    assert first.startswith("vigil-7d9f-abcde_") and second.startswith("vigil-7d9f-abcde_")
    assert first != second
    monkeypatch.delenv("POD_NAME")
    assert default_identity() and default_identity() != default_identity()
    with pytest.raises(ValueError):
        Candidate("")


# ================================================================================ the model world

SKEW = 1.22  # clock rates within [1/SKEW, SKEW]: the fastest runs 1.49x the slowest, under 15/10


@dataclass
class Request:
    id: int
    owner: int
    kind: str  # get | create | update
    purpose: str  # elect | release
    record: LeaseRecord | None = None
    version: str | None = None
    sent_at: float = 0.0  # the sender's clock
    answer: tuple | None = None  # set once served


@dataclass
class Node:
    candidate: Candidate
    clock: float
    wall_offset: float
    alive: bool = True
    active: int | None = None  # the request it awaits
    first_seen: dict[str, float] = field(default_factory=dict)  # the model's own memory: version -> first seen

    def wall(self) -> datetime:
        return WALL + timedelta(seconds=self.clock + self.wall_offset)


class World:
    """The API server, the network, the candidates and the reference clock T. Every method is
    one event; invariants are checked as they happen."""

    def __init__(self, config: ElectionConfig = CFG):
        self.config = config
        self.T = 0.0
        self.lease: LeaseRecord | None = None
        self.version = 0
        self.expected_transitions = 0
        self.nodes: list[Node] = []
        self.network: dict[int, Request] = {}
        self.next_id = 0
        self.acting: dict[int, float] = {}  # node -> T its current right to act began
        self.intervals: list[tuple[int, float, float]] = []  # (node, from T, to T), closed
        self.takeovers: list[tuple[int, float, float]] = []  # (node, own clock waited, T)
        self.margins: list[float] = []  # for each takeover of a held lease: its start - the last fence closed

    # -- candidates

    def join(self, offset: float = 0.0, wall_offset: float = 0.0) -> int:
        self.nodes.append(Node(Candidate(f"c{len(self.nodes)}"), offset, wall_offset))
        return len(self.nodes) - 1

    def alive(self) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if n.alive]

    def may_act(self, i: int) -> bool:
        node = self.nodes[i]
        return node.alive and node.candidate.may_act(node.clock, self.config)

    # -- events

    def advance(self, dt: float, rates: list[float]) -> None:
        for i, node in enumerate(self.nodes):
            rate = rates[i % len(rates)]
            before = node.clock
            node.clock += dt * rate
            deadline = node.candidate.deadline(self.config)
            if i in self.acting and deadline is not None and before < deadline <= node.clock:
                self._close(i, self.T + (deadline - before) / rate)  # exactly when its fence closed
        self.T += dt
        self._settle()

    def act(self, i: int) -> None:
        """What the shell does when its timer fires: a leader renews on what it last wrote
        (the fast path), a follower reads."""
        node = self.nodes[i]
        if not node.alive or node.active is not None:
            return
        node.candidate = node.candidate.expired(node.clock, self.config)
        if node.candidate.phase is ElectionPhase.LEADING:
            self._send_decision(i, node.candidate.decide(node.clock, node.wall(), self.config))
        elif node.candidate.phase is ElectionPhase.FOLLOWING:
            self._send(i, "get", "elect")
        self._settle()

    def release(self, i: int) -> None:
        """Graceful shutdown: the fence closes first, then read and give the lease up."""
        node = self.nodes[i]
        if not node.alive or node.active is not None or node.candidate.phase is not ElectionPhase.LEADING:
            return
        node.candidate = node.candidate.stopped(StopReason.RELEASED)
        self._settle()
        self._send(i, "get", "release")

    def crash(self, i: int) -> None:
        self.nodes[i].alive = False  # its requests stay in the network and may still land
        self._settle()

    def timeout(self, i: int) -> None:
        """The node gives up waiting; the request may still be served (its answer then lost)."""
        node = self.nodes[i]
        if node.alive and node.active is not None:
            node.active = None
            node.candidate = node.candidate.expired(node.clock, self.config)
            self._settle()

    def drop(self, rid: int) -> None:
        """Lost before the server saw it."""
        request = self.network.get(rid)
        if request is not None and request.answer is None:
            del self.network[rid]
            self._abandon(request)

    def serve(self, rid: int) -> None:
        request = self.network.get(rid)
        if request is None or request.answer is not None:
            return
        if request.kind == "get":
            request.answer = ("missing",) if self.lease is None else ("ok", self.lease, str(self.version))
        elif request.kind == "create":
            request.answer = ("conflict",) if self.lease is not None else self._store(request.record)
        elif self.lease is None:
            request.answer = ("gone",)
        elif request.version != str(self.version):
            request.answer = ("conflict",)
        else:
            request.answer = self._store(request.record)
        owner = self.nodes[request.owner]
        if not owner.alive or owner.active != rid:  # answered into the void
            del self.network[rid]

    def deliver(self, rid: int) -> None:
        request = self.network.get(rid)
        if request is None or request.answer is None:
            return
        del self.network[rid]
        node = self.nodes[request.owner]
        if not node.alive or node.active != rid:
            return
        node.active = None
        now, answer = node.clock, request.answer
        candidate = node.candidate.expired(now, self.config)
        if answer[0] == "ok":
            node.first_seen.setdefault(answer[2], now)
        if request.kind == "get":
            record, version = (answer[1], answer[2]) if answer[0] == "ok" else (None, "")
            candidate = candidate.observed(record, version, now)
            node.candidate = candidate
            if request.purpose == "release":
                decision = candidate.release_decision(node.wall())
                if decision.verdict is LeaseVerdict.WAIT:
                    node.alive = False  # nothing to give up: the process exits
                else:
                    self._send(request.owner, "update", "release", decision.write, decision.version)
            else:
                self._send_decision(request.owner, candidate.decide(now, node.wall(), self.config))
        elif answer[0] == "ok":
            node.candidate = candidate.wrote(answer[1], answer[2], request.sent_at, now)
            if request.purpose == "release":
                node.alive = False  # released: the process exits
        else:  # conflict or gone
            node.candidate = candidate
            if request.purpose == "release" or candidate.phase is ElectionPhase.LEADING:
                self._send(request.owner, "get", request.purpose)  # read again (the slow path)
        self._settle()

    # -- internals

    def _send_decision(self, i: int, decision) -> None:
        if decision.verdict is LeaseVerdict.WAIT:
            return
        node = self.nodes[i]
        seen = node.candidate.seen
        if decision.verdict is LeaseVerdict.ACQUIRE and seen is not None and seen.record.holder:
            # THE property: a held lease is taken only after a full lease duration unchanged,
            # by the model's own memory of when this node first saw that version
            waited = node.clock - node.first_seen[decision.version]
            # Within float rounding: the model's clock is a sum of rate-scaled steps, so a wait the
            # elector measures as exactly 15 s can come out here as 14.999999999999996 s.
            assert waited >= self.config.lease_duration - 1e-9, f"{node.candidate.identity} took over after {waited}s"
            self.takeovers.append((i, waited, self.T))
        kind = "create" if decision.version is None else "update"
        self._send(i, kind, "elect", decision.write, decision.version)

    def _send(self, i: int, kind: str, purpose: str, record=None, version=None) -> None:
        node = self.nodes[i]
        request = Request(self.next_id, i, kind, purpose, record, version, sent_at=node.clock)
        self.network[request.id] = request
        node.active = request.id
        self.next_id += 1

    def _store(self, record: LeaseRecord) -> tuple:
        before = self.lease
        if before is not None and record.holder and record.holder != before.holder:
            self.expected_transitions += 1  # a different identity acquired
        self.lease = record
        self.version += 1
        assert record.transitions == self.expected_transitions, (record, self.expected_transitions)
        return ("ok", record, str(self.version))

    def _abandon(self, request: Request) -> None:
        owner = self.nodes[request.owner]
        if owner.active == request.id:
            owner.active = None

    def _close(self, i: int, at: float) -> None:
        self.intervals.append((i, self.acting.pop(i), at))

    def _settle(self) -> None:
        """Opens and closes rights to act at the current T; a right opens only at an event, so
        checking the others there finds every overlap."""
        for i in range(len(self.nodes)):
            acting = self.may_act(i)
            if acting and i not in self.acting:
                others = [j for j in self.acting if j != i]
                assert not others, f"c{i} may act at T={self.T} while {others} still may"
                self.acting[i] = self.T
                if self.takeovers and self.takeovers[-1][0] == i:
                    ends = [end for j, _, end in self.intervals if j != i]
                    if ends:
                        self.margins.append(self.T - max(ends))
            elif not acting and i in self.acting:
                self._close(i, self.T)

    def all_intervals(self) -> list[tuple[int, float, float]]:
        return self.intervals + [(i, since, self.T) for i, since in self.acting.items()]

    def run_healthy(self, seconds: float) -> None:
        """A perfect network and equal clocks: every live node acts every retry period and is
        answered at once; stopped processes exit and come back as new candidates."""
        period = self.config.retry_period
        for _ in range(math.ceil(seconds / period)):
            for i in self.alive():
                if self.nodes[i].candidate.phase is ElectionPhase.STOPPED:
                    self.crash(i)
                    self.join(offset=self.nodes[i].clock)
            if not self.alive():
                self.join()
            self.advance(period, [1.0])
            for i in self.alive():
                self.act(i)
            while self.network:
                for rid in sorted(self.network):
                    self.serve(rid)
                    self.deliver(rid)


def overlaps(intervals: list[tuple[int, float, float]]) -> list[tuple]:
    return [
        (a, b)
        for n, a in enumerate(intervals)
        for b in intervals[n + 1 :]
        if a[0] != b[0] and a[1] < b[2] and b[1] < a[2]
    ]


FATES = ["ok", "ok", "lost answer", "lost request", "held", "slow request", "slow answer"]
node = st.integers(0, 5)
fates = st.lists(st.sampled_from(FATES), min_size=1, max_size=3)
step = st.one_of(
    st.tuples(st.just("tick"), st.floats(0, 5, allow_nan=False), st.just([])),
    st.tuples(st.just("exchange"), node, fates),  # a node's timer fires: read and maybe write, or renew
    st.tuples(st.just("exchange"), node, fates),
    st.tuples(st.sampled_from(["cut", "heal", "crash", "release", "join"]), node, fates),
    # a node's request lands at once but its answer takes seconds (longer than a renew deadline,
    # even), while the others go on; a slow link is often cut next
    st.tuples(st.just("slow"), node, st.tuples(st.integers(1, 14), st.booleans())),
    # a node cut off for a while, the others going on every second
    st.tuples(st.just("partition"), node, st.integers(1, 20)),
    st.tuples(st.just("partition"), node, st.integers(1, 20)),
    st.tuples(st.sampled_from(["act", "serve", "deliver"]), st.integers(0, 1000), st.just([])),  # finer interleavings
)
# each node's clock keeps its rate (a fast clock stays fast: that is what adds up); the extremes
# of the bound are drawn often, since that is where a fence too long would show
rate = st.one_of(st.sampled_from([1 / SKEW, SKEW]), st.floats(1 / SKEW, SKEW))
steps = st.lists(step, min_size=30, max_size=120)  # Hypothesis draws ~5 steps unless told: too short for a takeover


def exchange(world: World, i: int, fates: list[str], cut: bool) -> None:
    """Node i's requests (a read, then maybe a write) each meet a fate: a round trip, an answer
    lost after the server applied it, a request lost before it, one held in the network to
    land later (or never) while the node times out, or one still awaited when time passes
    (slow to arrive, or answered slowly: a later exchange of the node goes on with it). A cut
    node's requests never come back."""
    for fate in fates:
        rid = world.nodes[i].active
        if rid is None:
            return
        if cut and fate in ("ok", "lost answer", "slow answer"):
            fate = "held"
        if fate == "slow request":
            return
        if fate == "slow answer":
            world.serve(rid)
            return
        if fate == "ok":
            world.serve(rid)
            world.deliver(rid)
        elif fate == "lost answer":
            world.serve(rid)
            world.timeout(i)
            world.deliver(rid)  # into the void
        elif fate == "lost request":
            world.timeout(i)
            world.drop(rid)
        else:
            world.timeout(i)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    candidates=st.integers(2, 3),
    rates=st.lists(rate, min_size=3, max_size=3),
    offsets=st.lists(st.floats(0, 10_000), min_size=3, max_size=3),
    walls=st.lists(st.floats(-86_400, 86_400), min_size=3, max_size=3),
    story=steps,
)
def test_never_two_leaders_whatever_the_network_and_clock_rates_do(candidates, rates, offsets, walls, story):
    world = World()
    for k in range(candidates):
        world.join(offsets[k], walls[k])
    cut: set[int] = set()
    for op, pick, arg in story:
        if op == "tick":
            world.advance(pick, rates)
            continue
        i = pick % len(world.nodes)
        requests = sorted(world.network)
        if op == "exchange":
            world.act(i)
            exchange(world, i, arg, i in cut)
        elif op == "release":
            world.release(i)
            exchange(world, i, arg, i in cut)
        elif op == "slow":
            seconds, then_cut = arg
            world.act(i)
            rid = world.nodes[i].active
            if rid is not None:
                world.serve(rid)
                for _ in range(seconds):
                    world.advance(1.0, rates)
                    for j in world.alive():
                        if j != i:
                            world.act(j)
                            exchange(world, j, ["ok", "ok"], j in cut)
                world.deliver(rid)
            if then_cut:
                cut.add(i)
        elif op == "partition":
            seconds = arg
            for _ in range(seconds):
                world.advance(1.0, rates)
                for j in world.alive():
                    world.act(j)
                    exchange(world, j, ["ok", "ok"], j == i or j in cut)
        elif op == "cut":
            cut.add(i)
        elif op == "heal":
            cut.discard(i)
        elif op == "act":
            world.act(i)
        elif op == "serve" and requests:
            world.serve(requests[pick % len(requests)])  # perhaps long after it was sent
        elif op == "deliver" and requests:
            world.deliver(requests[pick % len(requests)])
        elif op == "crash" and len(world.alive()) > 1:
            world.crash(i)
        elif op == "join" and len(world.alive()) < 3:
            world.join(offsets[pick % 3] + world.T, walls[pick % 3])
    assert not overlaps(world.all_intervals())
    if world.margins:  # steer the search towards takeovers that come close to the old leader's fence
        target(-min(world.margins), label="negated margin of a takeover (s)")
    # then the network heals: within a lease duration and a few retries exactly one leads, and stays
    world.run_healthy(CFG.lease_duration + 4 * CFG.retry_period)
    leaders = [i for i in world.alive() if world.may_act(i)]
    assert len(leaders) == 1, [(n.candidate.identity, n.candidate.phase) for n in world.nodes if n.alive]
    world.run_healthy(5 * CFG.retry_period)
    assert [i for i in world.alive() if world.may_act(i)] == leaders
    assert not overlaps(world.all_intervals())


def elect(world: World, i: int) -> None:
    """Node i reads and takes the lease over a perfect network."""
    world.act(i)
    while world.nodes[i].active is not None:
        rid = world.nodes[i].active
        world.serve(rid)
        world.deliver(rid)


def test_a_leader_whose_renewals_are_lost_stops_before_the_standby_may_take_over():
    world = World()
    a, b = world.join(), world.join()
    elect(world, a)
    assert world.may_act(a)
    elect(world, b)  # b reads the record a just wrote
    assert world.nodes[b].candidate.phase is ElectionPhase.FOLLOWING
    for _ in range(20):  # a's renewals vanish; b keeps looking
        world.act(a)
        world.timeout(a)
        elect(world, b)
        world.advance(1.0, [1.0])
    assert [(n, end - start) for n, start, end in world.intervals] == [(a, 10.0)]  # renew deadline
    assert world.may_act(b)
    assert world.takeovers == [(b, 15.0, 15.0)]  # b waited a full lease duration (and took over at T=15)


def test_a_renewal_answered_slowly_does_not_stretch_the_fence():
    """The renewal lands at once but its answer takes 6 s: the standby saw the new record at
    once and counts from there, so the leader's fence counts from the send too."""
    world = World()
    a, b = world.join(), world.join()
    elect(world, a)
    world.advance(1.0, [1.0])
    world.act(a)  # renew
    renewal = world.nodes[a].active
    world.serve(renewal)
    elect(world, b)  # b sees the renewed record at T=1
    world.advance(6.0, [1.0])
    world.deliver(renewal)  # answered at T=7
    assert world.nodes[a].candidate.deadline(CFG) == 11.0  # 1 + 10, not 7 + 10
    for _ in range(20):  # then a is cut off; b keeps looking
        world.advance(1.0, [1.0])
        world.act(a)
        world.timeout(a)
        elect(world, b)
    assert [(n, start, end) for n, start, end in world.intervals] == [(a, 0.0, 11.0)]
    assert world.takeovers == [(b, 15.0, 16.0)]


def test_the_model_catches_an_overlap_when_clock_rates_differ_beyond_the_bound():
    """The checker is not vacuous: a follower whose clock runs 2x the leader's (beyond 15/10)
    takes over while the leader still believes it may act."""
    world = World()
    a, b = world.join(), world.join()
    elect(world, a)
    elect(world, b)
    with pytest.raises(AssertionError, match="may act"):
        for _ in range(40):
            world.advance(0.5, [0.7, 1.4])
            elect(world, b)


def test_release_lets_a_standby_take_over_at_once():
    world = World()
    a, b = world.join(), world.join()
    elect(world, a)
    elect(world, b)
    world.advance(1.0, [1.0])
    world.release(a)
    assert not world.may_act(a)  # the fence closed before the release was even sent
    while world.network:
        rid = min(world.network)
        world.serve(rid)
        world.deliver(rid)
    assert world.lease is not None and world.lease.holder == "" and world.lease.lease_duration_seconds == 1
    elect(world, b)  # no time has passed
    assert world.may_act(b)
    assert world.lease.holder == "c1" and world.lease.transitions == 1


def test_two_followers_racing_for_a_released_lease_make_one_leader():
    world = World()
    a, b, c = world.join(), world.join(), world.join()
    elect(world, a)
    world.release(a)
    while world.network:
        rid = min(world.network)
        world.serve(rid)
        world.deliver(rid)
    world.act(b)
    world.act(c)
    for rid in sorted(world.network):  # both read the released record
        world.serve(rid)
        world.deliver(rid)
    for rid in sorted(world.network):  # both write on the same version: one conflicts
        world.serve(rid)
        world.deliver(rid)
    assert [world.may_act(i) for i in (b, c)] == [True, False]
    assert world.lease is not None and world.lease.transitions == 1


# ============================================================================ the shell, in virtual time


class Server:
    """An in-memory Lease with resourceVersions; remembers every write with its virtual time."""

    def __init__(self, time: FakeClock) -> None:
        self.time = time
        self.lease: LeaseRecord | None = None
        self.version = 0
        self.writes: list[tuple[float, LeaseRecord]] = []
        self.on_write = lambda record: None

    def store(self, record: LeaseRecord) -> tuple[LeaseRecord, str]:
        self.on_write(record)
        self.lease, self.version = record, self.version + 1
        self.writes.append((self.time.now, record))
        return record, str(self.version)


class Api:
    """One elector's view of the Server; `broken` makes every call fail (a cut network)."""

    def __init__(self, server: Server) -> None:
        self.server, self.broken = server, False

    def _check(self) -> None:
        if self.broken:
            raise ApiError("connection refused")

    async def get(self):
        self._check()
        return None if self.server.lease is None else (self.server.lease, str(self.server.version))

    async def create(self, record):
        self._check()
        if self.server.lease is not None:
            raise Conflict("exists")
        return self.server.store(record)

    async def update(self, record, version):
        self._check()
        if self.server.lease is None:
            raise NotFound("gone")
        if version != str(self.server.version):
            raise Conflict("changed")
        return self.server.store(record)


SHELL = ElectionConfig(lease_duration=15, renew_deadline=10, retry_period=2)


def elector(server: Server, identity: str, **kwargs) -> tuple[LeaderElector, Api]:
    api = Api(server)
    made = LeaderElector(api, identity, SHELL, clock=server.time, jitter=lambda: 0.5, **kwargs)
    return made, api


def shell(scenario):
    return asyncio.run(scenario())


def test_shell_one_leads_the_other_waits_and_takes_over_a_lease_duration_after_a_kill():
    async def scenario():
        time = FakeClock()
        server = Server(time)
        a, _ = elector(server, "a")
        b, _ = elector(server, "b")
        task_a = asyncio.ensure_future(a.run())
        assert await time.until(a.leading.is_set, 1)
        task_b = asyncio.ensure_future(b.run())
        assert not await time.until(b.leading.is_set, 30)  # a renews: b waits for ever
        assert a.deadline_ok() and not b.deadline_ok() and b.leader == "a"
        task_a.cancel()  # SIGKILL: no release
        await asyncio.gather(task_a, return_exceptions=True)
        last_renewal = server.writes[-1][0]
        assert await time.until(b.leading.is_set, 30)
        took = time.now - last_renewal
        # a full lease duration after b first saw the last renewal, and at most one poll later
        assert SHELL.lease_duration <= took <= SHELL.lease_duration + SHELL.retry_period * (1 + JITTER_FACTOR)
        assert server.lease is not None and server.lease.holder == "b" and server.lease.transitions == 1
        assert b.counters.acquired == 1 and a.counters.renewals >= 14
        b_run = asyncio.ensure_future(b.release())
        assert await time.until(b_run.done, 1)
        assert await time.until(task_b.done, 1) and task_b.result() is StopReason.RELEASED

    shell(scenario)


def test_shell_release_closes_the_fence_before_writing_and_hands_over_within_a_retry():
    async def scenario():
        time = FakeClock()
        server = Server(time)
        stops: list[StopReason] = []
        a, _ = elector(server, "a", on_stopped_leading=stops.append)
        b, _ = elector(server, "b")
        task_a = asyncio.ensure_future(a.run())
        assert await time.until(a.leading.is_set, 1)
        task_b = asyncio.ensure_future(b.run())
        assert not await time.until(b.leading.is_set, 5)
        fence_at_release: list[bool] = []
        server.on_write = lambda record: fence_at_release.append(a.deadline_ok()) if not record.holder else None
        released = asyncio.ensure_future(a.release())
        assert await time.until(released.done, 1) and released.result() is True
        assert fence_at_release == [False]  # closed before the release was written
        assert await time.until(task_a.done, 1) and task_a.result() is StopReason.RELEASED
        assert stops == [StopReason.RELEASED] and a.counters.released == 1 and a.counters.lost == 0
        released_at = time.now
        assert await time.until(b.leading.is_set, 10)
        assert time.now - released_at <= SHELL.retry_period * (1 + JITTER_FACTOR)
        assert server.lease is not None and server.lease.holder == "b" and server.lease.transitions == 1
        task_b.cancel()
        await asyncio.gather(task_b, return_exceptions=True)

    shell(scenario)


def test_shell_a_leader_cut_off_stops_at_its_renew_deadline_before_the_lease_expires_elsewhere():
    async def scenario():
        time = FakeClock()
        server = Server(time)
        stops: list[StopReason] = []
        a, api_a = elector(server, "a", on_stopped_leading=stops.append)
        b, _ = elector(server, "b")
        task_a = asyncio.ensure_future(a.run())
        assert await time.until(a.leading.is_set, 1)
        task_b = asyncio.ensure_future(b.run())
        assert not await time.until(b.leading.is_set, 5)
        api_a.broken = True
        last_renewal = server.writes[-1][0]
        # The fence says how long it stays open: a write's answer must come within that.
        assert a.check() == pytest.approx(last_renewal + SHELL.renew_deadline - time.now)
        assert await time.until(task_a.done, 30)
        assert task_a.result() is StopReason.DEADLINE and stops == [StopReason.DEADLINE]
        stopped_at = time.now
        assert stopped_at == pytest.approx(last_renewal + SHELL.renew_deadline)
        assert not a.deadline_ok() and not a.leading.is_set() and a.stopped.is_set()
        assert a.counters.lost == 1 and a.counters.renew_failures >= 4
        with pytest.raises(NotLeading):
            a.check()
        assert await time.until(b.leading.is_set, 30)
        assert time.now >= last_renewal + SHELL.lease_duration > stopped_at
        task_b.cancel()
        await asyncio.gather(task_b, return_exceptions=True)

    shell(scenario)


def test_shell_the_fence_closes_on_the_clock_even_when_the_loop_is_not_scheduled():
    async def scenario():
        time = FakeClock()
        server = Server(time)
        a, _ = elector(server, "a")
        task = asyncio.ensure_future(a.run())
        assert await time.until(a.leading.is_set, 1)
        time.now += SHELL.renew_deadline  # frozen (SIGSTOP) for a renew deadline: no task ran
        assert not a.deadline_ok()
        assert await time.until(task.done, 1) and task.result() is StopReason.DEADLINE

    shell(scenario)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_shell_a_failing_start_callback_stops_leading(asynchronous):
    async def scenario():
        time = FakeClock()
        server = Server(time)

        def boom():
            raise RuntimeError("cannot start the controller")

        async def boom_later():
            boom()

        stops: list[StopReason] = []
        a, _ = elector(
            server, "a", on_started_leading=boom_later if asynchronous else boom, on_stopped_leading=stops.append
        )
        task = asyncio.ensure_future(a.run())
        assert await time.until(task.done, 5)
        assert task.result() is StopReason.CALLBACK_FAILED and stops == [StopReason.CALLBACK_FAILED]
        assert not a.deadline_ok() and not a.leading.is_set()
        assert server.lease is not None and server.lease.holder == "a"  # not released: it expires

    shell(scenario)


def test_shell_a_conflict_on_the_fast_path_reads_and_renews():
    async def scenario():
        time = FakeClock()
        server = Server(time)
        a, _ = elector(server, "a")
        task = asyncio.ensure_future(a.run())
        assert await time.until(a.leading.is_set, 1)
        server.version += 1  # someone labelled the Lease: same spec, new resourceVersion
        writes = len(server.writes)
        assert await time.until(lambda: len(server.writes) > writes, 5)
        assert a.deadline_ok() and a.counters.conflicts == 1 and a.counters.renew_failures == 0
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    shell(scenario)


def test_shell_a_leader_that_finds_another_holder_stops_at_once():
    async def scenario():
        time = FakeClock()
        server = Server(time)
        stops: list[StopReason] = []
        a, _ = elector(server, "a", on_stopped_leading=stops.append)
        task = asyncio.ensure_future(a.run())
        assert await time.until(a.leading.is_set, 1)
        server.store(held_by("intruder", transitions=1))  # written behind the elector's back
        assert await time.until(task.done, 5)
        assert task.result() is StopReason.SUPERSEDED and stops == [StopReason.SUPERSEDED]
        assert a.leader == "intruder" and a.counters.holder_changes == 1

    shell(scenario)


def test_shell_runs_once():
    async def scenario():
        time = FakeClock()
        a, _ = elector(Server(time), "a")
        released = asyncio.ensure_future(a.release())  # before ever running: nothing to release
        assert await time.until(released.done, 1) and released.result() is True
        assert await a.run() is StopReason.RELEASED
        with pytest.raises(RuntimeError, match="runs once"):
            await a.run()

    shell(scenario)


# --- the fence in the operator's own client: tests/unit/kube/test_client.py -------------------------


def test_each_process_names_its_identity_in_its_user_agent():
    """The audit log records the User-Agent: it tells replicas, and election writes, apart."""
    from kubernetes import client

    from vigil import __version__
    from vigil.kube.client import ApiClient, user_agent
    from vigil.kube.config import Credentials
    from vigil.kube.leases import LeaseStore

    assert user_agent() == f"vigil/{__version__}"
    assert user_agent("pod-a_0123456789") == f"vigil/{__version__} (pod-a_0123456789)"
    assert (
        user_agent("pod-a_0123456789", "leader-election") == f"vigil/{__version__} (pod-a_0123456789; leader-election)"
    )
    conf = client.Configuration()
    conf.host = "http://127.0.0.1:9"
    lease_client = ApiClient(Credentials(conf), user_agent("pod-b_abc", "leader-election"))
    elector = LeaderElector.for_lease(lease_client, "ns", "lease", identity="pod-b_abc")
    assert isinstance(elector.api, LeaseStore) and elector.api.client is lease_client
    assert elector.identity == "pod-b_abc"


def test_a_fenced_write_is_bounded_by_the_time_left_and_the_api_server_told_no_later():
    assert fenced_timeout(None, 20.0) is None, "no election: no bound"
    assert fenced_timeout(3.5, 20.0) == 3.5
    assert fenced_timeout(30.0, 20.0) == 20.0
    assert 0 < fenced_timeout(-1.0, 20.0) <= 0.001, "never 0, which aiohttp reads as no timeout"  # type: ignore[operator]
    assert go_duration(3.5) == "3500ms" and go_duration(0.0123456) == "12ms" and go_duration(0.0) == "1ms"
