"""A keyed work queue with the guarantees of client-go's: a key waits in the queue at most once,
is processed by one worker at a time, and a key added while it is processed is processed again
afterwards. Delayed adds keep only the earliest pending time per key.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from vigil.runtime.clock import SYSTEM, Clock
from vigil.runtime.timers import Timers

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    """`on_add()` is called for every add that enqueues, `on_wait(seconds)` with how long a key
    waited when a worker takes it (for the workqueue_* metrics)."""

    def __init__(
        self,
        clock: Clock = SYSTEM,
        on_add: Callable[[], None] = lambda: None,
        on_wait: Callable[[float], None] = lambda seconds: None,
    ) -> None:
        self.clock, self.on_add, self.on_wait = clock, on_add, on_wait
        self._added_at: dict[K, float] = {}
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._waiting: set[K] = set()  # in _queue
        self._processing: set[K] = set()
        self._dirty: set[K] = set()  # added while processing: goes back in when done
        self._timers: Timers[K] = Timers(clock, self.add)  # delayed adds

    def add(self, key: K) -> None:
        if key in self._processing:
            self._dirty.add(key)
        elif key not in self._waiting:
            self._waiting.add(key)
            self._added_at[key] = self.clock.monotonic()
            self._queue.put_nowait(key)
            self.on_add()

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
        key = await self._queue.get()
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

    def shutdown(self) -> None:
        self._timers.shutdown()
