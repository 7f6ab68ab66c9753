"""What holds the event loop: its lag, and the garbage collector's pauses, as they happen.

Every beat the leader answers, every silence alarm and every write runs on one event loop, so a
loop held for a second delays each of them by that second: beats answered late, a silence
measured late. Two readings tell an operator (and `bench/`) when and why:

- `LagProbe` sets a timer every `period` seconds and observes how late it fires (the loop's lag,
  as seen from inside; bench.heartbeat_load sees it from outside, as /healthz round trips);
- `CollectorPauses`, a `gc.callbacks` entry, times each collection by generation: with a large
  heap (10,000 connections, their pods and jobs) a full collection walks every object there is,
  the usual cause of a held loop in a Python server.

Both pure (a clock or a `now` and an `observe` passed in); `CollectorWatch` is the thin part: a
runnable that hooks a `CollectorPauses` to the interpreter's collector while the operator runs.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

from vigil.runtime.clock import Clock, Handle

PERIOD = 0.25  # seconds between two looks at the loop: 4 a second cost nothing, and catch a 0.5 s stall


class LagProbe:
    """A runnable: while started, observes every `period` how many seconds late its timer fired."""

    def __init__(self, clock: Clock, observe: Callable[[float], None], period: float = PERIOD) -> None:
        self.clock, self.observe, self.period = clock, observe, period
        self._handle: Handle | None = None

    async def start(self) -> None:
        self._next()

    async def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _next(self) -> None:
        due = self.clock.monotonic() + self.period
        self._handle = self.clock.call_at(due, lambda: self._fired(due))

    def _fired(self, due: float) -> None:
        self.observe(max(0.0, self.clock.monotonic() - due))
        self._next()  # from now, not from `due`: a stall is observed once, not once per missed period


class CollectorPauses:
    """A `gc.callbacks` entry: `observe(generation, seconds)` for each collection, timed on `now`."""

    def __init__(self, now: Callable[[], float], observe: Callable[[int, float], None]) -> None:
        self.now, self.observe = now, observe
        self._began: float | None = None

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = self.now()
        elif phase == "stop" and self._began is not None:
            began, self._began = self._began, None
            self.observe(int(info.get("generation", 2)), self.now() - began)


class CollectorWatch:
    """A runnable: `pauses` hooked to `callbacks` (the interpreter's, `gc.callbacks`) while started."""

    def __init__(self, pauses: CollectorPauses, callbacks: list[Any] | None = None) -> None:
        self.pauses = pauses
        self.callbacks = gc.callbacks if callbacks is None else callbacks

    async def start(self) -> None:
        self.callbacks.append(self.pauses)

    async def stop(self) -> None:
        if self.pauses in self.callbacks:
            self.callbacks.remove(self.pauses)
