"""Vigil side by side with the batch/v1 Job controller: the same jobs, the same bed, one run.

    .venv/bin/python -m bench.compare --jobs 1000 --workloads all-succeed,fail-twice,queued --out bench/results/

For each workload, N batch/v1 Jobs (the Job controller of kube-controller-manager) and then N
VigilJobs (a `vigil operator` process the bench starts, with the admin kubeconfig, as users run
it) are submitted by 8 client threads into a fresh namespace each, one side after the other, all at
once (a burst, which keeps the machine's CPU busy) or, with `--rate R`, as a steady stream of R a
second (the load a cluster lives with: throughput follows the rate, and latency is what differs);
every pod runs for about 1 s on a kwok node and exits as the workload says. One watch of pods
and one of the jobs per run time everything on the bench's own monotonic clock. Printed as a
markdown table (and written to <out>/<timestamp>.md and .json): makespan, throughput,
p50/p95/p99 of submit -> pod created and submit -> finished, CPU seconds and peak RSS of the
operator and of kube-controller-manager, the CPU seconds of every other process of the bed
(kube-apiserver, etcd, kube-scheduler, kwok) and of the bench itself, the whole machine's busy CPU
(from /proc/stat: on this shared machine, what bounds throughput), and per job by verb and
resource the API requests, the API server's time serving them and the watch events it sent,
with the ratio Vigil / native of every figure. `--profile` adds py-spy's profile of the
operator and kube-apiserver's own (pprof), with the CPU each kind of status write costs it.

By default the bench brings up (or reuses) a local test bed of its own (name `bench`, port base
27443) with enough kwok nodes that pod capacity (110 pods a node) is never the limit, and leaves
it running (`python3 -m testbed.cluster down --name bench` stops it). `--kubeconfig PATH` runs
against another cluster instead (e.g. the test suite's); the /proc figures need it to be a local
test bed, else they are reported missing. See bench/README.md for what each figure means.
"""

# The bench's parts: bench.bed (the cluster, its test bed and namespaces), bench.workloads (the
# jobs of each workload), bench.measure (one side run and measured), bench.procfs (/proc),
# bench.profiles (py-spy and kube-apiserver's pprof) and bench.report (the markdown). This module
# is the command, and re-exports the names the other benches and the tests import from it.

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bed import (  # noqa: E402
    FAILURE_COUNT,
    POD_CAPACITY,
    STAGES_ATTEMPT_BENCH,
    STAGES_ATTEMPT_LINE,
    Api,
    bench_stages,
    create_namespace,
    delete_namespace,
    install_crds,
    kwok_config,
    log,
    nodes_for,
    own_cluster,
    release_vigil_pods,
    testbed_of,
)
from bench.measure import (  # noqa: E402
    LABEL,
    WRITE_VERBS,
    Operator,
    Timeline,
    Watch,
    default_timeout,
    due_after,
    free_port,
    growth,
    percentile,
    run_side,
    server_figures,
    sum_samples,
)
from bench.procfs import Sampler, cpu_seconds, machine_busy_seconds, status_kib  # noqa: E402
from bench.profiles import (  # noqa: E402
    SERVER_HANDLERS,
    SERVER_PROFILE_CHUNK,
    WAITS,
    Profiler,
    ServerProfiler,
    py_spy,
)
from bench.report import (  # noqa: E402
    CPU_BOUND_SHARE,
    REQUIRED,
    ROWS,
    fmt,
    no_nan,
    not_cpu_bound,
    pace_text,
    profile_text,
    ratio,
    requests_table,
    server_profile_text,
    setup_text,
    table,
)
from bench.workloads import (  # noqa: E402
    BACKOFF,
    FAIL_SHARE,
    KINDS,
    RUN_FOR,
    WORKLOADS,
    annotations,
    fails,
    native_job,
    pod_spec,
    vigil_job,
)
from testbed import cluster as testbed  # noqa: E402

__all__ = [
    "BACKOFF",
    "CPU_BOUND_SHARE",
    "FAILURE_COUNT",
    "FAIL_SHARE",
    "KINDS",
    "LABEL",
    "POD_CAPACITY",
    "REQUIRED",
    "ROOT",
    "ROWS",
    "RUN_FOR",
    "SERVER_HANDLERS",
    "SERVER_PROFILE_CHUNK",
    "STAGES_ATTEMPT_BENCH",
    "STAGES_ATTEMPT_LINE",
    "WAITS",
    "WORKLOADS",
    "WRITE_VERBS",
    "Api",
    "Operator",
    "Profiler",
    "Sampler",
    "ServerProfiler",
    "Timeline",
    "Watch",
    "annotations",
    "bench_stages",
    "cpu_seconds",
    "create_namespace",
    "default_timeout",
    "delete_namespace",
    "due_after",
    "fails",
    "fmt",
    "free_port",
    "git_commit",
    "growth",
    "install_crds",
    "kcm_flags",
    "kwok_config",
    "log",
    "machine_busy_seconds",
    "main",
    "native_job",
    "no_nan",
    "nodes_for",
    "not_cpu_bound",
    "own_cluster",
    "pace_text",
    "percentile",
    "pod_spec",
    "profile_text",
    "py_spy",
    "ratio",
    "release_vigil_pods",
    "requests_table",
    "run_side",
    "server_figures",
    "server_profile_text",
    "setup_text",
    "status_kib",
    "sum_samples",
    "table",
    "testbed_of",
    "vigil_job",
]


def git_commit() -> str:
    result = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--", "operator"], capture_output=True, text=True
    )
    return (result.stdout.strip() or "unknown") + (" (with uncommitted changes in operator/)" if dirty.stdout else "")


def kcm_flags(cluster: testbed.Cluster | None) -> str:
    pid = testbed.running_pid(cluster, "kube-controller-manager") if cluster else None
    if not pid:
        return "flags unknown (not a local test bed)"
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    flags = [a for a in args if a.startswith(("--kube-api-qps", "--kube-api-burst"))]
    return " ".join(flags) if flags else "--kube-api-qps/--kube-api-burst at their defaults (20/30)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1000, help="N: jobs per side and workload (default 1000)")
    parser.add_argument(
        "--workloads", "--workload", default="all-succeed", help=f"comma-separated, of {', '.join(WORKLOADS)}"
    )
    parser.add_argument("--kinds", default="native,vigil", help="which sides to run (default both)")
    parser.add_argument("--threads", type=int, default=8, help="client threads that submit (default 8)")
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="submit a steady stream of this many jobs a second instead of all at once (default: all at once)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="where the .md and .json go")
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds a side may take (default 120 + N/5, + N/R with --rate)"
    )
    parser.add_argument("--kubeconfig", type=Path, help="run against this cluster instead of the bench's own")
    parser.add_argument(
        "--use-existing-cluster", action="store_true", help="run against $KUBECONFIG instead of the bench's own"
    )
    parser.add_argument("--name", default="bench", help="the bench's own test bed (default bench)")
    parser.add_argument("--port-base", type=int, default=27443, help="its port base (default 27443)")
    parser.add_argument("--nodes", type=int, default=None, help="kwok nodes (default: N/110 + 1, at least 3)")
    parser.add_argument(
        "--profile", action="store_true", help="sample the operator with py-spy (pip install -e '.[bench]')"
    )
    parser.add_argument(
        "--operator-args", default="", help="more arguments for `vigil operator`, e.g. '--workers 8' (default none)"
    )
    args = parser.parse_args(argv)
    if args.profile:
        py_spy()  # before the bed starts, not after the run
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if bad := [w for w in workloads if w not in WORKLOADS] + [k for k in kinds if k not in KINDS]:
        parser.error(f"unknown workload or kind: {', '.join(bad)}")
    if args.rate is not None and args.rate <= 0:
        parser.error(f"--rate must be a number of jobs a second above 0, not {args.rate:g}")
    timeout = args.timeout or default_timeout(args.jobs, args.rate)
    nodes = args.nodes or nodes_for(args.jobs)

    kubeconfig = args.kubeconfig
    if args.use_existing_cluster and not kubeconfig:
        if not os.environ.get("KUBECONFIG"):
            parser.error("--use-existing-cluster needs $KUBECONFIG")
        kubeconfig = Path(os.environ["KUBECONFIG"])
    if kubeconfig:
        cluster = testbed_of(kubeconfig)
        if "fail-twice" in workloads:
            log(
                "note: fail-twice needs kwok to count Job pods' attempts (the bench's stages); on another "
                "cluster, native fail-twice Jobs fail on every attempt"
            )
        if cluster:
            names = testbed.create_nodes(cluster, nodes)
            testbed.wait_for(
                f"{nodes} Ready kwok nodes", lambda: testbed._nodes_ready(cluster, names), 120, cluster, "kwok"
            )
    else:
        if args.profile:  # a bed brought up now serves pprof; one already up must be brought down first
            os.environ["VIGIL_APISERVER_PROFILING"] = "1"
        cluster = own_cluster(args.name, args.port_base, nodes, "fail-twice" in workloads)
        kubeconfig = cluster.kubeconfig
    api = Api(kubeconfig, args.threads)
    install_crds(api)
    version = json.loads(api.get("/version")).get("gitVersion", "unknown")
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    meta = {
        "started": started,
        "commit": git_commit(),
        "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.system()} "
        f"{platform.release()}",
        "cluster": f"local test bed {cluster.name!r}" if cluster else f"kubeconfig {kubeconfig}",
        "kubernetes": version,
        "nodes": len(api.core.list_node(label_selector="type=kwok").items),
        "kcm_flags": kcm_flags(cluster),
        "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "jobs": args.jobs,
        "threads": args.threads,
        "rate": args.rate,
        "workloads": workloads,
        "operator_args": args.operator_args,
    }
    workdir = Path(tempfile.mkdtemp(prefix="vigil-bench-"))
    log(f"operator logs in {workdir}")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    profile = args.out / f"{stamp}-profile" if args.profile else None
    results: dict[str, dict[str, dict]] = {}
    for workload in workloads:
        results[workload] = {}
        for kind in kinds:
            results[workload][kind] = run_side(
                api,
                cluster,
                kind,
                workload,
                args.jobs,
                args.threads,
                timeout,
                workdir,
                profile,
                tuple(shlex.split(args.operator_args)),
                args.rate,
            )
            partial = args.out / f"{stamp}.partial.json"  # what has run so far, should a later run fail
            args.out.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps(no_nan({"meta": meta, "results": results}), indent=1) + "\n")

    pace = f", {args.rate:g} jobs/s" if args.rate else ""
    report = [f"# Vigil vs the batch/v1 Job controller, N = {args.jobs:,}{pace}", "", setup_text(meta), ""]
    for workload in workloads:
        sides = results[workload]
        if set(sides) == set(KINDS):
            report += [table(sides["native"], sides["vigil"]), ""]
            if note := not_cpu_bound(sides["native"], sides["vigil"]):
                report += [note, ""]
            report += [requests_table(sides["native"], sides["vigil"]), ""]
            if "profile" in sides["vigil"]:
                report += [profile_text(sides["vigil"]["profile"]), ""]
            if "apiserver_profile" in sides["vigil"] and "apiserver_profile" in sides["native"]:
                profiles = sides["native"]["apiserver_profile"], sides["vigil"]["apiserver_profile"]
                report += [server_profile_text(*profiles), ""]
            if "vigil_attempts_uncertain_total" in sides["vigil"]:
                report += [
                    f"vigil_attempts_uncertain_total: {sides['vigil']['vigil_attempts_uncertain_total']:.0f}",
                    "",
                ]
        else:
            for kind, side in sides.items():
                shown = {k: v for k, v in side.items() if k != "profile"}
                report += [f"## {workload}, {kind}", "```json", json.dumps(no_nan(shown), indent=1), "```", ""]
                if "profile" in side:
                    report += [profile_text(side["profile"]), ""]
    text = "\n".join(report)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stamp}.md").write_text(text + "\n")
    (args.out / f"{stamp}.partial.json").unlink(missing_ok=True)
    (args.out / f"{stamp}.json").write_text(json.dumps(no_nan({"meta": meta, "results": results}), indent=1) + "\n")
    log(f"wrote {args.out / (stamp + '.md')} and .json")
    return 0 if all(s["finished"] == s["jobs"] for w in results.values() for s in w.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
