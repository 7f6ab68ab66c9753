"""A VigilWorkerPool's pods: how many it wants, which to create and which to delete, and the
status to write (docs/design.md, "VigilWorkerPool"; docs/pull.md, "The pool's pods"). Pure: the
pool, its pods as the watch has them, its load (from the leader's lease state), the time and the
randomness of new names all come in; the actions go out as data.

The rule:

- desired = spec.replicas clamped to [minReplicas, maxReplicas] when it is set (by `kubectl
  scale`, an HPA, KEDA: Vigil does not autoscale then); else clamp(ceil((queued + running) /
  slotsPerWorker), min, max), where a lower figure takes effect only once it has been wanted for
  scaleDownDelaySeconds: the figure used is the highest one wanted over that window, as the
  HorizontalPodAutoscaler's scale-down stabilization window does (`ScaleMemory`). More workers
  are added at once.
- A worker pod that ended (Failed or Succeeded) is deleted, and one gone is replaced: the pool
  keeps `desired` pods that exist, are not being deleted and have not ended.
- Scaling down deletes idle workers only (no task leased, `PoolLoad.busy`): not Ready ones
  first, then the most recently Ready; a busy one stays until it is idle, so the pool may run
  above `desired` for a while (and above maxReplicas, after maxReplicas was lowered).
- Each new pod is named `<pool>-<5 characters>` (not generateName: a name the decision chose is
  one it can find again), labelled vigil.dev/pool, controlled by the pool, with no finalizer of
  Vigil's, and given the pull protocol's environment and token (`worker_pod_manifest`).
- Without a pull endpoint (the operator has no beat channel) the pool makes no pods, and says so.

The scale-down window's memory is the controller's, in memory, not the pool's status: a new
leader starts with none, and its first look puts the status's desiredReplicas in the window as
if it had been wanted at that moment. So a failover can only lengthen a scale-down's delay (never
remove a worker sooner than asked), and a backlog that goes up and down costs no status write
for the window's sake.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import ValidationError

from vigil import api
from vigil.core import fields
from vigil.core.actions import CreatePod, DeletePod
from vigil.core.conditions import set_condition
from vigil.core.fields import Obj, Pod
from vigil.core.manifest import BEAT_TOKEN_DIR, BEAT_TOKEN_SECONDS, BEAT_TOKEN_VOLUME, BeatChannel

PULL_PATH = "/v1/pull"
TOKEN_FILE = f"{BEAT_TOKEN_DIR}/token"
# Kubernetes' own alphabet for generated names (apimachinery's rand.String): lowercase letters and
# digits without vowels and look-alikes, so no suffix spells a word.
SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
SUFFIX_LENGTH = 5

CONDITION_READY = "Ready"
CONDITION_AT_MAXIMUM = "AtMaximum"
REASON_NO_PULL_ENDPOINT = "NoPullEndpoint"
REASON_INVALID_SPEC = "InvalidSpec"
REASON_CREATE_FAILED = "PodCreateFailed"


@dataclass(frozen=True)
class PoolLoad:
    """What the leader's lease state knows of a pool's work: tasks waiting for one of its workers,
    tasks leased to its workers, and the leased tasks per worker pod (by pod name)."""

    queued: int = 0
    running: int = 0
    busy: Mapping[str, int] = field(default_factory=dict)


EMPTY_LOAD = PoolLoad()


@dataclass(frozen=True)
class ScaleMemory:
    """The figures wanted over the last scaleDownDelaySeconds, as (monotonic seconds, replicas),
    kept as a monotonic queue: oldest first and each figure lower than the one before it, since a
    figure wanted earlier and no higher than a later one can never be the window's highest. So it
    holds at most one entry per distinct figure, and its first entry is the window's highest."""

    wants: tuple[tuple[float, int], ...] = ()

    def highest(self) -> int:
        return self.wants[0][1]

    def wanted(self, at: float, replicas: int, delay: float) -> ScaleMemory:
        """The memory with `replicas` wanted at `at`, and every figure older than `delay` gone."""
        kept = [(t, n) for t, n in self.wants if t > at - delay and n > replicas]
        return ScaleMemory((*kept, (at, replicas)))

    def next_expiry(self, at: float, delay: float) -> float | None:
        """Seconds until the window's highest figure leaves it, while another figure is lower."""
        if len(self.wants) < 2:
            return None
        return max(0.0, self.wants[0][0] + delay - at)


@dataclass(frozen=True)
class PoolDecision:
    """One look at a pool: its status to write (None: unchanged), fenced by the pool's
    resourceVersion; then its pods to create and to delete; the scale-down window to keep; and
    when to look again at the latest, if nothing changes before."""

    status: dict[str, Any] | None
    resource_version: str | None
    create: tuple[CreatePod, ...] = ()
    delete: tuple[DeletePod, ...] = ()
    memory: ScaleMemory | None = None
    requeue_after: float | None = None


def random_suffix(rng: random.Random) -> str:
    """Five characters of SUFFIX_ALPHABET, as Kubernetes generates names."""
    return "".join(rng.choice(SUFFIX_ALPHABET) for _ in range(SUFFIX_LENGTH))


def pool_selector(name: str) -> str:
    """The label selector of a pool's pods, as status.selector gives it to /scale."""
    return f"{api.LABEL_POOL}={name}"


def pull_url(beat_url: str) -> str:
    """The leader's pull endpoint: the beat channel's URL with its path replaced by /v1/pull."""
    parts = urlsplit(beat_url)
    return urlunsplit((parts.scheme, parts.netloc, PULL_PATH, "", ""))


# --------------------------------------------------------------------------------- the pods


def pool_of(pod: Pod) -> tuple[str, str] | None:
    """(namespace, pool name) of the VigilWorkerPool that controls the pod, or None: its
    controller reference is a VigilWorkerPool of vigil.dev whose name is its vigil.dev/pool
    label (the pod's namespace is the pool's: an owner reference never crosses namespaces)."""
    metadata = fields.metadata(pod)
    ref = _controller(metadata)
    if ref is None or ref.get("kind") != api.POOL_KIND:
        return None
    if not str(ref.get("apiVersion") or "").startswith(api.RESERVED_PREFIX):
        return None
    name = ref.get("name")
    if not isinstance(name, str) or not name or fields.labels(pod).get(api.LABEL_POOL) != name:
        return None
    return metadata.get("namespace") or "", name


_KEPT_METADATA = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp")
_OWNER_FIELDS = ("apiVersion", "kind", "name", "uid", "controller")


def keep_pool_pod(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The pool pods' watch transform: a pod no pool controls (`pool_of`) is not kept (None); a
    pool's pod is trimmed, in place, to what this module reads: its identity, version, creation
    and deletion, the vigil.dev/pool label, the controller reference, its phase and its Ready
    condition (status and lastTransitionTime)."""
    if pool_of(pod) is None:
        return None
    metadata = fields.metadata(pod)
    kept: dict[str, Any] = {key: metadata[key] for key in _KEPT_METADATA if key in metadata}
    kept["labels"] = {api.LABEL_POOL: fields.labels(pod)[api.LABEL_POOL]}
    ref = _controller(metadata)
    assert ref is not None  # pool_of found it
    kept["ownerReferences"] = [{key: ref[key] for key in _OWNER_FIELDS if key in ref}]
    pod["metadata"] = kept
    pod["spec"] = {}
    status = fields.status(pod)
    trimmed: dict[str, Any] = {"phase": status["phase"]} if "phase" in status else {}
    ready = [
        {key: c[key] for key in ("type", "status", "lastTransitionTime") if key in c}
        for c in status.get("conditions") or []
        if c.get("type") == "Ready"
    ]
    if ready:
        trimmed["conditions"] = ready[:1]
    pod["status"] = trimmed
    return pod


def _controller(metadata: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return next((ref for ref in metadata.get("ownerReferences") or [] if ref.get("controller") is True), None)


def _controlled_by(pod: Pod, uid: str) -> bool:
    ref = _controller(fields.metadata(pod))
    return ref is not None and ref.get("uid") == uid and ref.get("kind") == api.POOL_KIND


def has_ended(pod: Pod) -> bool:
    return fields.phase(pod) in ("Succeeded", "Failed")


def is_ready(pod: Pod) -> bool:
    if fields.phase(pod) != "Running":
        return False
    conditions = fields.status(pod).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _ready_since(pod: Pod) -> str:
    for c in fields.status(pod).get("conditions") or []:
        if c.get("type") == "Ready":
            return str(c.get("lastTransitionTime") or "")
    return ""


def removal_candidates(pods: Iterable[Pod]) -> list[Pod]:
    """`pods` in the order they are removed: not Ready first; among the Ready, the most recently
    Ready first (the longest-serving worker stays); then the newest first."""
    not_ready = [p for p in pods if not is_ready(p)]
    ready = [p for p in pods if is_ready(p)]
    not_ready.sort(key=lambda p: (fields.creation_timestamp(p) or "", fields.name(p)), reverse=True)
    ready.sort(key=lambda p: (_ready_since(p), fields.creation_timestamp(p) or "", fields.name(p)), reverse=True)
    return [*not_ready, *ready]


# ----------------------------------------------------------------------------- the manifest


def worker_pod_manifest(pool: api.VigilWorkerPool, name: str, channel: BeatChannel) -> dict[str, Any]:
    """A worker's pod: the pool's template as given, named `name`, labelled vigil.dev/pool,
    controlled by the pool (blockOwnerDeletion: the pool's foreground deletion waits for it), no
    finalizer of Vigil's; in every container the pull protocol's environment (docs/pull.md) and
    the projected token, audience the channel's, bound to the pod, as attempt pods mount theirs
    for beats (`vigil.core.manifest`)."""
    meta, spec = pool.metadata, pool.spec
    template = copy.deepcopy(spec.template)
    pod_meta = template.get("metadata") or {}
    pod_meta.pop("generateName", None)
    pod_spec = template.get("spec") or {}
    pod_meta["name"] = name
    pod_meta["namespace"] = meta.namespace
    pod_meta["labels"] = {**(pod_meta.get("labels") or {}), api.LABEL_POOL: meta.name}
    pod_meta["ownerReferences"] = [
        {
            "apiVersion": api.API_VERSION,
            "kind": api.POOL_KIND,
            "name": meta.name,
            "uid": meta.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    env: list[dict[str, Any]] = [
        {"name": "VIGIL_PULL_URL", "value": pull_url(channel.url)},
        {"name": "VIGIL_PULL_CA", "value": channel.ca_pem},
        {"name": "VIGIL_PULL_TOKEN_FILE", "value": TOKEN_FILE},
        {"name": "VIGIL_POOL", "value": meta.name},
        {"name": "VIGIL_POOL_SLOTS", "value": str(spec.slots_per_worker)},
        {"name": "VIGIL_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "VIGIL_POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "VIGIL_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
    ]
    mount = {"name": BEAT_TOKEN_VOLUME, "mountPath": BEAT_TOKEN_DIR, "readOnly": True}
    token = {"audience": channel.audience, "expirationSeconds": BEAT_TOKEN_SECONDS, "path": "token"}
    volumes = [v for v in pod_spec.get("volumes") or [] if v.get("name") != BEAT_TOKEN_VOLUME]
    projected = {"sources": [{"serviceAccountToken": token}]}
    pod_spec["volumes"] = [*volumes, {"name": BEAT_TOKEN_VOLUME, "projected": projected}]
    ours = {entry["name"] for entry in env}
    for key in ("initContainers", "containers"):
        for container in pod_spec.get(key) or []:
            # Vigil's values replace the user's of the same name: a wrong endpoint or token would be unsafe.
            theirs = [e for e in container.get("env") or [] if e.get("name") not in ours]
            container["env"] = theirs + copy.deepcopy(env)
            mounts = [m for m in container.get("volumeMounts") or [] if m.get("name") != BEAT_TOKEN_VOLUME]
            container["volumeMounts"] = [*mounts, dict(mount)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": pod_spec}


# ------------------------------------------------------------------------------ the decision


def clamp(value: int, low: int, high: int) -> int:
    return min(max(value, low), high)


def wanted_by_load(spec: api.VigilWorkerPoolSpec, load: PoolLoad) -> int:
    """Workers the load asks for, unbounded: ceil((queued + running) / slotsPerWorker)."""
    return math.ceil(max(0, load.queued + load.running) / spec.slots_per_worker)


def decide_pool(
    pool: Obj,
    pods: Iterable[Pod],
    load: PoolLoad = EMPTY_LOAD,
    *,
    now: datetime,
    monotonic: float,
    memory: ScaleMemory | None = None,
    beat_channel: BeatChannel | None = None,
    suffix: Callable[[], str],
    create_error: str | None = None,
) -> PoolDecision:
    """One look at `pool` (the object as read), given its pods (any pods: those the pool does not
    control are ignored), its load, the wall time `now` (for status) and the monotonic seconds
    `monotonic` (for the scale-down window, `memory`), the operator's beat channel (None: no
    pull endpoint, no pods), new names' suffixes (`suffix()`, e.g. `random_suffix`), and the
    last failure to create a pod (`create_error`, shown in the Ready condition until a create
    succeeds)."""
    metadata = fields.metadata(pool)
    resource_version = metadata.get("resourceVersion")
    current = _current_status(pool)
    if metadata.get("deletionTimestamp"):
        return PoolDecision(None, resource_version, memory=memory)  # its pods go with it (garbage collection)
    try:
        parsed = api.VigilWorkerPool.model_validate(pool)
    except ValidationError as err:
        status = _with_condition(
            current,
            CONDITION_READY,
            "False",
            REASON_INVALID_SPEC,
            f"the pool cannot be read: {err.errors()[0]['msg']}",
            now,
            int(metadata.get("generation") or 1),
        )
        return PoolDecision(_changed(status, current), resource_version, memory=memory)
    spec, uid = parsed.spec, parsed.metadata.uid

    owned = [pod for pod in pods if _controlled_by(pod, uid) and not fields.deletion_timestamp(pod)]
    ended = [pod for pod in owned if has_ended(pod)]
    live = [pod for pod in owned if not has_ended(pod)]
    ready = sum(1 for pod in live if is_ready(pod))

    previous = current.desired_replicas if current.last_scale_time is not None else None
    target = spec.target()
    asked = spec.replicas if target is not None else wanted_by_load(spec, load)
    requeue = None
    if target is not None:
        desired, memory = target, None
    else:
        want = clamp(asked or 0, spec.min_replicas, spec.max_replicas)
        delay = float(spec.scale_down_delay_seconds)
        if memory is None:
            memory = ScaleMemory()
            if previous is not None:  # a new memory: as if the last figure were wanted now
                memory = memory.wanted(monotonic, clamp(previous, spec.min_replicas, spec.max_replicas), delay)
        memory = memory.wanted(monotonic, want, delay)
        desired = clamp(memory.highest(), spec.min_replicas, spec.max_replicas)
        requeue = memory.next_expiry(monotonic, delay)

    create: list[CreatePod] = []
    delete: list[DeletePod] = []
    if beat_channel is not None:
        delete += [DeletePod(fields.name(pod), fields.uid(pod)) for pod in ended]
        if len(live) < desired:
            taken = {fields.name(pod) for pod in pods}
            for _ in range(desired - len(live)):
                name = _new_name(parsed.metadata.name, taken, suffix)
                taken.add(name)
                create.append(CreatePod(worker_pod_manifest(parsed, name, beat_channel)))
        elif len(live) > desired:
            idle = [pod for pod in live if load.busy.get(fields.name(pod), 0) <= 0]
            chosen = removal_candidates(idle)[: len(live) - desired]
            delete += [DeletePod(fields.name(pod), fields.uid(pod)) for pod in chosen]

    generation = parsed.metadata.generation
    conditions = list(current.conditions)
    if beat_channel is None:
        ready_condition = (
            "False",
            REASON_NO_PULL_ENDPOINT,
            "the operator has no pull endpoint (vigil operator --heartbeat-url and --beat-address): "
            "the pool makes no workers",
        )
    elif create_error is not None:
        ready_condition = ("False", REASON_CREATE_FAILED, f"a worker pod could not be created: {create_error}")
    elif ready >= desired and len(live) == desired:
        ready_condition = ("True", "WorkersReady", f"{ready} of {desired} workers ready")
    elif ready >= desired:
        ready_condition = ("True", "WorkersReady", f"{ready} workers ready, {desired} desired: the idle ones go")
    else:
        ready_condition = ("False", "WorkersNotReady", f"{ready} of {desired} workers ready")
    conditions = set_condition(
        conditions,
        type=CONDITION_READY,
        status=ready_condition[0],  # type: ignore[arg-type]
        reason=ready_condition[1],
        message=ready_condition[2],
        now=now,
        generation=generation,
    )
    over = (asked or 0) > spec.max_replicas
    what = "spec.replicas" if target is not None else "the backlog"
    conditions = set_condition(
        conditions,
        type=CONDITION_AT_MAXIMUM,
        status="True" if over else "False",
        reason="AtMaximum" if over else "BelowMaximum",
        message=f"{what} asks for {asked} workers, {'more than' if over else 'within'} maxReplicas "
        f"({spec.max_replicas})",
        now=now,
        generation=generation,
    )
    status = api.VigilWorkerPoolStatus(
        replicas=len(live),
        ready_replicas=ready,
        desired_replicas=desired,
        slots=ready * spec.slots_per_worker,
        slots_used=max(0, load.running),
        backlog=max(0, load.queued),
        selector=pool_selector(parsed.metadata.name),
        conditions=conditions,
        observed_generation=generation,
        last_scale_time=now if previous != desired else current.last_scale_time,
    )
    return PoolDecision(
        _changed(status, current),
        resource_version,
        tuple(create),
        tuple(delete),
        memory,
        requeue,
    )


def _current_status(pool: Obj) -> api.VigilWorkerPoolStatus:
    try:
        return api.VigilWorkerPoolStatus.model_validate(fields.status(pool))
    except ValidationError:  # someone else's write: Vigil's next one replaces it
        return api.VigilWorkerPoolStatus()


def _with_condition(
    status: api.VigilWorkerPoolStatus,
    type: str,
    value: api.ConditionStatus,
    reason: str,
    message: str,
    now: datetime,
    generation: int,
) -> api.VigilWorkerPoolStatus:
    conditions = set_condition(
        status.conditions, type=type, status=value, reason=reason, message=message, now=now, generation=generation
    )
    return status.model_copy(update={"conditions": conditions, "observed_generation": generation})


def _changed(status: api.VigilWorkerPoolStatus, current: api.VigilWorkerPoolStatus) -> dict[str, Any] | None:
    """The status to write, whole, or None when it is what the pool holds already."""
    new = status.model_dump(by_alias=True, mode="json", exclude_none=True)
    return None if new == current.model_dump(by_alias=True, mode="json", exclude_none=True) else new


def _new_name(pool: str, taken: set[str], suffix: Callable[[], str]) -> str:
    """`<pool>-<suffix>`, a name no pod of the pool has (27^5 suffixes: a few draws at most)."""
    for _ in range(100):
        name = f"{pool}-{suffix()}"
        if name not in taken:
            return name
    raise ValueError(f"no free name for a pod of the pool {pool} in 100 draws: is the suffix random?")
