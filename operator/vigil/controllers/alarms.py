"""Silence alarms: one timer per job, that wakes the job only when a verdict really changed.

After each decision the shell arms the job's alarm for the instant the first of its attempts
would turn Uncertain (or Lost) if no beat arrived. A beating attempt pushes that instant forward
with every beat, so most alarms ring for nothing: with the work queue's delayed add, every
healthy job was reconciled once per Uncertain threshold (1,000 jobs beating with a 60 s timeout:
33 reconciles a second, a quarter of the operator's CPU under heartbeat load). When an alarm
rings it first asks whether any attempt's verdict differs from the ones the last decision was
taken on (`ring_or_rearm`, pure); only then does the job go to the work queue, else the alarm is
set again for the new instant.

Remembers, per job: its timer, and the verdict states (per pod UID) that its last decision saw.
Both are dropped with the job (`cancel`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

# An alarm may ring a hair early (asyncio runs timers within its clock's resolution): a deadline
# this close counts as reached, so the job is woken rather than re-armed for an instant.
EARLY_SECONDS = 0.001


def ring_or_rearm(
    decided: Mapping[str, str], current: Mapping[str, str], next_deadline: float | None, now: float
) -> float | None:
    """When an alarm rings: None to wake the job (some verdict changed since the decision, or
    its deadline is reached), or the monotonic time to set the alarm again for (beats moved it)."""
    if dict(current) != dict(decided) or next_deadline is None or next_deadline <= now + EARLY_SECONDS:
        return None
    return next_deadline


@dataclass(slots=True)
class _Alarm:
    timer: asyncio.TimerHandle
    decided: dict[str, str]


class SilenceAlarms(Generic[K]):
    """`look(key)` gives the job's current verdict states by pod UID and the next instant one of
    them would change (None: never, without a new pod); `wake(key)` hands the job to the work
    queue. Times are on `monotonic`, which the event loop's own clock must advance with."""

    def __init__(
        self,
        look: Callable[[K], tuple[dict[str, str], float | None]],
        wake: Callable[[K], None],
        monotonic: Callable[[], float],
    ) -> None:
        self.look, self.wake, self.monotonic = look, wake, monotonic
        self._alarms: dict[K, _Alarm] = {}
        self.rearmed = 0  # rings that found nothing changed (for tests and the benchmark)

    def arm(self, key: K, decided: Mapping[str, str]) -> None:
        """After a decision taken on the verdict states `decided`: wake at once if they changed
        meanwhile (the decision's writes took time), else at the next deadline."""
        self.cancel(key)
        current, deadline = self.look(key)
        when = ring_or_rearm(decided, current, deadline, self.monotonic())
        if when is not None:
            self._set(key, dict(decided), when)
        elif current != dict(decided) or deadline is not None:
            self.wake(key)
        # else no deadline: nothing changes without an event, and events reconcile anyway

    def cancel(self, key: K) -> None:
        alarm = self._alarms.pop(key, None)
        if alarm is not None:
            alarm.timer.cancel()

    def shutdown(self) -> None:
        for alarm in self._alarms.values():
            alarm.timer.cancel()
        self._alarms.clear()

    def __len__(self) -> int:
        return len(self._alarms)

    def _set(self, key: K, decided: dict[str, str], when: float) -> None:
        loop = asyncio.get_running_loop()
        timer = loop.call_at(loop.time() + max(0.0, when - self.monotonic()), self._ring, key)
        self._alarms[key] = _Alarm(timer, decided)

    def _ring(self, key: K) -> None:
        alarm = self._alarms.pop(key, None)
        if alarm is None:
            return
        current, deadline = self.look(key)
        when = ring_or_rearm(alarm.decided, current, deadline, self.monotonic())
        if when is None:
            self.wake(key)
        else:
            self.rearmed += 1
            self._set(key, alarm.decided, when)
