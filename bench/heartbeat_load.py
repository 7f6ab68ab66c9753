"""Heartbeat load: M attempts held Running, each beating every 10 s through the agent's own code.

    .venv/bin/python -m bench.heartbeat_load --attempts 1000 --seconds 120

Starts `vigil operator` (with --metrics-address and --health-address) for a fresh namespace,
submits M VigilJobs whose pods run until deleted (kwok), and, as each pod becomes Running,
starts beating for it: every `--interval` seconds (the agent's own +-10% jitter), the agent's
`Heart.beat()` (vigil.agent.heart), which patches the pod's `vigil.dev/heartbeat` annotation
through `PodHeartbeat.patch`, exactly the call `vigil-agent` makes. The agents run in-process on
a thread pool (`--workers`) with the admin kubeconfig instead of M processes with their pods'
service-account tokens. After every attempt beats, it measures for `--seconds`:

- the operator's CPU seconds per 1,000 beats (utime + stime from /proc) and its peak RSS;
- event-loop lag, from outside: the round trip of GET /healthz (served on the operator's event
  loop) every 0.25 s, p50/p99/max. The operator has no lag gauge; a blocked loop shows here;
- that no attempt became Uncertain falsely: vigil_attempts_uncertain_total from the operator's
  /metrics, the VigilJobs' phases and HeartbeatHealthy conditions at the end, against the
  largest gap between two renewals of one pod the agents themselves saw (a gap under the
  detector's Uncertain threshold, `liveness.thresholds`, makes any Uncertain a false one);
- what the control plane paid: kube-apiserver's and etcd's CPU (cores), and the API server's
  own latency for PATCH pods (apiserver_request_duration_seconds, p50/p99 from its buckets), so
  that a saturated API server or etcd shows in their figures rather than in a claim.

Channels (`--channel`, issue 26): `annotation` is the above; `leader` POSTs each beat to the
operator's /v1/heartbeat (served on its beat HTTPS server, self-signed here, started with
--beat-address and --heartbeat-url) through the agent's own `LeaderBeat`, with a projected
token per pod from TokenRequest (audience vigil.dev, bound to the pod, written to a file the
agent re-reads on every beat), falling back to the patch as the agent does. It adds the posts
by outcome (vigil_heartbeat_posts_total), the agents' fallbacks, the POST's latency as the
agents saw it (p50/p99), and for both channels the PATCH pods requests the API server served in
the window. `both` (the default) runs the annotation and then the leader channel, each with a
fresh namespace and operator on the same bed, and prints them side by side.

The achieved beat rate is printed beside the intended one (M / interval): on a small machine the
client side may not keep up, and then the figures are for the rate achieved.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import copy
import heapq
import json
import math
import os
import queue
import random
import resource
import shlex
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import urllib3  # noqa: E402
from kubernetes import client, config  # noqa: E402

from bench.compare import LABEL as METRIC_LABEL  # noqa: E402
from bench.compare import (  # noqa: E402
    Api,
    Operator,
    Profiler,
    Sampler,
    Watch,
    cpu_seconds,
    create_namespace,
    delete_namespace,
    free_port,
    install_crds,
    log,
    nodes_for,
    own_cluster,
    percentile,
    pod_spec,
    py_spy,
    release_vigil_pods,
    testbed_of,
)
from testbed import cluster as testbed  # noqa: E402
from vigil.agent.channel import LeaderAnswer, LeaderBeat  # noqa: E402
from vigil.agent.heart import Heart, PodHeartbeat, Settings  # noqa: E402
from vigil.api import Heartbeat  # noqa: E402
from vigil.core import fencing  # noqa: E402
from vigil.core.fencing import leader_timeout, request_timeout  # noqa: E402
from vigil.core.liveness import stamp_floor, stamp_period, thresholds  # noqa: E402
from vigil.servers.beats import OUTCOMES  # noqa: E402
from vigil.servers.webhook import make_self_signed  # noqa: E402

JOB_LABEL = "bench.vigil.dev/heartbeat-load"
JOB_ACCOUNT = "vigil-job"
BEAT_AUDIENCE = "vigil.dev"
# Every agent of the bench beats from 127.0.0.1, where pods would have an address each.
BENCH_PER_SOURCE = 65_536


class TimedLeader(LeaderBeat):
    """The agent's LeaderBeat, timing each POST as the agent saw it and counting fallbacks.

    A pod's agent beats from one thread over one keep-alive connection; here each pod is pinned
    to one worker thread (`Agents.slot`), so there is still one connection per pod, as M agents
    would hold against the operator."""

    def __init__(self, owner: Agents, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.owner = owner

    def post(self, beat: str) -> LeaderAnswer:
        began = time.monotonic()
        answer = super().post(beat)
        took = time.monotonic() - began
        with self.owner.lock:
            self.owner.post_latency.append(took)
            if answer.observed is None:
                self.owner.fallbacks += 1
                self.owner.fallback_why[answer.why[:60]] = self.owner.fallback_why.get(answer.why[:60], 0) + 1
        return answer


def allow_open_files(needed: int) -> None:
    """Raises this process's open-file limit to `needed` (the operator it starts inherits it): on
    the leader channel each of the M agents holds a connection, and the operator one per agent."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, max(hard, needed)))
    except (ValueError, OSError) as err:
        log(f"cannot raise the open-file limit from {soft} to {needed} ({err}): the run may fail with EMFILE")


def grant_heartbeat_rbac(namespace: str) -> None:
    """The job ServiceAccount with docs/heartbeat-rbac.md's Role (patch pods), as the e2e tests make it."""
    core = client.CoreV1Api()
    core.create_namespaced_service_account(namespace, {"metadata": {"name": JOB_ACCOUNT}})
    rbac = client.RbacAuthorizationV1Api()
    name = f"{JOB_ACCOUNT}-heartbeat"
    rbac.create_namespaced_role(
        namespace,
        {"metadata": {"name": name}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}]},
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": JOB_ACCOUNT, "namespace": namespace}],
        },
    )


def pod_token(namespace: str, pod: str, uid: str) -> str:
    """A projected token of the job account bound to the pod, audience vigil.dev (as the kubelet mounts it)."""
    bound = client.V1BoundObjectReference(kind="Pod", api_version="v1", name=pod, uid=uid)
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[BEAT_AUDIENCE], expiration_seconds=3600, bound_object_ref=bound)
    )
    return client.CoreV1Api().create_namespaced_service_account_token(JOB_ACCOUNT, namespace, request).status.token


def histogram(api: Api, name: str, match: dict[str, str]) -> dict[float, float]:
    """Cumulative bucket counts of a histogram on the API server's /metrics, summed over the
    series whose labels include `match`."""
    buckets: dict[float, float] = {}
    prefix = name + "_bucket{"
    for line in api.get("/metrics").decode().splitlines():
        if not line.startswith(prefix):
            continue
        labels_part, _, value = line.rpartition(" ")
        labels = dict(METRIC_LABEL.findall(labels_part))
        if all(labels.get(k) == v for k, v in match.items()):
            le = math.inf if labels["le"] == "+Inf" else float(labels["le"])
            buckets[le] = buckets.get(le, 0.0) + float(value)
    return buckets


def status_writes(api: Api) -> float:
    """The VigilJob status writes (PATCH or PUT of vigiljobs/status) the API server has served."""
    return sum(
        histogram(
            api, "apiserver_request_duration_seconds", {"verb": verb, "resource": "vigiljobs", "subresource": "status"}
        ).get(math.inf, 0.0)
        for verb in ("PATCH", "PUT")
    )


def bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """The q-quantile of the observations between two scrapes, as Prometheus' histogram_quantile
    estimates it (linear within the bucket)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0
    if not total:
        return math.nan
    rank, lower, below = q * total, 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * ((rank - below) / max(count - below, 1e-9))
        lower, below = bound, count
    return lower


class Agents:
    """M agents' heartbeat loops on one scheduler thread and a pool of workers."""

    leader_class: type[TimedLeader] = TimedLeader

    def __init__(
        self,
        namespace: str,
        interval: float,
        timeout: float,
        workers: int,
        kubeconfig: Path,
        leader: tuple[str, str, Path] | None = None,
    ):
        # The agent loads $KUBECONFIG, which the kubernetes client reads once, when imported.
        os.environ["KUBECONFIG"] = str(kubeconfig)
        config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(kubeconfig)
        # The agent's own client; each worker thread has its own connection (PodHeartbeat keeps one
        # per thread), so the pool holds as many as there are workers.
        self.base = PodHeartbeat(Settings(pod_name="-", namespace=namespace), timeout=fencing.request_timeout(timeout))
        self.namespace, self.interval, self.timeout = namespace, interval, timeout
        # A pod's beats always go through the same worker (see TimedLeader); a pool for the rest.
        self.workers = [concurrent.futures.ThreadPoolExecutor(1) for _ in range(workers)]
        self.slot: dict[str, int] = {}
        self.pool = concurrent.futures.ThreadPoolExecutor(workers)
        self.due: list[tuple[float, str]] = []
        self.hearts: dict[str, Heart] = {}
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.halt = threading.Event()
        self.events: queue.Queue = queue.Queue()
        self.beats = 0
        self.renewed = 0
        self.errors: dict[str, int] = {}
        self.leader = leader  # (url, CA PEM, token directory) for the leader channel
        self.post_latency: list[float] = []
        self.fallbacks = 0
        self.fallback_why: dict[str, int] = {}
        self.channels: list[LeaderBeat] = []
        self.lateness: list[float] = []  # seconds a beat started after it was due (the bench's own lag)
        self.last_renewal: dict[str, float] = {}
        self.max_gap = 0.0
        self.hold_from, self.hold_seconds = math.inf, 0.0  # see hold()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def add(self, pod: str, uid: str = "") -> None:
        if self.leader is None:
            self._add(pod, uid)
        else:  # a TokenRequest per pod: on the pool, not on the watch's thread
            self.pool.submit(self._add, pod, uid)

    def _add(self, pod: str, uid: str) -> None:
        with self.lock:
            if pod in self.hearts:
                return
        settings = Settings(pod_name=pod, namespace=self.namespace, interval=self.interval, timeout=self.timeout)
        channel = None
        if self.leader is not None:
            url, ca, tokens = self.leader
            token_file = tokens / pod
            token_file.write_text(pod_token(self.namespace, pod, uid))
            channel = self.leader_class(
                self,
                url,
                ca,
                str(token_file),
                namespace=self.namespace,
                name=pod,
                uid=uid,
                timeout=leader_timeout(request_timeout(self.timeout), self.interval),
            )
        with self.lock:
            if pod in self.hearts:
                return
            beat_client = copy.copy(self.base)
            beat_client.settings = settings
            checkpoint = Path("/nonexistent/vigil-bench-checkpoint")
            self.hearts[pod] = Heart(settings, beat_client, checkpoint, self.events, channel)
            self.slot[pod] = len(self.slot) % len(self.workers)
            if channel is not None:
                self.channels.append(channel)
            heapq.heappush(self.due, (time.monotonic() + random.uniform(0, 2), pod))
        self.wake.set()

    def run(self) -> None:
        while not self.halt.is_set():
            with self.lock:
                now = time.monotonic()
                ready = []
                while self.due and self.due[0][0] <= now:
                    ready.append(heapq.heappop(self.due))
                wait = (self.due[0][0] - now) if self.due else 1.0
            for due, pod in ready:
                self.workers[self.slot[pod]].submit(self.beat, pod, due)
            self.wake.wait(min(max(wait, 0.001), 1.0))
            self.wake.clear()

    def hold(self, seconds: float) -> float:
        """No beat starts for `seconds`: every agent's next beat moves that much later (their
        spread kept, so no burst when they resume); a beat already in flight ends and its next is
        moved too. Returns when the hold began (monotonic)."""
        with self.lock:
            self.hold_from, self.hold_seconds = time.monotonic(), seconds
            self.due = [(due + seconds, pod) for due, pod in self.due]
            heapq.heapify(self.due)
            return self.hold_from

    def beat(self, pod: str, due: float) -> None:
        if self.halt.is_set():
            return
        began = time.monotonic()
        heart = self.hearts[pod]
        try:
            observed = heart.beat()  # the agent's own beat: LeaderBeat.post, or PodHeartbeat.patch
        except Exception:  # as Heart.run does: a failed beat is an API error
            observed = fencing.Observed.API_ERROR
        ended = time.monotonic()
        if observed is fencing.Observed.RENEWED:
            delay = fencing.next_beat_delay(self.interval, random.random())
        else:
            delay = fencing.retry_delay(heart.failures, self.interval, self.timeout, random.random())
        with self.lock:
            self.beats += 1
            self.lateness.append(began - due)
            if observed is fencing.Observed.RENEWED:
                self.renewed += 1
                if pod in self.last_renewal:
                    self.max_gap = max(self.max_gap, ended - self.last_renewal[pod])
                self.last_renewal[pod] = ended
            else:
                self.errors[observed.value] = self.errors.get(observed.value, 0) + 1
            if began < self.hold_from <= ended:  # in flight as the hold began: its next beat waits too
                delay += self.hold_seconds
            heapq.heappush(self.due, (began + delay, pod))
        self.wake.set()

    def stop(self) -> None:
        self.halt.set()
        self.wake.set()
        self.pool.shutdown(wait=True, cancel_futures=True)
        for worker in self.workers:
            worker.shutdown(wait=True, cancel_futures=True)
        self.base.close()  # every worker thread's client: no beat is in flight any more
        for channel in self.channels:
            with contextlib.suppress(Exception):
                channel.close()


class LoopProbe(threading.Thread):
    """Round trips of GET /healthz on the operator every 0.25 s: its event loop's lag, from outside."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/healthz"
        self.http = urllib3.PoolManager()
        self.samples: list[float] = []
        self.failures = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            began = time.monotonic()
            try:
                self.http.request("GET", self.url, timeout=30, retries=False)
                self.samples.append(time.monotonic() - began)
            except urllib3.exceptions.HTTPError:
                self.failures += 1
            self.halt.wait(0.25)

    def stop(self) -> list[float]:
        self.halt.set()
        self.join()
        return self.samples


def wait_until_settled(operator: Operator, attempts: int, quiet: float, deadline: float) -> float | None:
    """Waits until the operator has made no reconcile for `quiet` seconds, or has held all
    `attempts` jobs Running for `quiet` seconds (both also mean every agent has beaten once: a
    quiet longer than the interval); returns the seconds waited, or None when `deadline` passed
    first (a control plane that cannot carry the beats keeps attempts flapping, and then the
    window measures that).

    Starting M attempts costs the operator more than beating does (each job's Running write),
    and a window that opens while it still works on them charges that to the beats. Once
    settled, the only reconciles a beat brings are the LAST-BEAT stamps, each job's once per
    stamp period, which the default window spans. With many attempts the stamps of the first
    jobs come due before the last ones have started (at M = 10,000 starting takes longer than a
    stamp period), so the operator is never quiet: then every job Running is the steady state.
    """
    reconciles, running = "controller_runtime_reconcile_total", 'vigil_jobs{phase="Running"}'
    began = time.monotonic()
    last, changed = operator.metric(reconciles), began
    all_running_since = None
    while time.monotonic() - min(changed, all_running_since or math.inf) < quiet:
        if time.monotonic() - began > deadline:
            return None
        time.sleep(0.5)  # poll step, within the deadline above
        seen = operator.metrics(reconciles, running)
        if seen[reconciles] != last:
            last, changed = seen[reconciles], time.monotonic()
        if seen[running] < attempts:
            all_running_since = None
        elif all_running_since is None:
            all_running_since = time.monotonic()
    return time.monotonic() - began


# The operator's own readings of what held its loop, counted over the window.
LAG_COUNT = "vigil_event_loop_lag_seconds_count"
LAG_QUARTER = 'vigil_event_loop_lag_seconds_bucket{le="0.25"}'
FULL_COUNT = 'vigil_gc_pause_seconds_count{generation="2"}'
FULL_SUM = 'vigil_gc_pause_seconds_sum{generation="2"}'
GC_QUARTERS = [
    (
        f'vigil_gc_pause_seconds_count{{generation="{g}"}}',
        f'vigil_gc_pause_seconds_bucket{{generation="{g}",le="0.25"}}',
    )
    for g in "012"
]
STALL_SAMPLES = [LAG_COUNT, LAG_QUARTER, FULL_COUNT, FULL_SUM, *(name for pair in GC_QUARTERS for name in pair)]
QUIET_DRAIN_SECONDS = 0.5  # for the beats in flight as a hold begins to be answered


def quiet_seconds_allowed(heartbeat: Heartbeat, interval: float, slack: float = 5.0) -> float:
    """The longest hold of every agent that keeps each pod's silence under the detector's
    Uncertain threshold: the threshold, less one interval with the agent's +10% jitter, less
    `slack` seconds for the bench's own lateness in starting a beat."""
    uncertain_after, _lost_after = thresholds(heartbeat)
    return max(0.0, uncertain_after - 1.1 * interval - slack)


def quiet_window(agents: Agents, pids: dict[str, int], seconds: float) -> dict[str, float]:
    """Each process's CPU (cores) over a hold of every agent: what holding the M attempts
    costs with no beat arriving, so that the window's figures less these are what the beats
    cost. The hold is short enough that no attempt becomes Uncertain (quiet_seconds_allowed)."""
    agents.hold(seconds)
    time.sleep(QUIET_DRAIN_SECONDS)  # the beats in flight as it began are answered
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    began = time.monotonic()
    time.sleep(seconds - QUIET_DRAIN_SECONDS)
    took = time.monotonic() - began
    return {name: (cpu_seconds(pid) - before[name]) / took for name, pid in pids.items()}


def vigil_job(i: int, interval: float, timeout: float, grace: float, account: str = "") -> dict:
    spec = pod_spec()
    if account:
        spec["serviceAccountName"] = account
    return {
        "apiVersion": "vigil.dev/v1beta1",
        "kind": "VigilJob",
        "metadata": {"name": f"beat-{i}", "labels": {JOB_LABEL: "true"}},
        "spec": {
            "template": {"spec": spec},  # no sim annotations: the pod runs until deleted
            "heartbeat": {
                "intervalSeconds": int(interval),
                "timeoutSeconds": int(timeout),
                "startupGraceSeconds": grace,
            },
        },
    }


def heartbeat_of(args: argparse.Namespace) -> Heartbeat:
    """The heartbeat spec the bench's jobs run with, as the operator reads it."""
    return Heartbeat.model_validate({"intervalSeconds": int(args.interval), "timeoutSeconds": int(args.timeout)})


def falsely_uncertain(uncertain_total: float, max_gap: float, heartbeat: Heartbeat) -> bool:
    """Whether attempts became Uncertain although no pod went silent for long enough: every gap
    between two renewals was under the silence after which the detector says Uncertain. A gap past
    it (a client or an API server that cannot carry the beats) makes Uncertain the right verdict."""
    uncertain_after, _lost_after = thresholds(heartbeat)
    return uncertain_total > 0 and max_gap < uncertain_after


def report(result: dict, args: argparse.Namespace, max_gap: float) -> int:
    """Prints the figures (and writes them as JSON with --out); 1 when an attempt became Uncertain falsely."""
    m, window = result["attempts"], result["window_seconds"]
    print(f"## Heartbeat load, M = {m:,} attempts beating every {args.interval:.0f} s ({window:.0f} s measured)\n")
    if not result["settled"]:
        print("Not settled: the window opened while the operator still reconciled and not every job was Running.\n")
    print("| figure | value |\n| --- | ---: |")
    for key, value in result.items():
        if key == "profile":
            continue
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        print(f"| {key} | {shown} |")
    if profile := result.get("profile"):
        print(
            f"\npy-spy over the window ({profile.get('samples', 0)} samples of working threads; {profile['stacks']})\n"
        )
        print("| # | function (self) | self | Vigil's function (anywhere in the stack) | total |")
        print("| ---: | --- | ---: | --- | ---: |")
        rows = max(len(profile["self"]), len(profile["total"]))
        for n in range(rows):
            own = profile["self"][n] if n < len(profile["self"]) else ("", 0.0)
            inc = profile["total"][n] if n < len(profile["total"]) else ("", 0.0)
            print(f"| {n + 1} | `{own[0]}` | {own[1]:.1%} | `{inc[0]}` | {inc[1]:.1%} |")
    heartbeat = heartbeat_of(args)
    false_uncertain = falsely_uncertain(result["vigil_attempts_uncertain_total_since_start"], max_gap, heartbeat)
    uncertain_after, lost_after = thresholds(heartbeat)
    print(
        f"\nfalse Uncertain: {'YES' if false_uncertain else 'none'} (largest gap between renewals "
        f"{max_gap:.1f} s; Uncertain after {uncertain_after:.0f} s of silence, Lost after {lost_after:.0f} s)"
    )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        path = args.out / f"heartbeat-{result.get('channel', '')}-{m}-{stamp}.json"
        clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in result.items()}
        path.write_text(json.dumps(clean, indent=1) + "\n")
        log(f"wrote {path}")
    return 1 if false_uncertain else 0


SIDE_BY_SIDE = (
    "beats_intended_per_second", "beats_per_second", "beats_renewed", "beat_errors", "beats_seen_by_operator",
    "posts_counted", "leader_fallbacks_to_annotation", "apiserver_patch_pods_requests_in_window",
    "apiserver_vigiljob_status_writes_in_window",
    "leader_post_p50_seconds", "leader_post_p99_seconds", "apiserver_patch_pods_p50_seconds",
    "apiserver_patch_pods_p99_seconds", "operator_cpu_seconds_per_1000_beats", "operator_cpu_cores",
    "operator_cpu_seconds_per_1000_beats_for_beats", "quiet_operator_cpu_cores",
    "operator_peak_rss_mib", "event_loop_lag_healthz_p50_seconds", "event_loop_lag_healthz_p99_seconds",
    "event_loop_lag_healthz_max_seconds", "event_loop_lag_inside_over_quarter_second", "gc_full_collections",
    "gc_full_collection_mean_seconds", "gc_pauses_over_quarter_second",
    "apiserver_cpu_cores", "quiet_apiserver_cpu_cores", "apiserver_cpu_cores_for_beats", "etcd_cpu_cores",
    "vigil_attempts_uncertain_total", "max_gap_between_renewals_seconds",
    "false_uncertain", "settled",
)  # fmt: skip


def side_by_side(results: dict[str, dict], args: argparse.Namespace) -> None:
    """The channels' figures in one table (and in one JSON file with --out)."""
    names = list(results)
    m = args.attempts
    print(f"\n## Heartbeat channels side by side, M = {m:,} every {args.interval:.0f} s\n")
    print("| figure | " + " | ".join(names) + " |\n| --- |" + " ---: |" * len(names))
    for key in SIDE_BY_SIDE:
        cells = []
        for name in names:
            value = results[name].get(key, "")
            cells.append(f"{value:.3f}" if isinstance(value, float) else str(value))
        print(f"| {key} | " + " | ".join(cells) + " |")
    if args.out:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        path = args.out / f"heartbeat-both-{m}-{stamp}.json"
        clean = {
            n: {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for n, r in results.items()
        }
        path.write_text(json.dumps(clean, indent=1) + "\n")
        log(f"wrote {path}")


def cleanup(api: Api, namespace: str, m: int) -> None:
    """Deletes the jobs first (their pods go with them, and the operator starts no new attempt for
    a pod the namespace's deletion took), then the namespace; a slow cleanup is reported, not fatal."""
    try:
        with contextlib.suppress(client.ApiException):  # a 504 on many jobs: the server deletes on
            api.custom.delete_collection_namespaced_custom_object("vigil.dev", "v1beta1", namespace, "vigiljobs")
        delete_namespace(api, namespace, timeout=max(300, m / 2))
    except (SystemExit, Exception) as err:  # a saturated API server drops connections too
        log(f"warning: cleanup of {namespace} unfinished: {err}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.heartbeat_load", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--attempts", "-m", type=int, default=200, help="M: attempts held Running (default 200)")
    parser.add_argument("--interval", type=float, default=10, help="seconds between beats of one agent (default 10)")
    parser.add_argument("--timeout", type=float, default=60, help="heartbeat.timeoutSeconds (default 60)")
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="the measured window (default: one LAST-BEAT stamp period, max(300, timeout/2, M/10) s, so "
        "the status writes of the stamps count at their steady rate: a shorter window may hold none)",
    )
    parser.add_argument(
        "--settle-seconds",
        type=float,
        default=None,
        help="how long to wait for a steady state before the window (default max(300, M/2)); past it the "
        "window is measured anyway and the figures say settled: False",
    )
    parser.add_argument(
        "--channel",
        choices=("leader", "annotation", "both"),
        default="both",
        help="beat by the pod's annotation, POST to the leader, or both one after the other (default both)",
    )
    parser.add_argument(
        "--quiet-seconds",
        type=float,
        default=None,
        help="before the window, hold every agent this long and measure each process's CPU with no beat "
        "arriving, to say what the beats themselves cost (0: no hold; at most, and by default up to 10, the "
        "detector's Uncertain threshold less 1.1 intervals and 5 s)",
    )
    parser.add_argument("--workers", type=int, default=16, help="threads that make the agents' patches (default 16)")
    parser.add_argument("--threads", type=int, default=8, help="client threads that submit the jobs (default 8)")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    parser.add_argument("--kubeconfig", type=Path, help="run against this cluster instead of the bench's own")
    parser.add_argument("--use-existing-cluster", action="store_true", help="run against $KUBECONFIG")
    parser.add_argument("--name", default="bench")
    parser.add_argument("--port-base", type=int, default=27443)
    parser.add_argument(
        "--profile", action="store_true", help="sample the operator with py-spy over the window (the bench extra)"
    )
    parser.add_argument(
        "--operator-args",
        default="",
        help="more arguments for `vigil operator`, e.g. '--pod-watch-pace 0' (default none)",
    )
    args = parser.parse_args(argv)
    m = args.attempts
    allowed = quiet_seconds_allowed(heartbeat_of(args), args.interval)
    if args.quiet_seconds is None:
        args.quiet_seconds = min(10.0, allowed)
    if not 0 <= args.quiet_seconds <= allowed:
        parser.error(
            f"--quiet-seconds {args.quiet_seconds:g}: at most {allowed:g} with --interval {args.interval:g} and "
            f"--timeout {args.timeout:g}, or the hold itself would make attempts Uncertain (0 for no hold)"
        )
    if args.profile:
        py_spy()
    if args.settle_seconds is None:
        args.settle_seconds = max(300.0, m / 2)
    if args.seconds is None:
        args.seconds = stamp_period(heartbeat_of(args), stamp_floor(m))

    kubeconfig = args.kubeconfig
    if args.use_existing_cluster and not kubeconfig:
        kubeconfig = Path(os.environ["KUBECONFIG"])
    if kubeconfig:
        cluster = testbed_of(kubeconfig)
        if cluster:
            testbed.create_nodes(cluster, nodes_for(m))
    else:
        cluster = own_cluster(args.name, args.port_base, nodes_for(m), needs_bench_stages=False)
        kubeconfig = cluster.kubeconfig
    api = Api(kubeconfig, args.threads)
    install_crds(api)
    config.load_kube_config(str(kubeconfig))
    channels = ["annotation", "leader"] if args.channel == "both" else [args.channel]
    if "leader" in channels:
        allow_open_files(args.attempts + 4096)
    results = {}
    code = 0
    for channel in channels:
        result, one = run_channel(args, api, cluster, kubeconfig, channel)
        results[channel] = result
        code |= one
    if len(results) > 1:
        side_by_side(results, args)
    return code


def start_attempts(api: Api, namespace: str, agents: Agents, args: argparse.Namespace, account: str) -> None:
    """Submits `args.attempts` jobs whose pods run until deleted, and hands each pod to the agents
    as it becomes Running; returns once all are (SystemExit past their startup grace)."""
    m = args.attempts
    running: set[str] = set()

    def on_pod(kind: str, pod: dict, now: float) -> None:
        name = pod["metadata"]["name"]
        if (pod.get("status") or {}).get("phase") == "Running" and name not in running:
            running.add(name)
            agents.add(name, pod["metadata"].get("uid", ""))

    pods = Watch(api, f"/api/v1/namespaces/{namespace}/pods", on_pod)
    pods.start()
    pods.ready.wait(30)
    grace = int(max(120, m / 5))  # every attempt beats before its startup grace runs out
    began = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(args.threads) as pool:
        list(
            pool.map(
                lambda i: api.custom.create_namespaced_custom_object(
                    "vigil.dev",
                    "v1beta1",
                    namespace,
                    "vigiljobs",
                    vigil_job(i, args.interval, args.timeout, grace, account),
                    _preload_content=False,
                ),
                range(m),
            )
        )
    try:
        while len(running) < m:
            if pods.error:
                raise pods.error
            if time.monotonic() - began > grace:
                raise SystemExit(f"only {len(running)} of {m} pods Running after {grace} s")
            time.sleep(0.5)  # poll step, within the grace above
    finally:
        pods.stop()


def run_channel(args: argparse.Namespace, api: Api, cluster, kubeconfig: Path, channel: str) -> tuple[dict, int]:
    """One channel's run: a fresh namespace and operator, M jobs, the window; (figures, exit code)."""
    m = args.attempts
    namespace = f"bench-beat-{uuid.uuid4().hex[:4]}"
    create_namespace(api, namespace)
    workdir = Path(tempfile.mkdtemp(prefix="vigil-bench-beat-"))
    extra = tuple(shlex.split(args.operator_args))
    leader = None
    if channel == "leader":
        grant_heartbeat_rbac(namespace)
        certs = workdir / "certs"
        make_self_signed(certs)
        port = free_port()
        url = f"https://127.0.0.1:{port}/v1/heartbeat"
        extra += (
            "--beat-address", f"127.0.0.1:{port}",
            "--beat-cert-file", str(certs / "tls.crt"),
            "--beat-key-file", str(certs / "tls.key"),
            "--beat-connections-per-source", str(BENCH_PER_SOURCE),
            "--heartbeat-url", url,
            "--heartbeat-ca-file", str(certs / "ca.crt"),
        )  # fmt: skip
        tokens = workdir / "tokens"
        tokens.mkdir()
        leader = (url, (certs / "ca.crt").read_text(), tokens)
    operator = Operator(kubeconfig, namespace, workdir / "operator.log", extra)
    agents = probe = None
    log(f"{channel} channel: {m} attempts in {namespace}; operator log {operator.log_path}")
    try:
        operator.wait_ready()
        agents = Agents(namespace, args.interval, args.timeout, args.workers, kubeconfig, leader)
        began = time.monotonic()
        start_attempts(api, namespace, agents, args, JOB_ACCOUNT if leader else "")
        log(f"all {m} pods Running and beating after {time.monotonic() - began:.0f} s; letting the operator settle")
        settled = wait_until_settled(operator, m, quiet=args.interval + 2, deadline=args.settle_seconds)
        if settled is None:
            log(
                f"warning: not settled after {args.settle_seconds:.0f} s (the operator still reconciles and not "
                "every job is Running); measuring anyway: see the control plane's figures"
            )
        else:
            quiet = args.interval + 2
            log(f"settled after {settled:.0f} s more (no reconcile, or every job Running, for {quiet:.0f} s)")

        pids = {"operator": operator.pid}
        if cluster:
            for component in ("kube-apiserver", "etcd"):
                if pid := testbed.running_pid(cluster, component):
                    pids[component] = pid
        quiet: dict[str, float] = {}
        if args.quiet_seconds > QUIET_DRAIN_SECONDS:
            log(f"holding every agent for {args.quiet_seconds:g} s: the processes' CPU with no beat arriving")
            quiet = quiet_window(agents, pids, args.quiet_seconds)
            time.sleep(1.1 * args.interval)  # the beats resume at their pace before the window opens
        sampler = Sampler(pids)
        probe = LoopProbe(operator.health_port)
        patch_match = {"verb": "PATCH", "resource": "pods", "subresource": ""}
        hist_before = histogram(api, "apiserver_request_duration_seconds", patch_match)
        # Writes of vigiljobs/status: once every job runs, the LAST-BEAT stamps are most of them.
        status_before = status_writes(api)
        uncertain_before = operator.metric("vigil_attempts_uncertain_total")
        seen_before = operator.metric("vigil_heartbeats_total")
        reconciles_before = operator.metric("controller_runtime_reconcile_total")
        post_names = [f'vigil_heartbeat_posts_total{{outcome="{o}"}}' for o in OUTCOMES]
        posts_before = operator.metrics(*post_names)
        stalls_before = operator.metrics(*STALL_SAMPLES)
        with agents.lock:
            beats_before, renewed_before, fallbacks_before = agents.beats, agents.renewed, agents.fallbacks
            agents.lateness.clear()
            agents.post_latency.clear()
        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        window_began = time.monotonic()
        sampler.start()
        probe.start()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        profiler = (
            Profiler(
                operator.proc.pid, (args.out or Path(tempfile.gettempdir())) / f"heartbeat-{m}-{stamp}-profile.txt"
            )
            if args.profile
            else None
        )
        log(f"measuring for {args.seconds:.0f} s")
        time.sleep(args.seconds)
        cpu_after = {name: cpu_seconds(pid) for name, pid in pids.items()}
        window = time.monotonic() - window_began
        with agents.lock:
            beats = agents.beats - beats_before
            renewed = agents.renewed - renewed_before
            lateness = list(agents.lateness)
            post_latency = list(agents.post_latency)
            fallbacks = agents.fallbacks - fallbacks_before
        peak = sampler.stop()
        if profiler is not None:
            profiler.stop()
        lags = probe.stop()
        hist_after = histogram(api, "apiserver_request_duration_seconds", patch_match)
        status_after = status_writes(api)
        posts_after = operator.metrics(*post_names)
        stalls_after = operator.metrics(*STALL_SAMPLES)
        stalls = {name: stalls_after[name] - stalls_before[name] for name in STALL_SAMPLES}
        seen = operator.metric("vigil_heartbeats_total") - seen_before
        reconciles = operator.metric("controller_runtime_reconcile_total") - reconciles_before
        uncertain_total = operator.metric("vigil_attempts_uncertain_total")
        jobs = api.custom.list_namespaced_custom_object("vigil.dev", "v1beta1", namespace, "vigiljobs")["items"]
        phases: dict[str, int] = {}
        unhealthy = 0
        for job in jobs:
            status = job.get("status") or {}
            phases[status.get("phase") or "New"] = phases.get(status.get("phase") or "New", 0) + 1
            for cond in status.get("conditions") or []:
                if cond.get("type") == "HeartbeatHealthy" and cond.get("status") != "True":
                    unhealthy += 1
        operator_cpu = cpu_after["operator"] - cpu_before["operator"]
        patch_pods = hist_after.get(math.inf, 0.0) - hist_before.get(math.inf, 0.0)
        result = {
            "channel": channel,
            "attempts": m,
            "operator_args": args.operator_args,
            "interval_seconds": args.interval,
            "window_seconds": window,
            "settled": settled is not None,
            "beats_intended_per_second": m / args.interval,
            "beats_per_second": beats / window,
            "beats_renewed": renewed,
            "beat_errors": dict(agents.errors),
            "beats_seen_by_operator": seen,
            # A beat alone reconciles nothing; these are due LAST-BEAT stamps and changes to what
            # Vigil reads of a pod (a Ready flip is not one: podstate.strip_pod drops it).
            "reconciles_in_window": reconciles,
            "beat_start_lateness_p99_seconds": percentile(lateness, 99),
            "max_gap_between_renewals_seconds": agents.max_gap,
            "operator_cpu_seconds": operator_cpu,
            "operator_cpu_seconds_per_1000_beats": 1000 * operator_cpu / beats if beats else math.nan,
            "operator_cpu_cores": operator_cpu / window,
            "operator_peak_rss_mib": peak["operator"],
            "event_loop_lag_healthz_p50_seconds": percentile(lags, 50),
            "event_loop_lag_healthz_p99_seconds": percentile(lags, 99),
            "event_loop_lag_healthz_max_seconds": max(lags) if lags else math.nan,
            "healthz_failures": probe.failures,
            # What held the loop, from the operator's own metrics (vigil.runtime.stalls).
            "event_loop_lag_inside_looks": stalls[LAG_COUNT],
            "event_loop_lag_inside_over_quarter_second": stalls[LAG_COUNT] - stalls[LAG_QUARTER],
            "gc_full_collections": stalls[FULL_COUNT],
            "gc_full_collection_seconds": stalls[FULL_SUM],
            "gc_full_collection_mean_seconds": stalls[FULL_SUM] / stalls[FULL_COUNT] if stalls[FULL_COUNT] else 0.0,
            "gc_pauses_over_quarter_second": sum(stalls[c] - stalls[q] for c, q in GC_QUARTERS),
            "apiserver_patch_pods_p50_seconds": bucket_quantile(hist_before, hist_after, 0.5),
            "apiserver_patch_pods_p99_seconds": bucket_quantile(hist_before, hist_after, 0.99),
            "apiserver_patch_pods_requests_in_window": patch_pods,
            "apiserver_vigiljob_status_writes_in_window": status_after - status_before,
            "vigil_attempts_uncertain_total": uncertain_total - uncertain_before,
            "vigil_attempts_uncertain_total_since_start": uncertain_total,
            "jobs_by_phase": phases,
            "jobs_heartbeat_unhealthy": unhealthy,
        }
        for name in ("kube-apiserver", "etcd"):
            if name in pids:
                result[f"{name.replace('kube-', '')}_cpu_cores"] = (cpu_after[name] - cpu_before[name]) / window
        if quiet:
            # What the beats cost, over what holding M attempts costs anyway: the window's CPU less
            # the hold's (the LAST-BEAT stamps, which only a beat brings due, count as the beats').
            result["quiet_seconds"] = args.quiet_seconds
            for name, cores in quiet.items():
                short = name.replace("kube-", "")
                result[f"quiet_{short}_cpu_cores"] = cores
                result[f"{short}_cpu_cores_for_beats"] = result[f"{short}_cpu_cores"] - cores
            per_second = beats / window
            result["operator_cpu_seconds_per_1000_beats_for_beats"] = (
                1000 * result["operator_cpu_cores_for_beats"] / per_second if per_second else math.nan
            )
        if leader is not None:
            for name, outcome in zip(post_names, OUTCOMES, strict=True):
                result[f"posts_{outcome}"] = posts_after[name] - posts_before[name]
            result["leader_fallbacks_to_annotation"] = fallbacks
            result["leader_fallback_reasons"] = dict(agents.fallback_why)
            result["leader_post_p50_seconds"] = percentile(post_latency, 50)
            result["leader_post_p99_seconds"] = percentile(post_latency, 99)
        if profiler is not None:
            result["profile"] = {"stacks": str(profiler.path), **profiler.top(15)}
        code = report(result, args, agents.max_gap)
        result["false_uncertain"] = bool(code)
    finally:
        if agents:
            agents.stop()
        try:
            cleanup(api, namespace, m)
        finally:
            operator.stop()
            release_vigil_pods(api, namespace)

    return result, code


if __name__ == "__main__":
    sys.exit(main())
