"""`make up`: the local cluster, Vigil's CRDs, the operator, and the example jobs, watched until
each one has finished. Leaves everything running; `make down` stops it all.

    python -m testbed.demo [--nodes 3] [--timeout 180] [--name default] [--port-base 16443]

Each of its four steps prints a "[demo step N/4]" line when it starts and when it is done, with
the seconds it took. --name and --port-base (or $VIGIL_CLUSTER and $VIGIL_PORT_BASE, which
`make up` and `make down` pass on) run the demo as another cluster beside the default one:
`VIGIL_CLUSTER=mine VIGIL_PORT_BASE=18643 make up`, then `VIGIL_CLUSTER=mine make down`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from testbed import cluster as testbed

ROOT = Path(__file__).resolve().parent.parent
TERMINAL = {"Succeeded", "DeadLettered"}
STEPS = 4


def step(number: int, what: str, run: Callable[[], object]) -> object:
    """Runs one step of the demo between a line that says what it does and one that says it is done."""
    began = time.monotonic()
    testbed.log(f"[demo step {number}/{STEPS}] {what}")
    result = run()
    testbed.log(f"[demo step {number}/{STEPS}] done in {time.monotonic() - began:.1f}s")
    return result


def _vigil_command() -> list[str]:
    script = Path(sys.executable).with_name("vigil")
    if not script.exists():
        raise testbed.ClusterError(f"{script} is missing: install the project first (make venv).")
    return [str(script), "operator", "--log-level", "info"]


def _not_established(cluster: testbed.Cluster, names: list[str]) -> list[str]:
    """Those of the CRDs `names` whose Established condition is not True yet. A CRD the API
    server has not written a status for yet has no conditions at all (`kubectl wait
    --for=condition=Established` fails on it with "accessor error: <nil>"): not established."""
    answer = json.loads(testbed.kubectl(cluster, "get", "crd", *names, "-o", "json"))
    crds = answer["items"] if answer.get("kind") == "List" else [answer]  # one name: the object itself
    established = {
        crd["metadata"]["name"]
        for crd in crds
        if any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in (crd.get("status") or {}).get("conditions") or []
        )
    }
    return [name for name in names if name not in established]


def install_crds(cluster: testbed.Cluster, timeout: float = 60) -> None:
    applied = testbed.kubectl(
        cluster, "apply", "--server-side", "--force-conflicts", "-o", "name", "-f", str(ROOT / "crds")
    )
    names = [line.rpartition("/")[2] for line in applied.split()]
    deadline = time.monotonic() + timeout
    while waiting := _not_established(cluster, names):
        if time.monotonic() > deadline:
            raise testbed.ClusterError(f"CRDs not Established after {timeout:.0f}s: {', '.join(waiting)}")
        time.sleep(0.2)
    testbed.log(f"Established: {', '.join(names)}")


def start_operator(cluster: testbed.Cluster) -> None:
    testbed.stop(cluster, "vigil-operator")  # a new run gets the code as it is now
    testbed.start(cluster, "vigil-operator", _vigil_command(), env={"KUBECONFIG": str(cluster.kubeconfig)})


def _without_age(table: str) -> str:
    """The table without its last column (AGE), which changes every second by itself."""
    return "\n".join(line.rsplit(None, 1)[0] if line.strip() else line for line in table.splitlines())


def run_examples(cluster: testbed.Cluster, timeout: float) -> bool:
    examples = str(ROOT / "examples")
    # Foreground: until the last run's pods are gone too, so that the new attempts' pods (same names)
    # do not wait for the garbage collector (PodNameConflict).
    testbed.kubectl(
        cluster, "delete", "-f", examples, "--ignore-not-found", "--cascade=foreground", "--wait=true", "--timeout=60s"
    )
    testbed.kubectl(cluster, "apply", "-f", examples)
    deadline, shown = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        # The objects first, then the tables: a table read after the objects shows at least their
        # state (a final phase stays final), so the last table printed is a finished one.
        jobs = json.loads(testbed.kubectl(cluster, "get", "vj", "-o", "json"))["items"]
        queues = json.loads(testbed.kubectl(cluster, "get", "vq", "-o", "json"))["items"]
        table = testbed.kubectl(cluster, "get", "vj") + "\n" + testbed.kubectl(cluster, "get", "vq")
        # Finished: every job in a final phase, and every queue's counts caught up with them.
        finished = (
            bool(jobs)
            and all((job.get("status") or {}).get("phase") in TERMINAL for job in jobs)
            and all(not (q.get("status") or {}).get(n) for q in queues for n in ("running", "queued"))
        )
        if _without_age(table) != shown or finished:
            print(table, flush=True)
            shown = _without_age(table)
        if finished:
            return True
        if not testbed.running_pid(cluster, "vigil-operator"):
            log = cluster.logs / "vigil-operator.log"
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:]) if log.exists() else "(no log)"
            raise testbed.ClusterError(f"vigil operator exited; the last lines of {log}:\n{tail}")
        time.sleep(1)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=180, help="seconds the examples get to finish")
    parser.add_argument(
        "--name", default=os.environ.get("VIGIL_CLUSTER") or "default", help="the cluster's name ($VIGIL_CLUSTER)"
    )
    parser.add_argument(
        "--port-base",
        type=int,
        default=int(os.environ["VIGIL_PORT_BASE"]) if os.environ.get("VIGIL_PORT_BASE") else None,
        help="the apiserver's port, the others follow it ($VIGIL_PORT_BASE; default: the cluster's own, else 16443)",
    )
    args = parser.parse_args(argv)
    saved = testbed.Cluster.load(args.name)
    base = args.port_base or (saved.ports.apiserver if saved else 16443)
    cluster = testbed.Cluster(args.name, testbed.Ports.from_base(base))
    began = time.monotonic()
    try:
        step(
            1,
            f"cluster {cluster.name!r}: etcd, kube-apiserver, controller manager, scheduler, "
            f"kwok and {args.nodes} nodes on {cluster.server}",
            lambda: testbed.up(cluster, args.nodes),
        )
        print(testbed.kubectl(cluster, "get", "nodes"), flush=True)
        step(2, "Vigil's CRDs (crds/), until Established", lambda: install_crds(cluster))
        step(3, "vigil operator", lambda: start_operator(cluster))
        finished = step(
            4, "the jobs in examples/, until each has finished", lambda: run_examples(cluster, args.timeout)
        )
    except testbed.ClusterError as err:
        testbed.log(f"ERROR: {err}")
        return 1
    kubeconfig = f"export KUBECONFIG={cluster.kubeconfig} PATH={testbed.BIN}:$PATH"
    print(kubeconfig)
    print("kubectl get vj -l vigil.dev/dead-letter=true     # the dead-letter queue")
    print("kubectl describe vj flaky                         # attempts, backoff, events")
    down = "make down" if cluster.name == "default" else f"VIGIL_CLUSTER={cluster.name} make down"
    print(f"operator log: {cluster.logs / 'vigil-operator.log'}; stop everything with: {down}")
    if not finished:
        testbed.log(f"ERROR: the examples did not all finish within {args.timeout:.0f}s")
        return 1
    testbed.log(f"the demo is up in {time.monotonic() - began:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
