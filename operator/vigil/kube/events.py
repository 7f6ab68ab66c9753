"""Events are posted beside the work, not in its way.

A decision's events (AttemptStarting, AttemptSucceeded, ...) are handed to the recorder, which
returns at once and posts them from senders of its own, as client-go's recorder hands events to
a broadcaster: a worker never waits for an event's round trip before it takes the next job.

`EventRecorder` remembers only the events not yet posted: at most `capacity` of them. An event
is best effort (as in client-go, which drops events when its queue is full): past the capacity
new events are dropped and counted, never waited for, so a slow API server cannot stall
reconciling through its events.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from vigil.runtime.clock import SYSTEM, Clock

log = logging.getLogger(__name__)

CAPACITY = 1000  # client-go's maxQueuedEvents
CONCURRENCY = 4  # posts in flight: enough to keep up with starts at the API server's latency

Post = Callable[[Mapping[str, Any], str, str, str], Awaitable[None]]  # (job, type, reason, message)


class EventRecorder:
    def __init__(
        self,
        post: Post,
        *,
        capacity: int = CAPACITY,
        concurrency: int = CONCURRENCY,
        on_drop: Callable[[], None] = lambda: None,
        clock: Clock = SYSTEM,
    ) -> None:
        self.post, self.on_drop, self.clock = post, on_drop, clock
        self._capacity, self._concurrency = capacity, concurrency
        self._pending: asyncio.Queue[tuple[Mapping[str, Any], str, str, str]] = asyncio.Queue(capacity)
        self._senders: list[asyncio.Task] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.dropped = 0

    def record(self, job: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Queues the event and returns at once; drops it if `capacity` events wait already."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # the first event (or, in tests, a new event loop)
            self._loop, self._pending = loop, asyncio.Queue(self._capacity)
            self._senders = [asyncio.create_task(self._send(), name="vigil-events") for _ in range(self._concurrency)]
        try:
            self._pending.put_nowait((job, type_, reason, message))
        except asyncio.QueueFull:
            self.dropped += 1
            self.on_drop()
            if self.dropped in (1, 10, 100) or self.dropped % 1000 == 0:
                log.warning("%d events dropped so far: the API server does not keep up with them", self.dropped)

    def __len__(self) -> int:
        return self._pending.qsize()

    async def flush(self, timeout: float) -> bool:
        """Waits until every queued event was posted (or given up), at most `timeout` seconds."""
        joined = asyncio.ensure_future(self._pending.join())
        expired = asyncio.ensure_future(self.clock.sleep(timeout))
        try:
            await asyncio.wait({joined, expired}, return_when=asyncio.FIRST_COMPLETED)
            return joined.done()
        finally:
            joined.cancel()
            expired.cancel()

    async def start(self) -> None:
        """Nothing to do: the senders start with the first event."""

    async def stop(self) -> None:
        """The last decisions' events, briefly (`close`)."""
        await self.close()

    async def close(self, timeout: float = 2.0) -> None:
        """Posts what waits, for at most `timeout` seconds, then stops."""
        if self._senders:
            await self.flush(timeout)
        for task in self._senders:
            task.cancel()
        await asyncio.gather(*self._senders, return_exceptions=True)
        self._senders, self._loop = [], None

    async def _send(self) -> None:
        while True:
            job, type_, reason, message = await self._pending.get()
            try:
                await self.post(job, type_, reason, message)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # best effort: Kube.post_event already swallows API refusals
                log.debug("posting event %s on %s failed: %s", reason, job["metadata"].get("name"), err)
            finally:
                self._pending.task_done()
