"""The leader elector: one process's side of the election on a Lease, with the semantics of
client-go's `tools/leaderelection` (v0.36), plus the fencing check the operator asks before
every write. The decisions are `vigil.core.election`'s; this loop only reads, writes, sleeps
and reports, through a `LeaseApi` (`vigil.kube.leases.LeaseStore` for the real API server).

What the loop adds, as client-go does: a follower retries every retry period x [1, 2.2)
(jitter factor 1.2), and no later than the moment the record it watches would expire on its own
clock; a leader renews every retry period, first without reading (on what it last wrote), and
reads only when that write conflicts. Every API call has a timeout, and a leader's calls never
outlive its deadline. docs/leader-election.md says why each timing is what it is.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import random
import secrets
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from vigil.core.backoff import jitter_up
from vigil.core.election import (
    JITTER_FACTOR,
    Candidate,
    ElectionConfig,
    ElectionPhase,
    LeaseDecision,
    LeaseRecord,
    LeaseVerdict,
    StopReason,
)
from vigil.kube.client import ApiClient
from vigil.kube.errors import Conflict, NotFound
from vigil.kube.leases import LeaseStore
from vigil.runtime.clock import SYSTEM, Clock

log = logging.getLogger(__name__)


def default_identity() -> str:
    """Unique per process: the pod's name (POD_NAME) or else the host name, plus a random
    suffix, so that a restarted container never passes for its previous incarnation."""
    base = os.environ.get("POD_NAME") or socket.gethostname() or "vigil"
    return f"{base}_{secrets.token_hex(5)}"


def monotonic() -> float:
    """This process's clock for the election (the system clock's monotonic reading: CLOCK_BOOTTIME,
    which keeps counting while the machine is suspended)."""
    return SYSTEM.monotonic()


class LeaseApi(Protocol):
    """One Lease. Each call returns the record with the resourceVersion the server gave it;
    `create` raises Conflict when the Lease exists, `update` Conflict when it changed and
    NotFound when it was deleted (`vigil.kube.errors`)."""

    async def get(self) -> tuple[LeaseRecord, str] | None: ...  # None: no such Lease

    async def create(self, record: LeaseRecord) -> tuple[LeaseRecord, str]: ...

    async def update(self, record: LeaseRecord, version: str) -> tuple[LeaseRecord, str]: ...


class NotLeading(Exception):
    """Raised by `LeaderElector.check()`: this process must not write now."""


@dataclass
class ElectionCounters:
    """Plain counts of what happened, for logs now and metrics later."""

    acquired: int = 0  # times this process became leader (0 or 1: a stopped elector never leads again)
    renewals: int = 0  # successful renewals
    renew_failures: int = 0  # renewal attempts that did not land (conflict, error, timeout)
    conflicts: int = 0  # 409s on any write
    errors: int = 0  # API errors and timeouts on any call
    holder_changes: int = 0  # changes of holder seen in the Lease
    lost: int = 0  # leadership taken away (deadline, superseded, deleted, callback failed)
    released: int = 0  # releases written


Callback = Callable[..., Any]


@dataclass
class _Outcome:
    landed: bool = False
    conflict: bool = False


class LeaderElector:
    """Runs the election for one process against one Lease; `run()` once, `release()` to give
    the lease up gracefully, `deadline_ok()`/`check()` before every guarded write.

    Remembers the core state (`state`), the last holder reported (to log changes), two events
    (`leading`: set while leading; `stopped`: set once leading has ended, never cleared), and
    the counters. `on_started_leading()` is called once when leadership starts (if it raises,
    leadership stops: CALLBACK_FAILED); `on_stopped_leading(reason)` once when it ends, only if
    it had started; either may be a coroutine function (then run as a task).
    """

    def __init__(
        self,
        api: LeaseApi,
        identity: str | None = None,
        config: ElectionConfig | None = None,
        *,
        on_started_leading: Callback | None = None,
        on_stopped_leading: Callback | None = None,
        name: str = "lease",
        call_timeout: float | None = None,
        clock: Clock = SYSTEM,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.api = api
        self.config = config or ElectionConfig()
        self.identity = identity or default_identity()
        self.name = name  # for logs: namespace/name of the Lease
        self.call_timeout = call_timeout if call_timeout is not None else self.config.renew_deadline / 2
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self.state = Candidate(self.identity)
        self.leading = asyncio.Event()
        self.stopped = asyncio.Event()
        self.counters = ElectionCounters()
        self.leader: str | None = None  # the holder last seen ("" released, None unknown)
        self.clock, self._jitter = clock, jitter
        self._lock = asyncio.Lock()  # one Lease conversation at a time: a renewal and a release never interleave
        self._wake = asyncio.Event()
        self._closing = False
        self._ran = False
        self._waiting: LeaseDecision | None = None  # the last WAIT on a held lease: when to look again
        self._tasks: set[asyncio.Task] = set()

    @classmethod
    def for_lease(
        cls,
        client: ApiClient,
        namespace: str,
        name: str,
        config: ElectionConfig | None = None,
        identity: str | None = None,
        **kwargs: Any,
    ) -> LeaderElector:
        """An elector on the Lease namespace/name, over `client` (one of the Lease's own)."""
        config = config or ElectionConfig()
        timeout = kwargs.pop("call_timeout", None) or config.renew_deadline / 2
        store = LeaseStore(client, namespace, name, request_timeout=timeout)
        identity = identity or default_identity()
        return cls(store, identity, config, name=f"{namespace}/{name}", call_timeout=timeout, **kwargs)

    # -- what the operator asks

    def deadline_ok(self) -> bool:
        """True only while leading and now < last renewal sent + renew deadline (own clock).
        Computed from the clock on every call, so it turns false on time even when the event
        loop is late or the process was frozen."""
        return self.state.may_act(self.clock.monotonic(), self.config)

    def check(self) -> float:
        """The fence before a write: raises NotLeading unless `deadline_ok()`; else the seconds
        left before it closes (a write's answer must come within them: `core.election.fenced_timeout`)."""
        now = self.clock.monotonic()
        deadline = self.state.deadline(self.config)
        if deadline is None or not self.state.may_act(now, self.config):
            raise NotLeading(f"{self.identity} is not leading {self.name} ({self.state.phase.value})")
        return deadline - now

    # -- the loop

    async def run(self) -> StopReason:
        """Follows until it acquires, then renews until leadership ends; returns why it ended
        (RELEASED if `release()` was called before it ever led). Cancelling it (a stand-in for
        SIGKILL) stops leading without releasing."""
        if self._ran:
            raise RuntimeError("LeaderElector.run() runs once; make a new elector (with a new identity)")
        self._ran = True
        log.info("leader election on %s as %s: %s", self.name, self.identity, self.config)
        try:
            while not self._closing and self.state.phase is not ElectionPhase.STOPPED:
                async with self._lock:
                    if self._closing:
                        break
                    await self._attempt()
                if self.state.phase is ElectionPhase.STOPPED:
                    break
                await self._pause(self._next_delay())
        except asyncio.CancelledError:
            self._set(self.state.stopped(StopReason.CANCELLED))
            raise
        self._set(self.state.stopped(StopReason.RELEASED))  # no-op if it stopped otherwise
        assert self.state.stop_reason is not None
        return self.state.stop_reason

    async def release(self) -> bool:
        """Gives the lease up. Call it only once every write guarded by the lease has finished:
        it stops leading first (the fence closes at once), then, if the Lease still names this
        process, writes an empty holder with leaseDurationSeconds 1, so a standby takes over at
        its next attempt. Retries conflicts and errors for at most a renew deadline. True once
        nothing of ours is held."""
        self._closing = True
        self._wake.set()
        self._set(self.state.stopped(StopReason.RELEASED))
        give_up = self.clock.monotonic() + self.config.renew_deadline
        async with self._lock:
            while True:
                remaining = give_up - self.clock.monotonic()
                if remaining <= 0:
                    log.warning("could not release %s: standbys take over once it expires", self.name)
                    return False
                try:
                    got = await self._bounded(self.api.get(), remaining)
                    record, version = got if got is not None else (None, "")
                    self._set(self.state.observed(record, version, now=self.clock.monotonic()))
                    decision = self.state.release_decision(self.clock.wall())
                    if decision.verdict is LeaseVerdict.WAIT:
                        return True
                    assert decision.write is not None and decision.version is not None
                    record, version = await self._bounded(
                        self.api.update(decision.write, decision.version), give_up - self.clock.monotonic()
                    )
                    self._set(self.state.wrote(record, version, self.clock.monotonic(), self.clock.monotonic()))
                    self.counters.released += 1
                    log.info("released %s (leaseTransitions %d)", self.name, record.transitions)
                    return True
                except (Conflict, NotFound) as err:  # read again and decide again
                    self.counters.conflicts += 1
                    log.info("releasing %s: %s; reading again", self.name, err)
                except Exception as err:  # noqa: BLE001 - any failure: retry until give_up
                    self.counters.errors += 1
                    log.warning("releasing %s failed: %s", self.name, _describe(err))
                    await self.clock.sleep(min(self.config.retry_period, max(0.0, give_up - self.clock.monotonic())))

    # -- one attempt (client-go's tryAcquireOrRenew)

    async def _attempt(self) -> None:
        self._waiting = None
        self._set(self.state.expired(self.clock.monotonic(), self.config))
        if self.state.phase is ElectionPhase.STOPPED:
            return
        renewing = self.state.phase is ElectionPhase.LEADING
        landed = await self._try_acquire_or_renew()
        if renewing:
            if landed:
                self.counters.renewals += 1
            else:
                self.counters.renew_failures += 1

    async def _try_acquire_or_renew(self) -> bool:
        """One attempt; true if a write naming us landed."""
        if self.state.phase is ElectionPhase.LEADING:
            # fast path: renew on the record we last wrote, without reading first
            outcome = await self._write(self.state.decide(self.clock.monotonic(), self.clock.wall(), self.config))
            if outcome.landed or not outcome.conflict or self.state.phase is ElectionPhase.STOPPED:
                return outcome.landed  # an error: try again after the retry period, within the deadline
        try:
            got = await self._bounded(self.api.get(), self._call_budget())
        except Exception as err:  # noqa: BLE001 - a failed read is a failed attempt
            self.counters.errors += 1
            log.warning("reading %s failed: %s", self.name, _describe(err))
            self._set(self.state.expired(self.clock.monotonic(), self.config))
            return False
        record, version = got if got is not None else (None, "")
        self._set(self.state.observed(record, version, self.clock.monotonic()))
        decision = self.state.decide(self.clock.monotonic(), self.clock.wall(), self.config)
        if decision.verdict is LeaseVerdict.WAIT:
            self._waiting = decision
            log.debug("%s: %s", self.name, decision.why)
            return False
        outcome = await self._write(decision)
        if not outcome.landed:
            log.debug("%s: could not %s: %s", self.name, decision.verdict.value, decision.why)
        return outcome.landed

    async def _write(self, decision: LeaseDecision) -> _Outcome:
        if decision.write is None:
            return _Outcome()
        sent_at = self.clock.monotonic()  # the write can land no earlier than this: the deadline counts from here
        try:
            call = (
                self.api.create(decision.write)
                if decision.version is None
                else self.api.update(decision.write, decision.version)
            )
            record, version = await self._bounded(call, self._call_budget())
        except (Conflict, NotFound) as err:
            # a follower losing a race is routine; a leader's conflict means its last answer was lost
            self.counters.conflicts += 1
            level = logging.INFO if self.state.phase is ElectionPhase.LEADING else logging.DEBUG
            log.log(level, "%s: %s", self.name, err)
            return _Outcome(conflict=True)
        except Exception as err:  # noqa: BLE001 - an error or timeout: the write may or may not have landed
            self.counters.errors += 1
            log.warning("writing %s failed: %s", self.name, _describe(err))
            self._set(self.state.expired(self.clock.monotonic(), self.config))
            return _Outcome()
        self._set(self.state.wrote(record, version, sent_at, self.clock.monotonic()))
        return _Outcome(landed=True)

    def _call_budget(self) -> float:
        """A leader's call never outlives its deadline (it could not help after it anyway)."""
        deadline = self.state.deadline(self.config)
        if deadline is None:
            return self.call_timeout
        return max(0.0, min(self.call_timeout, deadline - self.clock.monotonic()))

    async def _bounded(self, call: Awaitable[Any], timeout: float) -> Any:
        if timeout <= 0:
            if inspect.iscoroutine(call):
                call.close()
            raise TimeoutError("no time left before the renew deadline")
        return await asyncio.wait_for(call, timeout)

    def _next_delay(self) -> float:
        now = self.clock.monotonic()
        deadline = self.state.deadline(self.config)
        if deadline is not None:  # leading: renew every retry period; wake at the deadline at the latest
            return max(0.0, min(self.config.retry_period, deadline - now))
        delay = jitter_up(self.config.retry_period, JITTER_FACTOR, self._jitter())
        if self._waiting is not None and self._waiting.retry_in is not None:
            # no later than the moment the watched record expires (if still unchanged then)
            delay = min(delay, self._waiting.retry_in + 0.01)
        return delay

    async def _pause(self, delay: float) -> None:
        sleeper = asyncio.ensure_future(self.clock.sleep(delay))
        waker = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waker.cancel()

    # -- transitions: state, events, counters, logs, callbacks

    def _set(self, new: Candidate) -> None:
        old, self.state = self.state, new
        holder = new.holder
        if holder != self.leader and new.seen is not None and holder is not None:
            if self.leader is not None:
                self.counters.holder_changes += 1
            log.info("%s is held by %s (was %s)", self.name, holder or "nobody (released)", self.leader or "unknown")
            self.leader = holder
        if old.phase is not ElectionPhase.LEADING and new.phase is ElectionPhase.LEADING:
            self.counters.acquired += 1
            log.info(
                "%s: %s became leader (leaseTransitions %d)",
                self.name,
                self.identity,
                new.seen.record.transitions if new.seen else 0,
            )
            self.leading.set()
            if self.on_started_leading is not None:
                try:
                    self._call_back(self.on_started_leading, failed=self._started_failed)
                except Exception:
                    log.exception("on_started_leading raised")
                    self._started_failed()
                    return
        if old.phase is ElectionPhase.LEADING and new.phase is ElectionPhase.STOPPED:
            reason = new.stop_reason
            assert reason is not None
            if reason.lost:
                self.counters.lost += 1
                log.warning("%s: %s stopped leading: %s", self.name, self.identity, reason.value)
            else:
                log.info("%s: %s stopped leading: %s", self.name, self.identity, reason.value)
            self.leading.clear()
            self.stopped.set()
            if self.on_stopped_leading is not None:
                try:
                    self._call_back(self.on_stopped_leading, reason)
                except Exception:
                    log.exception("on_stopped_leading raised")

    def _started_failed(self) -> None:
        # a leader whose start-up failed must not go on holding the fence open
        log.error("%s: on_started_leading failed: %s stops leading", self.name, self.identity)
        self._set(self.state.stopped(StopReason.CALLBACK_FAILED))
        self._wake.set()

    def _call_back(self, callback: Callback, *args: Any, failed: Callable[[], None] | None = None) -> None:
        """Calls it; a coroutine it returns runs as a task, whose failure is handled like a raise."""
        result = callback(*args)
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            self._tasks.add(task)

            def done(task: asyncio.Task) -> None:
                self._tasks.discard(task)
                if not task.cancelled() and task.exception() is not None:
                    log.error("%s failed", getattr(callback, "__name__", "callback"), exc_info=task.exception())
                    if failed is not None:
                        failed()

            task.add_done_callback(done)


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
