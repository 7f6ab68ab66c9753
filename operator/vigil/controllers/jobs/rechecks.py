"""Rechecks of jobs left in Starting.

A Pending pod has no heartbeat deadline that would catch a lost watch event, so a job that stays
Starting has itself and its pods read from the API server every `period` seconds rather than
waiting on watches that may have lost them (the reconciler does the reading; this decides when).

Remembers, per job in Starting: when it and its pods were last read (or when it was first seen
Starting), and the timer that brings it back for its next look. Both go as soon as the job
leaves Starting (`clear`). The timer is its own, not a delayed add in the work queue, so that it
can be cancelled alone: a leftover would cost every started job one look for nothing `period`
seconds later.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from vigil.runtime.clock import Clock
from vigil.runtime.timers import Timers

K = TypeVar("K", bound=Hashable)


class StartingRechecks(Generic[K]):
    """`wake(key)` hands a job to the work queue; times are on `clock.monotonic()`."""

    def __init__(self, wake: Callable[[K], None], clock: Clock, period: float) -> None:
        self.wake, self.clock, self.period = wake, clock, period
        self._since: dict[K, float] = {}  # the last direct read, or the first look in Starting
        self._timers: Timers[K] = Timers(clock, self._ring)

    def due(self, key: K) -> bool:
        """At a look at a job in Starting: whether it is time to read it and its pods directly.
        The first look starts the count; a True starts it again (the caller reads now)."""
        now = self.clock.monotonic()
        since = self._since.setdefault(key, now)
        if now - since < self.period:
            return False
        self._since[key] = now
        return True

    def arm(self, key: K) -> None:
        """Brings the job back one period from now, unless its timer is already set."""
        self._since.setdefault(key, self.clock.monotonic())
        if key not in self._timers:
            self._timers.set_after(key, self.period)

    def clear(self, key: K) -> None:
        """The job left Starting (or is gone): forget it and cancel its timer."""
        self._since.pop(key, None)
        self._timers.cancel(key)

    def shutdown(self) -> None:
        self._since.clear()
        self._timers.shutdown()

    def __len__(self) -> int:
        return len(self._since)

    def _ring(self, key: K) -> None:
        if key in self._since:
            self.wake(key)
