"""A clock that moves only when a test moves it: the `vigil.runtime.clock.Clock` of unit tests.

`monotonic()` and `wall()` advance together. Timers (`call_at`) and sleepers fire in order of
their due time as the test advances the clock: `tick()` for code without tasks, `advance()`
(awaited) letting the event loop run what each firing wakes, and `until()` jumping from one due
time to the next until a condition holds.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

START = 1000.0
WALL_START = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
TURNS = 200  # turns of the event loop given to what a firing wakes (in-memory fakes answer at once)


class _Timer:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback, self.cancelled = callback, False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    def __init__(self, start: float = START, wall: datetime = WALL_START) -> None:
        self.now = start
        self._start, self._wall = start, wall
        self._due: list[tuple[float, int, _Timer]] = []
        self._order = itertools.count()

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return self._wall + timedelta(seconds=self.now - self._start)

    def call_at(self, when: float, callback: Callable[[], None]) -> _Timer:
        timer = _Timer(callback)
        heapq.heappush(self._due, (when, next(self._order), timer))
        return timer

    async def sleep(self, seconds: float) -> None:
        future = asyncio.get_running_loop().create_future()
        self.call_at(self.now + max(0.0, seconds), lambda: future.done() or future.set_result(None))
        await future

    def pending(self) -> int:
        """Timers and sleepers not yet fired nor cancelled."""
        return sum(not timer.cancelled for _, _, timer in self._due)

    def next_due(self) -> float | None:
        self._drop_cancelled()
        return self._due[0][0] if self._due else None

    def tick(self, seconds: float) -> None:
        """Moves time on by `seconds`, firing what falls due, in order, each at its own time."""
        end = self.now + seconds
        while (when := self.next_due()) is not None and when <= end:
            self._fire_next(when)
        self.now = max(self.now, end)

    async def advance(self, seconds: float) -> None:
        """As `tick`, and lets the event loop run after each firing (and before the first)."""
        end = self.now + seconds
        await settle()
        while (when := self.next_due()) is not None and when <= end:
            self._fire_next(when)
            await settle()
        self.now = max(self.now, end)
        await settle()

    async def until(self, condition: Callable[[], object], within: float) -> bool:
        """Runs everything, jumping to each next due time, until `condition()` holds; False if
        `within` seconds pass first."""
        end = self.now + within
        while True:
            await settle()
            if condition():
                return True
            when = self.next_due()
            if when is None or when > end:
                self.now = max(self.now, end)
                return bool(condition())
            self._fire_next(when)

    def _fire_next(self, when: float) -> None:
        _, _, timer = heapq.heappop(self._due)
        self.now = max(self.now, when)
        timer.callback()

    def _drop_cancelled(self) -> None:
        while self._due and self._due[0][2].cancelled:
            heapq.heappop(self._due)


async def settle(turns: int = TURNS) -> None:
    """Lets the event loop run every task that is ready, a number of turns over."""
    for _ in range(turns):
        await asyncio.sleep(0)
