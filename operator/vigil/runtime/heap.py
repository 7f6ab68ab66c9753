"""The long-lived heap is kept out of the garbage collector's full collections.

A full collection walks every object the collector tracks. At 10,000 attempts beating to the
leader the operator tracks millions (the jobs and pods it keeps, a TLS connection per pod), and
each full collection held the event loop 0.74 s, five times in ten minutes (bench/README.md,
"What held the loop"): every beat, alarm and write waited that long. Nearly all of those objects
live as long as their job: walking them again finds nothing to free.

So every object that survives a full collection is moved out of the collector's generations
(`gc.freeze()`, which costs nothing: it joins two lists), and later full collections walk only
what was made since. Frozen objects are still freed as their last reference goes; only a cycle
among them would wait. For those, every `thaw_seconds` (an hour) everything is put back and
collected once: one long pause an hour instead of one every two minutes.

`LongLivedHeap` is the whole policy, on a clock and a `collector` (the `gc` module, or a fake).
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from vigil.runtime.clock import Clock, Handle

log = logging.getLogger(__name__)

THAW_SECONDS = 3600.0


class Collector(Protocol):
    callbacks: list[Callable[[str, dict[str, Any]], None]]

    def freeze(self) -> None: ...

    def unfreeze(self) -> None: ...

    def collect(self, generation: int = 2) -> int: ...


class LongLivedHeap:
    """A runnable: while started, freezes what each full collection leaves, and every
    `thaw_seconds` unfreezes it all and collects once."""

    def __init__(
        self,
        clock: Clock,
        collector: Collector = gc,  # type: ignore[assignment]  # the module has the protocol's functions
        thaw_seconds: float = THAW_SECONDS,
        elapsed: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.clock, self.collector, self.thaw_seconds, self.elapsed = clock, collector, thaw_seconds, elapsed
        self._thaw: Handle | None = None

    async def start(self) -> None:
        self.collector.callbacks.append(self._collected)
        self.collector.freeze()  # what the start built (modules, settings, the first lists) lives on
        self._thaw = self.clock.call_at(self.clock.monotonic() + self.thaw_seconds, self.thaw)

    async def stop(self) -> None:
        if self._collected in self.collector.callbacks:
            self.collector.callbacks.remove(self._collected)
        if self._thaw is not None:
            self._thaw.cancel()
            self._thaw = None
        self.collector.unfreeze()  # the process goes on (tests): its collector as it found it

    def _collected(self, phase: str, info: dict[str, Any]) -> None:
        # At "stop" the collection is over and its survivors are in the oldest generation; this
        # may run on any thread that allocated (a resolver's, say), so it only freezes, which is
        # safe anywhere the GIL is held, and sets no timer.
        if phase == "stop" and info.get("generation") == 2:
            self.collector.freeze()

    def thaw(self) -> None:
        """Everything back into the generations, one full collection, and frozen again."""
        began = self.elapsed()
        self.collector.unfreeze()
        freed = self.collector.collect(2)  # its "stop" freezes the survivors again
        log.info(
            "hourly full collection of the long-lived heap: %d objects freed in %.2f s", freed, self.elapsed() - began
        )
        self._thaw = self.clock.call_at(self.clock.monotonic() + self.thaw_seconds, self.thaw)
