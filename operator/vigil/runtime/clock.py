"""The one clock of the process, injected everywhere time is read, slept on or waited for.

Two readings, named as such everywhere: `monotonic()`, seconds that only grow (silence, leases,
timers, backoff: everything that measures a duration), and `wall()`, the calendar time written
into objects for people and compared with the times other components wrote. Timers are set on
the monotonic reading (`call_at`). Tests pass a clock they advance by hand
(`tests/support/clock.py`), so no unit test waits for real time to pass.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol


class Handle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def wall(self) -> datetime: ...

    async def sleep(self, seconds: float) -> None: ...

    def call_at(self, when: float, callback: Callable[[], None]) -> Handle:
        """Calls `callback` on the running event loop once `monotonic()` reaches `when`."""
        ...


def _boottime() -> float:
    # CLOCK_BOOTTIME where there is one: it keeps counting while the machine is suspended
    # (CLOCK_MONOTONIC stops, and a leader frozen with its VM would wake up believing its lease
    # still fresh, or a silent attempt would look less silent than it was).
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class SystemClock:
    """The machine's clocks; timers on the running event loop."""

    def __init__(self) -> None:
        self._monotonic = _boottime if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic

    def monotonic(self) -> float:
        return self._monotonic()

    @staticmethod
    def wall() -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def call_at(self, when: float, callback: Callable[[], None]) -> Handle:
        loop = asyncio.get_running_loop()
        # The loop's own clock is CLOCK_MONOTONIC: translate, at the moment the timer is set.
        return loop.call_at(loop.time() + max(0.0, when - self.monotonic()), callback)


SYSTEM = SystemClock()
