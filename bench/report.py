"""The report of bench.compare: the two sides of each workload side by side as markdown tables
(with the ratio Vigil / native of every figure), the API requests by verb and resource, the
profiles, and the run's setup."""

from __future__ import annotations

import math
from typing import Any

from bench.bed import POD_CAPACITY
from bench.profiles import SERVER_HANDLERS, SERVER_PROFILE_CHUNK

# --- the report ----------------------------------------------------------------------------------

ROWS = [
    ("jobs finished", "finished", "{:.0f}"),
    ("pods per job (attempts)", "pods_per_job", "{:.2f}"),
    ("makespan (first submit → last finished), s", "makespan_seconds", "{:.1f}"),
    ("throughput, jobs/s", "throughput_jobs_per_second", "{:.1f}"),
    ("submit → pod created p50, s", "submit_to_pod_p50_seconds", "{:.2f}"),
    ("submit → pod created p95, s", "submit_to_pod_p95_seconds", "{:.2f}"),
    ("submit → pod created p99, s", "submit_to_pod_p99_seconds", "{:.2f}"),
    ("submit → finished p50, s", "submit_to_finished_p50_seconds", "{:.2f}"),
    ("submit → finished p95, s", "submit_to_finished_p95_seconds", "{:.2f}"),
    ("submit → finished p99, s", "submit_to_finished_p99_seconds", "{:.2f}"),
    ("controller CPU s (operator / kube-controller-manager)", "controller_cpu_seconds", "{:.1f}"),
    ("controller peak RSS MiB (VmRSS sampled every 0.5 s)", "controller_peak_rss_mib", "{:.0f}"),
    ("kube-controller-manager CPU s (whole process)", "controller_manager_cpu_seconds", "{:.1f}"),
    ("kube-apiserver CPU s", "apiserver_cpu_seconds", "{:.1f}"),
    ("kube-apiserver peak RSS MiB", "apiserver_peak_rss_mib", "{:.0f}"),
    ("etcd CPU s", "etcd_cpu_seconds", "{:.1f}"),
    ("kube-scheduler CPU s", "scheduler_cpu_seconds", "{:.1f}"),
    ("kwok CPU s (every simulated kubelet)", "kwok_cpu_seconds", "{:.1f}"),
    ("the bench's own CPU s (submissions and watches)", "bench_cpu_seconds", "{:.1f}"),
    ("machine CPU s, every process (/proc/stat)", "machine_busy_cpu_seconds", "{:.1f}"),
    ("machine CPU busy, share of all cores over the run", "machine_busy_share", "{:.0%}"),
    ("machine CPU ms per job", "machine_cpu_ms_per_job", "{:.1f}"),
    ("API requests per job (all clients)", "api_requests_per_job", "{:.1f}"),
    ("API writes per job (POST/PUT/PATCH/DELETE)", "api_writes_per_job", "{:.1f}"),
]
# Figures every complete run has (the CI smoke checks them).
REQUIRED = [key for _, key, _ in ROWS]


# Below this share of the machine's CPU over a run, a side was not bound by the CPU.
CPU_BOUND_SHARE = 0.9


def not_cpu_bound(native: dict, vigil: dict) -> str | None:
    """A line for the report when a side kept the machine less than CPU_BOUND_SHARE busy: its
    makespan then holds waits and its throughput is not what the CPU allows, so the ratio of
    throughputs misleads and CPU per job is the figure to compare. A paced stream (`--rate`) is
    meant to leave the CPU room: there the waits are the arrivals, and latency is what to read."""
    idle = [
        f"{name} {side['machine_busy_share']:.0%}"
        for name, side in (("native", native), ("Vigil", vigil))
        if side.get("machine_busy_share", 1.0) < CPU_BOUND_SHARE
    ]
    if not idle:
        return None
    busy = f"machine busy {', '.join(idle)} over the run (below {CPU_BOUND_SHARE:.0%})"
    if rate := native.get("rate_jobs_per_second"):
        return (
            f"Not bound by the CPU, as a stream of {rate:g} jobs/s is meant to be: {busy}. Both sides waited "
            "for arrivals, so throughput follows the rate; compare latency and machine CPU per job."
        )
    return (
        f"Not bound by the CPU: {busy}. That side waited on something else (backoff, or a stall of the bed), "
        "so compare machine CPU per job rather than throughput."
    )


def fmt(value: Any, pattern: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return pattern.format(value)


def ratio(vigil: Any, native: Any) -> float:
    try:
        return vigil / native if native else math.nan
    except TypeError:
        return math.nan


def table(native: dict, vigil: dict) -> str:
    n = native["jobs"]
    lines = [
        f"| {native['workload']}, N = {n:,} | native Job controller | Vigil | Vigil / native |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, key, pattern in ROWS:
        lines.append(
            f"| {label} | {fmt(native.get(key), pattern)} | {fmt(vigil.get(key), pattern)} | "
            f"{fmt(ratio(vigil.get(key), native.get(key)), '{:.2f}')} |"
        )
    return "\n".join(lines)


def requests_table(native: dict, vigil: dict) -> str:
    """Per job, by verb and resource: requests, the API server's time serving them, and the watch
    events it encoded and sent (to every watcher) with their bytes."""
    n = native["jobs"]
    figures = [
        ("requests", "api_requests_by_verb_resource", 1.0, "{:.2f}"),
        ("server ms", "api_request_seconds_by_verb_resource", 1000.0, "{:.1f}"),
        ("watch events", "api_watch_events_by_verb_resource", 1.0, "{:.1f}"),
        ("watch KiB", "api_watch_bytes_by_verb_resource", 1 / 1024, "{:.1f}"),
    ]
    figures = [f for f in figures if f[1] in native and f[1] in vigil]  # results from before some figures
    keys = set().union(*(set(side[f[1]]) for f in figures for side in (native, vigil)))

    def per_job(side: dict, figure: str, key: str, scale: float) -> float:
        return side[figure].get(key, 0.0) * scale / n

    def weight(key: str) -> float:  # the busiest first: requests plus the server's seconds, per job
        return -sum(per_job(side, figure, key, 1.0) for side in (native, vigil) for _, figure, *_ in figures[:2])

    header = " | ".join(f"{name}: native | Vigil | V/n" for name, *_ in figures)
    lines = [
        f"| per job, {native['workload']} (verb resource) | {header} |",
        "| --- |" + " ---: |" * (3 * len(figures)),
    ]
    for k in sorted(keys, key=weight):
        cells = []
        shown = False
        for _, figure, scale, pattern in figures:
            a, b = per_job(native, figure, k, scale), per_job(vigil, figure, k, scale)
            shown = shown or max(a, b) >= 0.005
            cells += [fmt(a, pattern), fmt(b, pattern), fmt(ratio(b, a), "{:.2f}")]
        if shown:
            lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def profile_text(profile: dict) -> str:
    top = profile["top"]
    lines = [
        f"py-spy, the operator during the Vigil run ({top.get('samples', 0)} samples of working threads at "
        f"100 Hz, waits left out; stacks in {profile['file']})",
        "",
        "| # | function (self) | self | Vigil's function (anywhere in the stack) | total |",
        "| ---: | --- | ---: | --- | ---: |",
    ]
    for i, (own, inclusive) in enumerate(zip(top["self"], top["total"], strict=False), 1):
        lines.append(f"| {i} | `{own[0]}` | {own[1]:.1%} | `{inclusive[0]}` | {inclusive[1]:.1%} |")
    return "\n".join(lines)


def server_profile_text(native: dict, vigil: dict) -> str:
    """The two API server profiles side by side: CPU seconds, the top functions by cumulative share
    (where the time goes, callees included), and the CPU each kind of status write costs."""
    if "error" in native or "error" in vigil:
        return f"kube-apiserver profile: {native.get('error') or vigil.get('error')}"
    lines = [
        f"kube-apiserver CPU profile over each run, in {SERVER_PROFILE_CHUNK} s chunks ({native['seconds']:.0f} s "
        f"native, {vigil['seconds']:.0f} s Vigil; pprof files "
        f"{native['file']}, {vigil['file']}): {native.get('cpu_seconds', math.nan):.1f} CPU-s native, "
        f"{vigil.get('cpu_seconds', math.nan):.1f} CPU-s Vigil",
        "",
        "| # | native: function (cumulative) | share | Vigil: function (cumulative) | share |",
        "| ---: | --- | ---: | --- | ---: |",
    ]
    for i, (a, b) in enumerate(zip(native["cum"], vigil["cum"], strict=False), 1):
        lines.append(f"| {i} | `{a[0]}` | {a[1]:.1%} | `{b[0]}` | {b[1]:.1%} |")
    lines += ["", "| side | request (its handler, the etcd round trip included) | CPU-s | requests | CPU ms each |"]
    lines.append("| --- | --- | ---: | ---: | ---: |")
    for name, side in (("native", native), ("Vigil", vigil)):
        for request, seconds in side["handlers"].items():
            count = side.get("requests", {}).get(request, 0)
            handler = SERVER_HANDLERS[request].rsplit("/", 1)[-1]
            each = fmt(seconds * 1000 / count if count else math.nan, "{:.2f}")
            lines.append(f"| {name} | {request} (`{handler}`) | {seconds:.2f} | {count:.0f} | {each} |")
    return "\n".join(lines)


def setup_text(meta: dict) -> str:
    return "\n".join(
        [
            f"- when: {meta['started']} (UTC); commit {meta['commit']}; {meta['machine']}",
            f"- cluster: {meta['cluster']}; Kubernetes {meta['kubernetes']}; {meta['nodes']} kwok nodes "
            f"({POD_CAPACITY} pods each)",
            f"- baseline: kube-controller-manager {meta['kcm_flags']}",
            f"- Vigil: `vigil operator {meta.get('operator_args') or '(defaults)'}`",
            f"- load average at start: {meta['loadavg']}",
            "- each side ran alone (one after the other, each in its own namespace, deleted and gone before the "
            "next run): apiserver_request_total has no client label, so its delta is every client's requests "
            "during the run (the bench's submissions and watches, kube-scheduler, kwok, kube-controller-manager, "
            "and the operator on the Vigil side)",
            "- every pod: kwok's vigil-sim stages, run-for 1s (finish-at has whole seconds, so 0-1 s of "
            "running), annotation exit-code '0' (fail-twice: '1,1,0' for 30% of jobs, i.e. exit 1 on attempts "
            "1 and 2); native fail-twice Jobs are Indexed with completions 1 and backoffLimitPerIndex 2, their "
            "attempt read by kwok from batch.kubernetes.io/job-index-failure-count; VigilJobs: "
            "heartbeat.required false, fail-twice retry maxAttempts 3 with the Job controller's backoff "
            "(10 s doubling, no jitter); queued: VigilJobs through a VigilQueue with maxRunning = N against "
            "plain Jobs (no queue in the native controller without Kueue)",
            f"- submissions: {pace_text(meta.get('rate'), meta.get('threads', 8))}",
            "- times on the bench's monotonic clock: submit = just before the create request; pod "
            "created = the first pod's ADDED event on one pod watch; finished = the job's first event with "
            "Complete/Failed (Job) or phase Succeeded/DeadLettered (VigilJob) on one job watch",
            "- CPU: utime+stime delta from /proc over the run (first submit → last finished); RSS: VmRSS sampled "
            "every 0.5 s, max over the run; the operator is started (and ready) before the run, so its start-up "
            "is not counted",
        ]
    )


def pace_text(rate: float | None, threads: int) -> str:
    if not rate:
        return f"all at once, by {threads} client threads (a burst: both sides are bound by the machine's CPU)"
    return (
        f"a steady stream of {rate:g} jobs/s (job i due i/{rate:g} s after the first, open loop), by "
        f"{threads} client threads"
    )


def no_nan(value: Any) -> Any:
    """JSON has no NaN: a missing figure is null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: no_nan(v) for k, v in value.items()}
    return value
