"""`make up`: the local cluster, Vigil's CRDs, the operator, and the example jobs, watched until
each one has finished. Leaves everything running; `make down` stops it all.

    python -m testbed.demo [--nodes 3] [--timeout 180] [--name default] [--port-base 16443] [--real-node]

Each of its five steps (seven with --real-node) prints a "[demo step N/M]" line when it starts and
when it is done, with the seconds it took. The operator runs as the chart runs it (templates/deployment.yaml), on
loopback: leader election on a Lease, the admission webhook (registered with the API server),
beats to the leader, metrics over HTTPS for authorized tokens and the health probes; etcd
fsyncs every write. Its ports follow the cluster's: webhook base+10, metrics +11, health +12,
beats +13.
Step 5 shows the webhook's 429 for a job of the queue that takes none, and one scrape.

--real-node (`make up REAL_NODE=1`; root) adds the bed's one real node (a kubelet with containerd,
testbed/node.py) with Vigil's image (testbed/image.sh) and a plain image, runs the operator with
that agent image and its webhook and beats on the node's bridge (where pods reach it), and ends
with examples/any-image/stall.yaml and hang.yaml on that node (testbed.doubt): the default
heartbeat from an image with nothing of Vigil, Uncertain and back, Lost, NoOverlap's fencing and
a checkpoint carried to the next attempt.

--name and --port-base (or $VIGIL_CLUSTER and $VIGIL_PORT_BASE, which
`make up` and `make down` pass on) run the demo as another cluster beside the default one:
`VIGIL_CLUSTER=mine VIGIL_PORT_BASE=18643 make up`, then `VIGIL_CLUSTER=mine make down`.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import yaml

from testbed import cluster as testbed
from testbed import doubt
from testbed import node as real_node
from vigil import api
from vigil.servers import webhook

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")
LEASE = ("default", "vigil")  # the Lease the operator leads on: namespace, name
WEBHOOK_CONFIGURATION = "vigil-demo"
CLOSED_QUEUE = "closed"  # examples/queue.yaml: maxQueued 0, so the webhook refuses every new job
# The examples the demo runs (examples/<name>.yaml): those a kwok node finishes as their
# sim.vigil.dev/* annotations say, in seconds (array: 50 tasks of 1 s, 10 at a time, its TASKS
# column 50/50 at the end). The others (nightly-report, etl-step, training) are
# for a cluster with real nodes: their work is their containers' (a real image's output, a
# checkpoint the agent carries), which kwok does not run; the API server checks them
# (tests/integration/test_validation.py) and tests/unit/api/test_examples.py validates them.
DEMO_EXAMPLES = ("flaky", "hello", "poison", "queue", "array", "pool")
# kwok runs no container, so the workers of examples/pool.yaml's VigilWorkerPool run here: a
# `vigil-worker` process per worker pod, with the pod's identity (a token of its ServiceAccount
# bound to it, audience vigil.dev) and the pull environment the pool gave the pod, whose task
# sleeps a moment. They are the bed's extras (`make down` stops them); a pod the pool adds after
# `make up` has ended gets none.
POOL_WORKER = "pool-worker-"  # the prefix of their names among the bed's processes
POOL_TASK = (
    "import os, time; time.sleep(0.3); "
    "print('resized image', os.environ['VIGIL_TASK_INDEX'], 'attempt', os.environ['VIGIL_ATTEMPT'], flush=True)"
)
# The examples name no node: the demo places their pods on the kwok nodes (tainted so that only
# pods that tolerate it land there) as it applies them.
KWOK_PLACEMENT = {
    "nodeSelector": {"type": "kwok"},
    "tolerations": [{"key": testbed.FAKE_NODE, "operator": "Exists", "effect": "NoSchedule"}],
}
# The job account of examples/any-image/ with the Role the chart gives it (templates/heartbeat-rbac.yaml).
JOB_ACCOUNT = """
apiVersion: v1
kind: ServiceAccount
metadata: {name: vigil-job, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: vigil-heartbeat, namespace: default}
rules: [{apiGroups: [""], resources: [pods], verbs: [patch]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: vigil-heartbeat, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: vigil-heartbeat}
subjects: [{kind: ServiceAccount, name: vigil-job, namespace: default}]
"""
# Who may read the metrics: a service account bound as the chart's <release>-metrics-reader is.
METRICS_READER = """
apiVersion: v1
kind: ServiceAccount
metadata: {name: vigil-metrics-reader, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: vigil-demo-metrics-reader}
rules: [{nonResourceURLs: [/metrics], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: vigil-demo-metrics-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: vigil-demo-metrics-reader}
subjects: [{kind: ServiceAccount, name: vigil-metrics-reader, namespace: default}]
"""


class Steps:
    """The demo's steps, numbered as they run, each between a line that says what it does and one
    that says it is done, with its time: `[demo step N/total]`."""

    def __init__(self, total: int) -> None:
        self.total, self.done = total, 0

    def run(self, what: str, run: Callable[[], T]) -> T:
        self.done += 1
        began, label = time.monotonic(), f"[demo step {self.done}/{self.total}]"
        testbed.log(f"{label} {what}")
        result = run()
        testbed.log(f"{label} done in {time.monotonic() - began:.1f}s")
        return result


@dataclass(frozen=True)
class Served:
    """Where the demo's operator serves, on loopback, from the cluster's port base."""

    webhook: int
    metrics: int
    health: int
    beats: int
    certs: Path  # ca.crt, tls.crt, tls.key: the webhook's and the metrics' serving certificate
    address: str = "127.0.0.1"  # of the webhook and the beats: the real node's bridge when there is one
    agent_image: str | None = None  # the injected agent's (--agent-image), on a real node

    @classmethod
    def of(cls, cluster: testbed.Cluster, address: str = "127.0.0.1", agent_image: str | None = None) -> Served:
        base = cluster.ports.apiserver
        return cls(base + 10, base + 11, base + 12, base + 13, cluster.dir / "vigil-demo-certs", address, agent_image)


def _vigil_command(served: Served) -> list[str]:
    script = Path(sys.executable).with_name("vigil")
    if not script.exists():
        raise testbed.ClusterError(f"{script} is missing: install the project first (make venv).")
    certs = served.certs
    return [
        str(script), "operator", "--log-level", "info",
        "--leader-elect", "--lease-namespace", LEASE[0], "--lease-name", LEASE[1],
        "--webhook-address", f"{served.address}:{served.webhook}",
        "--webhook-cert-file", str(certs / "tls.crt"), "--webhook-key-file", str(certs / "tls.key"),
        "--beat-address", f"{served.address}:{served.beats}",
        "--heartbeat-url", f"https://{served.address}:{served.beats}/v1/heartbeat",
        "--heartbeat-ca-file", str(certs / "ca.crt"),
        "--metrics-address", f"127.0.0.1:{served.metrics}",
        "--metrics-cert-file", str(certs / "tls.crt"), "--metrics-key-file", str(certs / "tls.key"),
        "--health-address", f"127.0.0.1:{served.health}",
        *(("--agent-image", served.agent_image) if served.agent_image else ()),
    ]  # fmt: skip


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


def _operator_log_tail(cluster: testbed.Cluster) -> str:
    log = cluster.logs / "vigil-operator.log"
    return "\n".join(log.read_text(errors="replace").splitlines()[-15:]) if log.exists() else "(no log)"


def _ready(served: Served) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{served.health}/readyz", timeout=2) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start_operator(cluster: testbed.Cluster, served: Served, timeout: float = 60) -> Served:
    """The operator, with a fresh serving certificate, and the webhook registered for it; until
    it is ready (it leads, and every watch has listed)."""
    testbed.stop(cluster, "vigil-operator")  # a new run gets the code as it is now
    ca = webhook.make_self_signed(served.certs, ip_addresses=sorted({"127.0.0.1", served.address}))
    url = f"https://{served.address}:{served.webhook}{webhook.PATH}"
    configuration = webhook.webhook_configuration(WEBHOOK_CONFIGURATION, ca, url=url)
    testbed.kubectl(cluster, "apply", "-f", "-", input=json.dumps(configuration))
    testbed.kubectl(cluster, "apply", "-f", "-", input=METRICS_READER)
    command = _vigil_command(served)
    testbed.start(cluster, "vigil-operator", command, env={"KUBECONFIG": str(cluster.kubeconfig)})
    deadline = time.monotonic() + timeout
    while not _ready(served):
        if not testbed.running_pid(cluster, "vigil-operator"):
            raise testbed.ClusterError(
                f"vigil operator exited; the last lines of its log:\n{_operator_log_tail(cluster)}"
            )
        if time.monotonic() > deadline:
            raise testbed.ClusterError(
                f"vigil operator not ready after {timeout:.0f}s (http://127.0.0.1:{served.health}/readyz); "
                f"the last lines of its log:\n{_operator_log_tail(cluster)}"
            )
        time.sleep(0.2)
    holder = testbed.kubectl(cluster, "get", "lease", "-n", LEASE[0], LEASE[1], "-o", "jsonpath={.spec.holderIdentity}")
    testbed.log(f"operator ready, leading Lease {LEASE[0]}/{LEASE[1]} as {holder}")
    return served


def _without_age(table: str) -> str:
    """The table without its last column (AGE), which changes every second by itself."""
    return "\n".join(line.rsplit(None, 1)[0] if line.strip() else line for line in table.splitlines())


def demo_manifests() -> list[dict]:
    """The objects of DEMO_EXAMPLES as written, but for their jobs' pods, placed on the kwok nodes."""
    objects = []
    for name in DEMO_EXAMPLES:
        for body in yaml.safe_load_all((ROOT / "examples" / f"{name}.yaml").read_text()):
            if body and body["kind"] in ("VigilJob", "VigilWorkerPool") and body["spec"].get("template"):
                body["spec"]["template"].setdefault("spec", {}).update(copy.deepcopy(KWOK_PLACEMENT))
            if body:
                objects.append(body)
    return objects


def keep_pool_workers(cluster: testbed.Cluster) -> None:
    """A `vigil-worker` process for each worker pod of the demo's pools that is up, none for a pod
    that is gone (see POOL_WORKER)."""
    pods = json.loads(testbed.kubectl(cluster, "get", "pods", "-l", api.LABEL_POOL, "-o", "json"))["items"]
    wanted = {}
    for pod in pods:
        meta, spec = pod["metadata"], pod["spec"]
        if meta.get("deletionTimestamp") or not spec.get("nodeName"):
            continue
        wanted[POOL_WORKER + meta["name"]] = pod
    running = {p.stem for p in cluster.pids.glob(f"{POOL_WORKER}*.pid")} if cluster.pids.exists() else set()
    for component in running - set(wanted):
        testbed.stop(cluster, component)
    for component, pod in wanted.items():
        if testbed.running_pid(cluster, component):
            continue
        meta = pod["metadata"]
        env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0].get("env") or [] if "value" in e}
        token = testbed.kubectl(
            cluster,
            "create", "token", pod["spec"].get("serviceAccountName") or "default", "-n", meta["namespace"],
            "--audience", "vigil.dev", "--duration", "24h",
            "--bound-object-kind", "Pod", "--bound-object-name", meta["name"], "--bound-object-uid", meta["uid"],
        ).strip()  # fmt: skip
        token_file = cluster.dir / f"{component}.token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        worker = Path(sys.executable).with_name("vigil-worker")
        testbed.start(
            cluster,
            component,
            [str(worker), "--", sys.executable, "-c", POOL_TASK],
            env={
                **{k: env[k] for k in ("VIGIL_PULL_URL", "VIGIL_PULL_CA", "VIGIL_POOL", "VIGIL_POOL_SLOTS")},
                "VIGIL_PULL_TOKEN_FILE": str(token_file),
                "VIGIL_POD_NAME": meta["name"],
                "VIGIL_POD_NAMESPACE": meta["namespace"],
                "VIGIL_POD_UID": meta["uid"],
            },
        )


def run_examples(cluster: testbed.Cluster, timeout: float) -> bool:
    examples = json.dumps({"apiVersion": "v1", "kind": "List", "items": demo_manifests()})
    # Foreground: until the last run's pods are gone too, so that the new attempts' pods (same names)
    # do not wait for the garbage collector (PodNameConflict).
    testbed.kubectl(
        cluster,
        "delete", "-f", "-", "--ignore-not-found", "--cascade=foreground", "--wait=true", "--timeout=60s",
        input=examples,
    )  # fmt: skip
    testbed.kubectl(cluster, "apply", "-f", "-", input=examples)
    deadline, shown = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        keep_pool_workers(cluster)
        # The objects first, then the tables: a table read after the objects shows at least their
        # state (a final phase stays final), so the last table printed is a finished one.
        jobs = json.loads(testbed.kubectl(cluster, "get", "vj", "-o", "json"))["items"]
        queues = json.loads(testbed.kubectl(cluster, "get", "vq", "-o", "json"))["items"]
        table = testbed.kubectl(cluster, "get", "vj") + "\n" + testbed.kubectl(cluster, "get", "vq")
        # Finished: every job in a final phase, and every queue's counts caught up with them.
        finished = (
            bool(jobs)
            and all((job.get("status") or {}).get("phase") in api.TERMINAL_PHASES for job in jobs)
            and all(not (q.get("status") or {}).get(n) for q in queues for n in ("running", "queued"))
        )
        if _without_age(table) != shown or finished:
            print(table, flush=True)
            shown = _without_age(table)
        if finished:
            return True
        if not testbed.running_pid(cluster, "vigil-operator"):
            raise testbed.ClusterError(
                f"vigil operator exited; the last lines of its log:\n{_operator_log_tail(cluster)}"
            )
        time.sleep(1)
    return False


def show_backpressure(cluster: testbed.Cluster, served: Served) -> None:
    """A job for the queue that takes none is refused by the webhook with 429 (a server-side
    dry run: nothing is stored either way); then one scrape of the metrics, with a token allowed
    to read them."""
    job = {
        "apiVersion": "vigil.dev/v1beta1",
        "kind": "VigilJob",
        "metadata": {"name": "one-too-many"},
        "spec": {
            "queue": CLOSED_QUEUE,
            "template": {"spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]}},
            "heartbeat": {"required": False},
        },
    }
    command = f"kubectl create --dry-run=server -f job.json    # a VigilJob for queue {CLOSED_QUEUE}"
    try:
        testbed.kubectl(cluster, "create", "--dry-run=server", "-f", "-", input=json.dumps(job))
    except testbed.ClusterError as refused:
        if "429" not in str(refused) and "TooManyRequests" not in str(refused):
            raise
        print(f"$ {command}\n{str(refused).partition('failed: ')[2]}", flush=True)
    else:
        raise testbed.ClusterError(f"the webhook admitted a job for queue {CLOSED_QUEUE!r} (maxQueued: 0)")
    lines = scrape(cluster, served)
    wanted = ("vigil_jobs{", "vigil_attempts_started_total", "vigil_queue_admission_refusals_total{")
    shown = [line for line in lines if line.startswith(wanted)]
    url = f"https://127.0.0.1:{served.metrics}/metrics"
    print(f"$ curl {url} (a token bound to the metrics reader): {len(lines)} lines, e.g.", flush=True)
    print("\n".join(shown[:6]), flush=True)


def scrape(cluster: testbed.Cluster, served: Served) -> list[str]:
    """The operator's /metrics, read with a token allowed to read them; its lines."""
    token = testbed.kubectl(cluster, "create", "token", "vigil-metrics-reader", "-n", "default").strip()
    url = f"https://127.0.0.1:{served.metrics}/metrics"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    context = ssl.create_default_context(cafile=str(served.certs / "ca.crt"))
    with urllib.request.urlopen(request, timeout=10, context=context) as answer:
        return answer.read().decode().splitlines()


def start_real_node(cluster: testbed.Cluster) -> str:
    """The real node, with Vigil's image (built by testbed/image.sh unless up to date) and the
    plain image imported; Vigil's image's name."""
    built = subprocess.run([str(ROOT / "testbed" / "image.sh")], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if built.returncode:
        raise testbed.ClusterError(f"testbed/image.sh could not build Vigil's image (exit {built.returncode})")
    image = built.stdout.strip().splitlines()[-1]
    real_node.up(cluster, [image, real_node.plain_image()])
    return image


def show_doubt(cluster: testbed.Cluster, served: Served, timeout: float = 240) -> None:
    """examples/any-image/stall.yaml and hang.yaml on the real node, followed to their end; the
    story they tell and the beats the leader counted, or an error naming what did not happen."""
    testbed.kubectl(cluster, "apply", "-f", "-", input=JOB_ACCOUNT)
    seen = doubt.watch(
        lambda *args, input=None: testbed.kubectl(cluster, *args, input=input),
        "default",
        real_node.plain_image(),
        real_node.POD_PLACEMENT,
        timeout,
        say=lambda line: print(line, flush=True),
    )
    print("\n".join(doubt.tell(seen)), flush=True)
    posts = [line for line in scrape(cluster, served) if line.startswith("vigil_heartbeat_posts_total{")]
    print("beats the real pods posted to the leader (vigil_heartbeat_posts_total), by outcome:", flush=True)
    print("\n".join(line for line in posts if not line.endswith(" 0.0")), flush=True)
    if missing := doubt.problems(seen):
        raise testbed.ClusterError("the real node's jobs did not tell the whole story:\n" + "\n".join(missing))


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
    parser.add_argument(
        "--real-node",
        action="store_true",
        default=os.environ.get("VIGIL_REAL_NODE", "") not in ("", "0"),
        help="add the bed's real node and run examples/any-image/ on it ($VIGIL_REAL_NODE=1; root)",
    )
    args = parser.parse_args(argv)
    saved = testbed.Cluster.load(args.name)
    base = args.port_base or (saved.ports.apiserver if saved else 16443)
    cluster = testbed.Cluster(args.name, testbed.Ports.from_base(base))
    steps = Steps(7 if args.real_node else 5)
    began = time.monotonic()
    try:
        steps.run(
            f"cluster {cluster.name!r}: etcd, kube-apiserver, controller manager, scheduler, "
            f"kwok and {args.nodes} nodes on {cluster.server}",
            lambda: testbed.up(cluster, args.nodes, durable=True),
        )
        served = Served.of(cluster)
        if args.real_node:
            image = steps.run(
                "the real node: a kubelet with containerd, with Vigil's image (testbed/image.sh) and a plain one",
                lambda: start_real_node(cluster),
            )
            served = Served.of(cluster, address=real_node.gateway(cluster), agent_image=image)
        print(testbed.kubectl(cluster, "get", "nodes"), flush=True)
        steps.run("Vigil's CRDs (crds/), until Established", lambda: install_crds(cluster))
        steps.run(
            "vigil operator as the chart runs it (leader election, webhook, beats to the leader, metrics, health)",
            lambda: start_operator(cluster, served),
        )
        finished = steps.run(
            f"the jobs in examples/ ({', '.join(DEMO_EXAMPLES)}) on the kwok nodes, until each has finished",
            lambda: run_examples(cluster, args.timeout),
        )
        steps.run(
            f"backpressure: a job for queue {CLOSED_QUEUE!r} (maxQueued: 0), and the metrics",
            lambda: show_backpressure(cluster, served),
        )
        if args.real_node:
            steps.run(
                "on the real node, examples/any-image/stall.yaml and hang.yaml: the default heartbeat from "
                "an image with nothing of Vigil, Uncertain and back, Lost, NoOverlap, a checkpoint carried",
                lambda: show_doubt(cluster, served),
            )
    except testbed.ClusterError as err:
        testbed.log(f"ERROR: {err}")
        return 1
    kubeconfig = f"export KUBECONFIG={cluster.kubeconfig} PATH={testbed.BIN}:$PATH"
    print(kubeconfig)
    print("kubectl get vj -l vigil.dev/dead-letter=true     # the dead-letter queue")
    print("kubectl describe vj flaky                         # attempts, backoff, events")
    if args.real_node:
        print("kubectl describe vj stall                         # HeartbeatUncertain, then HeartbeatResumed")
        print("kubectl logs hang-2                               # the attempt that resumed from the checkpoint")
    down = "make down" if cluster.name == "default" else f"VIGIL_CLUSTER={cluster.name} make down"
    print(f"operator log: {cluster.logs / 'vigil-operator.log'}; stop everything with: {down}")
    print(
        f"operator: webhook https://{served.address}:{served.webhook}, beats https://{served.address}:{served.beats}, "
        f"metrics https://127.0.0.1:{served.metrics}/metrics "
        f"(a token: kubectl create token vigil-metrics-reader; CA {served.certs / 'ca.crt'}), "
        f"health http://127.0.0.1:{served.health}/healthz and /readyz, Lease {LEASE[0]}/{LEASE[1]}"
    )
    if not finished:
        testbed.log(f"ERROR: the examples did not all finish within {args.timeout:.0f}s")
        return 1
    testbed.log(f"the demo is up in {time.monotonic() - began:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
