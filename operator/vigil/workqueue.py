"""A keyed work queue with the guarantees of client-go's: a key waits in the queue at most once,
is processed by one worker at a time, and a key added while it is processed is processed again
afterwards. Delayed adds keep only the earliest pending time per key.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._waiting: set[K] = set()  # in _queue
        self._processing: set[K] = set()
        self._dirty: set[K] = set()  # added while processing: goes back in when done
        self._timers: dict[K, asyncio.TimerHandle] = {}

    def add(self, key: K) -> None:
        if key in self._processing:
            self._dirty.add(key)
        elif key not in self._waiting:
            self._waiting.add(key)
            self._queue.put_nowait(key)

    def add_after(self, key: K, seconds: float) -> None:
        """Adds the key after `seconds`, unless an earlier delayed add is already pending."""
        if seconds <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + seconds
        timer = self._timers.get(key)
        if timer is not None and not timer.cancelled():
            if timer.when() <= when:
                return
            timer.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> K:
        key = await self._queue.get()
        self._waiting.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def forget(self, key: K) -> None:
        """Drops a pending delayed add (the object is gone)."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def __len__(self) -> int:
        return len(self._waiting) + len(self._dirty)

    def shutdown(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
