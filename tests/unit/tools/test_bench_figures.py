"""Figures the benches derive, checked without a cluster: the operator's /metrics as
`compare.sum_samples` reads them (a wrong sum would move every settle and per-beat figure), when
`compare` says a side was not bound by the CPU, how it paces a stream, and when `heartbeat_load`
calls an Uncertain false, and how long it may hold the agents to measure the cost without beats."""

from __future__ import annotations

import pytest

from bench.compare import default_timeout, due_after, not_cpu_bound, sum_samples
from bench.heartbeat_load import falsely_uncertain, quiet_seconds_allowed
from vigil.api import Heartbeat

pytestmark = pytest.mark.unit

EXPOSITION = """\
# HELP vigil_jobs Jobs by phase.
# TYPE vigil_jobs gauge
vigil_jobs{phase="Running"} 9998.0
vigil_jobs{phase="Succeeded"} 2.0
vigil_jobs_total_seen 7.0
controller_runtime_reconcile_total{controller="vigiljob",result="success"} 40.0
controller_runtime_reconcile_total{controller="vigiljob",result="error"} 2.0
"""


def test_a_bare_name_sums_all_its_samples_and_a_labelled_one_reads_that_sample():
    sums = sum_samples(EXPOSITION, ["controller_runtime_reconcile_total", 'vigil_jobs{phase="Running"}', "vigil_jobs"])
    assert sums == {
        "controller_runtime_reconcile_total": 42.0,
        'vigil_jobs{phase="Running"}': 9998.0,
        "vigil_jobs": 10000.0,  # not vigil_jobs_total_seen: a longer name is another metric
    }


def test_a_metric_not_exposed_reads_zero():
    assert sum_samples(EXPOSITION, ["vigil_heartbeats_total"]) == {"vigil_heartbeats_total": 0.0}


EVERY_10_S = Heartbeat.model_validate({"intervalSeconds": 10, "timeoutSeconds": 60})  # Uncertain after 30 s


def test_an_uncertain_is_false_only_when_no_pod_was_silent_as_long_as_the_uncertain_threshold():
    assert falsely_uncertain(1, max_gap=29.0, heartbeat=EVERY_10_S)
    # Beats held up 57 s by a saturated API server: Uncertain is the right verdict, though under the timeout.
    assert not falsely_uncertain(3297, max_gap=57.0, heartbeat=EVERY_10_S)
    assert not falsely_uncertain(0, max_gap=11.2, heartbeat=EVERY_10_S)


def test_the_hold_keeps_every_pods_silence_under_the_uncertain_threshold():
    # Uncertain after 30 s: a beat up to 11 s late (the +10% jitter) and 5 s of the bench's own lag leave 14 s.
    assert quiet_seconds_allowed(EVERY_10_S, 10) == pytest.approx(14.0)
    every_2_s = Heartbeat.model_validate({"intervalSeconds": 2, "timeoutSeconds": 30})  # Uncertain after 15 s
    assert quiet_seconds_allowed(every_2_s, 2) == pytest.approx(7.8)
    tight = Heartbeat.model_validate({"intervalSeconds": 10, "timeoutSeconds": 15})  # Uncertain = Lost at 15 s
    assert quiet_seconds_allowed(tight, 10) == 0.0


def test_a_side_that_left_the_cpu_idle_is_named_and_cpu_bound_sides_say_nothing():
    bound, stalled = {"machine_busy_share": 0.99}, {"machine_busy_share": 0.65}
    assert not_cpu_bound(bound, bound) is None
    note = not_cpu_bound(stalled, bound)
    assert note is not None and "native 65%" in note and "Vigil" not in note.split("over the run")[0]
    assert "native 65%, Vigil 70%" in (not_cpu_bound(stalled, {"machine_busy_share": 0.70}) or "")
    assert not_cpu_bound({}, {}) is None  # not a local bed: no machine figure, nothing to say


def test_a_paced_side_is_expected_to_leave_the_cpu_idle_and_the_note_says_to_read_latency():
    paced = {"machine_busy_share": 0.55, "rate_jobs_per_second": 20.0}
    note = not_cpu_bound(paced, {"machine_busy_share": 0.60, "rate_jobs_per_second": 20.0}) or ""
    assert "stream of 20 jobs/s" in note and "native 55%, Vigil 60%" in note and "latency" in note
    assert "stall" not in note  # idle by design, not a stalled bed


def test_a_stream_is_due_at_a_steady_pace_and_its_length_is_added_to_the_timeout():
    assert [due_after(i, 20.0) for i in (0, 1, 20, 1000)] == [0.0, 0.05, 1.0, 50.0]
    assert default_timeout(1000, None) == 120 + 200
    assert default_timeout(1000, 20.0) == 120 + 200 + 50  # a side has the whole stream's length more
