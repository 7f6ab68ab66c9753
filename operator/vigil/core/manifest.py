"""The pod of an attempt: its name and its manifest, built from the job's template."""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from vigil import api

# Where the projected token for beats to the leader is mounted, in every container.
BEAT_TOKEN_VOLUME = "vigil-heartbeat-token"
BEAT_TOKEN_DIR = "/var/run/secrets/vigil.dev/heartbeat"
# The kubelet renews a projected token at 80% of its life; an hour is the usual life (the API
# server's minimum is 10 minutes), and a pod's deletion revokes it at once whatever its life.
BEAT_TOKEN_SECONDS = 3600


@dataclass(frozen=True)
class BeatChannel:
    """The leader's heartbeat endpoint, as the pods are told of it (`vigil operator
    --heartbeat-url`): its URL, the CA of its certificate (PEM) and the tokens' audience."""

    url: str
    ca_pem: str = ""
    audience: str = "vigil.dev"


# The injected agent (heartbeat.agent: Sidecar; docs/heartbeats.md, "The injected agent").
# The emptyDir at api.LIVENESS_DIR that the agent shares with every container: the liveness file
# and the checkpoint file are there.
SHARED_VOLUME = "vigil-shared"
DEFAULT_CONTAINER = "kubectl.kubernetes.io/default-container"
# Requests: what the agent needs while beating (measured in e2e/test_sidecar_agent.py: 56 MiB
# RSS, a few millicores); the limit leaves room for the API client's buffers and TLS without
# letting a leak in the agent take the node's memory. CPU has no limit: a throttled agent beats
# late, and a late beat is what makes an attempt look Lost.
AGENT_RESOURCES = {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "96Mi"}}


def resolved_agent(heartbeat: api.Heartbeat, agent_image: str | None) -> api.AgentKind | None:
    """Who beats for the attempt: None when no agent is required, else heartbeat.agent, or
    when unset, the operator's default (Sidecar when it knows an agent image)."""
    if not heartbeat.required:
        return None
    if heartbeat.agent is not None:
        return heartbeat.agent
    return "Sidecar" if agent_image else "Image"


def agent_security_context(pod_security: dict[str, Any] | None) -> dict[str, Any]:
    """The injected agent's securityContext. Stopping the job takes a signal to its processes,
    which needs the job's UID or CAP_KILL; a capability added to a non-root container is not
    effective (no ambient capabilities in Kubernetes), so CAP_KILL means running as root.

    - The pod sets runAsUser: the agent inherits it (nothing set here) and keeps no capability,
      as Pod Security "restricted" asks. Job containers that override their UID cannot be stopped.
    - The pod says runAsNonRoot but no UID: the agent runs as its image's user (65532), with no
      capability: it can stop the job only if the job runs as 65532 too.
    - Neither (the job's image picks its UID, perhaps root): the agent runs as root with CAP_KILL
      alone, which Pod Security "baseline" allows and "restricted" refuses.
    """
    context: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    pod_security = pod_security or {}
    if pod_security.get("runAsUser") is None and not pod_security.get("runAsNonRoot"):
        context["runAsUser"] = 0
        context["runAsNonRoot"] = False
        context["capabilities"] = {"drop": ["ALL"], "add": ["KILL"]}
    return context


@dataclass(frozen=True)
class TaskRef:
    """The task of an array an attempt belongs to (spec.tasks): its job's real name (the decision
    core names the task `<job>-<index>`, so that its pods are `<job>-<index>-<attempt>`), its index,
    the array's size and its item (VIGIL_TASK_ITEM, already as its pod reads it)."""

    job_name: str
    index: int
    count: int
    item: str | None = None


def task_name(job_name: str, index: int) -> str:
    """What a task's attempts are named after: `<job>-<index>`."""
    return f"{job_name}-{index}"


PULLED_TEMPLATE: dict[str, Any] = {"spec": {"containers": [{"name": "task"}]}}
MAX_POD_NAME = 63  # a DNS label, so the name also works as the pod's hostname and in labels
_HASH_LENGTH = 8


def attempt_pod_name(job_name: str, attempt: int) -> str:
    """`<job>-<attempt>`, or where that is too long, the job name cut short and a hash of it:
    `<job prefix>-<hash>-<attempt>`. The same job name and attempt always give the same name."""
    name = f"{job_name}-{attempt}"
    if len(name) <= MAX_POD_NAME:
        return name
    digest = hashlib.sha256(job_name.encode()).hexdigest()[:_HASH_LENGTH]
    suffix = f"-{digest}-{attempt}"
    prefix = job_name[: MAX_POD_NAME - len(suffix)].rstrip("-.")
    return prefix + suffix


def attempt_pod_manifest(
    job: api.VigilJob,
    attempt: int,
    checkpoint: str | None,
    started_at: datetime | None = None,
    beat_channel: BeatChannel | None = None,
    agent_image: str | None = None,
    task: TaskRef | None = None,
) -> dict[str, Any]:
    """The pod of `attempt`: the job's template as given, plus restartPolicy Never, Vigil's
    labels, the job as controlling owner, the attempt-tracking finalizer, the VIGIL_*
    environment in every container, and when the attempt started (`vigil.dev/started-at`).
    When the attempt's agent is the injected one (`resolved_agent`: Sidecar), the pod also
    gets it: a native sidecar `vigil-agent` from `agent_image` and shareProcessNamespace.
    `task`: the attempt is one of an array's task (`job` is then named after the task, see
    TaskRef): its index label and VIGIL_TASK_* environment, and the array as its owner."""
    meta, spec = job.metadata, job.spec
    owner = task.job_name if task is not None else meta.name
    # A pulled task (spec.pool) has no template: its "pod" is the virtual one of vigil.core.pull,
    # of which only the name, labels, owner and environment are read.
    template = copy.deepcopy(spec.template) if spec.template is not None else copy.deepcopy(PULLED_TEMPLATE)
    pod_meta = template.get("metadata") or {}
    pod_meta.pop("generateName", None)
    pod_spec = template.get("spec") or {}

    name = attempt_pod_name(meta.name, attempt)
    pod_meta["name"] = name
    pod_meta["namespace"] = meta.namespace
    pod_meta["labels"] = {
        **(pod_meta.get("labels") or {}),
        api.LABEL_JOB_UID: meta.uid,
        api.LABEL_ATTEMPT: str(attempt),
        api.LABEL_QUEUE: spec.queue,
    }
    if task is not None:
        pod_meta["labels"][api.LABEL_TASK_INDEX] = str(task.index)
    if started_at is not None:
        pod_meta["annotations"] = {
            **(pod_meta.get("annotations") or {}),
            api.ANNOTATION_STARTED_AT: started_at.isoformat(),
        }
    pod_meta["ownerReferences"] = [
        {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "name": owner,
            "uid": meta.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    # Keeps the pod object, once deleted, until decide() has its final phase and exit code in
    # the job's status (see vigil.core.lifecycle); the template's own finalizers stay.
    theirs = [f for f in pod_meta.get("finalizers") or [] if f != api.FINALIZER_ATTEMPT_TRACKING]
    pod_meta["finalizers"] = [*theirs, api.FINALIZER_ATTEMPT_TRACKING]
    pod_spec["restartPolicy"] = "Never"

    vigil_env: list[dict[str, Any]] = [
        {"name": "VIGIL_JOB", "value": owner},
        {"name": "VIGIL_JOB_UID", "value": meta.uid},
        {"name": "VIGIL_ATTEMPT", "value": str(attempt)},
        # Attempt numbers only grow, across redrives too, so the number is the fencing token.
        {"name": "VIGIL_FENCING_TOKEN", "value": str(attempt)},
        {"name": "VIGIL_HEARTBEAT_INTERVAL", "value": str(spec.heartbeat.interval_seconds)},
        # For self-fencing: an agent that cannot renew for this long must assume it was replaced,
        # and under NoOverlap stop its child.
        {"name": "VIGIL_HEARTBEAT_TIMEOUT", "value": str(spec.heartbeat.timeout_seconds)},
        {"name": "VIGIL_GUARANTEE", "value": spec.guarantee},
        {"name": "VIGIL_CHECKPOINT", "value": checkpoint or ""},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    if task is not None:
        vigil_env += [
            {"name": "VIGIL_TASK_INDEX", "value": str(task.index)},
            {"name": "VIGIL_TASK_COUNT", "value": str(task.count)},
            # The same for every attempt of the task, and no other task's: what its side effects
            # are keyed by, so that a retry (at least once) does them once.
            {"name": "VIGIL_IDEMPOTENCY_KEY", "value": f"{meta.uid}-{task.index}"},
        ]
        if task.item is not None:
            vigil_env.append({"name": "VIGIL_TASK_ITEM", "value": task.item})
    leader = beat_channel is not None and spec.heartbeat.required and spec.heartbeat.via == "Leader"
    mounts: list[dict[str, Any]] = []
    if leader:
        assert beat_channel is not None
        vigil_env += [
            {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {"name": "VIGIL_HEARTBEAT_URL", "value": beat_channel.url},
            {"name": "VIGIL_HEARTBEAT_CA", "value": beat_channel.ca_pem},
            {"name": "VIGIL_HEARTBEAT_TOKEN_FILE", "value": f"{BEAT_TOKEN_DIR}/token"},
        ]
        mounts = [{"name": BEAT_TOKEN_VOLUME, "mountPath": BEAT_TOKEN_DIR, "readOnly": True}]
        volumes = [v for v in pod_spec.get("volumes") or [] if v.get("name") != BEAT_TOKEN_VOLUME]
        token = {"audience": beat_channel.audience, "expirationSeconds": BEAT_TOKEN_SECONDS, "path": "token"}
        projected = {"sources": [{"serviceAccountToken": token}]}
        pod_spec["volumes"] = [*volumes, {"name": BEAT_TOKEN_VOLUME, "projected": projected}]
    heartbeat = spec.heartbeat
    named = {c.get("name") for key in ("initContainers", "containers") for c in pod_spec.get(key) or []}
    # The name vigil-agent is refused at admission (api.AGENT_CONTAINER_REFUSAL); a job stored
    # before that rule keeps its own container of that name, since a second would make the pod invalid.
    sidecar = (
        resolved_agent(heartbeat, agent_image) == "Sidecar" and bool(agent_image) and api.AGENT_CONTAINER not in named
    )
    if sidecar:
        # A job of any image checkpoints by writing this file (vigil.agent.checkpoint() does).
        vigil_env.append({"name": api.ENV_CHECKPOINT_FILE, "value": api.CHECKPOINT_FILE})
        mounts = [*mounts, {"name": SHARED_VOLUME, "mountPath": api.LIVENESS_DIR}]
        volumes = [v for v in pod_spec.get("volumes") or [] if v.get("name") != SHARED_VOLUME]
        pod_spec["volumes"] = [
            *volumes,
            {"name": SHARED_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        ]
    if sidecar and heartbeat.liveness_file:
        vigil_env.append({"name": "VIGIL_LIVENESS_FILE", "value": heartbeat.liveness_file})
    if sidecar and heartbeat.liveness_port:
        vigil_env.append({"name": "VIGIL_LIVENESS_PORT", "value": str(heartbeat.liveness_port)})
    ours = {entry["name"] for entry in vigil_env}
    first = True  # the first container takes vigil_env itself, each other a copy (a task array makes thousands)
    for key in ("initContainers", "containers"):
        for container in pod_spec.get(key) or []:
            # Vigil's values replace the user's of the same name: a wrong token would be unsafe.
            theirs = [e for e in container.get("env") or [] if e.get("name") not in ours]
            container["env"] = theirs + (list(vigil_env) if first else copy.deepcopy(vigil_env))
            first = False
            if mounts:
                drop = {m["name"] for m in mounts}
                kept = [m for m in container.get("volumeMounts") or [] if m.get("name") not in drop]
                container["volumeMounts"] = kept + copy.deepcopy(mounts)
    if sidecar:
        assert agent_image is not None
        # Last of the init containers: the template's own init containers have run to their end
        # before it starts (were it first, the gap between two of them would look like the job's
        # end), and it starts before the main containers, which it waits for.
        agent_env = [
            *copy.deepcopy(vigil_env),
            {"name": "VIGIL_STARTUP_GRACE", "value": str(heartbeat.startup_grace_seconds)},
        ]
        agent: dict[str, Any] = {
            "name": api.AGENT_CONTAINER,
            "image": agent_image,
            "restartPolicy": "Always",  # a native sidecar (Kubernetes >= 1.29)
            "command": ["vigil-agent", "--sidecar"],
            "env": agent_env,
            "resources": copy.deepcopy(AGENT_RESOURCES),
            "securityContext": agent_security_context(pod_spec.get("securityContext")),
        }
        if mounts:
            agent["volumeMounts"] = copy.deepcopy(mounts)
        pod_spec["initContainers"] = [*(pod_spec.get("initContainers") or []), agent]
        # The agent sees the job's processes (to watch and to signal them) only in one PID namespace.
        pod_spec["shareProcessNamespace"] = True
        # `kubectl logs` and `kubectl exec` of the pod mean the job's first container, without
        # kubectl's "Defaulted container" notice; a template that names its own keeps it.
        main = (pod_spec.get("containers") or [{}])[0].get("name")
        annotations = pod_meta.setdefault("annotations", {})
        if main and DEFAULT_CONTAINER not in annotations:
            annotations[DEFAULT_CONTAINER] = main

    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": pod_spec}
