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
) -> dict[str, Any]:
    """The pod of `attempt`: the job's template as given, plus restartPolicy Never, Vigil's
    labels, the job as controlling owner, the attempt-tracking finalizer, the VIGIL_*
    environment in every container, and when the attempt started (`vigil.dev/started-at`)."""
    meta, spec = job.metadata, job.spec
    template = copy.deepcopy(spec.template)
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
    if started_at is not None:
        pod_meta["annotations"] = {
            **(pod_meta.get("annotations") or {}),
            api.ANNOTATION_STARTED_AT: started_at.isoformat(),
        }
    pod_meta["ownerReferences"] = [
        {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "name": meta.name,
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
        {"name": "VIGIL_JOB", "value": meta.name},
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
    ours = {entry["name"] for entry in vigil_env}
    for key in ("initContainers", "containers"):
        for container in pod_spec.get(key) or []:
            # Vigil's values replace the user's of the same name: a wrong token would be unsafe.
            theirs = [e for e in container.get("env") or [] if e.get("name") not in ours]
            container["env"] = theirs + copy.deepcopy(vigil_env)
            if mounts:
                kept = [m for m in container.get("volumeMounts") or [] if m.get("name") != BEAT_TOKEN_VOLUME]
                container["volumeMounts"] = kept + copy.deepcopy(mounts)

    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": pod_spec}
