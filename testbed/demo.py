"""`make up`: the local cluster, Vigil's CRDs, the operator, and the example jobs, watched until
each one has finished. Leaves everything running; `make down` stops it all.

    python -m testbed.demo [--nodes 3] [--timeout 180]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from testbed import cluster as testbed

ROOT = Path(__file__).resolve().parent.parent
TERMINAL = {"Succeeded", "DeadLettered"}


def _vigil_command() -> list[str]:
    script = Path(sys.executable).with_name("vigil")
    if not script.exists():
        raise testbed.ClusterError(f"{script} is missing: install the project first (make venv).")
    return [str(script), "operator", "--log-level", "info"]


def install_crds(cluster: testbed.Cluster) -> None:
    testbed.kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    testbed.kubectl(cluster, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")


def start_operator(cluster: testbed.Cluster) -> None:
    testbed.stop(cluster, "vigil-operator")  # a new run gets the code as it is now
    testbed.start(cluster, "vigil-operator", _vigil_command(), env={"KUBECONFIG": str(cluster.kubeconfig)})


def run_examples(cluster: testbed.Cluster, timeout: float) -> bool:
    examples = str(ROOT / "examples")
    testbed.kubectl(cluster, "delete", "-f", examples, "--ignore-not-found", "--wait=true")
    testbed.kubectl(cluster, "apply", "-f", examples)
    deadline, shown = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        table = testbed.kubectl(cluster, "get", "vj") + "\n" + testbed.kubectl(cluster, "get", "vq")
        if table != shown:
            print(table, flush=True)
            shown = table
        jobs = json.loads(testbed.kubectl(cluster, "get", "vj", "-o", "json"))["items"]
        if jobs and all((job.get("status") or {}).get("phase") in TERMINAL for job in jobs):
            return True
        time.sleep(1)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=180)
    args = parser.parse_args(argv)
    cluster = testbed.Cluster("default", testbed.Ports.from_base(16443))
    try:
        testbed.up(cluster, args.nodes)
        print(testbed.kubectl(cluster, "get", "nodes"), flush=True)
        install_crds(cluster)
        start_operator(cluster)
        finished = run_examples(cluster, args.timeout)
    except testbed.ClusterError as err:
        testbed.log(f"ERROR: {err}")
        return 1
    print(f"export KUBECONFIG={cluster.kubeconfig} PATH={testbed.BIN}:$PATH")
    print("kubectl get vj -l vigil.dev/dead-letter=true     # the dead-letter queue")
    print("kubectl describe vj flaky                         # attempts, backoff, events")
    print(f"operator log: {cluster.logs / 'vigil-operator.log'}; stop everything with: make down")
    if not finished:
        testbed.log(f"ERROR: the examples did not all finish within {args.timeout:.0f}s")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
