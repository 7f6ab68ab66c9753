"""A keyed work queue with the guarantees of client-go's: a key waits in the queue at most once,
is processed by one worker at a time, and a key added while it is processed is processed again
afterwards. Delayed adds keep only the earliest pending time per key.

Unlike client-go's single FIFO, keys are handed out fair across tenants (`tenant(key)`, the
namespace for the controllers' keys): round robin over the tenants with a key ready, FIFO within
each (`vigil.core.fairness.RoundRobin`), so one namespace's flood of keys delays another
namespace's key by at most one round. Without `tenant` every key is one tenant's: plain FIFO.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from vigil.core.fairness import RoundRobin
from vigil.runtime.clock import SYSTEM, Clock
from vigil.runtime.timers import Timers

K = TypeVar("K", bound=Hashable)


def one_tenant(key: Hashable) -> Hashable:
    return None


def namespace_of(key: Hashable) -> Hashable:
    """The tenant of a (namespace, name) key."""
    return key[0] if isinstance(key, tuple) and key else None


class WorkQueue(Generic[K]):
    """`on_add()` is called for every add that enqueues, `on_wait(seconds)` with how long a key
    waited when a worker takes it (for the workqueue_* metrics); `tenant(key)` says whose turn
    a key takes."""

    def __init__(
        self,
        clock: Clock = SYSTEM,
        on_add: Callable[[], None] = lambda: None,
        on_wait: Callable[[float], None] = lambda seconds: None,
        *,
        tenant: Callable[[K], Hashable] = one_tenant,
    ) -> None:
        self.clock, self.on_add, self.on_wait, self.tenant = clock, on_add, on_wait, tenant
        self._added_at: dict[K, float] = {}
        self._ready: RoundRobin[K, Hashable] = RoundRobin()
        self._getters: deque[asyncio.Future[None]] = deque()  # workers waiting for a key
        self._waiting: set[K] = set()  # in _ready
        self._processing: set[K] = set()
        self._dirty: set[K] = set()  # added while processing: goes back in when done
        self._timers: Timers[K] = Timers(clock, self.add)  # delayed adds

    def add(self, key: K) -> None:
        if key in self._processing:
            self._dirty.add(key)
        elif key not in self._waiting:
            self._waiting.add(key)
            self._added_at[key] = self.clock.monotonic()
            self._ready.push(self.tenant(key), key)
            self.on_add()
            self._wake_one()

    def add_after(self, key: K, seconds: float) -> None:
        """Adds the key after `seconds`, unless an earlier delayed add is already pending."""
        if seconds <= 0:
            self.add(key)
            return
        self._timers.set_after(key, seconds, keep_earlier=True)

    def add_batched(self, key: K, seconds: float) -> None:
        """Adds the key within `seconds`, so that the changes of that window cost one look: a key
        already waiting gets no timer (the worker that takes it reads the newest state then);
        one being processed gets a delayed add (its worker may have read the state before the
        change). The Job controller batches its pods' events over a second too (syncJobBatchPeriod).
        With `seconds` <= 0 it is `add`."""
        if key not in self._waiting:
            self.add_after(key, seconds)

    async def get(self) -> K:
        while not self._ready:
            waiter = asyncio.get_running_loop().create_future()
            self._getters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # woken, then cancelled: the key is another worker's
                raise
            finally:
                if waiter in self._getters:
                    self._getters.remove(waiter)
        key = self._ready.pop()
        self._waiting.discard(key)
        added = self._added_at.pop(key, None)
        if added is not None:
            self.on_wait(self.clock.monotonic() - added)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def forget(self, key: K) -> None:
        """Drops a pending delayed add (the object is gone)."""
        self._timers.cancel(key)

    def __len__(self) -> int:
        return len(self._waiting) + len(self._dirty)

    def _wake_one(self) -> None:
        while self._getters:
            waiter = self._getters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def shutdown(self) -> None:
        self._timers.shutdown()
