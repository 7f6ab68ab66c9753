"""The leader's side of pulled task arrays (spec.pool; docs/pull.md): the lease state
(`vigil.core.pull.PullState`, made anew each time this process starts to lead), the workers' long
polls waiting for offers, and which job a lease's look belongs to.

The job controller asks it for a pulled array's virtual pods and their liveness, and hands it the
decision's actions on them (after the write that fences them); the pull endpoint
(`vigil.servers.pull`) hands it the workers' requests. Every request or action that changes what a
job's decision would see puts that job in the work queue.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from vigil.core import fields
from vigil.core.objects import Key
from vigil.core.pools import EMPTY_LOAD, PoolLoad
from vigil.core.pull import Answer, PoolTiming, PullRequest, PullState, carry_out
from vigil.runtime.clock import Clock

log = logging.getLogger(__name__)

# Long polls held at once; past it a claim that finds nothing is answered at once (the worker asks
# again after its beat interval). Each holds a connection, which the server's gate bounds anyway.
MAX_WAITING = 20_000


class Pulled:
    """`poke(key)` asks for a look at a job; `timing(namespace, pool)` is a pool's heartbeat
    settings (its spec, from the pools' watch)."""

    def __init__(
        self,
        clock: Clock,
        poke: Callable[[Key], None],
        timing: Callable[[str, str], PoolTiming] = lambda namespace, pool: PoolTiming(),
        claimed: Callable[[float], None] = lambda waited: None,
        pool_of_job: Callable[[str, str], str | None] = lambda namespace, uid: None,
    ) -> None:
        """`pool_of_job(namespace, uid)`: that job's spec.pool, if the view holds it (a worker
        adopts, after a failover, only leases of its own pool's arrays)."""
        self.clock, self.poke, self.timing, self.claimed = clock, poke, timing, claimed
        self.pool_of_job = pool_of_job
        # Told (namespace, pool) when a pool's backlog may have changed (an offer, a claim, a
        # result): the pool controller's `poke`, which batches them.
        self.backlog_changed: Callable[[str, str], None] = lambda namespace, pool: None
        self.state: PullState | None = None
        self.keys: dict[str, Key] = {}  # job UID -> key, for the pulled jobs looked at
        self.waiting: dict[tuple[str, str], set[asyncio.Future[None]]] = {}
        self.waiters = 0

    # --- leading --------------------------------------------------------------------------------

    def start(self) -> None:
        """This process leads from now: its lease state starts empty (and adopts, docs/pull.md)."""
        self.state = PullState(
            started_at=self.clock.monotonic(),
            timing=self.timing,
            claimed=self.claimed,
            # A worker adopts only a pulled array of its own pool and namespace, as the view has it.
            adoptable=lambda namespace, pool, uid: self.pool_of_job(namespace, uid) == pool,
        )

    def stop(self) -> None:
        self.state = None
        for futures in self.waiting.values():
            for future in futures:
                if not future.done():
                    future.cancel()
        self.waiting.clear()

    # --- the job controller's side -------------------------------------------------------------

    def pods_of(self, key: Key, job: Mapping[str, Any]) -> list[dict[str, Any]]:
        if self.state is None:
            return []
        self.keys[fields.uid(job)] = key
        return self.state.pods_of(job, self.clock.monotonic())

    def liveness(self, job: Mapping[str, Any]) -> dict[str, Any]:
        if self.state is None:
            return {}
        return self.state.liveness(fields.uid(job), self.clock.monotonic(), self.clock.wall())

    def next_change(self, job: Mapping[str, Any]) -> float | None:
        """Seconds until a lease of the job changes verdict if nothing is heard, if any does."""
        if self.state is None:
            return None
        now = self.clock.monotonic()
        at = self.state.next_change(fields.uid(job), now)
        namespace, pool = fields.namespace(job), str(fields.spec(job).get("pool") or "")
        if self.state.adopting(now, namespace, pool):  # a look when the window ends
            timing = self.timing(namespace, pool)
            window = self.state.adoption_seconds
            ends = self.state.started_at + (window if window is not None else timing.timeout + timing.interval) + 0.1
            at = min(at, ends) if at is not None else ends
        return None if at is None else max(0.0, at - now)

    def carry_out(self, job: Mapping[str, Any], action: Any) -> bool:
        """A decision's action on a virtual pod, after the write that fences it; False if the
        action is not one (the executor's)."""
        if self.state is None:
            return False
        pool = str(fields.spec(job).get("pool") or "")
        done = carry_out(self.state, action, pool, self.clock.monotonic(), self.clock.wall())
        if done:
            self.backlog_changed(fields.namespace(job), pool)
            if self.state.has_ready(fields.namespace(job), pool):
                self._wake(fields.namespace(job), pool)
        return done

    def forget(self, job_uid: str) -> None:
        """A job gone: its leases go, and its workers are told to stop what they run of it."""
        self.keys.pop(job_uid, None)
        if self.state is not None:
            self.state.forget_job(job_uid)

    def load(self, namespace: str, pool: str) -> PoolLoad:
        if self.state is None:
            return EMPTY_LOAD
        return self.state.load(namespace, pool)

    def worker_gone(self, namespace: str, name: str) -> None:
        """A pool's pod deleted or finished: its leases vanish, and their jobs get a look."""
        if self.state is not None:
            self._touch(self.state.worker_gone(namespace, name, self.clock.wall()))

    # --- the workers' side ---------------------------------------------------------------------

    async def request(self, pool: str, request: PullRequest) -> Answer:
        """A worker's request, answered: at once, or once a task is offered to its pool (within
        its waitSeconds) when it asks for tasks and none is ready."""
        state = self.state
        if state is None:
            raise RuntimeError("not leading")
        answer = state.request(pool, request, self.clock.monotonic(), self.clock.wall())
        self._touch(answer.touched)
        if answer.claimed or request.results:
            self.backlog_changed(request.namespace, pool)
        if answer.claimed or not request.free or request.wait_seconds <= 0 or self.waiters >= MAX_WAITING:
            return answer
        where = (request.namespace, pool)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(where, set()).add(future)
        self.waiters += 1
        try:
            await asyncio.wait_for(future, request.wait_seconds)
        except TimeoutError:
            pass
        finally:
            self.waiters -= 1
            futures = self.waiting.get(where)
            if futures is not None:
                futures.discard(future)
                if not futures:
                    del self.waiting[where]
        if self.state is not state:
            raise RuntimeError("not leading")
        # What came in the meantime: the claim alone (its leases and results were taken above).
        again = state.claim_more(pool, request, self.clock.monotonic(), self.clock.wall())
        self._touch(again.touched)
        if again.claimed:
            self.backlog_changed(request.namespace, pool)
        body = dict(again.body)
        body["acked"] = answer.body["acked"] + again.body["acked"]
        body["cancel"] = answer.body["cancel"]
        return Answer(body, answer.touched | again.touched, again.claimed)

    def _wake(self, namespace: str, pool: str) -> None:
        for future in self.waiting.get((namespace, pool), ()):
            if not future.done():
                future.set_result(None)

    def _touch(self, job_uids: Any) -> None:
        for uid in job_uids:
            key = self.keys.get(uid)
            if key is not None:
                self.poke(key)
