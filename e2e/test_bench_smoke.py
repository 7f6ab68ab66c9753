"""Smoke of the benchmarks, so the scripts cannot rot: bench.compare with 50 jobs of each kind
(all succeed, a stream of 25 a second, so that the pacing runs too), bench.heartbeat_load with 50
attempts for 8 s and bench.write_cost with 20 writes of each kind, against the suite's cluster.

They check that the scripts run to the end and report every figure; never a speed.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cluster import ROOT, Kube
from tests.support.waits import deadline

pytestmark = pytest.mark.e2e


def run_bench(module: str, args: list[str], timeout: float) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    if result.returncode:
        print(result.stdout[-4000:], result.stderr[-4000:], sep="\n", file=sys.__stderr__)
    return result


def missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def test_compare_runs_both_kinds_and_reports_every_figure(kube: Kube, tmp_path: Path) -> None:
    from bench.compare import REQUIRED

    began = time.monotonic()
    result = run_bench(
        "bench.compare",
        ["--jobs", "50", "--rate", "25", "--workloads", "all-succeed"]
        + ["--kubeconfig", str(kube.kubeconfig), "--out", str(tmp_path)],
        timeout=deadline(240),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    (report,) = tmp_path.glob("*.json")
    (table,) = tmp_path.glob("*.md")
    sides = json.loads(report.read_text())["results"]["all-succeed"]
    for kind in ("native", "vigil"):
        side = sides[kind]
        assert side["finished"] == side["succeeded"] == 50, side
        assert side["rate_jobs_per_second"] == 25
        assert side["submit_seconds"] >= 49 / 25, "the stream was not paced"  # the last job is due at 1.96 s
        absent = [key for key in REQUIRED if missing(side.get(key))]
        if not kube.on_testbed:  # the /proc figures need the local test bed
            absent = [key for key in absent if "cpu" not in key and "rss" not in key]
        assert not absent, f"{kind}: figures missing: {absent}"
        assert side["api_requests_by_verb_resource"], kind
        # The API server's own account: the pods' watch events it sent, and its time on the creates.
        assert side["api_watch_events_by_verb_resource"].get("WATCH pods", 0) >= 50, kind
        created = "POST jobs" if kind == "native" else "POST vigiljobs"
        assert side["api_request_seconds_by_verb_resource"].get(created, 0) > 0, kind
    assert "| makespan" in table.read_text() and "a steady stream of 25 jobs/s" in table.read_text()
    print(f"bench.compare smoke took {time.monotonic() - began:.0f} s")


def test_heartbeat_load_runs_and_finds_no_false_uncertain(kube: Kube, tmp_path: Path) -> None:
    began = time.monotonic()
    result = run_bench(
        "bench.heartbeat_load",
        ["--attempts", "50", "--seconds", "8", "--interval", "2", "--timeout", "30"]
        + ["--kubeconfig", str(kube.kubeconfig), "--out", str(tmp_path)],
        timeout=deadline(180),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    (report,) = tmp_path.glob("heartbeat-both-*.json")  # the default: both channels, side by side
    both = json.loads(report.read_text())
    assert set(both) == {"annotation", "leader"}
    for channel, figures in both.items():
        assert figures["beats_renewed"] > 0, channel
        assert figures["settled"] is True, channel  # 50 attempts on the idle bed reach a steady state
        for key in (
            "operator_cpu_seconds_per_1000_beats",
            "operator_peak_rss_mib",
            "event_loop_lag_healthz_p99_seconds",
        ):
            assert not missing(figures.get(key)), (channel, key)
        assert figures["vigil_attempts_uncertain_total_since_start"] == 0, channel
        # The operator's own look at its loop, 4 a second (vigil.runtime.stalls), over the window.
        assert figures["event_loop_lag_inside_looks"] >= 2 * figures["window_seconds"], channel
        assert not missing(figures.get("gc_full_collection_mean_seconds")), channel
        assert figures["jobs_by_phase"] == {"Running": 50}, channel
        # The hold before the window: the operator's CPU with no beat arriving, and what the beats cost above it.
        assert figures["quiet_seconds"] > 0, channel
        assert not missing(figures.get("operator_cpu_seconds_per_1000_beats_for_beats")), channel
        if kube.on_testbed:  # the API server's CPU is read from /proc of the local test bed
            assert not missing(figures.get("apiserver_cpu_cores_for_beats")), channel
    assert not missing(both["annotation"].get("apiserver_patch_pods_p99_seconds"))
    leader = both["leader"]
    assert leader["posts_counted"] > 0
    assert not missing(leader.get("leader_post_p99_seconds"))
    # Beats to the leader write nothing: far fewer PATCH pods than the annotation's one per beat.
    patches = "apiserver_patch_pods_requests_in_window"
    assert leader[patches] < both["annotation"][patches] / 10
    print(f"bench.heartbeat_load smoke took {time.monotonic() - began:.0f} s")


def test_write_cost_measures_every_kind_of_write(kube: Kube, tmp_path: Path) -> None:
    result = run_bench(
        "bench.write_cost",
        ["--writes", "20", "--rounds", "1", "--kubeconfig", str(kube.kubeconfig), "--out", str(tmp_path)],
        timeout=deadline(180),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    (report,) = tmp_path.glob("write-cost-*.json")
    results = json.loads(report.read_text())["results"]
    assert set(results) == {
        "vigiljob-status-patch",
        "vigiljob-status-put",
        "vigiljob-status-small",
        "vigiljob-get",
        "vigiljob-create",
        "job-create",
        "job-status-put",
        "configmap-patch",
        "pod-heartbeat-patch",
        "lease-renew",
    }
    for kind, (figures,) in results.items():
        assert figures["writes_per_second"] > 0, kind
        if kube.on_testbed:  # the API server's CPU is read from /proc of the local test bed
            assert figures["cpu_ms_per_write"] > 0, kind


def test_heartbeat_failover_finds_every_agent_at_the_new_leader_and_no_attempt_lost(kube: Kube, tmp_path: Path) -> None:
    began = time.monotonic()
    result = run_bench(
        "bench.heartbeat_failover",
        ["--attempts", "30", "--interval", "3", "--timeout", "20"]
        + ["--kubeconfig", str(kube.kubeconfig), "--out", str(tmp_path)],
        timeout=deadline(240),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    (report,) = tmp_path.glob("heartbeat-failover-*.json")
    figures = json.loads(report.read_text())
    assert figures["agents_answered_by_new_leader"] == 30
    assert figures["first_beat_counted_after_takeover_seconds"] is not None
    assert figures["attempts_lost"] == 0 and figures["pods_of_a_later_attempt"] == 0
    assert figures["jobs_not_running_at_attempt_1"] == 0
    print(f"bench.heartbeat_failover smoke took {time.monotonic() - began:.0f} s")


def test_arrays_runs_every_scenario_and_reports_every_figure(kube: Kube, tmp_path: Path) -> None:
    from bench.arrays import REQUIRED

    began = time.monotonic()
    result = run_bench(
        "bench.arrays",
        ["--throughput", "--burst", "--big", "--tasks", "20", "--parallelism", "5"]
        + ["--burst-arrays", "6", "--burst-tasks", "10", "--big-tasks", "1000", "--big-seconds", "5"]
        + ["--kubeconfig", str(kube.kubeconfig), "--out", str(tmp_path)],
        timeout=deadline(300),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    (report,) = tmp_path.glob("arrays-20-burst-6x10-big-1000-*.json")
    (table,) = tmp_path.glob("arrays-*.md")
    results = json.loads(report.read_text())["results"]
    for kind in ("native", "vigil"):
        side = results["throughput"][kind]
        assert side["succeeded_tasks"] == 20 and side["outcome"] == "Succeeded", side
        assert side["tasks_with_a_pod"] == 20, kind
        absent = [key for key in REQUIRED if missing(side.get(key))]
        if not kube.on_testbed:  # the /proc and audit-log figures need the local test bed
            absent = [k for k in absent if not any(w in k for w in ("cpu", "rss", "machine", "controller_writes"))]
        assert not absent, f"{kind}: figures missing: {absent}"
        burst = results["burst"][kind]
        assert burst["acknowledged"] == 6 and burst["unreadable_after_ack"] == burst["lost"] == 0, burst
        assert burst["seen_by_controller"] == 6, kind
        big = results["big"][kind]
        assert big["first_tasks"] and big["status_sizes"], kind
        assert not missing(big["final_status_bytes"]), kind
    # The paused queue holds every task of the burst, and none of them runs.
    vigil_burst = results["burst"]["vigil"]
    assert vigil_burst["queue_depth_final"] == 60 and vigil_burst["queue_running_max"] == 0, vigil_burst
    assert "| **throughput, tasks/s** |" in table.read_text()
    print(f"bench.arrays smoke took {time.monotonic() - began:.0f} s")


def test_pull_runs_every_scenario_and_loses_no_task(kube: Kube, tmp_path: Path) -> None:
    from bench.pull import REQUIRED

    began = time.monotonic()
    result = run_bench(
        "bench.pull",
        ["--throughput", "--in-flight", "--burst", "--faults", "--workers", "3", "--slots", "50"]
        + ["--tasks", "200", "--arrays", "2", "--parallelism", "100", "--native-tasks", "10"]
        + ["--native-parallelism", "10", "--in-flight-tasks", "150", "--in-flight-seconds", "2"]
        + ["--in-flight-rounds", "1", "--burst-arrays", "4", "--burst-tasks", "50", "--burst-over", "1"]
        + ["--fault-tasks", "150", "--fault-seconds", "2", "--fault-rounds", "2", "--fault-heartbeat", "1,4"]
        + ["--fault-worker-after", "1", "--kubeconfig", str(kube.kubeconfig), "--out", str(tmp_path)],
        timeout=deadline(300),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    (report,) = tmp_path.glob("pull-200-inflight-150-burst-4x50-faults-150-*.json")
    (table,) = tmp_path.glob("pull-*.md")
    results = json.loads(report.read_text())["results"]
    for scenario in ("throughput", "in-flight", "burst", "faults"):
        vigil = results[scenario]["vigil"]
        assert vigil["arrays_by_phase"] == {"Succeeded": vigil["arrays_acknowledged"]}, (scenario, vigil)
        assert vigil["tasks_lost"] == 0 and vigil["tasks_not_succeeded"] == 0, scenario
        assert vigil["succeeded_tasks"] == vigil["tasks"], scenario
        assert vigil["worker_requests"] > 0, scenario
    throughput = results["throughput"]
    absent = [key for key in REQUIRED if missing(throughput["vigil"].get(key))]
    if not kube.on_testbed:  # the /proc and audit-log figures need the local test bed
        absent = [k for k in absent if not any(w in k for w in ("cpu", "rss", "controller_writes"))]
    assert not absent, f"figures missing: {absent}"
    assert throughput["native"]["succeeded_tasks"] == 10 and throughput["native"]["outcome"] == "Succeeded"
    # Nothing went Uncertain or Lost, and every worker request was answered, with the leader up throughout.
    in_flight = results["in-flight"]["vigil"]
    assert in_flight["in_flight_max"] > 0 and in_flight["worker_requests_not_200"] == 0, in_flight
    assert in_flight["tasks_seen_uncertain"] == in_flight["vigil_attempts_uncertain_total"] == 0, in_flight
    burst = results["burst"]
    assert burst["vigil"]["acknowledged"] == 4 and burst["vigil"]["lost"] == 0
    assert burst["native"]["acknowledged"] == 4 and burst["native"]["lost"] == 0
    assert burst["vigil"]["queue_depth_max"] >= 0
    faults = results["faults"]["vigil"]
    assert faults["fault"]["worker_killed"] and faults["fault"]["in_flight_at_leader_kill"] > 0, faults["fault"]
    # A task may run twice only as docs/design.md allows (its worker killed, or claimed just before
    # the leader's crash): none otherwise.
    assert not missing(faults.get("tasks_run_twice")) and faults.get("twice_unexplained") == 0, faults
    assert "| **throughput, tasks/s** |" in table.read_text() and "| faults | measured |" in table.read_text()
    print(f"bench.pull smoke took {time.monotonic() - began:.0f} s")
