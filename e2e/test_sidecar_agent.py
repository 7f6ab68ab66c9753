"""The injected agent (heartbeat.agent: Sidecar) with real processes: a job container from an
image with no Python and nothing of Vigil (`plain_image`: sleep, touch and sh), and
`vigil-agent --sidecar` from Vigil's image beside it in one PID namespace, as a pod with
shareProcessNamespace: true has them: a pause container (`/pause`, PID 1) holds the namespace and
both join it (`podman --pid container:PAUSE`), all three as the chart runs Vigil's image (user
65532, read-only root, no capabilities: the agent signals the job by sharing its UID). The agent
beats for a kwok pod of the test cluster, with a token bound to it, as the pod's own agent would.

- while the job runs, the pod's vigil.dev/heartbeat changes (and the agent's RSS is printed);
- under NoOverlap, the pod marked superseded: the job's container is stopped (143 or 137) and
  the agent exits 75;
- the job exiting by itself: the agent stops beating and exits 0, and the checkpoint the job
  left (from a shell) is on the pod;
- a liveness file the job stops touching: the beats stop though the process runs on."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import yaml

from tests.support.agents import HEARTBEAT_ANNOTATION, create_job_pod, grant_heartbeat_rbac, pod_token
from tests.support.cluster import ROOT, Kube, read_pod
from tests.support.images import CONTAINER_PREFIX, KUBECONFIG_IN_CONTAINER, Container, inline_kubeconfig, plain_image
from tests.support.waits import holds, wait_until
from vigil import api

pytestmark = pytest.mark.e2e  # the image and a real cluster

INTERVAL, TIMEOUT = 1, 6  # the agent's beats: every second; fenced after 6 s without a renewal
CHECKPOINT = '{"offset":1200}'


def annotation_of(kube: Kube, ns: str, pod: str, key: str) -> str | None:
    found = read_pod(kube, ns, pod)
    return (found.metadata.annotations or {}).get(key) if found else None


def beat_of(kube: Kube, ns: str, pod: str) -> str | None:
    return annotation_of(kube, ns, pod, HEARTBEAT_ANNOTATION)


def rss_kib(container: Container) -> int:
    """The resident memory of the container's main process, from the host's /proc."""
    pid = Container.state(container)["Pid"]
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


class Pod:
    """A pause container, the agent and the job, sharing the pause container's PID namespace."""

    def __init__(self, stack: ExitStack, kube: Kube, ns: str, tmp_path: Path, image: str, pod: str, **agent_env: str):
        self.stack, self.ns, self.pod = stack, ns, pod
        self.plain = plain_image()
        suffix = uuid.uuid4().hex[:8]
        self.pause_name = f"{CONTAINER_PREFIX}-pause-{suffix}"
        self.names = {role: f"{CONTAINER_PREFIX}-{role}-{suffix}" for role in ("agent", "job")}
        self.shared = tmp_path / "vigil-liveness"  # the pod's emptyDir at /var/run/vigil
        self.shared.mkdir()
        self.shared.chmod(0o1777)
        self.pause = stack.enter_context(Container(self.plain, self.pause_name, ["/pause", "infinity"]))
        self.join = ["--pid", f"container:{self.pause_name}", "--volume", f"{self.shared}:/var/run/vigil:rw"]
        identity = read_pod(kube, ns, pod)
        assert identity is not None
        token = pod_token(kube, ns, {"name": pod, "uid": identity.metadata.uid})
        kubeconfig = inline_kubeconfig(kube, tmp_path / f"{pod}.kubeconfig", token=token)
        env = {
            "POD_NAME": pod,
            "POD_NAMESPACE": ns,
            "KUBECONFIG": KUBECONFIG_IN_CONTAINER,
            "VIGIL_HEARTBEAT_INTERVAL": str(INTERVAL),
            "VIGIL_HEARTBEAT_TIMEOUT": str(TIMEOUT),
            "VIGIL_STOP_GRACE_SECONDS": "2",
            "VIGIL_STARTUP_GRACE": "30",
            **agent_env,
        }
        # First, as the kubelet starts a native sidecar before the main containers.
        self.agent = stack.enter_context(
            Container(
                image,
                self.names["agent"],
                ["--sidecar"],
                entrypoint="vigil-agent",
                env=env,
                files={kubeconfig: KUBECONFIG_IN_CONTAINER},
                extra=self.join,
            )
        )

    def start_job(self, script: str, env: dict[str, str] | None = None) -> Container:
        return self.stack.enter_context(
            Container(self.plain, self.names["job"], ["/bin/sh", "-c", script], env=env, extra=self.join)
        )


@contextmanager
def plain_pod(kube: Kube, ns: str, tmp_path: Path, image: str, **agent_env: str) -> Iterator[Pod]:
    grant_heartbeat_rbac(kube, ns)
    create_job_pod(kube, ns, "plain")
    with ExitStack() as stack:
        yield Pod(stack, kube, ns, tmp_path, image, "plain", **agent_env)


def beats_change(kube: Kube, ns: str, pod: str, times: int, what: str) -> None:
    seen: list[str] = []

    def new_beat() -> bool:
        value = beat_of(kube, ns, pod)
        if value and (not seen or seen[-1] != value):
            seen.append(value)
        return len(seen) > times

    wait_until(new_beat, 10 + times * INTERVAL, what)


def test_the_injected_agent_beats_for_a_plain_image_and_stops_it_when_superseded(
    kube: Kube, image: str, own_namespace: str, tmp_path: Path
):
    ns = own_namespace
    with plain_pod(kube, ns, tmp_path, image, VIGIL_GUARANTEE="NoOverlap") as pod:
        job = pod.start_job("sleep 3600")
        beats_change(kube, ns, "plain", 3, "three new beats from the injected agent while the job runs")
        assert job.exit_code() is None and pod.agent.exit_code() is None, pod.agent.logs()
        rss = rss_kib(pod.agent)
        print(f"the injected agent's RSS while beating: {rss / 1024:.1f} MiB", file=sys.__stderr__)
        assert rss < 96 * 1024, f"the agent uses {rss} KiB, beyond the 96Mi limit of vigil.core.manifest"

        kube.core.patch_namespaced_pod("plain", ns, {"metadata": {"annotations": {"vigil.dev/superseded": "2"}}})
        code = wait_until(lambda: job.exit_code(), 10, "the job's container to be stopped by its agent")
        assert code in (143, 137), f"the job exited {code}, not by SIGTERM or SIGKILL"
        assert wait_until(lambda: pod.agent.exit_code(), 10, "the agent to exit") == 75, pod.agent.logs()
        assert "superseded" in pod.agent.logs()


def test_the_injected_agent_waits_for_the_job_then_stops_beating_and_exits_0_when_it_ends(
    kube: Kube, image: str, own_namespace: str, tmp_path: Path
):
    ns = own_namespace
    with plain_pod(kube, ns, tmp_path, image, VIGIL_CHECKPOINT_FILE=api.CHECKPOINT_FILE) as pod:
        beats_change(kube, ns, "plain", 1, "the agent to beat while the job's container starts")
        # A checkpoint from a shell, as any image can leave one: a whole file, renamed into place.
        write = f"echo '{CHECKPOINT}' > {api.CHECKPOINT_FILE}.tmp && mv {api.CHECKPOINT_FILE}.tmp {api.CHECKPOINT_FILE}"
        job = pod.start_job(f"sleep 2; {write}; sleep 2; exit 3")  # its status is the kubelet's to report
        assert wait_until(lambda: job.exit_code(), 15, "the job to exit by itself") == 3
        assert wait_until(lambda: pod.agent.exit_code() is not None, 10, "the agent to exit") is True
        assert pod.agent.exit_code() == 0, pod.agent.logs()
        assert "the job's processes have all exited" in pod.agent.logs()
        # Published at the job's end (within 30 s of the last one, and always at the end).
        assert annotation_of(kube, ns, "plain", api.ANNOTATION_CHECKPOINT) == CHECKPOINT, pod.agent.logs()
        last = beat_of(kube, ns, "plain")

        def unchanged() -> None:
            assert beat_of(kube, ns, "plain") == last, "a beat after the job ended"

        holds(unchanged, 3 * INTERVAL)


def test_the_injected_agent_stops_beating_when_the_job_stops_touching_its_liveness_file(
    kube: Kube, image: str, own_namespace: str, tmp_path: Path
):
    ns = own_namespace
    with plain_pod(kube, ns, tmp_path, image, VIGIL_LIVENESS_FILE="/var/run/vigil/alive") as pod:
        # Touches for 4 s, then hangs: the process lives on but does no work.
        job = pod.start_job("for i in 1 2 3 4; do touch /var/run/vigil/alive; sleep 1; done; sleep 3600")
        beats_change(kube, ns, "plain", 2, "beats while the job touches its liveness file")
        wait_until(lambda: "not beating: the job has not touched" in pod.agent.logs(), 20, "the agent to hold back")
        last = beat_of(kube, ns, "plain")

        def unchanged() -> None:
            assert beat_of(kube, ns, "plain") == last, "a beat although the job stopped touching its file"

        holds(unchanged, 3 * INTERVAL)
        # AtLeastOnce (the default): the agent only warns; the operator declares the attempt Lost.
        assert job.exit_code() is None and pod.agent.exit_code() is None, pod.agent.logs()


def test_the_any_image_example_resumes_from_its_checkpoint_beside_the_injected_agent(
    kube: Kube, image: str, own_namespace: str, tmp_path: Path
):
    """examples/any-image/count.yaml's own script and liveness file, in the image with no Python,
    as the second attempt of the job: it resumes from the first one's checkpoint, touches its
    liveness file, leaves a checkpoint per step, and the agent publishes the last one."""
    ns = own_namespace
    example = yaml.safe_load((ROOT / "examples" / "any-image" / "count.yaml").read_text())
    (main,) = example["spec"]["template"]["spec"]["containers"]
    assert main["command"][:2] == ["sh", "-c"]
    liveness = example["spec"]["heartbeat"]["livenessFile"]
    agent_env = {"VIGIL_LIVENESS_FILE": liveness, "VIGIL_CHECKPOINT_FILE": api.CHECKPOINT_FILE}
    with plain_pod(kube, ns, tmp_path, image, **agent_env) as pod:
        env = {
            **{e["name"]: e["value"] for e in main["env"]},
            "COUNT_TO": "5",  # not 600 steps of a second
            "VIGIL_ATTEMPT": "2",
            "VIGIL_CHECKPOINT": '{"done":2}',  # what the operator gives the next attempt
            "VIGIL_CHECKPOINT_FILE": api.CHECKPOINT_FILE,
        }
        job = pod.start_job(main["command"][2], env=env)
        beats_change(kube, ns, "plain", 2, "beats while the example counts")
        assert wait_until(lambda: job.exit_code() is not None, 20, "the example to finish") is True
        assert job.exit_code() == 0, job.logs()
        assert "attempt 2 starts at 2" in job.logs() and "counted to 5" in job.logs()
        assert wait_until(lambda: pod.agent.exit_code() is not None, 10, "the agent to exit") is True
        assert annotation_of(kube, ns, "plain", api.ANNOTATION_CHECKPOINT) == '{"done":5}', pod.agent.logs()
