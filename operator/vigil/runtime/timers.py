"""Keyed one-shot timers on a clock: at most one timer per key, each calling `fire(key)` when it
is due. The work queue's delayed adds, the silence alarms, the rechecks of jobs left Starting,
the queues' wake-ups and the looks for pods the watch has not shown all set theirs here.

Remembers, per key with a timer set: when it is due and the clock's handle; a key is forgotten
as its timer fires or is cancelled.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

from vigil.runtime.clock import Clock, Handle

K = TypeVar("K", bound=Hashable)


class Timers(Generic[K]):
    def __init__(self, clock: Clock, fire: Callable[[K], None]) -> None:
        self.clock, self.fire = clock, fire
        self._timers: dict[K, tuple[float, Handle]] = {}

    def set(self, key: K, when: float, *, keep_earlier: bool = False) -> None:
        """The key's timer fires at monotonic `when`, replacing any set before; with
        `keep_earlier`, a timer already due sooner is kept instead."""
        held = self._timers.get(key)
        if held is not None:
            if keep_earlier and held[0] <= when:
                return
            held[1].cancel()
        self._timers[key] = (when, self.clock.call_at(when, lambda: self._fire(key, when)))

    def set_after(self, key: K, seconds: float, *, keep_earlier: bool = False) -> None:
        self.set(key, self.clock.monotonic() + seconds, keep_earlier=keep_earlier)

    def due(self, key: K) -> float | None:
        held = self._timers.get(key)
        return held[0] if held is not None else None

    def cancel(self, key: K) -> None:
        held = self._timers.pop(key, None)
        if held is not None:
            held[1].cancel()

    def shutdown(self) -> None:
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()

    def __len__(self) -> int:
        return len(self._timers)

    def __contains__(self, key: object) -> bool:
        return key in self._timers

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._timers))

    def _fire(self, key: K, when: float) -> None:
        held = self._timers.get(key)
        if held is None or held[0] != when:
            return  # replaced or cancelled meanwhile
        del self._timers[key]
        self.fire(key)
