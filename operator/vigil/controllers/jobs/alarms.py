"""Silence alarms: one timer per job, that wakes the job only when a verdict really changed.

After each decision the reconciler arms the job's alarm for the instant the first of its
attempts would turn Uncertain (or Lost) if no beat arrived. A beating attempt pushes that
instant forward with every beat, so most alarms ring for nothing: when one rings it first asks
whether any attempt's verdict differs from the ones the last decision was taken on
(`core.liveness.ring_or_rearm`); only then does the job go to the work queue, else the alarm is
set again for the new instant: a healthy job costs no reconcile at each threshold.

Remembers, per job: its timer, and the verdict states (per pod UID) that its last decision saw.
Both are dropped with the job (`cancel`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Generic, TypeVar

from vigil.core.liveness import ring_or_rearm
from vigil.runtime.clock import Clock
from vigil.runtime.timers import Timers

K = TypeVar("K", bound=Hashable)


class SilenceAlarms(Generic[K]):
    """`look(key)` gives the job's current verdict states by pod UID and the next instant one of
    them would change (None: never, without a new pod); `wake(key)` hands the job to the work
    queue. Instants are on `clock.monotonic()`."""

    def __init__(
        self,
        look: Callable[[K], tuple[dict[str, str], float | None]],
        wake: Callable[[K], None],
        clock: Clock,
    ) -> None:
        self.look, self.wake, self.clock = look, wake, clock
        self._timers: Timers[K] = Timers(clock, self._ring)
        self._decided: dict[K, dict[str, str]] = {}
        self.rearmed = 0  # rings that found nothing changed (for tests and the benchmark)

    def arm(self, key: K, decided: Mapping[str, str]) -> None:
        """After a decision taken on the verdict states `decided`: wake at once if they changed
        meanwhile (the decision's writes took time), else at the next deadline."""
        self.cancel(key)
        current, deadline = self.look(key)
        when = ring_or_rearm(decided, current, deadline, self.clock.monotonic())
        if when is not None:
            self._set(key, dict(decided), when)
        elif current != dict(decided) or deadline is not None:
            self.wake(key)
        # else no deadline: nothing changes without an event, and events reconcile anyway

    def cancel(self, key: K) -> None:
        self._timers.cancel(key)
        self._decided.pop(key, None)

    def shutdown(self) -> None:
        self._timers.shutdown()
        self._decided.clear()

    def __len__(self) -> int:
        return len(self._timers)

    def _set(self, key: K, decided: dict[str, str], when: float) -> None:
        self._decided[key] = decided
        self._timers.set(key, when)

    def _ring(self, key: K) -> None:
        decided = self._decided.pop(key, None)
        if decided is None:
            return
        current, deadline = self.look(key)
        when = ring_or_rearm(decided, current, deadline, self.clock.monotonic())
        if when is None:
            self.wake(key)
        else:
            self.rearmed += 1
            self._set(key, decided, when)
