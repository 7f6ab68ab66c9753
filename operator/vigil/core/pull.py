"""The leader's lease state for pulled tasks (docs/pull.md), pure: no clock read, no I/O.

A task array with `spec.pool` has no pods: the workers of its pool claim its tasks. So that every
rule of a task (retries, backoff, non-retryable codes, NoOverlap, late successes, checkpoints) is
the single-job lifecycle's, as it is for pushed tasks, each lease is shown to the array's
decision as a **virtual pod**: a pod dict made from the lease, never sent to the API server.

- `offer` (the decision's CreatePod, after the status write that records the start) makes the
  task claimable: a Pending virtual pod.
- A worker's claim leases it: Running, on the worker as its node.
- A worker's result ends it: Succeeded or Failed, with the exit code.
- `cancel` (the decision's DeletePod or AnnotatePod superseded) marks it deleting and tells the
  worker to stop it; it stays not finished (NoOverlap waits) until the worker reports its end or
  its worker is gone.
- `settle` (the decision's ReleasePod, after the status write that recorded the end) forgets it,
  and acknowledges the result to the worker: a worker keeps a result until then, so a leader's
  crash loses none.

Liveness is per worker: every request of a worker renews all its leases, and the verdicts of its
leases (`liveness`) follow its silence against the pool's thresholds, as a pod's follow its beats.
A new leader adopts what its workers say they hold (`held`) and have finished (`results`): for
`adoption_seconds` after it starts, a task its status says is running is shown as a Pending
virtual pod, so that no decision offers it again while its worker may still name it.

Times: `now` is monotonic seconds, `wall` a datetime; both are passed in.
"""

from __future__ import annotations

import functools
import json
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from vigil import api
from vigil.core import fields
from vigil.core.actions import AnnotatePod, CreatePod, DeletePod, ReleasePod
from vigil.core.liveness import Liveness
from vigil.core.lru import Lru
from vigil.core.manifest import attempt_pod_name, task_name
from vigil.core.pools import PoolLoad

LeaseKey = tuple[str, int, int]  # (job UID, task index, attempt number)

MAX_CLAIM = 1000  # tasks one request may claim (a worker's slots are at most this)
MAX_HELD = 1000  # leases one request may name
MAX_RESULTS = 1000  # results one request may carry
MAX_MESSAGE_CHARS = 300  # of a result's message, kept
MAX_WAIT_SECONDS = 20.0  # the longest long poll
# The body of a request: up to 1,000 results and 1,000 held leases (about 120 bytes each).
MAX_BODY_BYTES = 256 * 1024
VIRTUAL_UID_PREFIX = "pull-"
DEFAULT_GRACE_SECONDS = 30
GONE_JOBS = 10_000  # deleted jobs remembered (a UID each), for their workers' late requests
WORKER_CONTAINER = "task"


@dataclass(frozen=True)
class PoolPod:
    """A pod of a VigilWorkerPool as the leader's watch holds it: the pool it works for, its UID,
    and whether it has ended or is being deleted (it claims nothing more)."""

    pool: str
    uid: str
    deleting: bool


def timing_of(pool: Mapping[str, Any] | None) -> PoolTiming:
    """A VigilWorkerPool's spec.heartbeat (the defaults for a pool not known)."""
    heartbeat = (fields.spec(pool).get("heartbeat") or {}) if pool is not None else {}
    default = PoolTiming()
    return PoolTiming(
        float(heartbeat.get("intervalSeconds") or default.interval),
        float(heartbeat.get("timeoutSeconds") or default.timeout),
    )


class BadRequest(ValueError):
    """A request this module cannot take: the message says what is wrong (never echoing it whole)."""


@dataclass(frozen=True)
class PoolTiming:
    """A pool's heartbeat settings (spec.heartbeat): a worker beats every `interval` seconds, and
    is Lost after `timeout` seconds of silence (and fences itself by then)."""

    interval: float = 5.0
    timeout: float = 30.0

    @property
    def uncertain_after(self) -> float:
        return min(self.timeout, max(2.0 * self.interval, self.timeout / 2.0))


@dataclass
class Lease:
    """One attempt of one task, offered to a pool: claimed by at most one worker."""

    key: LeaseKey
    namespace: str
    pool: str
    job_name: str  # "" for a lease adopted before its job was looked at
    env: dict[str, str]
    grace_seconds: int
    deadline_seconds: int | None
    offered_wall: datetime
    offered_at: float
    worker: str | None = None  # the worker pod's name, once claimed
    granted_seq: int = 0  # the request whose answer gave it
    granted_boot: str = ""
    claimed_wall: datetime | None = None
    result: dict[str, Any] | None = None  # {"exitCode": int, "message": str}
    finished_wall: datetime | None = None
    checkpoint: str | None = None
    cancelled_wall: datetime | None = None
    vanished: str | None = None  # why it ended without a result (its worker gone or restarted)
    # Its worker has named it (in held, a result or a checkpoint) since it was given: it got it.
    confirmed: bool = False

    @property
    def uid(self) -> str:
        job_uid, index, attempt = self.key
        return f"{VIRTUAL_UID_PREFIX}{job_uid}-{index}-{attempt}"

    def wire(self) -> dict[str, Any]:
        """The lease as an answer gives it to its worker."""
        job_uid, index, attempt = self.key
        env = dict(self.env)
        if self.checkpoint is not None:
            env["VIGIL_CHECKPOINT"] = self.checkpoint
        return {
            "lease": [job_uid, index, attempt],
            "job": self.job_name,
            "namespace": self.namespace,
            "index": index,
            "attempt": attempt,
            "graceSeconds": self.grace_seconds,
            "deadlineSeconds": self.deadline_seconds,
            "env": env,
        }


@dataclass
class Worker:
    """A pool's worker as its requests show it."""

    namespace: str
    pool: str
    name: str
    uid: str
    boot: str = ""
    last_seen: float = 0.0
    last_seen_wall: datetime | None = None
    leases: set[LeaseKey] = field(default_factory=set)
    acks: set[LeaseKey] = field(default_factory=set)  # settled results to acknowledge
    gone: bool = False
    # The newest request taken from this worker process: an older one arriving late (its two
    # requests go on two connections) says nothing of what it holds now.
    last_seq: int = -1


@dataclass(frozen=True)
class Answer:
    """A request's answer (docs/pull.md), and the jobs whose look it calls for."""

    body: dict[str, Any]
    touched: frozenset[str]  # job UIDs with news (a result, a lease lost)
    claimed: int  # leases given


def lease_key(value: Any) -> LeaseKey:
    """A `[job uid, index, attempt]` of a request, checked."""
    if not isinstance(value, list) or len(value) != 3:
        raise BadRequest("a lease is [job uid, index, attempt]")
    uid, index, attempt = value
    if not isinstance(uid, str) or not 0 < len(uid) <= 64:
        raise BadRequest("a lease's job uid must be a string of at most 64 characters")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < api.MAX_TASKS:
        raise BadRequest(f"a lease's index must be an integer from 0 to {api.MAX_TASKS - 1}")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or not 0 < attempt < 2**31:
        raise BadRequest("a lease's attempt must be a positive integer")
    return uid, index, attempt


@dataclass(frozen=True)
class PullRequest:
    """A request's body, read and bounded (`read_request`)."""

    namespace: str
    name: str
    uid: str | None
    boot: str
    seq: int
    seen: int
    free: int
    wait_seconds: float
    held: tuple[LeaseKey, ...]
    checkpoints: tuple[tuple[LeaseKey, str], ...]
    results: tuple[tuple[LeaseKey, int, str], ...]


def read_request(body: bytes) -> PullRequest:
    """The body of POST /v1/pull, or BadRequest saying what to fix."""
    if len(body) > MAX_BODY_BYTES:
        raise BadRequest(f"the body is over {MAX_BODY_BYTES} bytes")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise BadRequest("the body is not JSON") from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    pod = data.get("pod")
    if not isinstance(pod, dict) or not all(isinstance(pod.get(k), str) and pod.get(k) for k in ("namespace", "name")):
        raise BadRequest('"pod" must name the worker pod: {"namespace", "name", "uid"}')
    uid = pod.get("uid")
    if uid is not None and not isinstance(uid, str):
        raise BadRequest('"pod.uid" must be a string')

    def number(name: str, low: int, high: int, default: int = 0) -> int:
        value = data.get(name, default)
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise BadRequest(f'"{name}" must be an integer from {low} to {high}')
        return value

    boot = data.get("boot", "")
    if not isinstance(boot, str) or len(boot) > 64:
        raise BadRequest('"boot" must be a string of at most 64 characters')
    wait = data.get("waitSeconds", 0)
    if not isinstance(wait, (int, float)) or isinstance(wait, bool) or not 0 <= wait <= MAX_WAIT_SECONDS:
        raise BadRequest(f'"waitSeconds" must be a number from 0 to {MAX_WAIT_SECONDS:g}')

    def items(name: str, limit: int) -> list[Any]:
        value = data.get(name) or []
        if not isinstance(value, list) or len(value) > limit:
            raise BadRequest(f'"{name}" must be a list of at most {limit}')
        return value

    held = tuple(lease_key(v) for v in items("held", MAX_HELD))
    checkpoints = []
    for entry in items("checkpoints", MAX_HELD):
        if not isinstance(entry, dict) or not isinstance(entry.get("value"), str):
            raise BadRequest('a checkpoint is {"lease": [...], "value": "..."}')
        value = entry["value"]
        if len(value.encode("utf-8", "surrogatepass")) > api.MAX_CHECKPOINT_BYTES:
            raise BadRequest(f"a checkpoint is over {api.MAX_CHECKPOINT_BYTES} bytes")
        checkpoints.append((lease_key(entry.get("lease")), value))
    results = []
    for entry in items("results", MAX_RESULTS):
        if not isinstance(entry, dict):
            raise BadRequest('a result is {"lease": [...], "exitCode": N, "message": "..."}')
        code = entry.get("exitCode")
        if not isinstance(code, int) or isinstance(code, bool) or not 0 <= code <= 255:
            raise BadRequest("a result's exitCode must be an integer from 0 to 255")
        message = entry.get("message") or ""
        if not isinstance(message, str):
            raise BadRequest("a result's message must be a string")
        results.append((lease_key(entry.get("lease")), code, message[:MAX_MESSAGE_CHARS]))
    return PullRequest(
        namespace=pod["namespace"],
        name=pod["name"],
        uid=uid,
        boot=boot,
        seq=number("seq", 0, 2**62),
        seen=number("seen", 0, 2**62),
        free=number("free", 0, MAX_CLAIM),
        wait_seconds=float(wait),
        held=held,
        checkpoints=tuple(checkpoints),
        results=tuple(results),
    )


def env_of(manifest: Mapping[str, Any]) -> dict[str, str]:
    """The VIGIL_* variables a task's process gets, as its pod would (the first container's),
    without those of the per-pod heartbeat: a pulled task's liveness is its worker's."""
    containers = (manifest.get("spec") or {}).get("containers") or [{}]
    env = {}
    for var in containers[0].get("env") or []:
        name = var.get("name", "")
        if name.startswith("VIGIL_") and "value" in var and not name.startswith(_POD_ONLY):
            env[name] = str(var["value"])
    return env


# The variables of a pod's own heartbeat and agent: not a pulled task's.
_POD_ONLY = ("VIGIL_HEARTBEAT", "VIGIL_LIVENESS", "VIGIL_STARTUP", "VIGIL_AGENT")


class PullState:
    """Every lease of every pool, held by the leader.

    `adoption_seconds`: how long after `started_at` (monotonic) a task its status says is
    running, but no worker has named, is waited for rather than offered again.
    `timing(namespace, pool)`: the pool's heartbeat settings.
    """

    def __init__(
        self,
        *,
        started_at: float,
        timing: Callable[[str, str], PoolTiming] = lambda namespace, pool: PoolTiming(),
        adoption_seconds: float | None = None,
        claimed: Callable[[float], None] = lambda waited: None,
        adoptable: Callable[[str, str, str], bool] = lambda namespace, pool, job_uid: True,
    ) -> None:
        """`claimed(seconds)` hears, for each lease given, how long its task waited for a worker.
        `adoptable(namespace, pool, job uid)`: whether that job is a pulled array of that pool in
        that namespace, so that a worker's lease of it may be adopted."""
        self.started_at, self.claimed, self.adoptable = started_at, claimed, adoptable
        self.timing = timing
        self.adoption_seconds = adoption_seconds
        self.leases: dict[LeaseKey, Lease] = {}
        self.ready: dict[tuple[str, str], OrderedDict[LeaseKey, None]] = {}  # per pool, oldest offer first
        self.workers: dict[tuple[str, str], Worker] = {}  # by (namespace, pod name)
        self.by_job: dict[str, set[LeaseKey]] = {}
        # Jobs deleted while this process led: what a worker still holds or reports of one is
        # stopped and acknowledged, never adopted (it would wait for a look that never comes).
        self.gone: Lru[str, bool] = Lru(GONE_JOBS)

    # --- the job controller's side (after the write that fences each) ---------------------

    def adopting(self, now: float, namespace: str, pool: str) -> bool:
        """Whether a task recorded as running is still waited for rather than offered again."""
        window = self.adoption_seconds
        if window is None:
            window = self.timing(namespace, pool).timeout + self.timing(namespace, pool).interval
        return now < self.started_at + window

    def offer(
        self,
        manifest: Mapping[str, Any],
        pool: str,
        now: float,
        wall: datetime,
        *,
        grace_seconds: int = DEFAULT_GRACE_SECONDS,
        deadline_seconds: int | None = None,
    ) -> Lease | None:
        """A task's attempt made claimable: what the decision's CreatePod of its (virtual) pod
        means for a pulled task. None if that attempt is already offered or leased."""
        key = _key_of(manifest)
        if key is None or key in self.leases:
            return None
        env = env_of(manifest)
        lease = Lease(
            key=key,
            namespace=fields.metadata(manifest).get("namespace", ""),
            pool=pool,
            job_name=env.get("VIGIL_JOB", ""),
            env=env,
            grace_seconds=grace_seconds,
            deadline_seconds=deadline_seconds,
            offered_wall=wall,
            offered_at=now,
        )
        self._add(lease)
        self.ready.setdefault((lease.namespace, pool), OrderedDict())[key] = None
        return lease

    def cancel(self, uid: str, wall: datetime) -> bool:
        """The decision's deletion of a virtual pod: its worker is told to stop it; a lease not
        claimed yet simply ends (nothing runs it). False if no such lease."""
        lease = self._by_uid(uid)
        if lease is None:
            return False
        if lease.cancelled_wall is None:
            lease.cancelled_wall = wall
        if lease.worker is None and lease.result is None:
            self.ready.get((lease.namespace, lease.pool), OrderedDict()).pop(lease.key, None)
            lease.vanished = lease.vanished or "Cancelled"
            lease.finished_wall = lease.finished_wall or wall
        return True

    def settle(self, uid: str) -> bool:
        """The decision's release of a finished virtual pod: its end is in the job's status, so
        the lease is forgotten and its result acknowledged to its worker."""
        lease = self._by_uid(uid)
        if lease is None:
            return False
        worker = self.workers.get((lease.namespace, lease.worker)) if lease.worker else None
        if worker is not None and lease.result is not None:
            worker.acks.add(lease.key)
        self._drop(lease)
        return True

    def forget_job(self, job_uid: str) -> None:
        """A job deleted: its leases are dropped; a worker still running one of its tasks is told
        to stop it when it next names it, and its results are acknowledged unrecorded."""
        self.gone.put(job_uid, True)
        for key in list(self.by_job.get(job_uid, ())):
            self._drop(self.leases[key])

    # --- what a decision reads ---------------------------------------------------------------

    def pods_of(self, job: Mapping[str, Any], now: float) -> list[dict[str, Any]]:
        """The virtual pods of a pulled array: one per lease, and, while adopting, a Pending one
        for each task its status says is running that no worker has named yet."""
        job_uid = fields.uid(job)
        pods = []
        pool = str(fields.spec(job).get("pool") or "")
        for key in sorted(self.by_job.get(job_uid, ())):
            lease = self.leases[key]
            if (lease.namespace, lease.pool) != (fields.namespace(job), pool):
                continue  # not this job's, whatever UID a worker named
            lease.job_name = lease.job_name or fields.name(job)
            pods.append(virtual_pod(job, key, _phase_of(lease), lease))
        if pool and self.adopting(now, fields.namespace(job), pool):
            known = {(lease_index, attempt) for _, lease_index, attempt in self.by_job.get(job_uid, ())}
            # An attempt seen running (its UID recorded) may be held by a worker that has not
            # spoken yet; one never seen running was most likely not claimed, and is offered again
            # at once, unless NoOverlap forbids the risk of two workers running it.
            careful = fields.spec(job).get("guarantee") == "NoOverlap"
            for task in (fields.status(job).get("tasks") or {}).get("active") or []:
                current = task.get("currentAttempt") or {}
                index, number = task.get("index"), current.get("number")
                seen = bool(current.get("podUID")) or careful
                if isinstance(index, int) and isinstance(number, int) and seen and (index, number) not in known:
                    pods.append(virtual_pod(job, (job_uid, index, number), "Pending", None))
        return pods

    def liveness(self, job_uid: str, now: float, wall: datetime) -> dict[str, Liveness]:
        """Each claimed, running lease's verdict: its worker's silence against the pool's
        thresholds (a worker whose pod is gone: Lost at once)."""
        verdicts: dict[str, Liveness] = {}
        for key in self.by_job.get(job_uid, ()):
            lease = self.leases[key]
            if lease.worker is None or lease.result is not None or lease.vanished is not None:
                continue
            worker = self.workers.get((lease.namespace, lease.worker))
            timing = self.timing(lease.namespace, lease.pool)
            silence = now - worker.last_seen if worker is not None else math.inf
            last = worker.last_seen_wall if worker is not None else None
            if worker is None or worker.gone or silence >= timing.timeout:
                detail = f"its worker {lease.worker} was silent for {timing.timeout:g}s (the pool's timeout)"
                if worker is not None and worker.gone:
                    detail = f"its worker pod {lease.worker} is gone"
                verdicts[lease.uid] = Liveness("Lost", silence, detail, last)
            elif silence >= timing.uncertain_after:
                verdicts[lease.uid] = Liveness(
                    "Uncertain",
                    silence,
                    f"its worker {lease.worker} has not been heard for {timing.uncertain_after:g}s",
                    last,
                )
            else:
                verdicts[lease.uid] = Liveness("Healthy", silence, f"its worker {lease.worker} is heard", last)
        return verdicts

    def next_change(self, job_uid: str, now: float) -> float | None:
        """The soonest instant (monotonic) a lease of the job would change verdict if its worker
        stays silent: when the job wants a look without any event."""
        due: list[float] = []
        for key in self.by_job.get(job_uid, ()):
            lease = self.leases[key]
            worker = self.workers.get((lease.namespace, lease.worker)) if lease.worker else None
            if worker is None or lease.result is not None or lease.vanished is not None:
                continue
            timing = self.timing(lease.namespace, lease.pool)
            for threshold in (timing.uncertain_after, timing.timeout):
                at = worker.last_seen + threshold
                if at > now:
                    due.append(at)
        return min(due, default=None)

    def load(self, namespace: str, pool: str) -> PoolLoad:
        """The pool's backlog, as its controller scales by it: tasks offered and not claimed,
        tasks running on its workers, and how many on each."""
        busy: dict[str, int] = {}
        running = 0
        for (ns, _), worker in self.workers.items():
            if ns == namespace and worker.pool == pool and not worker.gone:
                count = sum(1 for key in worker.leases if self.leases[key].result is None)
                busy[worker.name] = count
                running += count
        return PoolLoad(len(self.ready.get((namespace, pool), ())), running, busy)

    def has_ready(self, namespace: str, pool: str) -> bool:
        return bool(self.ready.get((namespace, pool)))

    # --- the workers' side -----------------------------------------------------------------

    def request(self, pool: str, request: PullRequest, now: float, wall: datetime) -> Answer:
        """A worker's request (its pod verified as a pod of `pool` by the caller): it renews its
        leases, records its results and checkpoints, adopts what it holds that this leader did
        not know, notes the leases it no longer holds, and claims up to `free` ready tasks."""
        where = (request.namespace, request.name)
        touched: set[str] = set()
        worker = self.workers.get(where)
        if worker is not None and request.uid and worker.uid and worker.uid != request.uid:
            touched |= self.worker_gone(request.namespace, request.name, wall)  # a new pod of that name
            worker = None
        if worker is None:
            worker = Worker(request.namespace, pool, request.name, request.uid or "")
            self.workers[where] = worker
        if worker.boot and request.boot and worker.boot != request.boot:
            # The worker process started again: whatever it ran before is gone with it.
            for key in list(worker.leases):
                if key not in request.held and self._running(key):
                    touched.add(self._vanish(self.leases[key], "WorkerRestarted", wall))
            worker.last_seq = -1
        worker.boot = request.boot or worker.boot
        in_order = request.seq > worker.last_seq
        worker.last_seq = max(worker.last_seq, request.seq)
        worker.last_seen, worker.last_seen_wall = now, wall
        cancel: list[list[Any]] = []
        held = dict.fromkeys(request.held)  # in the worker's order: the answer is deterministic
        acked: list[list[Any]] = []
        adopting = self.adopting(now, request.namespace, pool)

        def may_adopt(key: LeaseKey) -> bool:
            """Only while a new leader waits for its workers, only a job of the worker's own
            namespace and pool, and no more than a worker may hold: a worker's word costs memory,
            and names any job UID it likes."""
            return adopting and len(worker.leases) < MAX_HELD and self.adoptable(request.namespace, pool, key[0])

        for key, code, message in request.results:
            if self.gone.get(key[0]):
                acked.append(list(key))  # its job is deleted: nothing to record it in
                continue
            lease = self.leases.get(key)
            if lease is None:
                if not may_adopt(key):
                    acked.append(list(key))  # nothing this leader offered or waits for: dropped
                    continue
                lease = self._adopt(key, worker, wall)
            elif self._unclaimed(lease, request.namespace, pool):
                self._take_back(lease, worker, wall)  # see the same case of `held` below
            elif lease.worker != worker.name:
                continue  # not this worker's lease: its result is not this attempt's
            lease.confirmed = True
            if lease.result is None:
                lease.result = {"exitCode": code, "message": message}
                lease.finished_wall = wall
                touched.add(key[0])
        for key, value in request.checkpoints:
            lease = self.leases.get(key)
            if lease is not None and lease.worker == worker.name:
                lease.confirmed = True
                if lease.checkpoint != value:
                    lease.checkpoint = value
                    touched.add(key[0])
        for key in held if in_order else ():
            if self.gone.get(key[0]):
                cancel.append(list(key))
                continue
            lease = self.leases.get(key)
            if lease is None:
                if not may_adopt(key):
                    cancel.append(list(key))
                    continue
                lease = self._adopt(key, worker, wall)
                touched.add(key[0])
            elif (lease.namespace, lease.pool) != (request.namespace, pool):
                cancel.append(list(key))  # another pool's task: never this worker's
                continue
            elif self._unclaimed(lease, request.namespace, pool):
                # Offered again by a new leader, and named by the worker the old one gave it to
                # before anyone claimed it: it stays with that worker.
                self._take_back(lease, worker, wall)
                touched.add(key[0])
            if lease.worker != worker.name or lease.vanished is not None:
                cancel.append(list(key))  # someone else's, or ended: this worker must not run it
                continue
            lease.confirmed = True
            if lease.cancelled_wall is not None:
                cancel.append(list(key))
        for key in list(worker.leases) if in_order else ():
            lease = self.leases[key]
            if (
                key not in held
                and lease.result is None
                and lease.vanished is None
                and lease.granted_boot == request.boot
                and request.seen >= lease.granted_seq
            ):
                if lease.confirmed:
                    touched.add(self._vanish(lease, "LeaseDropped", wall))  # docs/pull.md: held is the truth
                else:
                    self._undelivered(lease, worker)
        acked += [list(key) for key in sorted(worker.acks)]
        worker.acks.clear()
        given = self.claim(worker, request.free, request.seq, request.boot, now, wall) if request.free else []
        body = self._body([lease.wire() for lease in given], cancel, acked, request.namespace, pool)
        touched.update(lease.key[0] for lease in given)
        return Answer(body, frozenset(touched), len(given))

    def claim_more(self, pool: str, request: PullRequest, now: float, wall: datetime) -> Answer:
        """The rest of a long poll, once a task was offered to its pool or its wait ran out: only
        the claim, and the acknowledgements due since. What the request said of its leases and
        results was taken when it came (`request`); the worker has said more since, on its other
        connection, so its `held` is not read again."""
        worker = self.workers.get((request.namespace, request.name))
        if worker is None or worker.gone or worker.boot != request.boot or worker.pool != pool:
            return Answer(self._body([], [], [], request.namespace, pool), frozenset(), 0)
        acked = [list(key) for key in sorted(worker.acks)]
        worker.acks.clear()
        given = self.claim(worker, request.free, request.seq, request.boot, now, wall)
        body = self._body([lease.wire() for lease in given], [], acked, request.namespace, pool)
        return Answer(body, frozenset(lease.key[0] for lease in given), len(given))

    def _body(
        self, leases: list[dict[str, Any]], cancel: list[list[Any]], acked: list[list[Any]], namespace: str, pool: str
    ) -> dict[str, Any]:
        timing = self.timing(namespace, pool)
        return {
            "leases": leases,
            "cancel": cancel,
            "acked": acked,
            "beatSeconds": timing.interval,
            "leaseSeconds": timing.timeout,
        }

    def _unclaimed(self, lease: Lease, namespace: str, pool: str) -> bool:
        """An offer of this pool nobody has claimed, still running for all the leader knows."""
        return (
            lease.worker is None
            and lease.vanished is None
            and lease.cancelled_wall is None
            and (lease.namespace, lease.pool) == (namespace, pool)
        )

    def _undelivered(self, lease: Lease, worker: Worker) -> None:
        """A lease its worker never named and now leaves out: the answer that gave it never
        reached the worker (its request timed out on a busy leader, its connection broke), so
        nothing ran it. It is offered again, first in line, with the same attempt number: a retry
        would spend an attempt of the task's, and its backoff, on a task that never started."""
        worker.leases.discard(lease.key)
        lease.worker, lease.granted_seq, lease.granted_boot, lease.claimed_wall = None, 0, "", None
        ready = self.ready.setdefault((lease.namespace, lease.pool), OrderedDict())
        ready[lease.key] = None
        ready.move_to_end(lease.key, last=False)

    def _take_back(self, lease: Lease, worker: Worker, wall: datetime) -> None:
        self.ready.get((lease.namespace, lease.pool), OrderedDict()).pop(lease.key, None)
        lease.worker, lease.granted_boot, lease.claimed_wall = worker.name, worker.boot, wall
        worker.leases.add(lease.key)

    def claim(self, worker: Worker, free: int, seq: int, boot: str, now: float, wall: datetime) -> list[Lease]:
        """Up to `free` ready tasks of the worker's pool, oldest offer first, leased to it."""
        ready = self.ready.get((worker.namespace, worker.pool))
        given: list[Lease] = []
        while ready and len(given) < free:
            key, _ = ready.popitem(last=False)
            lease = self.leases[key]
            lease.worker, lease.granted_seq, lease.granted_boot, lease.claimed_wall = worker.name, seq, boot, wall
            worker.leases.add(key)
            given.append(lease)
            self.claimed(max(0.0, now - lease.offered_at))
        return given

    def worker_gone(self, namespace: str, name: str, wall: datetime) -> set[str]:
        """The worker's pod is deleted or finished: nothing of its runs any more (NoOverlap may
        offer its tasks again). Returns the job UIDs that want a look."""
        worker = self.workers.get((namespace, name))
        if worker is None:
            return set()
        worker.gone = True
        del self.workers[(namespace, name)]
        return {self._vanish(self.leases[key], "WorkerGone", wall) for key in worker.leases if self._running(key)}

    def _running(self, key: LeaseKey) -> bool:
        lease = self.leases.get(key)
        return lease is not None and lease.result is None and lease.vanished is None

    # --- the bookkeeping -------------------------------------------------------------------

    def _add(self, lease: Lease) -> None:
        self.leases[lease.key] = lease
        self.by_job.setdefault(lease.key[0], set()).add(lease.key)

    def _drop(self, lease: Lease) -> None:
        self.leases.pop(lease.key, None)
        keys = self.by_job.get(lease.key[0])
        if keys is not None:
            keys.discard(lease.key)
            if not keys:
                del self.by_job[lease.key[0]]
        self.ready.get((lease.namespace, lease.pool), OrderedDict()).pop(lease.key, None)
        worker = self.workers.get((lease.namespace, lease.worker)) if lease.worker else None
        if worker is not None:
            worker.leases.discard(lease.key)

    def _by_uid(self, uid: str) -> Lease | None:
        key = _parse_uid(uid)
        return self.leases.get(key) if key is not None else None

    def _adopt(self, key: LeaseKey, worker: Worker, wall: datetime) -> Lease:
        """A lease a worker names that this leader never offered (a failover): taken as claimed
        by it. Its job's decision judges it as it would a pod it found: the current attempt's is
        followed, an older one's is stopped."""
        job_uid, index, attempt = key
        lease = Lease(
            key=key,
            namespace=worker.namespace,
            pool=worker.pool,
            job_name="",  # known at the first look at its job
            env={},
            grace_seconds=DEFAULT_GRACE_SECONDS,
            deadline_seconds=None,
            offered_wall=wall,
            offered_at=worker.last_seen,
            worker=worker.name,
            claimed_wall=wall,
            granted_boot=worker.boot,
            confirmed=True,
        )
        self._add(lease)
        worker.leases.add(key)
        return lease

    def _vanish(self, lease: Lease, why: str, wall: datetime) -> str:
        lease.vanished = why
        lease.finished_wall = wall
        return lease.key[0]


def _key_of(manifest: Mapping[str, Any]) -> LeaseKey | None:
    labels = fields.labels(manifest)
    uid, index, attempt = labels.get(api.LABEL_JOB_UID), labels.get(api.LABEL_TASK_INDEX), labels.get(api.LABEL_ATTEMPT)
    if not uid or not (index or "").isdigit() or not (attempt or "").isdigit():
        return None
    return uid, int(index or 0), int(attempt or 0)


def _parse_uid(uid: str) -> LeaseKey | None:
    if not uid.startswith(VIRTUAL_UID_PREFIX):
        return None
    job_uid, _, rest = uid[len(VIRTUAL_UID_PREFIX) :].rpartition("-")
    job_uid, _, index = job_uid.rpartition("-")
    if not job_uid or not index.isdigit() or not rest.isdigit():
        return None
    return job_uid, int(index), int(rest)


def is_virtual(uid: str) -> bool:
    return uid.startswith(VIRTUAL_UID_PREFIX)


def _phase_of(lease: Lease) -> str:
    if lease.result is not None:
        return "Succeeded" if int(lease.result["exitCode"]) == 0 else "Failed"
    if lease.vanished is not None:
        return "Vanished"
    return "Running" if lease.worker is not None else "Pending"


def virtual_pod(job: Mapping[str, Any], key: LeaseKey, phase: str, lease: Lease | None) -> dict[str, Any]:
    """The pod a lease is shown to its array's decision as: named, labelled and owned as the
    task's attempt pod would be, with the lease's state as the pod's phase. `phase` Pending with
    no lease is a task a new leader waits for (adopting)."""
    job_uid, index, attempt = key
    offered = lease.offered_wall if lease is not None else None
    metadata: dict[str, Any] = {
        "name": attempt_pod_name(task_name(fields.name(job), index), attempt),
        "namespace": fields.namespace(job),
        "uid": f"{VIRTUAL_UID_PREFIX}{job_uid}-{index}-{attempt}",
        "resourceVersion": "1",
        "labels": {api.LABEL_JOB_UID: job_uid, api.LABEL_ATTEMPT: str(attempt), api.LABEL_TASK_INDEX: str(index)},
        "ownerReferences": [
            {
                "apiVersion": f"{api.GROUP}/{api.VERSION}",
                "kind": api.KIND,
                "name": fields.name(job),
                "uid": job_uid,
                "controller": True,
            }
        ],
        "finalizers": [api.FINALIZER_ATTEMPT_TRACKING],
    }
    if offered is not None:
        metadata["creationTimestamp"] = _stamp(offered)
        metadata["annotations"] = {api.ANNOTATION_STARTED_AT: _stamp(offered)}
    status: dict[str, Any] = {"phase": "Pending"}
    node = ""
    if lease is not None:
        node = lease.worker or ""
        if lease.checkpoint is not None:
            metadata.setdefault("annotations", {})[api.ANNOTATION_CHECKPOINT] = lease.checkpoint
        if lease.cancelled_wall is not None:
            metadata["deletionTimestamp"] = _stamp(lease.cancelled_wall)
            metadata["deletionGracePeriodSeconds"] = lease.grace_seconds
        if phase in ("Succeeded", "Failed"):
            assert lease.result is not None
            status = {
                "phase": phase,
                "containerStatuses": [
                    {
                        "name": WORKER_CONTAINER,
                        "state": {
                            "terminated": {
                                "exitCode": int(lease.result["exitCode"]),
                                "reason": "Completed" if phase == "Succeeded" else "Error",
                                "message": lease.result.get("message", ""),
                                "finishedAt": _stamp(lease.finished_wall),
                            }
                        },
                    }
                ],
            }
        elif phase == "Vanished":
            # Ended with nothing said (its worker gone or restarted): read as a pod deleted under
            # its attempt, with no grace, as the lifecycle reads one.
            status = {"phase": "Failed", "reason": lease.vanished}
            metadata["deletionTimestamp"] = _stamp(lease.finished_wall)
            metadata["deletionGracePeriodSeconds"] = 0
        elif phase == "Running":
            status = {"phase": "Running", "startTime": _stamp(lease.claimed_wall)}
    return {"metadata": metadata, "spec": {"nodeName": node}, "status": status}


@functools.lru_cache(maxsize=1024)  # the leases of one look or one request share their instants
def _stamp(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ") if moment is not None else ""


def carry_out(state: PullState, action: Any, pool: str, now: float, wall: datetime) -> bool:
    """What a pulled array's action on a virtual pod means for its leases, after the status write
    that fences it: CreatePod offers the attempt, DeletePod and a superseded mark cancel it,
    ReleasePod settles it. False for any other action (the executor's, as for any job)."""
    if isinstance(action, CreatePod):
        spec = action.manifest.get("spec") or {}
        state.offer(
            action.manifest,
            pool,
            now,
            wall,
            grace_seconds=int(spec.get("terminationGracePeriodSeconds") or DEFAULT_GRACE_SECONDS),
            deadline_seconds=spec.get("activeDeadlineSeconds"),
        )
        return True
    if isinstance(action, (DeletePod, AnnotatePod)) and is_virtual(action.uid):
        if isinstance(action, DeletePod) or api.ANNOTATION_SUPERSEDED in action.annotations:
            state.cancel(action.uid, wall)
        return True
    if isinstance(action, ReleasePod) and is_virtual(action.uid):
        state.settle(action.uid)
        return True
    return False
