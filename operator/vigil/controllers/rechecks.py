"""Rechecks of jobs left in Starting.

A Pending pod has no heartbeat deadline that would catch a lost watch event, so a job that stays
Starting has itself and its pods read from the API server every `period` seconds rather than
waiting on watches that may have lost them (the shell does the reading; this decides when).

Remembers, per job in Starting: when it and its pods were last read (or when it was first seen
Starting), and the timer that brings it back for its next look. Both go as soon as the job leaves
Starting (`clear`). The timer is its own, not a delayed add in the work queue, so that it can be
cancelled alone: a leftover would cost every started job one look for nothing `period` seconds
later (a thousand jobs started at once: a thousand reconciles, seen in bench/heartbeat_load.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(slots=True)
class _Starting:
    since: float  # monotonic time of the last direct read, or of the first look in Starting
    timer: asyncio.TimerHandle | None = None


class StartingRechecks(Generic[K]):
    """`wake(key)` hands a job to the work queue; times are on `monotonic`."""

    def __init__(self, wake: Callable[[K], None], monotonic: Callable[[], float], period: float) -> None:
        self.wake, self.monotonic, self.period = wake, monotonic, period
        self._jobs: dict[K, _Starting] = {}

    def due(self, key: K) -> bool:
        """At a look at a job in Starting: whether it is time to read it and its pods directly.
        The first look starts the count; a True starts it again (the caller reads now)."""
        now = self.monotonic()
        starting = self._jobs.setdefault(key, _Starting(since=now))
        if now - starting.since < self.period:
            return False
        starting.since = now
        return True

    def arm(self, key: K) -> None:
        """Brings the job back one period from now, unless its timer is already set."""
        starting = self._jobs.setdefault(key, _Starting(since=self.monotonic()))
        if starting.timer is None:
            starting.timer = asyncio.get_running_loop().call_later(self.period, self._ring, key)

    def clear(self, key: K) -> None:
        """The job left Starting (or is gone): forget it and cancel its timer."""
        starting = self._jobs.pop(key, None)
        if starting is not None and starting.timer is not None:
            starting.timer.cancel()

    def shutdown(self) -> None:
        for key in list(self._jobs):
            self.clear(key)

    def __len__(self) -> int:
        return len(self._jobs)

    def _ring(self, key: K) -> None:
        starting = self._jobs.get(key)
        if starting is not None:
            starting.timer = None
            self.wake(key)
