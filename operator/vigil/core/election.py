"""Leader election's decisions, on a `coordination.k8s.io/v1` Lease, with the semantics of
client-go's `tools/leaderelection` (v0.36), plus the fencing check the operator asks before
every write. `Candidate` holds one process's state and decides (`LeaseDecision`); the loop that
reads, writes and sleeps is `vigil.leaderelection.elector`. The rules:

- Time is this process's own monotonic clock, injected as `now` (seconds). The timestamps in the
  Lease (`acquireTime`, `renewTime`) are written for people and never read: a follower only
  notes WHEN it first saw the exact record (spec and resourceVersion) it now sees. So clock
  offsets between nodes do not matter; clock RATES do, within the bound below.
- A follower takes the lease only once it has seen the same record, unchanged, for a full lease
  duration on its own clock: the larger of the record's `leaseDurationSeconds` and its own
  `--lease-duration` (client-go uses the record's alone; the larger one is also safe while the
  flags change in a rolling update, and against a record written without a duration). A lease
  whose holder is empty (released) is taken at once. A missing Lease is created.
- Every write carries the resourceVersion it was decided on (or is a create), so of two
  candidates that decide on the same record only one write lands; the other gets 409 Conflict.
- `leaseTransitions` grows by one exactly when an identity acquires a lease not held by itself
  (released or another's); renewals and releases keep it.
- A leader may act (`may_act`, the fencing check) only while now < (when it SENT its last
  successful write) + renew deadline. Counting from the send, not from the answer, matters: the
  write landed at the API server at or after the send, and a follower's count of a full lease
  duration starts no earlier than that landing, so the leader's right to act ends at least
  lease duration - renew deadline before anyone can take over, however slow the answer was.
  This holds while no clock runs faster than another by the ratio lease / renew deadline
  (1.5 with the defaults); client-go documents the same bound.
- A leader that cannot renew within the renew deadline, or that reads a record naming another
  holder (or none: deleted), stops for good (`ElectionPhase.STOPPED`). It never leads again: the
  process is meant to exit, and its pod to come back as a standby with a new identity. A write
  of ours that succeeds after that (it was in flight) does not bring leadership back.
- Release: the leader stops acting first, then writes an empty holder with
  `leaseDurationSeconds: 1` (for clients older than Kubernetes 1.14, which ignore an empty
  holder), keeping `leaseTransitions`. Only the caller knows when its in-flight writes are done,
  so release happens only when the caller asks (`LeaderElector.release`).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

JITTER_FACTOR = 1.2  # client-go's: a follower waits retry period x [1, 1 + 1.2) between attempts
RELEASED_LEASE_SECONDS = 1  # what a release writes, as client-go does

DEFAULT_LEASE_DURATION = 15.0
DEFAULT_RENEW_DEADLINE = 10.0
DEFAULT_RETRY_PERIOD = 2.0


class InvalidTimings(ValueError):
    """Timings that cannot work together; the message names the flag to fix."""


@dataclass(frozen=True)
class ElectionConfig:
    """The three timings, in seconds, validated as client-go validates them: all positive, and
    lease duration > renew deadline > 1.2 x retry period."""

    lease_duration: float = DEFAULT_LEASE_DURATION
    renew_deadline: float = DEFAULT_RENEW_DEADLINE
    retry_period: float = DEFAULT_RETRY_PERIOD

    def __post_init__(self) -> None:
        for flag, value in (
            ("--lease-duration", self.lease_duration),
            ("--renew-deadline", self.renew_deadline),
            ("--retry-period", self.retry_period),
        ):
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise InvalidTimings(f"{flag} must be a number of seconds greater than zero (got {value!r})")
        if self.lease_duration <= self.renew_deadline:
            raise InvalidTimings(
                f"--lease-duration ({self.lease_duration:g}s) must be greater than --renew-deadline "
                f"({self.renew_deadline:g}s): a leader that cannot renew must stop acting before its lease "
                "can expire at the standbys"
            )
        if self.renew_deadline <= JITTER_FACTOR * self.retry_period:
            raise InvalidTimings(
                f"--renew-deadline ({self.renew_deadline:g}s) must be greater than {JITTER_FACTOR:g} x "
                f"--retry-period ({self.retry_period:g}s x {JITTER_FACTOR:g} = "
                f"{JITTER_FACTOR * self.retry_period:g}s): the leader needs room for more than one attempt "
                "to renew"
            )

    @property
    def lease_seconds(self) -> int:
        """`leaseDurationSeconds` to write: whole seconds, rounded UP so that the record never
        promises less than this process waits for itself."""
        return math.ceil(self.lease_duration)


def micro_time(wall: datetime) -> str:
    """A Kubernetes MicroTime: RFC 3339, always six fractional digits (the API server refuses
    the form without them that `isoformat()` gives for a whole second)."""
    return wall.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class LeaseRecord:
    """The election record in a Lease's spec. The times are opaque strings: written for
    people, compared for change, never parsed."""

    holder: str = ""
    lease_duration_seconds: int = 0
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0

    @classmethod
    def from_spec(cls, spec: dict[str, Any] | None) -> LeaseRecord:
        spec = spec or {}
        return cls(
            holder=spec.get("holderIdentity") or "",
            lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
        )

    def to_spec(self) -> dict[str, Any]:
        return {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.lease_duration_seconds,
            "acquireTime": self.acquire_time,
            "renewTime": self.renew_time,
            "leaseTransitions": self.transitions,
        }


@dataclass(frozen=True)
class SeenRecord:
    """The record this process last read or wrote, its resourceVersion, and when (own clock)
    this process FIRST saw exactly that record at exactly that version."""

    record: LeaseRecord
    version: str
    since: float


def observe(previous: SeenRecord | None, record: LeaseRecord, version: str, now: float) -> SeenRecord:
    """The record seen at `now`: any change of spec or of resourceVersion restarts the count;
    the same record at the same version keeps the moment it was first seen."""
    if previous is not None and previous.record == record and previous.version == version:
        return previous
    return SeenRecord(record, version, now)


class ElectionPhase(enum.Enum):
    FOLLOWING = "following"
    LEADING = "leading"
    STOPPED = "stopped"  # final: this identity never leads again


class StopReason(enum.Enum):
    DEADLINE = "could not renew within the renew deadline"
    SUPERSEDED = "the lease names another holder"
    DELETED = "the lease was deleted"
    CALLBACK_FAILED = "on_started_leading raised"
    RELEASED = "released"
    CANCELLED = "cancelled"

    @property
    def lost(self) -> bool:
        """Leadership taken away, not given up: the process should exit (its pod restarts as a
        standby with a new identity)."""
        return self in (StopReason.DEADLINE, StopReason.SUPERSEDED, StopReason.DELETED, StopReason.CALLBACK_FAILED)


class LeaseVerdict(enum.Enum):
    ACQUIRE = "acquire"  # take a lease held by nobody, expired, or missing (create)
    RENEW = "renew"  # the lease names us: write it again
    WAIT = "wait"


@dataclass(frozen=True)
class LeaseDecision:
    """What to do now. `write` is the record to write, carrying `version` as its
    resourceVersion (None: create the Lease). `retry_in`, when waiting on a held lease, is how
    long (own clock) until it could be taken if it stays unchanged."""

    verdict: LeaseVerdict
    why: str
    write: LeaseRecord | None = None
    version: str | None = None
    retry_in: float | None = None


@dataclass(frozen=True)
class Candidate:
    """One process's election state, all of it.

    Remembers its identity, its phase, the last record it read or wrote (`seen`, with when it
    first saw it), the moment it SENT its last successful write naming itself (`renewed_at`,
    own clock), and why it stopped. Every method returns a new state; nothing here does I/O or
    reads a clock.
    """

    identity: str
    phase: ElectionPhase = ElectionPhase.FOLLOWING
    seen: SeenRecord | None = None
    renewed_at: float | None = None
    stop_reason: StopReason | None = None

    def __post_init__(self) -> None:
        if not self.identity:
            raise ValueError("a candidate needs a non-empty identity (an empty holder means a released lease)")

    # -- questions

    def may_act(self, now: float, config: ElectionConfig) -> bool:
        """The fencing check: leading, and within the renew deadline of the last write sent."""
        return (
            self.phase is ElectionPhase.LEADING
            and self.renewed_at is not None
            and now < self.renewed_at + config.renew_deadline
        )

    def deadline(self, config: ElectionConfig) -> float | None:
        """When (own clock) the right to act ends unless a renewal lands first."""
        if self.phase is not ElectionPhase.LEADING or self.renewed_at is None:
            return None
        return self.renewed_at + config.renew_deadline

    @property
    def holder(self) -> str | None:
        """The holder of the last record seen ("" released; None: no Lease seen)."""
        return None if self.seen is None else self.seen.record.holder

    # -- transitions

    def stopped(self, reason: StopReason) -> Candidate:
        """Stops for good; the first reason given is kept."""
        if self.phase is ElectionPhase.STOPPED:
            return self
        return replace(self, phase=ElectionPhase.STOPPED, stop_reason=reason)

    def expired(self, now: float, config: ElectionConfig) -> Candidate:
        """A leader past its renew deadline stops (DEADLINE)."""
        if self.phase is ElectionPhase.LEADING and not self.may_act(now, config):
            return self.stopped(StopReason.DEADLINE)
        return self

    def observed(self, record: LeaseRecord | None, version: str, now: float) -> Candidate:
        """A read answered at `now` (None: no Lease). A leader that reads a record not naming
        itself has lost the lease and stops at once."""
        seen = None if record is None else observe(self.seen, record, version, now)
        state = replace(self, seen=seen)
        if self.phase is ElectionPhase.LEADING:
            if record is None:
                return state.stopped(StopReason.DELETED)
            if record.holder != self.identity:
                return state.stopped(StopReason.SUPERSEDED)
        return state

    def wrote(self, record: LeaseRecord, version: str, sent_at: float, now: float) -> Candidate:
        """A write sent at `sent_at` was accepted, as `record` at `version`, answered at `now`.
        A record naming us makes us the leader, unless we have stopped: a late success after a
        stop (the write was in flight) does not bring leadership back."""
        state = replace(self, seen=SeenRecord(record, version, now))
        if self.phase is ElectionPhase.STOPPED or record.holder != self.identity:
            return state
        renewed_at = sent_at if self.renewed_at is None else max(self.renewed_at, sent_at)
        return replace(state, phase=ElectionPhase.LEADING, renewed_at=renewed_at)

    # -- the decision

    def decide(self, now: float, wall: datetime, config: ElectionConfig) -> LeaseDecision:
        """Acquire, renew or wait, given the last record seen; `wall` only stamps the record
        written (for people). Mirrors client-go's tryAcquireOrRenew."""
        if self.phase is ElectionPhase.STOPPED:
            return LeaseDecision(LeaseVerdict.WAIT, f"stopped: {self.stop_reason.value if self.stop_reason else '?'}")
        if self.phase is ElectionPhase.LEADING and not self.may_act(now, config):
            return LeaseDecision(LeaseVerdict.WAIT, "past the renew deadline: must stop, not renew")
        stamp = micro_time(wall)
        mine = LeaseRecord(self.identity, config.lease_seconds, stamp, stamp, 0)
        if self.seen is None:
            return LeaseDecision(LeaseVerdict.ACQUIRE, "no lease yet: create it", write=mine, version=None)
        record, version = self.seen.record, self.seen.version
        if record.holder == self.identity:
            # keep when it was acquired and how often it changed hands
            renewal = replace(mine, acquire_time=record.acquire_time or stamp, transitions=record.transitions)
            return LeaseDecision(LeaseVerdict.RENEW, "the lease names us", write=renewal, version=version)
        if self.phase is ElectionPhase.LEADING:  # not after observed(): never overwrite another's lease while leading
            return LeaseDecision(LeaseVerdict.WAIT, f"the lease names {record.holder!r}")
        taking = replace(mine, transitions=record.transitions + 1)
        if not record.holder:
            return LeaseDecision(LeaseVerdict.ACQUIRE, "the lease was released", write=taking, version=version)
        wait_for = max(float(record.lease_duration_seconds), config.lease_duration)
        expires = self.seen.since + wait_for
        if now < expires:
            return LeaseDecision(
                LeaseVerdict.WAIT,
                f"held by {record.holder!r}, unchanged for {now - self.seen.since:.3f}s of {wait_for:g}s",
                retry_in=expires - now,
            )
        return LeaseDecision(
            LeaseVerdict.ACQUIRE,
            f"held by {record.holder!r} but unchanged for {now - self.seen.since:.3f}s >= {wait_for:g}s",
            write=taking,
            version=version,
        )

    def release_decision(self, wall: datetime) -> LeaseDecision:
        """The write that gives the lease up, when the last record seen (read just before) still
        names us; else WAIT (nothing of ours to release)."""
        if self.seen is None or self.seen.record.holder != self.identity:
            return LeaseDecision(LeaseVerdict.WAIT, "the lease does not name us: nothing to release")
        stamp = micro_time(wall)
        released = LeaseRecord("", RELEASED_LEASE_SECONDS, stamp, stamp, self.seen.record.transitions)
        return LeaseDecision(LeaseVerdict.RENEW, "release", write=released, version=self.seen.version)


def mark_changes(own: str, lease: str, marked: Iterable[str]) -> dict[str, str | None]:
    """The label value each pod should get when `own` begins to lead: the lease name on its own
    pod (first, so the Service is never left empty by the change), none on every other."""
    return {own: lease, **{name: None for name in sorted(set(marked)) if name != own}}


MIN_WRITE_TIMEOUT = 0.001


def fenced_timeout(time_left: float | None, ceiling: float) -> float | None:
    """The timeout of a fenced write sent with `time_left` seconds before the fence closes (None:
    no fence, no bound): the time left, never more than `ceiling`. A write may wait for its
    answer far longer than the margin between the fence and the earliest takeover (lease
    duration - renew deadline, 5 s by default: the read timeout alone is 20 s); bounded by the
    time left, it is abandoned as the fence closes, and the API server, told the same bound
    (its `timeout` parameter), gives it up too, so it cannot land after a standby took over
    unless the request spent more than the margin on its way to the API server."""
    if time_left is None:
        return None
    # Never 0: aiohttp reads a timeout of 0 as none at all.
    return max(MIN_WRITE_TIMEOUT, min(time_left, ceiling))


def go_duration(seconds: float) -> str:
    """`seconds` as a Go duration (the API server's `timeout` parameter), rounded down to the
    millisecond so the server's bound is never later than ours, and at least 1 ms."""
    return f"{max(1, math.floor(seconds * 1000))}ms"
