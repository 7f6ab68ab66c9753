"""M attempts beating to the leader, and the leader SIGKILLed mid-run (issue 26).

    .venv/bin/python -m bench.heartbeat_failover --attempts 10000 --out bench/results/

Two `vigil operator` replicas with leader election (the chart's Lease timings unless
--operator-args says otherwise), both serving the heartbeat endpoint; the agents (the agent's own
`Heart` and `LeaderBeat`, as in bench.heartbeat_load) beat to one address that follows the
leader as the chart's webhook Service does: an iptables DNAT rule of the nat OUTPUT chain, as
kube-proxy writes them, sends new connections to the port of the Lease's holder and is swapped
when the Lease changes hands (open connections stay where they went; to a killed process they
are reset, and the agent falls back to its pod's annotation for that beat). Needs root and
iptables, as kube-proxy does.

Once every attempt beats and the leader has settled, the leader is SIGKILLed. Printed:
- how long until the standby holds the Lease (the Lease's duration, mostly);
- after that takeover, when each agent's first beat reached the new leader and was answered
  (p50, p99, max, and how many within one interval), and when the new leader counted its first;
- what the cut cost: the agents' fallbacks to the annotation, the PATCH pods the API server served;
- after a hold of one heartbeat timeout and an interval past the takeover: attempts Lost
  (the new leader's vigil_attempts_lost_total: the killed one's died with it, and what it may have
  decided before dying shows in the API's objects, which are read next), jobs not Running or past
  attempt 1, and pods of an attempt other than 1. Any of those is a failure (exit 1).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubernetes import client, config  # noqa: E402

from bench.compare import (  # noqa: E402
    Api,
    Operator,
    create_namespace,
    free_port,
    install_crds,
    log,
    nodes_for,
    own_cluster,
    percentile,
    release_vigil_pods,
    testbed_of,
)
from bench.heartbeat_load import (  # noqa: E402
    BENCH_PER_SOURCE,
    JOB_ACCOUNT,
    Agents,
    TimedLeader,
    allow_open_files,
    cleanup,
    grant_heartbeat_rbac,
    histogram,
    start_attempts,
    wait_until_settled,
)
from testbed import cluster as testbed  # noqa: E402
from vigil.servers.webhook import make_self_signed  # noqa: E402

REPLICAS = ("replica-a", "replica-b")  # POD_NAME of each: the Lease holder's identity starts with it


class AnsweredLeader(TimedLeader):
    """TimedLeader that notes, after `Agents.mark`, when each pod's first beat got a verdict."""

    def post(self, beat: str):
        answer = super().post(beat)
        owner = self.owner
        if answer.observed is not None and owner.mark is not None:
            now = time.monotonic()
            with owner.lock:
                owner.first_answer.setdefault(self.name, now)
        return answer


class FailoverAgents(Agents):
    leader_class = AnsweredLeader

    def __init__(self, *args, **kwargs):
        self.mark: float | None = None
        self.first_answer: dict[str, float] = {}
        super().__init__(*args, **kwargs)


class LeaderRoute(threading.Thread):
    """127.0.0.1:`port` -> the leader's port, by an iptables nat OUTPUT DNAT rule (as kube-proxy
    routes a Service), `upstream()` polled every 0.2 s; removed by close()."""

    def __init__(self, port: int, upstream: Callable[[], int | None]) -> None:
        super().__init__(daemon=True)
        self.port, self.upstream = port, upstream
        self.current: int | None = None
        self.changes: list[tuple[float, int | None]] = []
        self.halt = threading.Event()
        self.start()

    def _rule(self, action: str, to: int) -> None:
        subprocess.run(
            ["iptables", "-t", "nat", action, "OUTPUT", "-p", "tcp", "-d", "127.0.0.1", "--dport", str(self.port),
             "-m", "comment", "--comment", f"vigil-bench-{self.port}",
             "-j", "DNAT", "--to-destination", f"127.0.0.1:{to}"],
            check=True, capture_output=True,
        )  # fmt: skip

    def run(self) -> None:
        while not self.halt.wait(0.2):
            try:
                want = self.upstream()
            except Exception as err:  # an API hiccup: keep the route as it is
                log(f"cannot read the Lease: {err}")
                continue
            if want == self.current:
                continue
            if want is not None:
                self._rule("-I", want)
            if self.current is not None:
                self._rule("-D", self.current)
            self.current = want
            self.changes.append((time.monotonic(), want))

    def close(self) -> None:
        self.halt.set()
        self.join(2)
        if self.current is not None:
            self._rule("-D", self.current)
            self.current = None


def holder(namespace: str) -> str | None:
    try:
        lease = client.CoordinationV1Api().read_namespaced_lease("vigil-operator", namespace)
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise
    return lease.spec.holder_identity or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attempts", "-m", type=int, default=1000, help="M: attempts held Running (default 1000)")
    parser.add_argument("--interval", type=float, default=10, help="seconds between beats (default 10)")
    parser.add_argument("--timeout", type=float, default=60, help="heartbeat.timeoutSeconds (default 60)")
    parser.add_argument("--settle-seconds", type=float, default=None, help="default max(120, M/10)")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--kubeconfig", type=Path, help="run against this cluster instead of the bench's own")
    parser.add_argument("--name", default="bench")
    parser.add_argument("--port-base", type=int, default=27443)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--operator-args", default="", help="more arguments for both replicas")
    args = parser.parse_args(argv)
    m = args.attempts
    settle = args.settle_seconds if args.settle_seconds is not None else max(120.0, m / 10)
    if os.geteuid() != 0:
        raise SystemExit("heartbeat_failover routes the leader's address with iptables: run it as root")
    allow_open_files(2 * m + 4096)
    kubeconfig = args.kubeconfig
    if kubeconfig:
        if cluster := testbed_of(kubeconfig):
            testbed.create_nodes(cluster, nodes_for(m))
    else:
        kubeconfig = own_cluster(args.name, args.port_base, nodes_for(m), needs_bench_stages=False).kubeconfig
    api = Api(kubeconfig, args.threads)
    install_crds(api)
    config.load_kube_config(str(kubeconfig))

    namespace = f"bench-failover-{uuid.uuid4().hex[:4]}"
    create_namespace(api, namespace)
    grant_heartbeat_rbac(namespace)
    workdir = Path(tempfile.mkdtemp(prefix="vigil-bench-failover-"))
    certs = workdir / "certs"
    make_self_signed(certs)
    service_port = free_port()
    url = f"https://127.0.0.1:{service_port}/v1/heartbeat"
    tokens = workdir / "tokens"
    tokens.mkdir()
    replicas: dict[str, tuple[Operator, int]] = {}

    def start_replica(name: str) -> tuple[Operator, int]:
        port = free_port()
        extra = (
            "--beat-address", f"127.0.0.1:{port}",
            "--beat-cert-file", str(certs / "tls.crt"),
            "--beat-key-file", str(certs / "tls.key"),
            "--beat-connections-per-source", str(BENCH_PER_SOURCE),
            "--heartbeat-url", url,
            "--heartbeat-ca-file", str(certs / "ca.crt"),
            "--leader-elect", "--lease-namespace", namespace,
            *shlex.split(args.operator_args),
        )  # fmt: skip
        return Operator(kubeconfig, namespace, workdir / f"{name}.log", extra, {"POD_NAME": name}), port

    for name in REPLICAS:
        # A port free_port() found free may be taken before the operator binds it (other tests
        # and benches pick ports on this machine too): a replica that exits at start is started
        # again on new ports, and the run goes on only with both up.
        for tries in range(3):
            replicas[name] = start_replica(name)
            try:
                replicas[name][0].wait_ready()
                break
            except SystemExit as err:
                replicas[name][0].stop()
                if tries == 2:
                    for operator, _ in replicas.values():
                        operator.stop()
                    raise
                log(f"{name} did not come up ({err}); starting it again on other ports")

    def replica_of(identity: str | None) -> str | None:
        return next((n for n in replicas if identity and identity.startswith(n + "_")), None)

    def leader_port() -> int | None:
        name = replica_of(holder(namespace))
        return replicas[name][1] if name and replicas[name][0].proc.poll() is None else None

    route = LeaderRoute(service_port, leader_port)
    agents = None
    code = 0
    log(f"{m} attempts in {namespace}, two replicas; logs in {workdir}")
    try:
        deadline = time.monotonic() + 60
        while (first := replica_of(holder(namespace))) is None:
            if time.monotonic() > deadline:
                raise SystemExit("no replica took the Lease within 60 s")
            time.sleep(0.2)
        leader, leader_port_ = replicas[first]
        leader.wait_ready()
        agents = FailoverAgents(
            namespace, args.interval, args.timeout, args.workers, kubeconfig,
            (url, (certs / "ca.crt").read_text(), tokens),
        )  # fmt: skip
        began = time.monotonic()
        start_attempts(api, namespace, agents, args, JOB_ACCOUNT)
        log(f"all {m} pods Running after {time.monotonic() - began:.0f} s; letting the leader settle")
        if wait_until_settled(leader, m, quiet=args.interval + 2, deadline=settle) is None:
            log(f"warning: not settled after {settle:.0f} s; going on")
        time.sleep(2 * args.interval)  # every agent's connection is to the leader by now
        patch_match = {"verb": "PATCH", "resource": "pods", "subresource": ""}
        patches_before = histogram(api, "apiserver_request_duration_seconds", patch_match).get(math.inf, 0.0)
        with agents.lock:
            fallbacks_before = agents.fallbacks
            agents.lateness.clear()  # from the SIGKILL on: whether the bench's agents kept their pace

        killed_at = time.monotonic()
        leader.proc.send_signal(signal.SIGKILL)
        leader.proc.wait()
        log(f"SIGKILLed the leader {first}")
        while (new := replica_of(holder(namespace))) in (None, first):
            if time.monotonic() - killed_at > 120:
                raise SystemExit("no new leader within 120 s of the SIGKILL")
            time.sleep(0.1)
        took_over = time.monotonic()
        with agents.lock:
            agents.mark = took_over
        standby, _ = replicas[new]
        log(f"{new} holds the Lease {took_over - killed_at:.1f} s after the SIGKILL")
        counted = 'vigil_heartbeat_posts_total{outcome="counted"}'
        first_counted = None
        hold_until = took_over + args.timeout + args.interval
        while time.monotonic() < hold_until:
            if first_counted is None:
                try:
                    if standby.metric(counted) > 0:
                        first_counted = time.monotonic() - took_over
                except Exception:  # its metrics port is not serving yet
                    pass
            time.sleep(0.1)
        with agents.lock:
            answered = {pod: at - took_over for pod, at in agents.first_answer.items()}
            fallbacks = agents.fallbacks - fallbacks_before
            lateness = list(agents.lateness)
        patches = histogram(api, "apiserver_request_duration_seconds", patch_match).get(math.inf, 0.0) - patches_before
        lost = standby.metric("vigil_attempts_lost_total")
        jobs = api.custom.list_namespaced_custom_object("vigil.dev", "v1beta1", namespace, "vigiljobs")["items"]
        not_running = sum(
            ((j.get("status") or {}).get("phase"), (j.get("status") or {}).get("attempts")) != ("Running", 1)
            for j in jobs
        )
        later_pods = sum(
            (p.metadata.labels or {}).get("vigil.dev/attempt") != "1"
            for p in client.CoreV1Api().list_namespaced_pod(namespace).items
        )
        delays = sorted(answered.values())
        within = sum(d <= args.interval * 1.1 for d in delays)  # the agent's interval, with its +10% jitter
        result = {
            "attempts": m,
            "interval_seconds": args.interval,
            "timeout_seconds": args.timeout,
            "new_leader_after_sigkill_seconds": took_over - killed_at,
            "first_beat_counted_after_takeover_seconds": first_counted,
            "agents_answered_by_new_leader": len(delays),
            "agents_answered_within_one_interval": within,
            "answer_after_takeover_p50_seconds": percentile(delays, 50),
            "answer_after_takeover_p99_seconds": percentile(delays, 99),
            "answer_after_takeover_max_seconds": max(delays) if delays else math.nan,
            "fallbacks_to_annotation": fallbacks,
            # The bench's own agents starting beats late (their threads waiting on beats that time
            # out) delay the answers above without any fault of the new leader's.
            "agents_beat_start_lateness_p99_seconds": percentile(lateness, 99),
            "agents_beat_start_lateness_max_seconds": max(lateness) if lateness else math.nan,
            "apiserver_patch_pods_requests": patches,
            "attempts_lost": lost,
            "jobs_not_running_at_attempt_1": not_running,
            "pods_of_a_later_attempt": later_pods,
            "route_changes": len(route.changes),
        }
        print(f"\n| leader SIGKILLed at M = {m:,}, every {args.interval:.0f} s | value |\n| --- | ---: |")
        for key, value in result.items():
            print(f"| {key} | {value:.3f} |" if isinstance(value, float) else f"| {key} | {value} |")
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            path = args.out / f"heartbeat-failover-{m}-{stamp}.json"
            path.write_text(json.dumps(result, indent=1) + "\n")
            log(f"wrote {path}")
        if lost or not_running or later_pods or len(delays) < m:
            log("FAILED: an attempt was Lost or replaced, or an agent never reached the new leader")
            code = 1
    finally:
        if agents:
            agents.stop()
        route.close()
        try:
            cleanup(api, namespace, m)
        finally:
            for operator, _ in replicas.values():
                operator.stop()
            release_vigil_pods(api, namespace)
    return code


if __name__ == "__main__":
    sys.exit(main())
