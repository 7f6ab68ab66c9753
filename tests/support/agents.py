"""`vigil-agent` with the identity of a kwok pod: the job ServiceAccount and its heartbeat RBAC,
tokens bound to a pod (the TokenRequest API, as the kubelet mounts them), so every beat travels
the path it takes in a cluster (authentication, RBAC, admission); and agents as processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Protocol, TypeVar

from kubernetes import client

from tests.support.cluster import Kube, pod_phase, simulated_pod_spec, token_kubeconfig
from tests.support.jobs import FAST_BACKOFF, vigil_job
from tests.support.waits import wait_until

AGENT = Path(sys.executable).with_name("vigil-agent")
JOB_ACCOUNT = "vigil-job"
HEARTBEAT_ANNOTATION = "vigil.dev/heartbeat"
CHECKPOINT_ANNOTATION = "vigil.dev/checkpoint"
# Beats of the end-to-end tests: interval 1 s, timeout 6 s, so Uncertain after 3 s of silence
# and Lost after 6 s.
HEARTBEAT = {"intervalSeconds": 1, "timeoutSeconds": 6, "startupGraceSeconds": 10, "required": True}


# --- identities -------------------------------------------------------------------------------


def grant_heartbeat_rbac(
    kube: Kube,
    namespace: str,
    account: str = JOB_ACCOUNT,
    verbs: tuple[str, ...] = ("patch",),
    resources: tuple[str, ...] = ("pods",),
):
    """The job ServiceAccount and the Role/RoleBinding of docs/heartbeat-rbac.md (by default)."""
    kube.core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    rbac = client.RbacAuthorizationV1Api(kube.api)
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": f"{account}-heartbeat"},
            "rules": [{"apiGroups": [""], "resources": list(resources), "verbs": list(verbs)}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": f"{account}-heartbeat"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{account}-heartbeat"},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        },
    )


def create_job_pod(kube: Kube, namespace: str, name: str, account: str = JOB_ACCOUNT, **annotations: str) -> dict:
    """A pod that runs for ever on a kwok node, as the job account."""
    sim_annotations, spec = simulated_pod_spec(exit_code=None)
    pod = kube.core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name, "annotations": {**sim_annotations, **annotations}},
            "spec": {**spec, "serviceAccountName": account},
        },
    )
    return {"name": pod.metadata.name, "uid": pod.metadata.uid}


def pod_token(
    kube: Kube, namespace: str, pod: dict | None, account: str = JOB_ACCOUNT, audiences: tuple[str, ...] = ()
) -> str:
    """A token of the account, bound to the pod (as the kubelet mounts it), or unbound when pod is
    None; for the API server, or for `audiences` (a projected token's, e.g. Vigil's beats)."""
    bound = None
    if pod:
        bound = client.V1BoundObjectReference(kind="Pod", api_version="v1", name=pod["name"], uid=pod["uid"])
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=list(audiences), expiration_seconds=3600, bound_object_ref=bound)
    )
    return kube.core.create_namespaced_service_account_token(account, namespace, request).status.token


# --- jobs whose pods beat -------------------------------------------------------------------------


def heartbeat_job(
    name: str, guarantee: str = "AtLeastOnce", heartbeat: dict = HEARTBEAT, **pod_annotations: str
) -> dict:
    """A job whose pods run until deleted as the job account, for an agent to beat for them."""
    job = vigil_job(
        name,
        exit_code=None,
        run_for=None,
        heartbeat=heartbeat,
        guarantee=guarantee,
        retry={"maxAttempts": 3, "backoff": FAST_BACKOFF},
    )
    job["spec"]["template"]["spec"]["serviceAccountName"] = JOB_ACCOUNT
    job["spec"]["template"]["metadata"]["annotations"].update(pod_annotations)
    return job


class PodAgent:
    """`vigil-agent -- <a long sleep>` with the environment Vigil gave the pod, as the pod."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        pod_name: str,
        tmp_path: Path,
        server: str | None = None,
    ):
        pod = kube.core.read_namespaced_pod(pod_name, namespace)
        token = pod_token(kube, namespace, {"name": pod_name, "uid": pod.metadata.uid})
        kubeconfig = token_kubeconfig(kube, token, tmp_path / f"{pod_name}.kubeconfig", server=server)
        env = {e.name: e.value for e in pod.spec.containers[0].env if e.value is not None}
        env.update(POD_NAME=pod_name, POD_NAMESPACE=namespace, KUBECONFIG=str(kubeconfig), VIGIL_STOP_GRACE_SECONDS="2")
        env.update(POD_UID=pod.metadata.uid)  # the downward API's, which the pod's env cannot hold here
        if any(e.name == "VIGIL_HEARTBEAT_URL" for e in pod.spec.containers[0].env):
            # The projected token the kubelet would mount: the pod's, for Vigil's audience.
            token_file = tmp_path / f"{pod_name}.beat-token"
            identity = {"name": pod_name, "uid": pod.metadata.uid}
            token_file.write_text(pod_token(kube, namespace, identity, audiences=("vigil.dev",)))
            env.update(VIGIL_HEARTBEAT_TOKEN_FILE=str(token_file))
        self.log = tmp_path / f"{pod_name}.agent.log"
        self.child_marker = tmp_path / f"{pod_name}.child-stopped"
        child = (
            "import signal, sys, time, pathlib\n"
            f"marker = pathlib.Path({str(self.child_marker)!r})\n"
            "signal.signal(signal.SIGTERM, lambda *a: (marker.write_text('stopped'), sys.exit(0)))\n"
            "time.sleep(600)"  # the job's work: it runs until stopped
        )
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [str(AGENT), "--", sys.executable, "-c", child],
                env={**os.environ, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()


class Stoppable(Protocol):
    def stop(self) -> None: ...


A = TypeVar("A", bound=Stoppable)


class Agents:
    """Every agent a test starts, stopped after it whatever happened (the `agents` fixture)."""

    def __init__(self, kube: Kube, tmp_path: Path) -> None:
        self.kube, self.tmp_path = kube, tmp_path
        self.started: list[Stoppable] = []

    def start(self, namespace: str, pod_name: str, server: str | None = None, timeout: float = 30) -> PodAgent:
        """A `PodAgent` for the pod, once it runs (within `timeout`); `server`: the API server's
        address the agent uses (a fault proxy's, say). A pod told of the leader channel gets
        its projected token for it in a file, as the kubelet would mount it."""
        wait_until(lambda: pod_phase(self.kube, namespace, pod_name) == "Running", timeout, f"{pod_name} to run")
        return self.add(PodAgent(self.kube, namespace, pod_name, self.tmp_path, server=server))

    def add(self, agent: A) -> A:
        self.started.append(agent)
        return agent

    def stop(self) -> None:
        for agent in self.started:
            agent.stop()
