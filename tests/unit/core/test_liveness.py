"""The failure detector: silence on the operator's monotonic clock, thresholds and deadlines."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.builders import T0, make_pod
from vigil import api
from vigil.core.liveness import (
    STAMP_WRITES_PER_SECOND,
    HeartbeatTracker,
    beat_stamp_due,
    stamp_floor,
    stamp_period,
    thresholds,
)

pytestmark = pytest.mark.unit

HB = api.Heartbeat(interval_seconds=10, timeout_seconds=60, startup_grace_seconds=120)  # U 30, T 60


def pod(rv: int, *, beat: str | None = None, phase: str = "Running", uid: str = "p1") -> dict[str, Any]:
    return make_pod(1, uid=uid, phase=phase, heartbeat=beat, resource_version=str(rv))


def states(tracker: HeartbeatTracker, times: list[float], heartbeat: api.Heartbeat = HB) -> list[str]:
    return [tracker.liveness("p1", heartbeat, t).state for t in times]


# ---------------------------------------------------------------------------------- thresholds


@pytest.mark.parametrize(
    ("interval", "timeout", "expected"),
    [
        (10, 60, (30.0, 60.0)),  # timeout / 2
        (1, 60, (30.0, 60.0)),  # a short interval does not make every hiccup Uncertain
        (25, 60, (50.0, 60.0)),  # two whole intervals
        (40, 60, (60.0, 60.0)),  # no room for doubt: Healthy goes straight to Lost
        (10, 11, (11.0, 11.0)),
    ],
)
def test_uncertain_after_max_of_two_intervals_and_half_the_timeout_capped_at_the_timeout(
    interval: int, timeout: int, expected: tuple[float, float]
) -> None:
    assert thresholds(api.Heartbeat(interval_seconds=interval, timeout_seconds=timeout)) == expected


def test_after_a_beat_healthy_then_uncertain_then_lost() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(pod(1, beat="a"), 100.0)

    assert states(tracker, [100, 129.9, 130, 159.9, 160, 10_000]) == [
        "Healthy",
        "Healthy",
        "Uncertain",
        "Uncertain",
        "Lost",
        "Lost",
    ]
    assert tracker.liveness("p1", HB, 145).silence_seconds == 45
    assert tracker.deadline("p1", HB, 100) == 130
    assert tracker.deadline("p1", HB, 130) == 160
    assert tracker.deadline("p1", HB, 160) is None


def test_before_the_first_beat_the_grace_comes_in_front_of_the_usual_thresholds() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(pod(1), 100.0)  # running, no beat yet: grace counts from here

    assert states(tracker, [100, 249.9, 250, 279.9, 280]) == ["Healthy", "Healthy", "Uncertain", "Uncertain", "Lost"]
    assert tracker.deadline("p1", HB, 100) == 250  # 120 grace + 30
    assert tracker.deadline("p1", HB, 250) == 280  # 120 grace + 60
    assert "startup grace 120s" in tracker.liveness("p1", HB, 280).detail


def test_zero_grace_is_no_special_case() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(pod(1), 0.0)
    heartbeat = HB.model_copy(update={"startup_grace_seconds": 0})
    assert states(tracker, [0, 30, 60], heartbeat) == ["Healthy", "Uncertain", "Lost"]


def test_a_pod_not_yet_running_is_healthy_with_no_deadline() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(pod(1, phase="Pending"), 0.0)
    assert tracker.liveness("p1", HB, 10_000).state == "Healthy"
    assert tracker.deadline("p1", HB, 0) is None

    assert tracker.observe(pod(2), 500.0)  # now running: grace from when it was seen so
    assert tracker.deadline("p1", HB, 500) == 650


def test_a_pod_on_an_unreachable_node_counts_as_started() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(pod(1, phase="Unknown"), 0.0)
    assert tracker.liveness("p1", HB, 180).state == "Lost"


def test_not_required_is_always_healthy_and_never_due() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(pod(1, beat="a"), 0.0)
    relaxed = HB.model_copy(update={"required": False})
    assert tracker.liveness("p1", relaxed, 1e9).state == "Healthy"
    assert tracker.deadline("p1", relaxed, 0) is None


def test_an_unknown_pod_is_healthy_and_never_due() -> None:
    tracker = HeartbeatTracker()
    assert tracker.liveness("nobody", HB, 1e9).state == "Healthy"
    assert tracker.deadline("nobody", HB, 0) is None


# ----------------------------------------------------------------------------------- beats


def test_a_new_value_is_a_beat_and_the_same_value_again_is_not() -> None:
    tracker = HeartbeatTracker()
    assert tracker.observe(pod(1, beat="1:x"), 0.0)
    assert not tracker.observe(pod(2, beat="1:x"), 50.0)  # e.g. a checkpoint or status change
    assert tracker.liveness("p1", HB, 60).state == "Lost"

    assert tracker.observe(pod(3, beat="2:x"), 61.0)
    assert tracker.liveness("p1", HB, 61).state == "Healthy"
    assert tracker.liveness("p1", HB, 61).silence_seconds == 0
    assert tracker.deadline("p1", HB, 61) == 91


def test_a_duplicate_observation_changes_nothing() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(pod(5, beat="a"), 0.0)
    assert not tracker.observe(pod(5, beat="a"), 40.0)
    assert tracker.deadline("p1", HB, 40) == 60


def test_a_stale_snapshot_delivered_late_is_not_a_beat() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(pod(4, beat="old"), 0.0)
    tracker.observe(pod(9, beat="new"), 10.0)

    assert not tracker.observe(pod(4, beat="old"), 50.0)  # reordered: older version, other value
    assert tracker.liveness("p1", HB, 70).state == "Lost"  # silence still counts from 10

    assert tracker.observe(pod(10, beat="newer"), 71.0)
    assert tracker.liveness("p1", HB, 71).state == "Healthy"


def test_opaque_resource_versions_still_count_new_values() -> None:
    tracker = HeartbeatTracker()
    first = pod(1, beat="a")
    first["metadata"]["resourceVersion"] = "opaque-1"
    second = pod(1, beat="b")
    second["metadata"]["resourceVersion"] = "opaque-0"
    tracker.observe(first, 0.0)
    assert tracker.observe(second, 50.0)
    assert tracker.deadline("p1", HB, 50) == 80


def test_a_late_call_with_an_earlier_now_does_not_move_silence_back() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(pod(1, beat="a"), 100.0)
    tracker.observe(pod(2, beat="b"), 90.0)
    assert tracker.deadline("p1", HB, 100) == 130


def test_observe_reports_what_moves_the_deadline() -> None:
    tracker = HeartbeatTracker()
    assert tracker.observe(pod(1, phase="Pending"), 0.0)  # first sight
    assert not tracker.observe(pod(2, phase="Pending"), 1.0)
    assert tracker.observe(pod(3), 2.0)  # running
    assert not tracker.observe(pod(4), 3.0)
    assert tracker.observe(pod(5, beat="a"), 4.0)  # first beat


def test_the_wall_clock_time_of_the_last_beat_is_carried_for_display() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(pod(1, beat="a"), 0.0, wall=T0)
    tracker.observe(pod(2, beat="a"), 5.0, wall=T0 + timedelta(seconds=5))  # no beat: not moved
    assert tracker.liveness("p1", HB, 6).last_beat_at == T0
    tracker.observe(pod(3, beat="b"), 10.0, wall=T0 + timedelta(seconds=10))
    assert tracker.liveness("p1", HB, 11).last_beat_at == T0 + timedelta(seconds=10)


def test_forget_drops_a_pod() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(pod(1, beat="a"), 0.0)
    tracker.observe(pod(1, beat="a", uid="p2"), 0.0)
    tracker.forget("p1")
    tracker.forget("never-seen")
    assert "p1" not in tracker and "p2" in tracker and len(tracker) == 1
    assert tracker.liveness("p1", HB, 1e6).state == "Healthy"


def test_the_detail_does_not_change_while_the_state_does_not() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(pod(1, beat="a"), 0.0)
    assert tracker.liveness("p1", HB, 31).detail == tracker.liveness("p1", HB, 59).detail


# --------------------------------------------------------------------------- operator restarts


def test_after_a_restart_an_old_beat_counts_from_the_first_look() -> None:
    # The agent last beat long ago, while no operator was watching; the new one cannot know when.
    tracker = HeartbeatTracker()
    tracker.observe(pod(77, beat="812:boot"), 5000.0)

    assert tracker.liveness("p1", HB, 5000).state == "Healthy"
    assert tracker.deadline("p1", HB, 5000) == 5030
    assert states(tracker, [5059.9, 5060]) == ["Uncertain", "Lost"]  # a full timeout, then Lost


def test_after_a_restart_a_running_pod_without_beats_gets_its_grace_from_the_first_look() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(pod(77), 5000.0)
    assert tracker.deadline("p1", HB, 5000) == 5150


# ------------------------------------------------------------------------- lastHeartbeatAt


def test_last_heartbeat_at_is_written_alone_only_when_stale_by_the_period() -> None:
    assert stamp_period(HB) == 300
    assert stamp_period(HB.model_copy(update={"timeout_seconds": 3600})) == 1800
    assert beat_stamp_due(None, T0, HB)
    assert not beat_stamp_due(T0, None, HB)
    assert not beat_stamp_due(T0, T0 + timedelta(seconds=299), HB)
    assert beat_stamp_due(T0, T0 + timedelta(seconds=300), HB)
    assert beat_stamp_due(T0 + timedelta(seconds=400), T0, HB)  # a new leader's clock behind


def test_the_stamps_of_all_jobs_stay_within_the_budget_at_any_scale() -> None:
    assert STAMP_WRITES_PER_SECOND == 10
    assert stamp_period(HB, stamp_floor(3000)) == 300  # below 3,000 attempts nothing changes
    floor = stamp_floor(10_000)
    assert floor == 1000
    assert not beat_stamp_due(T0, T0 + timedelta(seconds=999), HB, floor)
    assert beat_stamp_due(T0, T0 + timedelta(seconds=1000), HB, floor)
    for beating in (1, 2_999, 10_000, 50_000):  # each job once a period: beating / period a second
        assert beating / stamp_period(HB, stamp_floor(beating)) <= STAMP_WRITES_PER_SECOND
    assert stamp_floor(50_000, 2.5) == 20_000


@pytest.mark.parametrize("rate", [0.0, -1.0])
def test_a_stamp_budget_that_is_not_positive_is_refused(rate: float) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        stamp_floor(10, rate)


# ------------------------------------------------------------------------------- properties

heartbeats = st.builds(
    lambda interval, extra, grace: api.Heartbeat(
        interval_seconds=interval, timeout_seconds=interval + extra, startup_grace_seconds=grace
    ),
    st.integers(1, 60),
    st.integers(1, 300),
    st.integers(0, 300),
)
# One observation: time passes, then the pod is seen (new value, same value, or a stale copy).
observations = st.lists(
    st.tuples(st.floats(0, 400, allow_nan=False), st.sampled_from(["beat", "same", "stale", "none"])),
    max_size=12,
)
RANK = {"Healthy": 0, "Uncertain": 1, "Lost": 2}


@settings(max_examples=300, deadline=None)
@given(heartbeat=heartbeats, steps=observations, start=st.floats(0, 1e6), running=st.booleans())
def test_the_verdict_follows_silence_since_the_last_beat_seen(
    heartbeat: api.Heartbeat, steps: list[tuple[float, str]], start: float, running: bool
) -> None:
    """A reference model: silence counts from the last new value this tracker saw (or from when
    it first saw the pod running, plus the grace); stale and repeated snapshots change nothing."""
    tracker = HeartbeatTracker()
    now, rv, beats = start, 10, 0
    phase = "Running" if running else "Pending"
    tracker.observe(pod(rv, phase=phase), now)
    reference = (now, float(heartbeat.startup_grace_seconds)) if running else None
    for gap, kind in steps:
        now += gap
        if kind == "stale":
            tracker.observe(pod(1, beat="ancient", phase=phase), now)
            continue
        rv += 1
        if kind == "beat":
            beats += 1
            reference = (now, 0.0)
        tracker.observe(pod(rv, beat=str(beats) if beats and kind != "none" else None, phase=phase), now)

    uncertain_after, lost_after = thresholds(heartbeat)
    for later in (0.0, 1.0, uncertain_after, lost_after, 1e5):
        at = now + later
        verdict = tracker.liveness("p1", heartbeat, at)
        if reference is None:
            assert verdict.state == "Healthy"
            continue
        since, allowance = reference
        expected = (
            "Lost"
            if at >= since + allowance + lost_after
            else "Uncertain"
            if at >= since + allowance + uncertain_after
            else "Healthy"
        )
        assert verdict.state == expected
        assert verdict.silence_seconds == pytest.approx(max(0.0, at - since))
        # never a false Lost: a Lost attempt was silent at least the timeout on our clock
        assert verdict.state != "Lost" or at - since >= lost_after - 1e-6


@settings(max_examples=300, deadline=None)
@given(
    heartbeat=heartbeats,
    beat=st.booleans(),
    start=st.floats(0, 1e6),
    probes=st.lists(st.floats(0, 1000), min_size=1, max_size=8),
)
def test_the_deadline_is_exactly_when_the_verdict_next_changes(
    heartbeat: api.Heartbeat, beat: bool, start: float, probes: list[float]
) -> None:
    tracker = HeartbeatTracker()
    tracker.observe(pod(1, beat="a" if beat else None), start)
    previous = 0
    for offset in sorted(probes):
        now = start + offset
        verdict = tracker.liveness("p1", heartbeat, now)
        assert RANK[verdict.state] >= previous  # without a beat, never better
        previous = RANK[verdict.state]
        due = tracker.deadline("p1", heartbeat, now)
        if due is None:
            assert verdict.state == "Lost"
            continue
        assert due > now
        assert tracker.liveness("p1", heartbeat, due).state != verdict.state
        assert tracker.liveness("p1", heartbeat, now + (due - now) / 2).state == verdict.state


# ---------------------------------------------------------------------- beats posted to the leader


def test_a_beat_posted_to_the_leader_counts_like_a_new_annotation_value() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(pod(1, beat="a"), 100.0)
    assert tracker.heard("p1", 150.0, T0)
    assert states(tracker, [150, 179.9, 180, 210]) == ["Healthy", "Healthy", "Uncertain", "Lost"]
    assert tracker.last_gap == 50.0 and tracker.beats == 2 and tracker.last_beat_at("p1") == T0
    # The annotation channel still counts after it: either channel's beats move the deadline.
    tracker.observe(pod(2, beat="b"), 200.0)
    assert tracker.deadline("p1", HB, 200.0) == 230.0


def test_a_posted_beat_before_any_annotation_ends_the_startup_grace() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(pod(1, phase="Pending"), 100.0)
    assert tracker.deadline("p1", HB, 100.0) is None  # not running: no deadline yet
    assert tracker.heard("p1", 110.0)  # it beats, so it runs: judged from this beat, no grace
    assert tracker.deadline("p1", HB, 110.0) == 140.0


def test_a_posted_beat_for_a_pod_never_observed_is_not_remembered() -> None:
    tracker = HeartbeatTracker()
    assert not tracker.heard("stranger", 100.0)
    assert len(tracker) == 0 and tracker.beats == 0


# ------------------------------------------------------------------------------------ takeover


def test_a_standbys_old_sight_of_a_pod_is_no_silence_once_it_takes_over() -> None:
    # A standby saw the attempt start at 100 and its beats went to the old leader; it takes over
    # at 1000. Counted from 100 the attempt would be Lost at once; counted from the takeover it
    # gets the grace (it was never heard from here) and then the usual thresholds.
    tracker = HeartbeatTracker()
    tracker.observe(pod(1), 100.0)
    assert tracker.liveness("p1", HB, 1000.0).state == "Lost"  # what a floorless tracker would say
    tracker.took_over(1000.0)
    assert tracker.liveness("p1", HB, 1000.0).state == "Healthy"
    assert tracker.deadline("p1", HB, 1000.0) == 1000 + 120 + 30
    assert states(tracker, [1179.9, 1180]) == ["Uncertain", "Lost"]
    # Its first beat to the new leader judges it like any other from then on.
    assert tracker.heard("p1", 1010.0)
    assert tracker.deadline("p1", HB, 1010.0) == 1040.0


def test_a_beat_seen_before_the_takeover_counts_silence_from_the_takeover() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(pod(1, beat="a"), 100.0)
    tracker.took_over(130.0)
    assert tracker.deadline("p1", HB, 130.0) == 160.0  # not 130: silence counts from 130
    assert states(tracker, [189.9, 190]) == ["Uncertain", "Lost"]
    # Beats after the takeover are judged as they come; the floor never moves them back.
    tracker.observe(pod(2, beat="b"), 200.0)
    assert tracker.deadline("p1", HB, 200.0) == 230.0
    tracker.took_over(50.0)  # a floor never goes back either
    assert tracker.floor == 130.0


@settings(max_examples=300, deadline=None)
@given(
    heartbeat=heartbeats,
    seen_at=st.floats(0, 1e5),
    lead_after=st.floats(0, 1e5),
    beat=st.booleans(),
    running=st.booleans(),
    probe=st.floats(0, 1e5),
)
def test_a_new_leader_never_declares_lost_before_a_full_timeout_of_hearing_nothing_since_it_led(
    heartbeat: api.Heartbeat, seen_at: float, lead_after: float, beat: bool, running: bool, probe: float
) -> None:
    tracker = HeartbeatTracker()
    tracker.observe(pod(1, beat="a" if beat else None, phase="Running" if running else "Pending"), seen_at)
    took_over = seen_at + lead_after
    tracker.took_over(took_over)
    now = took_over + probe
    verdict = tracker.liveness("p1", heartbeat, now)
    _, lost_after = thresholds(heartbeat)
    assert verdict.state != "Lost" or now - took_over >= lost_after
    due = tracker.deadline("p1", heartbeat, took_over)
    assert due is None or due - took_over >= thresholds(heartbeat)[0] - 1e-6
