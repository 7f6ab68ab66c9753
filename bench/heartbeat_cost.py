"""Operator CPU per heartbeat, side by side with a baseline measured in the same run.

    python bench/heartbeat_cost.py [--jobs 50] [--rate 100] [--seconds 60]

Starts the local test bed (or uses $KUBECONFIG), runs `--jobs` VigilJobs whose pods run for
ever on kwok nodes, then patches `vigil.dev/heartbeat` on those pods at `--rate` beats per
second for `--seconds`, as agents would. Two processes watch the same pods during the same
window: `vigil operator`, and the baseline, a kopf operator with the same server-side filter
and a handler that does nothing. Their CPU seconds (utime + stime from /proc) per beat are
printed side by side: the difference is what Vigil itself spends on a beat.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kubernetes import client, config  # noqa: E402

from bench.procfs import cpu_seconds  # noqa: E402
from testbed import cluster as testbed  # noqa: E402

BASELINE = """
import kopf

@kopf.on.login()
def login(**kwargs):
    return kopf.login_via_client(**kwargs)

@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_):
    settings.peering.standalone = True
    settings.watching.label_selectors["pods"] = "vigil.dev/job-uid"
    settings.posting.enabled = False

@kopf.on.event("pods", labels={"vigil.dev/job-uid": kopf.PRESENT})
async def noop(**_):
    pass
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--rate", type=float, default=100, help="beats per second, all pods together")
    parser.add_argument("--seconds", type=float, default=60)
    args = parser.parse_args()

    kubeconfig = os.environ.get("KUBECONFIG")
    if not kubeconfig:
        bench = testbed.Cluster("bench", testbed.Ports.from_base(20443))
        testbed.up(bench, nodes=3)
        kubeconfig = str(bench.kubeconfig)
    env = {**os.environ, "KUBECONFIG": kubeconfig}
    config.load_kube_config(kubeconfig)
    core, custom = client.CoreV1Api(), client.CustomObjectsApi()
    kubectl = [str(testbed.BIN / "kubectl"), "--kubeconfig", kubeconfig]
    subprocess.run(
        [*kubectl, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds")],
        check=True,
        capture_output=True,
    )
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    while not core.list_namespaced_service_account(namespace).items:
        time.sleep(0.2)

    bin_dir = Path(sys.executable).parent
    workdir = Path(tempfile.mkdtemp(prefix="vigil-bench-"))
    (workdir / "baseline.py").write_text(BASELINE)
    logs = contextlib.ExitStack()
    operator = subprocess.Popen(
        [str(bin_dir / "vigil"), "operator", "-n", namespace, "--log-level", "warning"],
        env=env,
        stdout=logs.enter_context((workdir / "operator.log").open("w")),
        stderr=subprocess.STDOUT,
    )
    baseline = subprocess.Popen(
        [str(bin_dir / "kopf"), "run", "--standalone", "-n", namespace, "--quiet", str(workdir / "baseline.py")],
        env=env,
        stdout=logs.enter_context((workdir / "baseline.log").open("w")),
        stderr=subprocess.STDOUT,
    )
    try:
        pod_spec = {
            "containers": [{"name": "main", "image": "registry.invalid/sim"}],
            "nodeSelector": {"type": "kwok"},
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
        }
        for i in range(args.jobs):
            custom.create_namespaced_custom_object(
                "vigil.dev",
                "v1beta1",
                namespace,
                "vigiljobs",
                {
                    "apiVersion": "vigil.dev/v1beta1",
                    "kind": "VigilJob",
                    "metadata": {"name": f"beat-{i}"},
                    "spec": {
                        "template": {"spec": pod_spec},
                        "heartbeat": {"intervalSeconds": 10, "timeoutSeconds": 600, "startupGraceSeconds": 600},
                    },
                },
            )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            pods = [p for p in core.list_namespaced_pod(namespace).items if p.status.phase == "Running"]
            if len(pods) == args.jobs:
                break
            time.sleep(0.5)
        else:
            raise SystemExit(f"only {len(pods)} of {args.jobs} pods run after 120 s; see {workdir}")
        time.sleep(
            5
        )  # let both watchers settle after the start-up burst  # benchmark pacing, not a wait for a condition

        names = itertools.cycle(p.metadata.name for p in pods)
        before = {"vigil": cpu_seconds(operator.pid), "baseline (kopf no-op)": cpu_seconds(baseline.pid)}
        began, beats = time.monotonic(), 0
        while (elapsed := time.monotonic() - began) < args.seconds:
            due = int(elapsed * args.rate)
            while beats < due:
                core.patch_namespaced_pod(
                    next(names),
                    namespace,
                    {"metadata": {"annotations": {"vigil.dev/heartbeat": f"{beats}:{uuid.uuid4().hex[:8]}"}}},
                )
                beats += 1
            time.sleep(0.005)  # rate pacing
        time.sleep(2)  # the last watch events reach both processes  # benchmark pacing, not a wait for a condition
        after = {"vigil": cpu_seconds(operator.pid), "baseline (kopf no-op)": cpu_seconds(baseline.pid)}
        window = time.monotonic() - began
        print(f"{beats} beats in {window:.0f} s ({beats / window:.0f}/s) on {args.jobs} pods")
        print(f"{'process':24} {'CPU s':>8} {'CPU ms/beat':>12} {'CPU share':>10}")
        for name in before:
            used = after[name] - before[name]
            print(f"{name:24} {used:8.2f} {1000 * used / beats:12.3f} {100 * used / window:9.1f}%")
        vigil_cost = (after["vigil"] - before["vigil"]) - (
            after["baseline (kopf no-op)"] - before["baseline (kopf no-op)"]
        )
        print(json.dumps({"beats": beats, "vigil_minus_baseline_ms_per_beat": round(1000 * vigil_cost / beats, 3)}))
    finally:
        operator.terminate()
        baseline.terminate()
        operator.wait(30)
        baseline.wait(30)
        logs.close()
        core.delete_namespace(namespace)
        if not os.environ.get("KUBECONFIG"):
            testbed.down(bench)
    return 0


if __name__ == "__main__":
    sys.exit(main())
