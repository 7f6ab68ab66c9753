"""The worker's bookkeeping on the pull protocol (docs/pull.md), pure: no sockets, no threads, no
clock of its own. Every time is a value of a monotonic clock handed in by the caller.

`WorkerState` holds what a worker must remember between requests: its slots and how many are
free, the numbering of its requests (`seq`, and `seen`: every request up to it has been answered
or has failed, and its answer acted on), the leases it holds, the results it keeps until an
answer lists them in `acked` (sent again with every request until then), the checkpoints it
sends until an answer to a request carrying them confirms them, the tasks it was told to cancel,
and the self-fencing clock (no 200 for `leaseSeconds`, counted from the sending of the last
request that got one: every task is stopped and its lease forgotten).

It builds each request's body (`request`, at most MAX_BODY_BYTES: the results that do not fit
go with the next one, oldest first) and takes each answer (`answered`, `failed`): a malformed
answer is no verdict, never an exception. What the worker must then do is returned as data:
`Start` a task with its lease's env, `Stop` a task (SIGTERM, then SIGKILL after its grace), and
`Forget` a lease (it is no longer listed in `held`, and its result, if any comes, is not sent).

Two requests may be in flight at once (a long poll claiming tasks, and the beats that report
results meanwhile); their answers may be taken in either order. `seen` is therefore the highest
seq below every request still in flight: a lease given in the answer to request s is never
reported as lost by omission before that answer has been acted on.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Lease = tuple[str, int, int]  # [job uid, task index, attempt]: the fence of one attempt

MAX_BODY_BYTES = 256 * 1024  # a request's body: the results that do not fit go with the next one
MAX_MESSAGE_CHARS = 1024  # a result's message (its exception, its signal) is cut to this
MAX_CHECKPOINT_CHARS = 2048  # a checkpoint, as the pod annotation's (vigil.api.MAX_CHECKPOINT_BYTES)
MAX_UID_CHARS = 64  # a job's UID (36 characters in Kubernetes), as the leader bounds it (vigil.core.pull)
MAX_SLOTS = 1000  # `held` lists every lease: with this many it is ~60 KiB of a request
MAX_ENTRIES = 1000  # checkpoints, and results, one request carries (the leader's bound, vigil.core.pull)
MAX_WAIT_SECONDS = 20.0  # the protocol's bound on `waitSeconds`
MAX_REST_SECONDS = 60.0  # a 503's Retry-After is honoured up to this (and never past self-fencing)
DEFAULT_BEAT_SECONDS = 5.0  # until the first answer says the pool's
DEFAULT_LEASE_SECONDS = 30.0
DEFAULT_GRACE_SECONDS = 30.0  # a lease's graceSeconds when the answer gives none
MIN_BEAT_SECONDS = 0.05  # an answer's beatSeconds below this is taken as this (no busy loop)


# --- what the leader sends --------------------------------------------------------------------------


@dataclass(frozen=True)
class Grant:
    """One lease of an answer: a task attempt given to this worker."""

    lease: Lease
    job: str
    namespace: str
    index: int
    attempt: int
    grace_seconds: float
    deadline_seconds: float | None
    env: Mapping[str, str]


@dataclass(frozen=True)
class Answer:
    """A 200's body, validated."""

    leases: tuple[Grant, ...]
    cancel: tuple[Lease, ...]
    acked: tuple[Lease, ...]
    beat_seconds: float
    lease_seconds: float


class Malformed(ValueError):
    """An answer that is not the protocol's: no verdict (the message says what is wrong)."""


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Malformed(f"{what} is not an integer")
    return value


def _seconds(value: Any, what: str, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise Malformed(f"{what} is not a number of seconds")
    if value < 0 or (positive and value == 0):
        raise Malformed(f"{what} must be {'greater than' if positive else 'at least'} 0")
    return float(value)


def parse_lease(value: Any, what: str = "a lease") -> Lease:
    if not isinstance(value, list) or len(value) != 3:
        raise Malformed(f"{what} is not [job uid, index, attempt]")
    uid, index, attempt = value
    if not isinstance(uid, str) or not uid or len(uid) > MAX_UID_CHARS:
        raise Malformed(f"{what}'s job uid is not a string of 1 to {MAX_UID_CHARS} characters")
    return uid, _int(index, f"{what}'s index"), _int(attempt, f"{what}'s attempt")


def _leases(value: Any, what: str) -> tuple[Lease, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise Malformed(f"{what} is not a list")
    return tuple(parse_lease(item, f"an entry of {what}") for item in value)


def _grant(value: Any) -> Grant:
    if not isinstance(value, dict):
        raise Malformed("an entry of leases is not an object")
    lease = parse_lease(value.get("lease"), "a granted lease")
    env = value.get("env")
    env = {} if env is None else env
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise Malformed(f"the env of lease {list(lease)} is not an object of strings")
    if any(not k or "=" in k or "\0" in k or "\0" in v for k, v in env.items()):
        raise Malformed(f"the env of lease {list(lease)} holds a name or value no process can be given")
    grace = value.get("graceSeconds")
    deadline = value.get("deadlineSeconds")
    job, namespace = value.get("job", ""), value.get("namespace", "")
    if not isinstance(job, str) or not isinstance(namespace, str):
        raise Malformed(f"the job or namespace of lease {list(lease)} is not a string")
    index = _int(value.get("index", lease[1]), "a lease's index")
    attempt = _int(value.get("attempt", lease[2]), "a lease's attempt")
    if (index, attempt) != lease[1:]:
        raise Malformed(f"lease {list(lease)} names index {index} and attempt {attempt}")
    return Grant(
        lease=lease,
        job=job,
        namespace=namespace,
        index=index,
        attempt=attempt,
        grace_seconds=DEFAULT_GRACE_SECONDS if grace is None else _seconds(grace, "graceSeconds", positive=False),
        deadline_seconds=None if deadline is None else _seconds(deadline, "deadlineSeconds", positive=False),
        env=dict(env),
    )


def parse_answer(body: bytes) -> Answer:
    """A 200's body as the protocol says it, or Malformed."""
    try:
        raw = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise Malformed("the answer is not JSON") from None
    if not isinstance(raw, dict):
        raise Malformed("the answer is not a JSON object")
    leases = raw.get("leases")
    leases = [] if leases is None else leases
    if not isinstance(leases, list):
        raise Malformed("leases is not a list")
    return Answer(
        leases=tuple(_grant(item) for item in leases),
        cancel=_leases(raw.get("cancel"), "cancel"),
        acked=_leases(raw.get("acked"), "acked"),
        beat_seconds=max(MIN_BEAT_SECONDS, _seconds(raw.get("beatSeconds"), "beatSeconds", positive=True)),
        lease_seconds=_seconds(raw.get("leaseSeconds"), "leaseSeconds", positive=True),
    )


# --- what the worker is to do ----------------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    """Run the task of `grant` (its env over the worker's own)."""

    grant: Grant


@dataclass(frozen=True)
class Stop:
    """Stop the task of `lease`: SIGTERM now, SIGKILL after `grace_seconds` (a function call: its
    `cancelled` event)."""

    lease: Lease
    grace_seconds: float
    reason: str


@dataclass(frozen=True)
class Forget:
    """The lease is not this worker's any more (or was never started): not listed in `held`, and
    its result, if one comes, is not sent. The leader learns it by omission."""

    lease: Lease
    reason: str


Action = Start | Stop | Forget


@dataclass(frozen=True)
class Result:
    exit_code: int
    message: str


@dataclass(frozen=True)
class Outgoing:
    """A request to send: its seq, its body (JSON, at most MAX_BODY_BYTES), and how long the
    leader may hold it (`wait_seconds`: the long poll, 0 for a beat)."""

    seq: int
    body: bytes
    claim: bool
    free: int
    wait_seconds: float
    results: tuple[Lease, ...]  # the results it carries (for the log and the tests)


@dataclass(frozen=True)
class Verdict:
    """What taking an answer gave: `ok` for a valid 200 (a verdict), else `why` it is none; the
    actions to carry out; how long not to ask again (a 503's Retry-After, bounded)."""

    ok: bool
    actions: tuple[Action, ...] = ()
    why: str = ""
    rest_seconds: float = 0.0


@dataclass
class _Task:
    grant: Grant
    state: Literal["running", "cancelled", "fenced"] = "running"


@dataclass
class _Checkpoint:
    value: str
    version: int = 1
    confirmed: int = 0  # the highest version an answer to a request carrying it confirmed


@dataclass(frozen=True)
class _Sent:
    sent_at: float
    claim: bool
    checkpoints: tuple[tuple[Lease, int], ...]


def _cut(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE_CHARS else message[: MAX_MESSAGE_CHARS - 3] + "..."


def _dump(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True).encode("ascii")


@dataclass
class WorkerState:
    """The bookkeeping of one worker process (a new `boot` at every start)."""

    pod: Mapping[str, str]  # {"namespace", "name", "uid"}
    boot: str
    slots: int
    beat_seconds: float = DEFAULT_BEAT_SECONDS
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    seq: int = 0  # the last request's number
    draining: bool = False  # claims no more, starts no lease
    last_ok_sent_at: float | None = None  # when the last request that got a 200 was sent
    last_sent_at: float | None = None  # when any request was last sent
    rest_until: float = -math.inf  # a 503's Retry-After: no request before this
    tasks: dict[Lease, _Task] = field(default_factory=dict)  # every task whose process may still run
    results: dict[Lease, Result] = field(default_factory=dict)  # oldest first, until acked
    checkpoints: dict[Lease, _Checkpoint] = field(default_factory=dict)
    unsent: set[Lease] = field(default_factory=set)  # results no request has carried yet
    inflight: dict[int, _Sent] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 1 <= self.slots <= MAX_SLOTS:
            raise ValueError(f"slots must be from 1 to {MAX_SLOTS}, not {self.slots}")

    # --- what the worker holds --------------------------------------------------------------------

    @property
    def free(self) -> int:
        """Slots with no task in them (a fenced task holds its slot until its process ends)."""
        return max(0, self.slots - len(self.tasks))

    @property
    def seen(self) -> int:
        """The highest seq below every request in flight: all up to it were taken."""
        return min(self.inflight) - 1 if self.inflight else self.seq

    def held(self) -> list[Lease]:
        """The leases of every task running now (cancelled ones too, until they end)."""
        return [lease for lease, task in self.tasks.items() if task.state != "fenced"]

    def runs(self, lease: Lease) -> bool:
        """Whether the lease's task is to run (held: not fenced, not ended)."""
        task = self.tasks.get(lease)
        return task is not None and task.state != "fenced"

    def grant(self, lease: Lease) -> Grant | None:
        task = self.tasks.get(lease)
        return task.grant if task is not None else None

    def fence_deadline(self) -> float | None:
        """When the leases held now are to be given up, if no 200 comes first (None: none held,
        or no 200 yet)."""
        if self.last_ok_sent_at is None or not self.held():
            return None
        return self.last_ok_sent_at + self.lease_seconds

    def beat_due_at(self) -> float:
        """When the next beat is due: `beatSeconds` after the last request sent, not before a
        503's Retry-After."""
        last = -math.inf if self.last_sent_at is None else self.last_sent_at
        return max(last + self.beat_seconds, self.rest_until)

    def has_unsent_results(self) -> bool:
        return bool(self.unsent)

    # --- what happens to tasks --------------------------------------------------------------------

    def checkpoint(self, lease: Lease, value: str) -> bool:
        """The task's checkpoint file (or its handler) now says `value`; True if that is new and
        is to be sent. A fenced or unknown lease's is ignored."""
        if len(value) > MAX_CHECKPOINT_CHARS:
            raise ValueError(f"a checkpoint is at most {MAX_CHECKPOINT_CHARS} characters")
        task = self.tasks.get(lease)
        if task is None or task.state == "fenced":
            return False
        known = self.checkpoints.get(lease)
        if known is None:
            self.checkpoints[lease] = _Checkpoint(value)
            return True
        if known.value == value:
            return False
        known.value, known.version = value, known.version + 1
        return True

    def finished(self, lease: Lease, exit_code: int, message: str = "") -> bool:
        """The task's process ended (or its handler returned) with `exit_code` (outside 0-255:
        255, the message saying so): its slot is free. True if a result is to be reported (not
        for a fenced or unknown lease)."""
        task = self.tasks.pop(lease, None)
        if task is None:
            return False
        if task.state == "fenced":
            self.checkpoints.pop(lease, None)
            return False
        if not 0 <= exit_code <= 255:  # the leader takes an exit status of a process, nothing else
            message = f"exit code {exit_code} is not from 0 to 255" + (f": {message}" if message else "")
            exit_code = 255
        self.results[lease] = Result(exit_code, _cut(message))
        self.unsent.add(lease)
        return True

    def drain(self) -> None:
        """The worker is stopping: it claims no more tasks and starts no lease it is given."""
        self.draining = True

    def tick(self, now: float) -> list[Action]:
        """Self-fencing: with no 200 for `leaseSeconds` (from the sending of the last request that
        got one), every task held is stopped and its lease forgotten: the leader has declared
        them Lost by now, and may run them elsewhere."""
        deadline = self.fence_deadline()
        if deadline is None or now < deadline:
            return []
        actions: list[Action] = []
        silent = now - (self.last_ok_sent_at or now)
        reason = f"no answer from the leader for {silent:g}s (leaseSeconds {self.lease_seconds:g})"
        for lease, task in self.tasks.items():
            if task.state == "fenced":
                continue
            if task.state == "running":  # a cancelled one is being stopped already
                actions.append(Stop(lease, task.grant.grace_seconds, f"self-fenced: {reason}"))
            task.state = "fenced"
            self.checkpoints.pop(lease, None)
            actions.append(Forget(lease, f"self-fenced: {reason}"))
        return actions

    # --- the requests -----------------------------------------------------------------------------

    def request(self, now: float, *, claim: bool, wait_seconds: float = 0.0) -> Outgoing:
        """The next request, numbered and recorded as in flight until `answered` or `failed`.
        A claim asks for every free slot (none while draining) and may be held `wait_seconds`;
        every request renews all leases and carries the checkpoints not yet confirmed and the
        results not yet acked, oldest first, as many as fit in MAX_BODY_BYTES."""
        seen = self.seen
        self.seq += 1
        free = self.free if claim and not self.draining else 0
        wait = min(MAX_WAIT_SECONDS, max(0.0, wait_seconds)) if free else 0.0
        head = {
            "pod": dict(self.pod),
            "boot": self.boot,
            "seq": self.seq,
            "seen": seen,
            "free": free,
            "waitSeconds": wait,
            "held": [list(lease) for lease in self.held()],
        }
        start = _dump(head)[:-1]  # without its closing brace
        size = len(start) + len(b',"checkpoints":[],"results":[]}')
        checkpoints: list[bytes] = []
        sent_checkpoints: list[tuple[Lease, int]] = []
        results: list[bytes] = []
        carried: list[Lease] = []

        def pending(lease: Lease) -> bytes | None:
            cp = self.checkpoints.get(lease)
            if cp is None or cp.confirmed >= cp.version:
                return None
            return _dump({"lease": list(lease), "value": cp.value})

        # The results first, oldest first, each with its task's last checkpoint (never after it);
        # those that do not fit go with the next request.
        for lease, result in self.results.items():
            entry = _dump({"lease": list(lease), "exitCode": result.exit_code, "message": result.message})
            checkpoint = pending(lease)
            need = len(entry) + 1 + (len(checkpoint) + 1 if checkpoint is not None else 0)
            if size + need > MAX_BODY_BYTES or len(results) >= MAX_ENTRIES or len(checkpoints) >= MAX_ENTRIES:
                break
            size += need
            results.append(entry)
            carried.append(lease)
            if checkpoint is not None:
                checkpoints.append(checkpoint)
                sent_checkpoints.append((lease, self.checkpoints[lease].version))
        # Then the running tasks' checkpoints, as many as fit.
        for lease in self.tasks:
            checkpoint = pending(lease)
            if checkpoint is None or size + len(checkpoint) + 1 > MAX_BODY_BYTES or len(checkpoints) >= MAX_ENTRIES:
                continue
            size += len(checkpoint) + 1
            checkpoints.append(checkpoint)
            sent_checkpoints.append((lease, self.checkpoints[lease].version))
        size -= (1 if results else 0) + (1 if checkpoints else 0)  # n entries, n - 1 commas
        body = start + b',"checkpoints":[' + b",".join(checkpoints) + b'],"results":[' + b",".join(results) + b"]}"
        assert len(body) == size <= MAX_BODY_BYTES, (len(body), size)
        self.unsent.difference_update(carried)
        self.inflight[self.seq] = _Sent(now, claim, tuple(sent_checkpoints))
        self.last_sent_at = now if self.last_sent_at is None else max(self.last_sent_at, now)
        return Outgoing(self.seq, body, claim, free, wait, tuple(carried))

    def failed(self, seq: int, now: float, why: str = "no answer") -> Verdict:
        """Request `seq` got no answer (refused, reset, TLS, timeout): no verdict."""
        self.inflight.pop(seq, None)
        return Verdict(False, tuple(self.tick(now)), why)

    def answered(self, seq: int, status: int, body: bytes, now: float, *, retry_after: float | None = None) -> Verdict:
        """Takes the answer to request `seq`: a 200 whose body is the protocol's is a verdict (it
        renews every lease held when the request was sent, acknowledges results, cancels, and
        grants leases); anything else is none (`retry_after`, a 503's, in seconds)."""
        sent = self.inflight.pop(seq, None)
        if sent is None:
            return Verdict(False, tuple(self.tick(now)), f"an answer to request {seq}, which is not in flight")
        if status != 200:
            rest = self._rest(now, retry_after) if status == 503 and retry_after else 0.0
            return Verdict(False, tuple(self.tick(now)), f"HTTP {status}", rest)
        try:
            answer = parse_answer(body)
        except Malformed as err:
            return Verdict(False, tuple(self.tick(now)), f"HTTP 200 but {err}")
        return Verdict(True, tuple(self._take(answer, sent, now)))

    def _rest(self, now: float, retry_after: float) -> float:
        """A 503's Retry-After, at most MAX_REST_SECONDS, and ending early enough that one request
        can still renew the leases held before they fence themselves."""
        rest = min(max(0.0, retry_after), MAX_REST_SECONDS)
        deadline = self.fence_deadline()
        if deadline is not None:
            margin = min(self.beat_seconds, self.lease_seconds / 3)
            rest = min(rest, max(0.0, deadline - margin - now))
        self.rest_until = max(self.rest_until, now + rest)
        return rest

    def _take(self, answer: Answer, sent: _Sent, now: float) -> list[Action]:
        self.last_ok_sent_at = sent.sent_at if self.last_ok_sent_at is None else max(self.last_ok_sent_at, sent.sent_at)
        self.beat_seconds, self.lease_seconds = answer.beat_seconds, answer.lease_seconds
        for lease, version in sent.checkpoints:
            cp = self.checkpoints.get(lease)
            if cp is not None:
                cp.confirmed = max(cp.confirmed, version)
                if cp.confirmed >= cp.version and lease not in self.tasks:
                    del self.checkpoints[lease]  # its task has ended and its last value is in
        for lease in answer.acked:
            if self.results.pop(lease, None) is not None:
                self.unsent.discard(lease)
                self.checkpoints.pop(lease, None)
        actions: list[Action] = []
        for lease in answer.cancel:
            task = self.tasks.get(lease)
            if task is not None and task.state == "running":
                task.state = "cancelled"
                actions.append(Stop(lease, task.grant.grace_seconds, "cancelled by the leader"))
        late = now >= sent.sent_at + self.lease_seconds
        for grant in answer.leases:
            lease = grant.lease
            if lease in self.tasks or lease in self.results:
                continue  # ours already: never started twice
            if self.draining:
                actions.append(Forget(lease, "the worker is stopping"))
            elif late:
                actions.append(Forget(lease, f"its answer came {now - sent.sent_at:g}s after the request"))
            elif self.free <= 0:
                actions.append(Forget(lease, "no free slot"))
            else:
                self.tasks[lease] = _Task(grant)
                actions.append(Start(grant))
        actions.extend(self.tick(now))
        return actions


def lease_text(lease: Iterable[object]) -> str:
    """A lease for the log: `<job uid>/<index>#<attempt>`."""
    uid, index, attempt = tuple(lease)
    return f"{uid}/{index}#{attempt}"
