"""Events are posted beside the work, not in its way, and one namespace's flood of them does not
drown another's.

A decision's events (AttemptStarting, AttemptSucceeded, ...) are handed to the recorder, which
returns at once and posts them from senders of its own, as client-go's recorder hands events to
a broadcaster: a worker never waits for an event's round trip before it takes the next job.

At `record()` time, on the caller's clock, client-go's correlator (`vigil.core.events`) decides
what the event becomes: a new Event, an update of the count of the Event it repeats (a PATCH;
created again if that Event is gone), one combined Event for many similar ones, or nothing, past
the job's budget. What is to be written waits in a `Backlog`: one write per Event, at most
`SHARE` per namespace and `CAPACITY` in all. An event is best effort (as in client-go, which
drops events when its queue is full): past a share or the capacity new events are dropped and
counted, never waited for, so a slow API server cannot stall reconciling through its events.
The senders take the writes round robin across namespaces and FIFO within each
(`vigil.runtime.workqueue`), one write of an Event at a time, so its count only grows.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from vigil.core import fields
from vigil.core.events import Backlog, Drop, EventCorrelator, EventKey, Patch, Write, created
from vigil.runtime.clock import SYSTEM, Clock
from vigil.runtime.workqueue import WorkQueue, namespace_of

log = logging.getLogger(__name__)

CAPACITY = 1000  # client-go's maxQueuedEvents
SHARE = 100  # a namespace's flood fills a tenth: ten namespaces would have to flood to fill it all
CONCURRENCY = 4  # posts in flight: enough to keep up with starts at the API server's latency

Post = Callable[[Mapping[str, Any], Write], Awaitable[None]]  # (job, the Event to create)
Update = Callable[[str, Write], Awaitable[bool]]  # (namespace, the Event's new count): False if it is gone


class EventRecorder:
    """`on_drop(cause)` is called for every event not written: "rate-limit" (the correlator's
    spam filter) or "backlog" (its namespace's share or the capacity is taken)."""

    def __init__(
        self,
        post: Post,
        patch: Update,
        *,
        capacity: int = CAPACITY,
        share: int = SHARE,
        concurrency: int = CONCURRENCY,
        on_drop: Callable[[str], None] = lambda cause: None,
        clock: Clock = SYSTEM,
        correlator: EventCorrelator | None = None,
    ) -> None:
        self.post, self.patch, self.on_drop, self.clock = post, patch, on_drop, clock
        self.correlator = correlator or EventCorrelator()
        self._capacity, self._share, self._concurrency = capacity, share, concurrency
        self._fresh()
        self._senders: list[asyncio.Task] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.dropped = 0

    def record(self, job: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Decides and queues the event, and returns at once; drops it past the job's budget or
        its namespace's share of the backlog."""
        involved = (fields.namespace(job), fields.name(job), fields.metadata(job).get("uid") or "")
        decision = self.correlator.correlate(
            involved, type_, reason, message, now=self.clock.monotonic(), wall=self.clock.wall()
        )
        if isinstance(decision, Drop):
            self._drop("rate-limit")
            return
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # the first event (or, in tests, a new event loop)
            self._loop = loop
            self._fresh()
            self._senders = [asyncio.create_task(self._send(), name="vigil-events") for _ in range(self._concurrency)]
        key = self._backlog.put(job, decision)
        if key is None:
            self._drop("backlog")
            return
        self._idle.clear()
        self._order.add(key)

    def _fresh(self) -> None:
        """Nothing waits nor is being sent."""
        self._backlog = Backlog(self._capacity, self._share)
        self._order: WorkQueue[EventKey] = WorkQueue(self.clock, tenant=namespace_of)
        self._sending = 0
        self._idle = asyncio.Event()  # set while nothing waits nor is being sent
        self._idle.set()

    def _drop(self, cause: str) -> None:
        self.dropped += 1
        self.on_drop(cause)
        if self.dropped in (1, 10, 100) or self.dropped % 1000 == 0:
            log.warning("%d events dropped so far (this one: %s)", self.dropped, cause)

    def __len__(self) -> int:
        return len(self._backlog)

    async def flush(self, timeout: float) -> bool:
        """Waits until every queued event was posted (or given up), at most `timeout` seconds."""
        idle = asyncio.ensure_future(self._idle.wait())
        expired = asyncio.ensure_future(self.clock.sleep(timeout))
        try:
            await asyncio.wait({idle, expired}, return_when=asyncio.FIRST_COMPLETED)
            return idle.done()
        finally:
            idle.cancel()
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
            key = await self._order.get()
            job, write = self._backlog.pop(key)
            self._sending += 1
            try:
                await self._write(job, write)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # best effort: Kube already swallows API refusals
                log.debug("writing event %s on %s failed: %s", write.reason, fields.metadata(job).get("name"), err)
            finally:
                self._sending -= 1
                self._order.done(key)  # a newer write of this Event, waiting meanwhile, may go now
                if not self._backlog and not self._sending:
                    self._idle.set()

    async def _write(self, job: Mapping[str, Any], write: Write) -> None:
        if isinstance(write, Patch) and await self.patch(fields.namespace(job), write):
            return
        await self.post(job, created(write))  # a new Event, or one whose first is gone
