"""The failure detector: how long each attempt has been silent, on the operator's own clock.

Heartbeats are the hottest path (thousands a second at scale), so `HeartbeatTracker.observe`
costs O(1), does no I/O and keeps only a few numbers per pod. The shell feeds it every pod
snapshot it sees, asks `verdict()` when it decides about a job, and keeps `deadline()` in a heap
so that it wakes only for attempts whose verdict is about to change.

Silence is measured on Vigil's side. Every time here is the operator's MONOTONIC clock, injected
as `now` (a float, in seconds); no timestamp written by a pod or a node is ever read, so clock
skew between nodes cannot make an attempt look lost:

- A beat is a beat posted to the leader (`heard`), or a new value of the pod's
  `vigil.dev/heartbeat` annotation (the fallback channel): either counts. The value itself is
  opaque; the same value seen again (a duplicate or an unrelated change to the pod) is no beat,
  and a snapshot with a resourceVersion not above the last one seen is ignored (a stale or
  reordered delivery must not pass for a beat).
- The first value a tracker sees counts as a beat seen at that moment. After an operator restart
  or a leader change the new tracker therefore counts silence from when it first saw the
  attempt: never a false Lost because the operator itself was away.
- A standby watches pods but hears no beats posted to the leader (it answers them 503), so what
  it saw before it led is no evidence of silence. `took_over(now)` sets a floor: silence counts
  from no earlier than the takeover, and the startup grace of an attempt not yet heard from still
  applies after it. A new leader so never declares Lost before a full timeout of hearing nothing
  on either channel since it took over (DESIGN: "counts silence from its takeover").
- Startup grace counts from when this tracker first saw the pod running (phase Running or
  Unknown, or already beating), never from the pod's own startedAt.

Thresholds, with I = heartbeat.intervalSeconds, T = heartbeat.timeoutSeconds and
G = heartbeat.startupGraceSeconds:

- U = min(T, max(2 x I, T / 2)) is the silence after which an attempt is Uncertain. 2 x I means
  at least one whole beat was missed (the agent jitters by +-10% and the watch adds latency, so
  one interval alone would flap); T / 2 keeps a short interval under a long timeout from calling
  every API hiccup Uncertain. It is capped at T: when T <= 2 x I (allowed, as T > I is all the
  schema asks) there is no room for doubt and the attempt goes from Healthy straight to Lost.
- After the first beat: Healthy while silence < U, Uncertain while U <= silence < T, Lost once
  silence >= T. (">=" rather than ">": at the deadline the shell wakes, and the verdict must then
  have changed, or it would sleep until that same deadline again.)
- Before the first beat, the grace is put in front of the same rule: silence counts from when
  the container was first seen running, and the thresholds are G + U and G + T. So G is purely
  an allowance for starting up: an agent that never beats is Lost G + T after it started, one
  that starts slowly is judged like any other once the grace is used up, and G = 0 is no
  special case (a first beat still has the usual U and T to arrive).
- A pod not yet seen running (Pending) is Healthy and has no deadline: a pod that never starts
  is the business of attemptDeadlineSeconds, not of the heartbeat.
- heartbeat.required false: always Healthy; liveness is then the pod's phase alone.

The wall-clock time of the last beat (`Liveness.last_beat_at`) is carried only for display in
`status.currentAttempt.lastHeartbeatAt`; see `beat_stamp_due` for how rarely it is written, and
`stamp_floor` for why that rarity grows with the attempts beating.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from vigil import api
from vigil.core import fields
from vigil.core.objects import version_number

State = Literal["Healthy", "Uncertain", "Lost"]

# lastHeartbeatAt is for people (kubectl's LAST-BEAT column), not for the detector: the phase and
# the HeartbeatHealthy condition say within the timeout whether beats arrive. Written on its own,
# it costs a status write, a reconcile and a watch event per job, so it is refreshed at most this
# often, as the kubelet reports an unchanged Node status every 5 minutes while its Lease carries
# the heartbeat (KEP-589): a stamp written every few beats would cost a status write per job
# per period, the dearest request there is (bench/heartbeat_load.py measures it).
MIN_STAMP_PERIOD_SECONDS = 300.0
# ...and no more often, across every job the leader tracks, than this many stamps a second. A
# period of its own per job still costs M / 300 status writes a second: at the 50,000 attempts in
# flight docs/capacity-planning.md sizes for (10,000 jobs a second of 5 s each) 167 a second,
# each 5-12 ms of kube-apiserver CPU (bench.write_cost), a core or two for a column people
# glance at. Below 3,000 attempts this changes nothing. The floor (`stamp_floor`) spreads the
# average; the shell's token bucket of the same rate bounds bursts.
STAMP_WRITES_PER_SECOND = 10.0


@dataclass(frozen=True)
class Liveness:
    """The detector's view of one attempt at one instant.

    state: Healthy, Uncertain or Lost.
    silence_seconds: monotonic seconds without a beat (before the first beat: since the container
        was first seen running); 0 when silence is not counted (not required, not running yet).
    detail: what the state rests on, for messages. It names thresholds, never the live silence,
        so it stays the same while the state does (status messages built from it do not churn).
    last_beat_at: the operator's wall-clock time when it last saw a beat, if the shell gave one.
    """

    state: State
    silence_seconds: float
    detail: str
    last_beat_at: datetime | None = None


def thresholds(heartbeat: api.Heartbeat) -> tuple[float, float]:
    """(U, T): the silence after which an attempt is Uncertain, and Lost."""
    timeout = float(heartbeat.timeout_seconds)
    return min(timeout, max(2.0 * heartbeat.interval_seconds, timeout / 2.0)), timeout


def stamp_floor(beating: int, writes_per_second: float = STAMP_WRITES_PER_SECOND) -> float:
    """The least period between one job's stamps that keeps all `beating` attempts' stamps
    within `writes_per_second` (each stamp of a job written alone once a period, the jobs' beats
    spread over it as they come)."""
    if writes_per_second <= 0:
        raise ValueError(f"stamp writes per second must be positive, not {writes_per_second}")
    return max(0, beating) / writes_per_second


def stamp_period(heartbeat: api.Heartbeat, floor: float = 0.0) -> float:
    """How stale status.currentAttempt.lastHeartbeatAt may get before it is written on its own:
    `floor` is `stamp_floor` of the attempts the leader tracks."""
    return max(MIN_STAMP_PERIOD_SECONDS, heartbeat.timeout_seconds / 2.0, floor)


def beat_stamp_due(
    stored: datetime | None, last_beat_at: datetime | None, heartbeat: api.Heartbeat, floor: float = 0.0
) -> bool:
    """Whether lastHeartbeatAt deserves a status write of its own (`floor`: see stamp_period).

    decide() also refreshes it whenever it writes status anyway; this is for the quiet case. The
    shell may call it on a beat to decide whether that beat is worth a reconcile.
    """
    if last_beat_at is None:
        return False
    if stored is None:
        return True
    # abs(): after a leader change the new leader's wall clock may be behind the stored stamp.
    return abs((last_beat_at - stored).total_seconds()) >= stamp_period(heartbeat, floor)


@dataclass(slots=True)
class _Seen:
    """What the tracker remembers of one pod."""

    version: int | None = None  # last numeric resourceVersion observed
    running_since: float | None = None  # monotonic time the container was first seen running
    beat: str | None = None  # last heartbeat annotation value
    beat_at: float | None = None  # monotonic time that value was first seen
    beat_wall: datetime | None = None  # the same, on the wall clock, for display only


class HeartbeatTracker:
    """Per pod UID: when the operator first saw it running, and when its heartbeat last changed.

    Not thread-safe; the operator calls it from its event loop.
    """

    def __init__(self) -> None:
        self._pods: dict[str, _Seen] = {}
        # Seconds between the last beat observe() saw and the one before it of the same pod (None
        # for a pod's first beat), for the heartbeat-gap histogram.
        self.last_gap: float | None = None
        self.beats = 0  # new heartbeat values observed, in all
        # Monotonic time this process began to lead: silence is never counted from before it.
        self.floor: float | None = None

    def __len__(self) -> int:
        return len(self._pods)

    def __contains__(self, uid: object) -> bool:
        return uid in self._pods

    def observe(self, pod: Mapping[str, Any], now: float, wall: datetime | None = None) -> bool:
        """Record one snapshot of a pod at monotonic time `now` (`wall`: the same instant on the
        wall clock, kept only for lastHeartbeatAt). O(1), no I/O.

        Returns True when what the verdict rests on changed (first sight, first seen running, a
        beat): the caller should then take `deadline()` again. False for duplicates, stale
        snapshots and changes that do not concern liveness.
        """
        uid = fields.uid(pod)
        version = version_number(fields.metadata(pod).get("resourceVersion"))
        seen = self._pods.get(uid)
        changed = seen is None
        if seen is None:
            seen = self._pods[uid] = _Seen()
        elif version is not None and seen.version is not None and version <= seen.version:
            return False  # a duplicate, or an older snapshot delivered late: never a beat
        if version is not None:
            seen.version = version

        beat = fields.annotations(pod).get(api.ANNOTATION_HEARTBEAT)
        if seen.running_since is None and (beat is not None or _is_running(pod)):
            seen.running_since = now
            changed = True
        if beat is not None and beat != seen.beat:
            self.last_gap = now - seen.beat_at if seen.beat_at is not None else None
            self.beats += 1
            seen.beat = beat
            # max(): a caller that passes an earlier `now` late must not move silence backwards
            seen.beat_at = now if seen.beat_at is None else max(now, seen.beat_at)
            seen.beat_wall = wall
            changed = True
        return changed

    def heard(self, uid: str, now: float, wall: datetime | None = None) -> bool:
        """A beat that came to the operator directly (`vigil.servers.beats`), not through the
        pod: counted like a new annotation value. Only for a pod `observe` has seen (the caller
        answers the others "not known yet"), so no beat makes the tracker remember a new pod.
        Returns False, recording nothing, for an unknown UID."""
        seen = self._pods.get(uid)
        if seen is None:
            return False
        if seen.running_since is None:
            seen.running_since = now  # it beats, so its container runs
        self.last_gap = now - seen.beat_at if seen.beat_at is not None else None
        self.beats += 1
        seen.beat_at = now if seen.beat_at is None else max(now, seen.beat_at)
        seen.beat_wall = wall
        return True

    def took_over(self, now: float) -> None:
        """This process leads from monotonic time `now` on: beats posted to the leader before it
        went elsewhere, so silence counts from no earlier than now (see the module docstring)."""
        self.floor = now if self.floor is None else max(self.floor, now)

    def forget(self, uid: str) -> None:
        """Drop a pod (deleted, or its job is gone). Unknown UIDs are fine."""
        self._pods.pop(uid, None)

    def liveness(self, uid: str, heartbeat: api.Heartbeat, now: float) -> Liveness:
        """The attempt's state at monotonic time `now` (see the module docstring for the rule)."""
        if not heartbeat.required:
            return Liveness("Healthy", 0.0, "heartbeat not required: liveness is the pod phase alone")
        seen = self._pods.get(uid)
        if seen is None:
            return Liveness("Healthy", 0.0, "not observed yet")
        clock = _clock(seen, heartbeat, self.floor)
        if clock is None:
            return Liveness("Healthy", 0.0, "waiting for the container to start")
        reference, uncertain_at, lost_at = clock
        silence = max(0.0, now - reference)
        state: State = "Lost" if now >= lost_at else "Uncertain" if now >= uncertain_at else "Healthy"
        return Liveness(state, silence, _detail(state, seen, heartbeat), seen.beat_wall)

    def last_beat_at(self, uid: str) -> datetime | None:
        """The wall-clock time the pod's last beat was seen (if the shell gave one): what
        lastHeartbeatAt shows. Asked on every beat, so without building a verdict."""
        seen = self._pods.get(uid)
        return None if seen is None else seen.beat_wall

    def deadline(self, uid: str, heartbeat: api.Heartbeat, now: float) -> float | None:
        """The monotonic time at which the verdict changes next if no beat arrives; None if it
        never will (not required, not running yet, or already Lost)."""
        if not heartbeat.required:
            return None
        seen = self._pods.get(uid)
        clock = None if seen is None else _clock(seen, heartbeat, self.floor)
        if clock is None:
            return None
        _, uncertain_at, lost_at = clock
        if now < uncertain_at < lost_at:
            return uncertain_at
        return lost_at if now < lost_at else None


def _is_running(pod: Mapping[str, Any]) -> bool:
    # Unknown (node unreachable) counts: a pod only gets there after it was bound and started,
    # and a partitioned pod that never beats must still become Lost.
    return fields.phase(pod) in ("Running", "Unknown")


def _clock(seen: _Seen, heartbeat: api.Heartbeat, floor: float | None) -> tuple[float, float, float] | None:
    """(silence counts from, Uncertain at, Lost at), all monotonic; None before the start.
    `floor`: the takeover; silence counted from before it would count beats this process could
    not hear."""
    uncertain_after, lost_after = thresholds(heartbeat)
    if seen.beat_at is not None:
        reference, allowance = seen.beat_at, 0.0
    elif seen.running_since is not None:
        reference, allowance = seen.running_since, float(heartbeat.startup_grace_seconds)
    else:
        return None
    if floor is not None and reference < floor:
        reference = floor
    # Absolute instants, compared with `now` as they are: verdict() and deadline() then agree
    # exactly, with no float rounding between "silence >= U" and "now >= deadline".
    return reference, reference + allowance + uncertain_after, reference + allowance + lost_after


def _detail(state: State, seen: _Seen, heartbeat: api.Heartbeat) -> str:
    # Only the message of the state at hand is built: this runs on every beat.
    uncertain_after, lost_after = thresholds(heartbeat)
    if seen.beat_at is None:
        grace = heartbeat.startup_grace_seconds
        if state == "Healthy":
            return f"waiting for the first heartbeat (startup grace {grace}s)"
        if state == "Uncertain":
            return (
                f"no first heartbeat within {grace + uncertain_after:g}s of the container starting "
                f"(startup grace {grace}s); Lost after {grace + lost_after:g}s"
            )
        return (
            f"no first heartbeat within {grace + lost_after:g}s of the container starting "
            f"(startup grace {grace}s + heartbeat.timeoutSeconds {heartbeat.timeout_seconds}s)"
        )
    if state == "Healthy":
        return "heartbeats arriving"
    if state == "Uncertain":
        return f"no heartbeat for {uncertain_after:g}s or more; Lost after {lost_after:g}s of silence"
    return f"no heartbeat for {lost_after:g}s or more (heartbeat.timeoutSeconds)"


def actionable(verdict: Liveness, pods_fresh: bool) -> Liveness:
    """The verdict as far as the operator may act on it: silence is evidence only while the
    operator can hear. While its view of pods is not fresh (a stalled or broken watch), an
    attempt may be Uncertain but never Lost."""
    if pods_fresh or verdict.state != "Lost":
        return verdict
    detail = f"{verdict.detail}; but the operator's view of pods is not fresh, so it is not declared Lost yet"
    return Liveness("Uncertain", verdict.silence_seconds, detail, verdict.last_beat_at)


# An alarm may ring a hair early (the event loop runs timers within its clock's resolution): a deadline
# this close counts as reached, so the job is woken rather than re-armed for an instant.
EARLY_SECONDS = 0.001


def ring_or_rearm(
    decided: Mapping[str, str], current: Mapping[str, str], next_deadline: float | None, now: float
) -> float | None:
    """When a silence alarm rings (`vigil.controllers.jobs.alarms`): None to wake the job (some
    verdict changed since the decision, or its deadline is reached), or the monotonic time to set
    the alarm again for (beats moved it)."""
    if dict(current) != dict(decided) or next_deadline is None or next_deadline <= now + EARLY_SECONDS:
        return None
    return next_deadline
