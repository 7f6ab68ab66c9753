"""Vigil's image, built here from the repository's Dockerfile (testbed/image.sh), run with podman
as the chart runs it (host network, user 65532, read-only root with a writable /tmp, no
capabilities, no privilege escalation): `vigil operator` takes a job through a failed attempt,
its backoff and a successful retry, serves /readyz and /metrics and stops on SIGTERM;
`kubectl-vigil` reads the job; `vigil-agent` beats for a pod and passes its child's exit status
through. The image is the chart's default one."""

from __future__ import annotations

import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from tests.support.agents import HEARTBEAT_ANNOTATION, create_job_pod, grant_heartbeat_rbac, pod_token
from tests.support.cluster import ROOT, Kube, free_port, install_crds, read_pod
from tests.support.images import (
    CONTAINER_PREFIX,
    KUBECONFIG_IN_CONTAINER,
    Container,
    inline_kubeconfig,
    podman,
    run_once,
)
from tests.support.jobs import FAST_BACKOFF, create, vigil_job, wait_phase
from tests.support.operators import LEASE, holder
from tests.support.waits import deadline, wait_until

pytestmark = pytest.mark.e2e  # the image end to end, on a real cluster


def container_name(role: str) -> str:
    return f"{CONTAINER_PREFIX}-{role}-{uuid.uuid4().hex[:8]}"


def answer(url: str) -> str | None:
    """The body of a 200 from `url`, else None (not serving yet, or not ready)."""
    try:
        with urllib.request.urlopen(url, timeout=deadline(5)) as response:
            return response.read().decode() if response.status == 200 else None
    except OSError:
        return None


def sample(metrics: str, name: str) -> float | None:
    for line in metrics.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def test_the_image_is_the_charts_default_and_runs_as_a_numeric_non_root_user(image: str):
    # `helm install` with the chart's defaults must find the image `make image` built: the chart
    # names <image.repository>:<appVersion> when image.tag is empty.
    chart = ROOT / "charts" / "vigil"
    values = yaml.safe_load((chart / "values.yaml").read_text())["image"]
    app_version = yaml.safe_load((chart / "Chart.yaml").read_text())["appVersion"]
    default = f"{values['repository']}:{values['tag'] or app_version}"
    shown = podman("image", "inspect", "--format", "{{.Id}} {{.Config.User}}", image, default)
    assert shown.returncode == 0, f"{default}, the chart's default image, was not built: {shown.stderr}"
    (built_id, user), (default_id, _) = (line.split() for line in shown.stdout.splitlines())
    assert default_id == built_id, f"{default} is not the image of this checkout ({image})"
    # Numeric, so that the kubelet can check runAsNonRoot without reading /etc/passwd.
    assert user == "65532:65532"


def test_the_operator_from_the_image_runs_a_job_through_its_life(
    kube: Kube, image: str, own_namespace: str, tmp_path: Path
):
    ns = own_namespace
    install_crds(kube)
    kubeconfig = inline_kubeconfig(kube, tmp_path / "kubeconfig")
    files = {kubeconfig: KUBECONFIG_IN_CONTAINER}
    env = {"KUBECONFIG": KUBECONFIG_IN_CONTAINER}
    health, metrics = free_port(), free_port()
    # As the chart's Deployment runs it, but on loopback ports and for this namespace alone; no
    # webhook (nothing here registers one). POD_NAMESPACE, as the downward API gives it, places the
    # Lease; with no POD_NAME there is no pod of its own to mark as the leader.
    command = [
        "operator", "--namespace", ns, "--log-level", "info",
        "--health-address", f"127.0.0.1:{health}",
        "--metrics-address", f"127.0.0.1:{metrics}", "--metrics-insecure",
        "--leader-elect", *LEASE,
    ]  # fmt: skip
    with Container(image, container_name("operator"), command, env={**env, "POD_NAMESPACE": ns}, files=files) as op:
        wait_until(
            lambda: answer(f"http://127.0.0.1:{health}/readyz") is not None or not op.running(),
            30,
            "the operator in its container to be ready",
        )
        assert op.running(), f"the operator's container stopped: {op.state()}\n{op.logs()}"
        assert holder(kube, ns), "the operator in the image leads: it holds the namespace's Lease"

        # Attempt 1 fails (exit 1), attempt 2 succeeds after a backoff of 1 s.
        create(kube, ns, vigil_job("imaged", "1,0", "1s", retry={"maxAttempts": 3, "backoff": FAST_BACKOFF}))
        job = wait_phase(kube, ns, "imaged", "Succeeded", timeout=45)
        assert job["status"]["attempts"] == 2
        assert [(h["number"], h["outcome"]) for h in job["status"]["history"]] == [(1, "Failed"), (2, "Succeeded")]
        scraped = wait_until(lambda: answer(f"http://127.0.0.1:{metrics}/metrics"), 10, "the operator's /metrics")
        assert sample(scraped, "vigil_attempts_started_total") == 2

        # `kubectl vigil` from the same image, with the same kubeconfig.
        status = run_once(
            image,
            container_name("plugin"),
            ["--kubeconfig", KUBECONFIG_IN_CONTAINER, "-n", ns, "status", "imaged"],
            entrypoint="kubectl-vigil",
            files=files,
        )
        assert status.returncode == 0, status.stderr
        assert f"VigilJob {ns}/imaged" in status.stdout
        assert "Phase:        Succeeded" in status.stdout
        assert "Attempts:     2 " in status.stdout

        # SIGTERM, as the kubelet stops the pod: it stops in time, and as a success (the image
        # runs `vigil` as PID 1, which must handle the signal itself).
        assert op.stop(grace=10) == 0, op.logs()


def test_vigil_agent_from_the_image_beats_and_passes_the_exit_status_through(
    kube: Kube, image: str, own_namespace: str, tmp_path: Path
):
    ns = own_namespace
    # The pod's own identity, as the kubelet mounts it: the job ServiceAccount's token, bound to it.
    grant_heartbeat_rbac(kube, ns)
    pod = create_job_pod(kube, ns, "beating")
    token = pod_token(kube, ns, pod)
    kubeconfig = inline_kubeconfig(kube, tmp_path / "agent.kubeconfig", token=token)
    env = {
        "POD_NAME": "beating",
        "POD_NAMESPACE": ns,
        "KUBECONFIG": KUBECONFIG_IN_CONTAINER,
        "VIGIL_HEARTBEAT_INTERVAL": "1",
    }
    ran = run_once(
        image,
        container_name("agent"),
        ["--", "sh", "-c", "sleep 3; exit 3"],  # a job of 3 s that fails with 3
        entrypoint="vigil-agent",
        env=env,
        files={kubeconfig: KUBECONFIG_IN_CONTAINER},
        timeout=30,
    )
    assert ran.returncode == 3, f"vigil-agent exited {ran.returncode}:\n{ran.stderr}"
    beat = (read_pod(kube, ns, "beating").metadata.annotations or {}).get(HEARTBEAT_ANNOTATION)
    assert beat, f"no {HEARTBEAT_ANNOTATION} on the pod after 3 s of beats every second:\n{ran.stderr}"
