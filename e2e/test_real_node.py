"""Vigil's injected agent in a real pod, on the bed's real node (a kubelet with containerd,
testbed/node.py; the `real_node` fixture): an operator given `--agent-image` runs a VigilJob with
the default heartbeat (required, agent unset) whose image has no Python and nothing of Vigil. The
kubelet starts `vigil-agent --sidecar` as a native sidecar in one PID namespace with the job; the
agent reaches the API server as the pod's service account, by the kubernetes Service's address,
and beats by the pod's vigil.dev/heartbeat annotation (no --heartbeat-url).

- the attempt runs, beats arrive (annotation and status.currentAttempt.lastHeartbeatAt), the job
  Succeeds when its command exits 0, and `kubectl logs` shows the job's output;
- under NoOverlap, the pod marked vigil.dev/superseded: the agent stops the job's container (the
  kubelet reports 143 or 137), as the pod runs as one UID (65532) and the agent needs no capability;
- `make up REAL_NODE=1`'s last step (testbed.doubt), beats to the leader over the node's bridge:
  Uncertain and back, Lost and fenced under NoOverlap, a checkpoint carried;
- `heartbeat.agent: Image`: `vigil-agent -- python3 ...` in the job's own container (Vigil's
  image), beating, passing the child's exit code through, carrying vigil.agent.checkpoint();
  `kubectl vigil logs -f --all-attempts` follows attempt 1's log as it is written, then the
  retry's after a line naming it, and ends with the job.

e2e/test_sidecar_agent.py runs the same processes under podman; this is the kubelet's way."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed import doubt
from testbed import node as real_node_bed
from tests.support.agents import HEARTBEAT_ANNOTATION, JOB_ACCOUNT, grant_heartbeat_rbac
from tests.support.cluster import SUITE_CLUSTER, Kube, free_port, install_crds, read_pod, show_log
from tests.support.fixtures import RealNode
from tests.support.jobs import GROUP, VERSION, create, pods_of, status
from tests.support.operators import OperatorProcess, beat_args, counted_beats
from tests.support.plugin import plugin_command, plugin_environment
from tests.support.waits import deadline, wait_until
from vigil import api
from vigil.servers.webhook import make_self_signed

pytestmark = pytest.mark.e2e

HEARTBEAT = {"intervalSeconds": 2, "timeoutSeconds": 10}  # required and agent left to their defaults
GREETING = "hello from a real pod on the real node"


def real_job(node: RealNode, name: str, script: str, guarantee: str = "AtLeastOnce") -> dict:
    """A VigilJob whose pod runs `script` from the plain image on the real node, as UID 65532."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "VigilJob",
        "metadata": {"name": name},
        "spec": {
            "guarantee": guarantee,
            "heartbeat": HEARTBEAT,
            "retry": {"maxAttempts": 1},
            "template": {
                "spec": {
                    **node.placement,
                    "serviceAccountName": JOB_ACCOUNT,
                    # One UID for the whole pod: the agent inherits it and may signal the job.
                    "securityContext": {"runAsUser": 65532, "runAsNonRoot": True},
                    "terminationGracePeriodSeconds": 5,
                    "containers": [
                        {
                            "name": "main",
                            "image": node.plain_image,
                            "imagePullPolicy": "Never",
                            "command": ["/bin/sh", "-c", script],
                        }
                    ],
                }
            },
        },
    }


@pytest.fixture
def operator(kube: Kube, real_node: RealNode, own_namespace: str, tmp_path: Path, request) -> Iterator:
    install_crds(kube)
    grant_heartbeat_rbac(kube, own_namespace)
    process = OperatorProcess(
        kube, [own_namespace], tmp_path / "operator.log", extra_args=("--agent-image", real_node.vigil_image)
    )
    failed_before = request.session.testsfailed
    process.start()
    try:
        yield process
    finally:
        process.stop()
        if request.session.testsfailed > failed_before:
            show_log(process.log_path)


def the_pod(kube: Kube, ns: str, job: dict):
    (pod,) = wait_until(lambda: pods_of(kube, ns, job), 30, "the attempt's pod")
    return pod


def beat_of(kube: Kube, ns: str, pod: str) -> str | None:
    found = read_pod(kube, ns, pod)
    return (found.metadata.annotations or {}).get(HEARTBEAT_ANNOTATION) if found else None


def new_beats(kube: Kube, ns: str, pod: str, count: int) -> list[str]:
    seen: list[str] = []

    def another() -> bool:
        value = beat_of(kube, ns, pod)
        if value and (not seen or seen[-1] != value):
            seen.append(value)
        return len(seen) > count

    wait_until(another, 20 + count * HEARTBEAT["intervalSeconds"] * 2, f"{count} new beats on {pod}")
    return seen


def container_status(kube: Kube, ns: str, pod: str, name: str):
    found = read_pod(kube, ns, pod)
    statuses = [*(found.status.container_statuses or []), *(found.status.init_container_statuses or [])]
    return next((s for s in statuses if s.name == name), None) if found else None


def exit_code(kube: Kube, ns: str, pod: str, name: str = "main") -> int | None:
    found = container_status(kube, ns, pod, name)
    terminated = found.state.terminated if found and found.state else None
    return terminated.exit_code if terminated else None


def wait_running(kube: Kube, ns: str, name: str, pod: str) -> None:
    def running() -> bool:
        attempt = status(kube, ns, name).get("currentAttempt") or {}
        return attempt.get("phase") == "Running"

    # The first pod of the node starts its sandbox and Python in the agent: seconds, on 2 busy cores.
    wait_until(running, 90, f"{name}'s attempt to run (pod {pod}: {container_status(kube, ns, pod, 'main')})")


def test_a_job_from_a_plain_image_runs_with_the_injected_agent_beating_in_a_real_pod(
    kube: Kube, real_node: RealNode, own_namespace: str, operator: OperatorProcess
):
    ns = own_namespace
    script = f"echo '{GREETING}'; sleep 14; echo 'the job is done'"
    job = create(kube, ns, real_job(real_node, "real", script))
    pod = the_pod(kube, ns, job)
    name = pod.metadata.name
    assert pod.spec.share_process_namespace is True
    agent = pod.spec.init_containers[-1]
    assert (agent.name, agent.image, agent.restart_policy) == (api.AGENT_CONTAINER, real_node.vigil_image, "Always")

    wait_running(kube, ns, "real", name)
    found = read_pod(kube, ns, name)
    assert found is not None and found.spec.node_name == real_node.name
    new_beats(kube, ns, name, 2)  # by the agent in the pod, as the pod's service account
    wait_until(
        lambda: (status(kube, ns, "real").get("currentAttempt") or {}).get("lastHeartbeatAt"),
        20,
        "the job's status to show the attempt's last beat",
    )

    wait_until(lambda: status(kube, ns, "real").get("phase") in api.TERMINAL_PHASES, 60, "the job to end")
    final = status(kube, ns, "real")
    assert final["phase"] == "Succeeded", final
    assert exit_code(kube, ns, name) == 0
    logs = kube.kubectl("logs", "-n", ns, name, "-c", "main").stdout
    assert GREETING in logs and "the job is done" in logs, logs


def test_the_injected_agent_stops_the_job_of_a_superseded_pod_on_the_real_node(
    kube: Kube, real_node: RealNode, own_namespace: str, operator: OperatorProcess
):
    ns = own_namespace
    job = create(kube, ns, real_job(real_node, "fenced", "echo started; sleep 3600", guarantee="NoOverlap"))
    name = the_pod(kube, ns, job).metadata.name
    wait_running(kube, ns, "fenced", name)
    new_beats(kube, ns, name, 1)
    assert exit_code(kube, ns, name) is None

    kube.core.patch_namespaced_pod(name, ns, {"metadata": {"annotations": {api.ANNOTATION_SUPERSEDED: "2"}}})
    code = wait_until(lambda: exit_code(kube, ns, name), 30, "the job's container to be stopped by the agent")
    assert code in (143, 137), f"the job exited {code}, not by SIGTERM or SIGKILL"
    print(f"the job's container on the real node, stopped by the injected agent: exit {code}", file=sys.__stderr__)
    # The kubelet restarts a native sidecar that exits (75, here) while the job's container runs:
    # what the first agent said may be in its previous container's log.
    agent_logs = "".join(
        kube.kubectl("logs", "-n", ns, name, "-c", api.AGENT_CONTAINER, f"--previous={previous}", check=False).stdout
        for previous in ("false", "true")
    )
    assert "superseded" in agent_logs, agent_logs


def test_the_demo_of_doubt_runs_on_the_real_node_uncertain_and_back_lost_fenced_and_resumed(
    kube: Kube, real_node: RealNode, own_namespace: str, tmp_path: Path, request
):
    """`make up REAL_NODE=1`'s last step (testbed.doubt), with the operator as it runs it: beats to
    the leader, served on the real node's bridge, where the pods reach it. examples/any-image/
    stall.yaml goes Uncertain and comes back to Running in one attempt; hang.yaml's first attempt
    hangs, is Lost, and its agent stops it before attempt 2 starts (NoOverlap) from its checkpoint."""
    ns = own_namespace
    install_crds(kube)
    grant_heartbeat_rbac(kube, ns, account="vigil-job")  # the examples' account, as the chart makes it
    address = real_node_bed.gateway(SUITE_CLUSTER)
    certs = tmp_path / "certs"
    make_self_signed(certs, ip_addresses=("127.0.0.1", address))
    port = free_port()
    metrics_port = free_port()
    beats = (
        *beat_args(certs, port, f"https://{address}:{port}/v1/heartbeat", address=address),
        "--agent-image", real_node.vigil_image,
        "--metrics-address", f"127.0.0.1:{metrics_port}", "--metrics-insecure",
    )  # fmt: skip
    process = OperatorProcess(kube, [ns], tmp_path / "operator.log", extra_args=beats)
    failed_before = request.session.testsfailed
    process.start()
    try:
        seen = doubt.watch(
            lambda *args, input=None: kube.kubectl(*args, input=input).stdout,
            ns,
            real_node.plain_image,
            real_node.placement,
            timeout=240,
            say=lambda line: print(line, file=sys.__stderr__),
        )
        story = "\n".join(doubt.tell(seen))
        assert not doubt.problems(seen), f"{doubt.problems(seen)}\n{story}"
        print(story, file=sys.__stderr__)
        assert counted_beats(metrics_port) > 0, "no beat from the real pods reached the leader over the bridge"
    finally:
        process.stop()
        if request.session.testsfailed > failed_before:
            show_log(process.log_path)


# The job's own code under `vigil-agent -- CMD` (heartbeat.agent: Image), from Vigil's image: the
# first attempt leaves a checkpoint with vigil.agent.checkpoint() and fails with 3, the second
# reads it with previous_checkpoint() and succeeds.
OWN_AGENT_JOB = """
import sys, time
from vigil.agent import checkpoint, previous_checkpoint
before = previous_checkpoint()
print("attempt starts from", before, flush=True)
if before is None:
    checkpoint({"step": 7})
    time.sleep(6)
    sys.exit(3)
print("resumed at step", before["step"], flush=True)
"""


def test_vigil_agent_in_the_jobs_own_image_beats_passes_exit_codes_and_carries_a_checkpoint_on_the_real_node(
    kube: Kube, real_node: RealNode, own_namespace: str, operator: OperatorProcess
):
    ns = own_namespace
    job = real_job(real_node, "own-agent", "")
    spec = job["spec"]
    spec["heartbeat"] = {**HEARTBEAT, "agent": "Image"}
    spec["retry"] = {"maxAttempts": 2, "backoff": {"initialSeconds": 1, "factor": 2.0, "maxSeconds": 5, "jitter": 0.0}}
    (container,) = spec["template"]["spec"]["containers"]
    container.update(image=real_node.vigil_image, command=["vigil-agent", "--", "python3", "-c", OWN_AGENT_JOB])
    created = create(kube, ns, job)
    # Followed from before its first attempt, as a user would: across the retry, to the job's end.
    follow = subprocess.Popen(
        [*plugin_command(), "-n", ns, "logs", "own-agent", "-f", "--all-attempts"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=plugin_environment(kube.kubeconfig),
    )
    first = the_pod(kube, ns, created).metadata.name
    assert not [c for c in read_pod(kube, ns, first).spec.init_containers or [] if c.name == api.AGENT_CONTAINER]
    new_beats(kube, ns, first, 2)  # by vigil-agent in the job's own container, as the pod's account

    wait_until(lambda: status(kube, ns, "own-agent").get("phase") in api.TERMINAL_PHASES, 90, "the job to end")
    final = status(kube, ns, "own-agent")
    assert final["phase"] == "Succeeded" and final["attempts"] == 2, final
    assert final["history"][0]["exitCode"] == 3, final["history"]  # the child's status, passed through
    assert json.loads(final["lastCheckpoint"]) == {"step": 7}, final
    second = next(p.metadata.name for p in pods_of(kube, ns, created) if p.metadata.name != first)
    logs = kube.kubectl("logs", "-n", ns, second, "-c", "main").stdout
    assert "resumed at step 7" in logs, logs
    try:
        followed, notes = follow.communicate(timeout=deadline(20))  # it ends with the job
    finally:
        follow.kill()
    assert follow.returncode == 0, notes
    assert followed.startswith(f"--- attempt 1: pod {first} on {real_node.name} ---\n"), followed
    retry = followed.index(f"--- attempt 2: pod {second} on {real_node.name} ---\n")
    assert followed.index("attempt starts from None") < retry < followed.index("resumed at step 7"), followed


# A pulled task on the real node: appends "<index> <attempt> <idempotency key> <exit code>" to the
# ledger (a hostPath the test reads) and exits 3 for the poison index 13, else 0.
POOL_TASK = r"""
import os, sys, time
index = int(os.environ["VIGIL_TASK_INDEX"])
time.sleep(0.1)
code = 3 if index == 13 else 0
with open("/ledger/ledger.txt", "a") as ledger:
    ledger.write(f"{index} {os.environ['VIGIL_ATTEMPT']} {os.environ['VIGIL_IDEMPOTENCY_KEY']} {code}\n")
sys.exit(code)
"""


def test_a_pool_of_real_worker_pods_runs_an_array_and_a_worker_deleted_mid_run_runs_no_task_twice(
    kube: Kube, real_node: RealNode, own_namespace: str, tmp_path: Path, request
):
    """Issue 45 on the kubelet: a VigilWorkerPool of two worker pods from Vigil's image
    (`vigil-worker -- python3 -c ...`), pulling over the node's bridge with their projected
    tokens, runs a pulled array of 200 tasks; one worker pod is deleted mid-run (its worker drains:
    its tasks finish and are reported, and the pool replaces it), the poison task is dead-lettered
    after its attempts, and the ledger shows every other task succeeded exactly once."""
    ns = own_namespace
    install_crds(kube)
    address = real_node_bed.gateway(SUITE_CLUSTER)
    certs = tmp_path / "certs"
    make_self_signed(certs, ip_addresses=("127.0.0.1", address))
    port = free_port()
    beats = beat_args(certs, port, f"https://{address}:{port}/v1/heartbeat", address=address)
    process = OperatorProcess(kube, [ns], tmp_path / "operator.log", extra_args=beats)
    ledger = Path(f"/tmp/vigil-ledger-{ns}")  # under /tmp itself: the pods' user may reach it
    ledger.mkdir(mode=0o777, exist_ok=True)
    ledger.chmod(0o777)
    failed_before = request.session.testsfailed
    process.start()
    try:
        worker = {
            "name": "worker",
            "image": real_node.vigil_image,
            "imagePullPolicy": "Never",
            "command": ["vigil-worker", "--grace", "20", "--", "python3", "-c", POOL_TASK],
            "volumeMounts": [{"name": "ledger", "mountPath": "/ledger"}],
        }
        pool = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "VigilWorkerPool",
            "metadata": {"name": "real"},
            "spec": {
                "minReplicas": 2,
                "maxReplicas": 2,
                "slotsPerWorker": 4,
                "heartbeat": {"intervalSeconds": 2, "timeoutSeconds": 10},
                "template": {
                    "spec": {
                        **real_node.placement,
                        "securityContext": {"runAsUser": 65532, "runAsNonRoot": True},
                        "terminationGracePeriodSeconds": 40,
                        "containers": [worker],
                        "volumes": [{"name": "ledger", "hostPath": {"path": str(ledger), "type": "Directory"}}],
                    }
                },
            },
        }
        kube.custom.create_namespaced_custom_object(GROUP, VERSION, ns, "vigilworkerpools", pool)

        def running_workers() -> list:
            pods = kube.core.list_namespaced_pod(ns, label_selector="vigil.dev/pool=real").items
            return [p for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]

        wait_until(lambda: len(running_workers()) == 2, 120, "two worker pods running on the real node")
        array = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "VigilJob",
            "metadata": {"name": "real-array"},
            "spec": {
                "pool": "real",
                "tasks": {"count": 200, "parallelism": 8},
                "retry": {"maxAttempts": 2, "backoff": {"initialSeconds": 1, "jitter": 0.0}},
            },
        }
        uid = create(kube, ns, array)["metadata"]["uid"]
        record = ledger / "ledger.txt"

        def runs() -> list[tuple[int, int, str, int]]:
            text = record.read_text() if record.exists() else ""
            return [(int(i), int(a), k, int(c)) for i, a, k, c in (line.split() for line in text.splitlines() if line)]

        wait_until(lambda: len(runs()) >= 40, 120, "40 tasks run")
        victim = running_workers()[0].metadata.name
        kube.core.delete_namespaced_pod(victim, ns)  # gracefully: its worker drains
        wait_until(lambda: status(kube, ns, "real-array").get("phase") == "DeadLettered", 240, "the array's end")
        tasks = status(kube, ns, "real-array")["tasks"]
        assert tasks["deadLetteredIndexes"] == "13" and tasks["succeeded"] == 199, tasks
        successes: dict[int, int] = {}
        for index, _, key, code in runs():
            assert key == f"{uid}-{index}"
            if code == 0:
                successes[index] = successes.get(index, 0) + 1
        assert successes == {index: 1 for index in range(200) if index != 13}, sorted(
            (i, n) for i, n in successes.items() if n != 1
        )
        assert sum(1 for index, _, _, code in runs() if index == 13 and code == 3) == 2  # both attempts
        assert victim not in [p.metadata.name for p in running_workers()]
        assert len(running_workers()) == 2, "the pool replaced the deleted worker"
    finally:
        process.stop()
        if request.session.testsfailed > failed_before:
            show_log(process.log_path)
        subprocess.run(["rm", "-rf", str(ledger)], check=False)
